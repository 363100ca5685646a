"""Manifests for ``benchmarks/scale.py``.

``write_synthetic``: a manifest as ``dali-shards index`` writes it, at any size, written directly:
the JSON (byte for byte what ``write_manifest`` writes for these entries), its sample table as a
sparse file of the right size (its records are never read by what is measured), and, where the
checkout measured writes them, the binary columns beside the JSON; the shards are not written. A
million shards of 10k samples: a 128 MB JSON and a 120 GB sample table (sparse: no disk used).
``make_manifest``: one written by ``write_manifest`` from synthetic offsets (the ``manifest-*``
cases); ``make_tiny_shards``: tiny real shards and their manifest."""

from __future__ import annotations

import json
import os
from typing import Tuple

import numpy as np

HEAD = '{\n "format": "dali-shards-manifest",\n "version": 3,\n "shards": [\n'
ENTRY = ('  {\n   "url": "%s",\n   "samples": %d,\n   "bytes": %d,\n   "ext_bytes": {\n    "cls": %d,\n'
         '    "jpg": %d\n   }\n  }')  # fmt: skip
TAIL = '\n ],\n "sample_table": "manifest.samples"\n}\n'


def entry_fields(shards: int, per_shard: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sizes, cls bytes, jpg bytes) of the synthetic shards: sizes that hold their samples."""
    sizes = 2000 * per_shard + np.arange(shards, dtype=np.int64)
    return sizes, np.full(shards, 3 * per_shard, np.int64), sizes // 2


def manifest_text(shards: int, per_shard: int) -> bytes:
    sizes, cls, jpg = entry_fields(shards, per_shard)
    body = ",\n".join(ENTRY % (f"s-{i:07d}.tar", per_shard, s, c, j)
                      for i, s, c, j in zip(range(shards), sizes.tolist(), cls.tolist(), jpg.tolist()))  # fmt: skip
    return (HEAD + body + TAIL).encode()


def write_synthetic(root: str, shards: int, per_shard: int, columns: bool = True) -> str:
    """The manifest of ``shards`` synthetic shards of ``per_shard`` samples under ``root`` (made once)."""
    folder = os.path.join(root, f"synthetic-v3-{shards}x{per_shard}")
    path = os.path.join(folder, "manifest.json")
    if os.path.exists(path):
        return path
    os.makedirs(folder, exist_ok=True)
    text = manifest_text(shards, per_shard)
    from dali_shards.catalog.table import record_starts

    with open(os.path.join(folder, "manifest.samples"), "wb") as f:
        f.truncate(int(record_starts(np.full(shards, per_shard, np.int64))[-1]))
    if columns:
        _write_columns(path, text, shards, per_shard)
    with open(path + ".tmp", "wb") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
    return path


def _write_columns(path: str, text: bytes, shards: int, per_shard: int) -> None:
    """The binary columns beside it, where this checkout writes them."""
    try:
        from dali_shards.catalog.binary import write_fields
        from dali_shards.catalog.parse import Fields
        from dali_shards.catalog.strings import StringTable
        from dali_shards.options import StorageOptions
    except ImportError:  # (a release without them)
        return
    sizes, cls, jpg = entry_fields(shards, per_shard)
    names = StringTable.of(f"s-{i:07d}.tar" for i in range(shards))
    fields = Fields(names, np.full(shards, per_shard, np.int64), sizes, ("cls", "jpg"), np.stack([cls, jpg], axis=1),
                    np.ones(shards, bool), np.ones(shards, bool), np.ones(shards, bool))  # fmt: skip
    write_fields(path, text, fields, "manifest.samples", StorageOptions())


def check_format(shards: int = 3, per_shard: int = 5) -> None:
    """The text is what ``write_manifest`` writes (json.dumps with indent=1) for these entries."""
    sizes, cls, jpg = entry_fields(shards, per_shard)
    doc = {"format": "dali-shards-manifest", "version": 3, "shards": [
        {"url": f"s-{i:07d}.tar", "samples": per_shard, "bytes": int(sizes[i]), "ext_bytes": {"cls": int(cls[i]), "jpg": int(jpg[i])}}
        for i in range(shards)], "sample_table": "manifest.samples"}  # fmt: skip
    assert manifest_text(shards, per_shard) == (json.dumps(doc, indent=1) + "\n").encode()


def make_manifest(root: str, shards: int, per_shard: int) -> str:
    """A manifest of ``shards`` synthetic shards with offsets and key fingerprints (the shards
    themselves are not written: reading the manifest never opens them)."""
    import numpy as np

    from dali_shards import ShardInfo, write_manifest  # (the same names in every release)
    from dali_shards.catalog.manifest import MANIFEST_VERSION

    path = os.path.join(root, f"manifest-v{MANIFEST_VERSION}-{shards}x{per_shard}", "manifest.json")
    if os.path.exists(path):
        return path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    rng = np.random.default_rng(0)
    infos = []
    for s in range(shards):
        blocks = rng.integers(100, 300, per_shard)
        offsets = np.concatenate([[0], np.cumsum(blocks) * 512])
        crc = rng.integers(0, 2**32, per_shard, dtype=np.uint32)
        size = int(offsets[-1]) + 1024
        infos.append(ShardInfo(f"{os.path.dirname(path)}/s-{s:07d}.tar", per_shard, size, {"jpg": size // 2, "cls": 3 * per_shard},
                               ShardInfo.offsets_from(offsets), crc))  # fmt: skip
    write_manifest(path, infos)
    return path


def make_tiny_shards(root: str, shards: int) -> str:
    """``shards`` tiny real shards (2 samples each) and their manifest."""
    from dali_shards.tools.writer import ShardWriter

    folder = os.path.join(root, f"tiny-{shards}")
    manifest = os.path.join(folder, "manifest.json")
    if not os.path.exists(manifest):
        with ShardWriter(os.path.join(folder, "t-%06d.tar"), max_count=2) as writer:
            for i in range(2 * shards):
                writer.write({"__key__": f"{i:08d}", "cls": i % 10, "txt": "x" * 40})
    return manifest
