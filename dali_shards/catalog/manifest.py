"""Per-shard sample counts: from a manifest file, or from a scan of the tar headers.

A manifest is a JSON file listing the shards (paths relative to the manifest) and how many
samples each holds, so that planning an epoch never needs to open a shard; optionally the shard's
size and its member bytes per extension. Where each sample lies (so that a worker can read any run
of samples with one positioned or ranged read) and its key's fingerprint are, in version 3, in the
manifest's *sample table* beside it (``catalog.table``), which only the workers that read a shard
read, its record alone::

    {"format": "dali-shards-manifest", "version": 3, "sample_table": "manifest.samples",
     "shards": [{"url": "train-000000.tar", "samples": 1000, "bytes": 104857600,
                 "ext_bytes": {"cls": 3000, "jpg": 104000000}}, ...]}

An entry says ``"spans": false`` where its offsets are unknown (a compressed shard) and
``"keys": false`` where its key fingerprints are. Version 2 held both inline, in every entry
(``"sample_blocks": "215 198 240 ...", "key_crc32": "q3Lx..."``): every process that read it parsed
every sample's; it is still read (with a warning where that is large). ``sample_blocks`` lists, for each sample, the 512-byte tar blocks from where its headers begin to
where the next sample's begin (the last sample's: to the end-of-archive marker); the first sample
begins at byte 0. ``key_crc32`` (optional) holds each sample's key fingerprint, the CRC-32 of its
key, as the base64 of little-endian uint32s: a worker that reads a sample checks its key against
it, so that a shard rewritten with other samples at the same places (same size) is caught.

Every field is checked when read (``url`` a string, ``samples`` an integer >= 0, ``bytes`` an
integer >= 0 or absent, ``ext_bytes`` a mapping of extensions to integers >= 0 or absent,
``sample_blocks`` one positive integer per sample that fit in ``bytes`` with the end-of-archive
block, or absent, ``key_crc32`` one fingerprint per sample, or absent, ``version`` an integer; the
counts and sizes within what a shard can hold: ``catalog.entries``), and a shard listed twice
(however spelled: ``catalog.identity``) is refused, each with a ``ConfigError`` naming the manifest, the entry and the field. A remote
manifest's entries must lie on its own server or bucket unless ``manifest_foreign_urls=True``
(``catalog.origins``). Version 1 manifests (without ``sample_blocks``) are read.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import os
from typing import Callable, Dict, Iterable, List, Optional, Sequence

import numpy as np

from dali_shards.catalog.binary import COLUMNS_MIN_SHARDS, remove_stale, write_binary
from dali_shards.catalog.columns import Catalog
from dali_shards.catalog.document import MANIFEST_FORMAT, MANIFEST_VERSION, build, finish
from dali_shards.catalog.entries import BLOCK
from dali_shards.catalog.fetch import identity
from dali_shards.catalog.shardinfo import ShardInfo
from dali_shards.catalog.shared import catalog_dir, key_of, shared
from dali_shards.catalog.table import decode, records_of, table_path, write_table
from dali_shards.errors import ConfigError
from dali_shards.io.filesystems import DEFAULT_STORAGE, filesystem, is_remote
from dali_shards.options import StorageOptions

log = logging.getLogger("dali_shards")

__all__ = ["MANIFEST_FORMAT", "MANIFEST_VERSION", "read_catalog", "read_manifest", "write_manifest", "load_index"]
INLINE_WARN_SAMPLES = 1_000_000  # a version-2 manifest holding more samples' offsets inline: warned
SHARE_BYTES = 256 << 10  # manifests of this size or more: one catalog per node (``catalog.shared``)


def read_catalog(path: str, config: StorageOptions = DEFAULT_STORAGE) -> Catalog:
    """The catalog of a manifest (a local path or a URL; relative URLs taken from its folder), in
    columns; one copy per node for large manifests (``catalog.shared``). A ConfigError names any
    field of the wrong type or beyond what a shard can hold, any shard listed twice, and (unless
    ``config.manifest_foreign_urls``) any entry of a remote manifest off its server or bucket."""
    known = identity(path, config, SHARE_BYTES)
    parts = known.parts
    folder = catalog_dir(config) if parts is not None and known.size >= SHARE_BYTES else None
    if folder is None or parts is None:
        catalog, meta = build(path, config, inline_warn=INLINE_WARN_SAMPLES)
    else:
        catalog, meta = shared(folder, key_of(*parts),
                               lambda: build(path, config, known.digest, inline_warn=INLINE_WARN_SAMPLES))  # fmt: skip
    return finish(path, catalog, meta, config)


def read_manifest(path: str, config: StorageOptions = DEFAULT_STORAGE) -> List[ShardInfo]:
    """Shards and sample counts from a manifest (``read_catalog``, one ``ShardInfo`` per shard)."""
    return list(read_catalog(path, config))


def _write_remote(path: str, write: Callable[[], object]) -> None:
    """``write()`` (a remote manifest or its table), its failure a ConfigError saying what to do."""
    try:
        write()
    except Exception as exc:  # noqa: BLE001 - named in the message
        raise _unwritable(path, exc) from None


def _unwritable(path: str, exc: Exception) -> ConfigError:
    return ConfigError(
        f"cannot write manifest {path!r}: {type(exc).__name__}: {exc}. For a read-only server (HTTP), write it "
        "locally with --manifest local.json and pass local.json as the source; or upload it (and its .samples "
        "table) beside the shards as manifest.json"
    )


def _inline(info: ShardInfo, config: StorageOptions) -> Dict[str, str]:
    """A version-2 entry's ``sample_blocks`` and ``key_crc32``, where known."""
    loaded = load_index(info, config)
    out = {}
    if loaded.offsets is not None and loaded.samples:
        out["sample_blocks"] = sample_blocks(loaded.offsets)
    if loaded.key_crc is not None and loaded.samples and len(loaded.key_crc) == loaded.samples:
        out["key_crc32"] = base64.b64encode(np.asarray(loaded.key_crc, dtype="<u4").tobytes()).decode("ascii")
    return out


def load_index(info: ShardInfo, config: StorageOptions = DEFAULT_STORAGE) -> ShardInfo:
    """``info`` with its offsets and key fingerprints in memory, read from its sample table if they
    are in one (tools and tests; pipelines' workers read only the records they need)."""
    if info.table is None or info.offsets is not None or info.key_crc is not None:
        return info
    offsets, keys = decode(info.url, records_of([info], config)[0], info.samples, info.bytes)
    return dataclasses.replace(info, offsets=offsets if info.table_spans else None, key_crc=keys if info.table_keys else None,
                               table=None)  # fmt: skip


def sample_blocks(offsets: np.ndarray) -> str:
    """``offsets`` as a manifest's ``sample_blocks`` (see the module)."""
    return " ".join(str(int(b)) for b in np.diff(offsets) // BLOCK)


def write_manifest(
    path: str, shards: Sequence[ShardInfo], config: StorageOptions = DEFAULT_STORAGE, version: int = MANIFEST_VERSION,
    columns: Optional[bool] = None, records: Optional[Iterable[bytes]] = None,
) -> None:
    """Write a manifest (a local path or a URL) and, for version 3, its sample table beside it;
    shards under its directory are stored relative to it. ``version=2`` writes every sample's
    offsets inline instead (for readers of the release before). ``columns``: whether to write its
    binary columns beside it too (``catalog.binary``; None: for ``COLUMNS_MIN_SHARDS`` shards or
    more). ``records`` (version 3): the shards' sample-table records, in order, streamed into the
    table (else made from ``shards``)."""
    if version not in (2, MANIFEST_VERSION):
        raise ConfigError(f"manifest version {version} cannot be written (2 or {MANIFEST_VERSION})")
    remote = is_remote(path)
    base = path.rsplit("/", 1)[0] + "/" if remote else os.path.dirname(os.path.abspath(path))
    entries = [_entry(s, remote, base, version, config) for s in shards]
    doc: Dict[str, object] = {"format": MANIFEST_FORMAT, "version": version, "shards": entries}
    table_name = None
    if version >= 3:
        table = table_path(path)
        # every record read before the table is replaced, unless given (from elsewhere)
        rows = records_of(shards, config) if records is None else records
        _write_remote(path, lambda: write_table(table, rows, config)) if remote else write_table(table, rows, config)
        table_name = table.rsplit("/", 1)[-1] if remote else os.path.basename(table)
        doc = {**doc, "sample_table": table_name}
    text = (json.dumps(doc, indent=1) + "\n").encode()
    if table_name is not None and (columns if columns is not None else len(entries) >= COLUMNS_MIN_SHARDS):
        write = lambda: write_binary(path, text, entries, table_name, config)  # noqa: E731
        _write_remote(path, write) if remote else write()
    elif not remote:
        remove_stale(path)
    if remote:
        fs, inner = filesystem(path, config)
        _write_remote(path, lambda: fs.pipe_file(inner, text))
        return
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(text)
    os.replace(tmp, path)


def _entry(s: ShardInfo, remote: bool, base: str, version: int, config: StorageOptions) -> Dict[str, object]:
    """A shard's manifest entry (its URL relative to ``base`` where under it)."""
    url = s.url
    if remote:
        url = url[len(base) :] if url.startswith(base) and "/" not in url[len(base) :] else url
    elif "://" not in url:
        rel = os.path.relpath(os.path.abspath(url), base)
        url = rel if not rel.startswith("..") else os.path.abspath(url)
    entry: Dict[str, object] = {"url": url, "samples": int(s.samples)}
    if s.bytes is not None:
        entry["bytes"] = int(s.bytes)
    if s.ext_bytes is not None:
        entry["ext_bytes"] = {k: int(v) for k, v in sorted(s.ext_bytes.items())}
    if version == 2:
        return {**entry, **_inline(s, config)}
    if not s.has_spans:
        entry["spans"] = False
    if s.key_crc is None and not (s.table is not None and s.table_keys):
        entry["keys"] = False
    return entry
