"""Per-shard sample counts: from a manifest file, or from a scan of the tar headers.

A manifest is a JSON file listing the shards (paths relative to the manifest) and how many
samples each holds, so that planning an epoch never needs to open a shard; optionally the shard's
size, its member bytes per extension, and (version 2, uncompressed shards) where each sample
lies, so that a worker can read any run of samples with one positioned or ranged read::

    {"format": "dali-shards-manifest", "version": 2,
     "shards": [{"url": "train-000000.tar", "samples": 1000, "bytes": 104857600,
                 "ext_bytes": {"cls": 3000, "jpg": 104000000},
                 "sample_blocks": "215 198 240 ...", "key_crc32": "q3Lx..."}, ...]}

``sample_blocks`` lists, for each sample, the 512-byte tar blocks from where its headers begin to
where the next sample's begin (the last sample's: to the end-of-archive marker); the first sample
begins at byte 0. ``key_crc32`` (optional) holds each sample's key fingerprint, the CRC-32 of its
key, as the base64 of little-endian uint32s: a worker that reads a sample checks its key against
it, so that a shard rewritten with other samples at the same places (same size) is caught.

Every field is checked when read (``url`` a string, ``samples`` an integer >= 0, ``bytes`` an
integer >= 0 or absent, ``ext_bytes`` a mapping of extensions to integers >= 0 or absent,
``sample_blocks`` one positive integer per sample that fit in ``bytes`` with the end-of-archive
block, or absent, ``key_crc32`` one fingerprint per sample, or absent, ``version`` an integer; the
counts and sizes within what a shard can hold: ``catalog.entries``), and a shard listed twice is
refused, each with a ``ConfigError`` naming the manifest, the entry and the field. A remote
manifest's entries must lie on its own server or bucket unless ``manifest_foreign_urls=True``
(``catalog.origins``). Version 1 manifests (without ``sample_blocks``) are read.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import posixpath
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from dali_shards.catalog.entries import BLOCK, check_entry, is_count
from dali_shards.catalog.origins import check_entry_origin
from dali_shards.errors import ConfigError, ManifestNotFound, ShardAccessError, ShardError
from dali_shards.io.fsrequest import probe, unreachable
from dali_shards.options import StorageOptions
from dali_shards.io.filesystems import DEFAULT_STORAGE, filesystem, is_remote
from dali_shards.io.fsrequest import http_status
from dali_shards.io.ranged import RangeReader
from dali_shards.io.storage import local_path, open_shard, shard_size
from dali_shards.io.tarscan import ShardStats, key_fingerprints, scan_tar
from dali_shards.options import OnError, option_default

log = logging.getLogger("dali_shards")

MANIFEST_FORMAT = "dali-shards-manifest"
MANIFEST_VERSION = 2


@dataclass(frozen=True)
class ShardInfo:
    """A shard's URL, its number of samples, its stored size in bytes, the bytes of its members
    per extension, and ``offsets``: where each sample's headers begin and where the last one ends
    (``samples + 1`` byte offsets, int64; uncompressed shards only), and ``key_crc``, each sample's
    key fingerprint (``io.tarscan.key_fingerprint``, uint32) -- each when known. A damaged
    shard counted with ``on_error="skip"`` says why in ``damage``, and how many samples are known
    lost in ``lost`` (at least; those after the damage cannot be counted)."""

    url: str
    samples: int
    bytes: Optional[int] = None
    ext_bytes: Optional[Dict[str, int]] = field(default=None, hash=False)
    offsets: Optional[np.ndarray] = field(default=None, hash=False, compare=False, repr=False)
    key_crc: Optional[np.ndarray] = field(default=None, hash=False, compare=False, repr=False)
    damage: Optional[str] = field(default=None, compare=False)  # why only ``samples`` could be counted
    lost: int = field(default=0, compare=False)  # with ``damage``: samples known lost (more may be)

    @staticmethod
    def offsets_from(values: Optional[Union[Sequence[int], np.ndarray]]) -> Optional[np.ndarray]:
        """``values`` as the read-only int64 array ``offsets`` holds (None stays None)."""
        if values is None:
            return None
        array = np.asarray(values, dtype=np.int64)
        array.setflags(write=False)
        return array


_scan_cache: Dict[Tuple[str, int, int], ShardStats] = {}
_scan_lock = threading.Lock()


def _cache_key(url: str) -> Optional[Tuple[str, int, int]]:
    path = local_path(url)
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (os.path.abspath(path), st.st_size, st.st_mtime_ns)


def stored_size(url: str, config: StorageOptions = DEFAULT_STORAGE) -> Optional[int]:
    """A shard's stored size in bytes: from the file system, or one metadata request for a
    remote shard (None if the server does not say)."""
    if not is_remote(url):
        return shard_size(url)
    reader = RangeReader(url, config)
    if reader.http:
        try:
            return reader.metadata_size()
        except ShardAccessError:  # the size is optional over HTTP
            return None
    return reader.object_size()


def scan_shard(url: str, on_error: str = option_default("on_error"), config: StorageOptions = DEFAULT_STORAGE) -> ShardInfo:
    """Count a shard's samples from its tar headers (member data is seeked over, not read).

    With ``on_error="skip"`` a damaged shard counts the samples before the damage, and a shard
    that cannot be opened counts none (both with a warning)."""
    key = _cache_key(url)
    with _scan_lock:
        cached = _scan_cache.get(key) if key else None
    remote = is_remote(url)
    size = None if remote else shard_size(url)
    if cached is None:
        try:
            if remote:  # asked once here, so that the stream does not ask again
                size = stored_size(url, config)
            with open_shard(url, config, size) as stream:
                cached = scan_tar(stream, url)
        except (ShardError, OSError, EOFError) as exc:
            if OnError(on_error) is OnError.RAISE:
                raise
            cached = _readable_prefix(url, config)
            cached.damage = cached.damage or (getattr(exc, "detail", None) or f"{type(exc).__name__}: {exc}")
            log.warning("dali_shards: shard %s is damaged (%s); using its first %d samples", url, exc, cached.samples)
            key = None  # do not cache a damaged shard's count
        if key:
            with _scan_lock:
                _scan_cache[key] = cached
    offsets = ShardInfo.offsets_from(cached.offsets)
    keys = key_fingerprints(cached.keys)
    return ShardInfo(url, cached.samples, size, dict(cached.ext_bytes), offsets, keys, cached.damage, cached.lost)


def _readable_prefix(url: str, config: StorageOptions = DEFAULT_STORAGE) -> ShardStats:
    """The complete samples of a damaged shard before the damage."""
    try:
        with open_shard(url, config) as stream:
            return scan_tar(stream, url, complete_only=True)
    except Exception:  # noqa: BLE001 - the damage is at the very start (or the shard cannot be opened)
        return ShardStats()


def scan_shards(
    urls: Sequence[str], max_threads: int = 16, on_error: str = option_default("on_error"), config: StorageOptions = DEFAULT_STORAGE
) -> List[ShardInfo]:
    """Scan many shards concurrently; results in the order given."""
    missing = [u for u in urls if (p := local_path(u)) is not None and not os.path.exists(p)]
    if missing and on_error == "skip":
        for u in missing:
            log.warning("dali_shards: shard %s not found; skipping it", u)
    elif missing:
        more = (
            f" ({len(missing)} of the {len(urls)} shards are missing, the last {missing[-1]!r})"
            if len(missing) > 1
            else ""
        )
        raise ShardAccessError(missing[0], f"file not found{more}", hint="check the shard path or pattern")
    if len(urls) <= 1:
        return [scan_shard(u, on_error, config) for u in urls]
    with ThreadPoolExecutor(max_workers=min(max_threads, len(urls))) as pool:
        return list(pool.map(lambda u: scan_shard(u, on_error, config), urls))


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
    shards: List[ShardInfo] = []
    first: Dict[str, int] = {}
    for i, entry in enumerate(entries):
        checked = check_entry(path, i, entry)
        url = checked.url
        if "://" not in url and not url.startswith("/"):
            url = posixpath.join(base, url) if remote else os.path.join(base, url)
        check_entry_origin(path, i, checked.url, url, config)
        if url in first:
            raise ConfigError(
                f"manifest {path!r} lists shard {url!r} twice (entries {first[url]} and {i}); each shard may "
                "appear once: remove one of them"
            )
        first[url] = i
        shards.append(ShardInfo(url, *checked[1:]))
    return shards


def sample_blocks(offsets: np.ndarray) -> str:
    """``offsets`` as a manifest's ``sample_blocks`` (see the module)."""
    return " ".join(str(int(b)) for b in np.diff(offsets) // BLOCK)


def write_manifest(path: str, shards: Sequence[ShardInfo], config: StorageOptions = DEFAULT_STORAGE) -> None:
    """Write a manifest (a local path or a URL); shards under its directory are stored relative
    to it."""
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
        entry = {"url": url, "samples": int(s.samples)}
        if s.bytes is not None:
            entry["bytes"] = int(s.bytes)
        if s.ext_bytes is not None:
            entry["ext_bytes"] = {k: int(v) for k, v in sorted(s.ext_bytes.items())}
        if s.offsets is not None and s.samples:
            entry["sample_blocks"] = sample_blocks(s.offsets)
        if s.key_crc is not None and s.samples and len(s.key_crc) == s.samples:
            entry["key_crc32"] = base64.b64encode(np.asarray(s.key_crc, dtype="<u4").tobytes()).decode("ascii")
        entries.append(entry)
    doc = {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "shards": entries}
    if remote:
        fs, inner = filesystem(path, config)
        try:
            fs.pipe_file(inner, (json.dumps(doc, indent=1) + "\n").encode())
        except Exception as exc:  # noqa: BLE001 - named in the message
            raise ConfigError(
                f"cannot write manifest {path!r}: {type(exc).__name__}: {exc}. For a read-only server (HTTP), "
                "write it locally with --manifest local.json and pass local.json as the source; or upload it "
                "beside the shards as manifest.json"
            ) from None
        return
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
