"""Per-shard sample counts: from a manifest file, or from a scan of the tar headers.

A manifest is a JSON file listing the shards (paths relative to the manifest) and how many
samples each holds, so that planning an epoch never needs to open a shard; optionally the shard's
size and its member bytes per extension::

    {"format": "dali-shards-manifest", "version": 1,
     "shards": [{"url": "train-000000.tar", "samples": 1000, "bytes": 104857600,
                 "ext_bytes": {"cls": 3000, "jpg": 104000000}}, ...]}
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from .errors import ConfigError, ShardAccessError, ShardError
from .remote import DEFAULT_STORAGE, RangeReader, StorageConfig, filesystem, http_status, is_remote
from .storage import local_path, open_shard, shard_size
from .tarformat import ShardStats, TarReader, is_metadata, scan_tar, split_key

log = logging.getLogger("dali_shards")

MANIFEST_FORMAT = "dali-shards-manifest"
MANIFEST_VERSION = 1


@dataclass(frozen=True)
class ShardInfo:
    """A shard's URL, its number of samples, its stored size in bytes and the bytes of its
    members per extension (when known)."""

    url: str
    samples: int
    bytes: Optional[int] = None
    ext_bytes: Optional[Dict[str, int]] = field(default=None, hash=False)


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


def stored_size(url: str, config: StorageConfig = DEFAULT_STORAGE) -> Optional[int]:
    """A shard's stored size in bytes: from the file system, or one metadata request for a
    remote shard (None if the server does not say)."""
    if not is_remote(url):
        return shard_size(url)
    reader = RangeReader(url, config)
    if reader.http:
        try:
            return int(reader.fs.size(reader.path))
        except Exception:  # noqa: BLE001 - the size is optional
            return None
    return reader.object_size()


def scan_shard(url: str, on_error: str = "raise", config: StorageConfig = DEFAULT_STORAGE) -> ShardInfo:
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
            if on_error == "raise":
                raise
            cached = _readable_prefix(url, config)
            log.warning("dali_shards: shard %s is damaged (%s); using its first %d samples", url, exc, cached.samples)
            key = None  # do not cache a damaged shard's count
        if key:
            with _scan_lock:
                _scan_cache[key] = cached
    return ShardInfo(url, cached.samples, size, dict(cached.ext_bytes))


def _readable_prefix(url: str, config: StorageConfig = DEFAULT_STORAGE) -> ShardStats:
    """The complete samples of a damaged shard before the damage: a sample is complete once a
    header of the next one has been read."""
    stats = ShardStats()
    pending: dict = {}
    key = None
    try:
        with open_shard(url, config) as stream:
            reader = TarReader(stream, url)
            while True:
                member = reader.next_member()
                if member is None:
                    break
                k, ext = split_key(member.name)
                if k is not None and not is_metadata(member.name):
                    if k != key:
                        if key is not None:
                            stats.samples += 1
                            for e, n in pending.items():
                                stats.ext_bytes[e] = stats.ext_bytes.get(e, 0) + n
                        key, pending = k, {}
                    pending[ext] = pending.get(ext, 0) + member.size
                reader.skip_data(member)
    except Exception:  # noqa: BLE001 - the damage itself: the sample being read is left out
        return stats
    if key is not None:
        stats.samples += 1
        for e, n in pending.items():
            stats.ext_bytes[e] = stats.ext_bytes.get(e, 0) + n
    return stats


def scan_shards(
    urls: Sequence[str], max_threads: int = 16, on_error: str = "raise", config: StorageConfig = DEFAULT_STORAGE
) -> List[ShardInfo]:
    """Scan many shards concurrently; results in the order given."""
    missing = [u for u in urls if local_path(u) is not None and not os.path.exists(local_path(u))]
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


class ManifestNotFound(ConfigError):
    """The manifest file does not exist."""


def _read_text(path: str, config: StorageConfig) -> bytes:
    if not is_remote(path):
        with open(local_path(path), "rb") as f:
            return f.read()
    reader = RangeReader(path, config)
    try:
        return reader.retrying("manifest read", lambda: reader.fs.cat_file(reader.path))
    except ShardAccessError as exc:
        cause = exc.__cause__
        if isinstance(cause, FileNotFoundError) or http_status(cause) in (404, 410):
            raise FileNotFoundError(path) from None
        raise ConfigError(f"cannot read manifest {path!r}: {exc.detail}; {exc.hint}") from None


def read_manifest(path: str, config: StorageConfig = DEFAULT_STORAGE) -> List[ShardInfo]:
    """Shards and sample counts from a manifest (a local path or a URL); relative URLs are taken
    from its directory."""
    try:
        doc = json.loads(_read_text(path, config))
    except FileNotFoundError:
        raise ManifestNotFound(f"manifest {path!r} not found") from None
    except ValueError as exc:
        raise ConfigError(f"manifest {path!r} is not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
        raise ConfigError(f'{path!r} is not a dali-shards manifest (expected "format": "{MANIFEST_FORMAT}")')
    if doc.get("version", 0) > MANIFEST_VERSION:
        raise ConfigError(f"manifest {path!r} has version {doc['version']}; upgrade dali_shards to read it")
    remote = is_remote(path)
    base = path.rsplit("/", 1)[0] if remote else os.path.dirname(os.path.abspath(local_path(path)))
    shards = []
    for i, entry in enumerate(doc.get("shards", [])):
        try:
            url, samples = str(entry["url"]), int(entry["samples"])
        except (KeyError, TypeError, ValueError):
            raise ConfigError(f'manifest {path!r}: entry {i} needs "url" and integer "samples"') from None
        if samples < 0:
            raise ConfigError(f"manifest {path!r}: entry {i} has a negative sample count")
        if "://" not in url and not url.startswith("/"):
            url = posixpath.join(base, url) if remote else os.path.join(base, url)
        ext_bytes = entry.get("ext_bytes")
        shards.append(ShardInfo(url, samples, entry.get("bytes"), None if ext_bytes is None else dict(ext_bytes)))
    return shards


def write_manifest(path: str, shards: Sequence[ShardInfo], config: StorageConfig = DEFAULT_STORAGE) -> None:
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
        entries.append(entry)
    doc = {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "shards": entries}
    if remote:
        fs, inner = filesystem(path, config)
        try:
            fs.pipe_file(inner, (json.dumps(doc, indent=1) + "\n").encode())
        except Exception as exc:  # noqa: BLE001 - named in the message
            raise ConfigError(
                f"cannot write manifest {path!r}: {type(exc).__name__}: {exc}; write it locally with "
                "--manifest and upload it beside the shards"
            ) from None
        return
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
