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
import posixpath
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from dali_shards.catalog.entries import BLOCK, Entry, check_entry, is_count
from dali_shards.catalog.identity import Seen
from dali_shards.catalog.origins import check_entry_origin
from dali_shards.catalog.shardinfo import ShardInfo
from dali_shards.catalog.table import check_table_counts, decode, record_starts, records_of, table_path, write_table
from dali_shards.errors import ConfigError, ManifestNotFound, ShardAccessError
from dali_shards.io.filesystems import DEFAULT_STORAGE, filesystem, is_remote
from dali_shards.io.fsrequest import http_status, probe, unreachable
from dali_shards.io.ranged import RangeReader
from dali_shards.io.storage import local_path
from dali_shards.options import StorageOptions

log = logging.getLogger("dali_shards")

MANIFEST_FORMAT = "dali-shards-manifest"
MANIFEST_VERSION = 3
INLINE_WARN_SAMPLES = 1_000_000  # a version-2 manifest holding more samples' offsets inline: warned


def _read_text(path: str, config: StorageOptions) -> bytes:
    if not is_remote(path):
        local = local_path(path)
        assert local is not None  # not remote: local
        with open(local, "rb") as f:
            return f.read()
    reader = RangeReader(path, config)
    try:
        return reader.whole("manifest read")
    except ShardAccessError as exc:
        cause = exc.__cause__
        if isinstance(cause, FileNotFoundError) or http_status(cause) in (404, 410):
            raise FileNotFoundError(path) from None
        server = (unreachable(cause, path) or probe(reader.fs, path, cause)) if cause is not None else None
        if server is not None:
            raise ConfigError(
                f"cannot read manifest {path!r}: the server {server} could not be reached "
                f"({type(cause).__name__}: {cause}); check that it is up and that the URL (or endpoint_url=) is right"
            ) from None
        raise ConfigError(f"cannot read manifest {path!r}: {exc.detail}; {exc.hint}") from None


def read_manifest(path: str, config: StorageOptions = DEFAULT_STORAGE) -> List[ShardInfo]:
    """Shards and sample counts from a manifest (a local path or a URL); relative URLs are taken
    from its directory. A ConfigError names any field of the wrong type or beyond what a shard can
    hold, any shard listed twice, and (unless ``config.manifest_foreign_urls``) any entry of a
    remote manifest off its server or bucket."""
    try:
        text = _read_text(path, config)
    except FileNotFoundError:
        raise ManifestNotFound(f"manifest {path!r} not found") from None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"manifest {path!r} is not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
        raise ConfigError(f'{path!r} is not a dali-shards manifest (expected "format": "{MANIFEST_FORMAT}")')
    version = doc.get("version", MANIFEST_VERSION)
    if not is_count(version):
        raise ConfigError(f'manifest {path!r}: "version" must be an integer, got {version!r}')
    if version > MANIFEST_VERSION:
        raise ConfigError(f"manifest {path!r} has version {version}; upgrade dali_shards to read it")
    entries = doc.get("shards", [])
    if not isinstance(entries, list):
        raise ConfigError(f'manifest {path!r}: "shards" must be a list of entries, got {type(entries).__name__}')
    remote = is_remote(path)
    if remote:
        base = path.rsplit("/", 1)[0]
    else:
        local = local_path(path)
        assert local is not None  # not remote: local
        base = os.path.dirname(os.path.abspath(local))
    listed = _listed(path, entries, version, base, config)
    if version >= 3:
        return _in_table(path, doc, base, remote, listed, entries, config)
    shards = [ShardInfo(*checked) for checked in listed]
    inline = sum(s.samples for s in shards if s.offsets is not None)
    if inline > INLINE_WARN_SAMPLES:
        log.warning(
            "dali_shards: manifest %s (version %d) holds the offsets of %d samples inline, parsed by every process "
            "that reads it: rewrite it with `dali-shards index` (version 3 keeps them in a sample table that "
            "only the workers reading a shard read)", path, version, inline,
        )  # fmt: skip
    return shards


def _listed(path: str, entries: list, version: int, base: str, config: StorageOptions) -> List[Entry]:
    """A manifest's entries checked, their URLs taken from ``base`` where relative; a ConfigError
    names an entry off a remote manifest's server (``catalog.origins``) and a shard listed twice,
    however spelled (``catalog.identity``: ``x.tar`` and ``./x.tar`` are one shard)."""
    remote = is_remote(path)
    listed: List[Entry] = []
    seen: Seen[Tuple[int, str]] = Seen()
    for i, entry in enumerate(entries):
        checked = check_entry(path, i, entry, version)
        url = checked.url
        if "://" not in url and not url.startswith("/"):
            url = posixpath.join(base, url) if remote else os.path.join(base, url)
        check_entry_origin(path, i, checked.url, url, config)
        before = seen.before(url, (i, checked.url))
        if before is not None:
            first, (j, written) = before
            raise ConfigError(
                f"manifest {path!r} lists shard {first!r} twice: entry {j} ({written!r}) and entry {i} "
                f"({checked.url!r}); each shard may appear once: remove one of them"
            )
        listed.append(checked._replace(url=url))
    return listed


def _in_table(path: str, doc: dict, base: str, remote: bool, shards: List[Entry], entries: list,
              config: StorageOptions) -> List[ShardInfo]:  # fmt: skip
    """A version-3 manifest's shards (their checked entries), each pointed at its record in the sample table."""
    name = doc.get("sample_table")
    if not isinstance(name, str) or not name or "/" in name or "://" in name or name in (".", ".."):
        raise ConfigError(f'manifest {path!r}: "sample_table" must be the name of a file beside it, got {name!r}')
    table = posixpath.join(base, name) if remote else os.path.join(base, name)
    counts = [s.samples for s in shards]
    check_table_counts(path, table, counts, [s.url for s in shards], config)  # (one missing or short: check_tables)
    starts = record_starts(counts)
    return [
        ShardInfo(*s, table=table, table_at=at, table_spans=e.get("spans", True) is not False,
                  table_keys=e.get("keys", True) is not False)  # fmt: skip
        for s, at, e in zip(shards, starts.tolist(), entries)
    ]


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
    records: Optional[Iterable[bytes]] = None,
) -> None:
    """Write a manifest (a local path or a URL) and, for version 3, its sample table beside it;
    shards under its directory are stored relative to it. ``version=2`` writes every sample's
    offsets inline instead (for readers of the release before). ``records`` (version 3): the
    shards' sample-table records, in order, streamed into the table (else made from ``shards``)."""
    if version not in (2, MANIFEST_VERSION):
        raise ConfigError(f"manifest version {version} cannot be written (2 or {MANIFEST_VERSION})")
    remote = is_remote(path)
    base = path.rsplit("/", 1)[0] + "/" if remote else os.path.dirname(os.path.abspath(path))
    entries = []
    for s in shards:
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
            entries.append({**entry, **_inline(s, config)})
            continue
        if not s.has_spans:
            entry["spans"] = False
        if s.key_crc is None and not (s.table is not None and s.table_keys):
            entry["keys"] = False
        entries.append(entry)
    doc: Dict[str, object] = {"format": MANIFEST_FORMAT, "version": version, "shards": entries}
    if version >= 3:
        table = table_path(path)
        # every record read before the table is replaced, unless given (from elsewhere)
        rows = records_of(shards, config) if records is None else records
        _write_remote(path, lambda: write_table(table, rows, config)) if remote else write_table(table, rows, config)
        doc = {**doc, "sample_table": table.rsplit("/", 1)[-1] if remote else os.path.basename(table)}
    if remote:
        fs, inner = filesystem(path, config)
        _write_remote(path, lambda: fs.pipe_file(inner, (json.dumps(doc, indent=1) + "\n").encode()))
        return
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
