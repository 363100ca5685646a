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
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from .errors import ConfigError, ShardAccessError, ShardError
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


def scan_shard(url: str, on_error: str = "raise") -> ShardInfo:
    """Count a shard's samples from its tar headers (member data is seeked over, not read).

    With ``on_error="skip"`` a damaged shard counts the samples before the damage, and a shard
    that cannot be opened counts none (both with a warning)."""
    key = _cache_key(url)
    with _scan_lock:
        cached = _scan_cache.get(key) if key else None
    if cached is None:
        try:
            with open_shard(url) as stream:
                cached = scan_tar(stream, url)
        except (ShardError, OSError, EOFError) as exc:
            if on_error == "raise":
                raise
            cached = _readable_prefix(url)
            log.warning("dali_shards: shard %s is damaged (%s); using its first %d samples", url, exc, cached.samples)
            key = None  # do not cache a damaged shard's count
        if key:
            with _scan_lock:
                _scan_cache[key] = cached
    return ShardInfo(url, cached.samples, shard_size(url), dict(cached.ext_bytes))


def _readable_prefix(url: str) -> ShardStats:
    """The complete samples of a damaged shard before the damage: a sample is complete once a
    header of the next one has been read."""
    stats = ShardStats()
    pending: dict = {}
    key = None
    try:
        with open_shard(url) as stream:
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


def scan_shards(urls: Sequence[str], max_threads: int = 16, on_error: str = "raise") -> List[ShardInfo]:
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
        return [scan_shard(u, on_error) for u in urls]
    with ThreadPoolExecutor(max_workers=min(max_threads, len(urls))) as pool:
        return list(pool.map(lambda u: scan_shard(u, on_error), urls))


def read_manifest(path: str) -> List[ShardInfo]:
    """Shards and sample counts from a manifest; relative URLs are taken from its directory."""
    try:
        with open(path, "rb") as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"manifest {path!r} not found") from None
    except ValueError as exc:
        raise ConfigError(f"manifest {path!r} is not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
        raise ConfigError(f'{path!r} is not a dali-shards manifest (expected "format": "{MANIFEST_FORMAT}")')
    if doc.get("version", 0) > MANIFEST_VERSION:
        raise ConfigError(f"manifest {path!r} has version {doc['version']}; upgrade dali_shards to read it")
    base = os.path.dirname(os.path.abspath(path))
    shards = []
    for i, entry in enumerate(doc.get("shards", [])):
        try:
            url, samples = str(entry["url"]), int(entry["samples"])
        except (KeyError, TypeError, ValueError):
            raise ConfigError(f'manifest {path!r}: entry {i} needs "url" and integer "samples"') from None
        if samples < 0:
            raise ConfigError(f"manifest {path!r}: entry {i} has a negative sample count")
        if "://" not in url and not os.path.isabs(url):
            url = os.path.join(base, url)
        ext_bytes = entry.get("ext_bytes")
        shards.append(ShardInfo(url, samples, entry.get("bytes"), None if ext_bytes is None else dict(ext_bytes)))
    return shards


def write_manifest(path: str, shards: Sequence[ShardInfo]) -> None:
    """Write a manifest; shard paths under its directory are stored relative to it."""
    base = os.path.dirname(os.path.abspath(path))
    entries = []
    for s in shards:
        url = s.url
        if "://" not in url:
            rel = os.path.relpath(os.path.abspath(url), base)
            url = rel if not rel.startswith("..") else os.path.abspath(url)
        entry = {"url": url, "samples": int(s.samples)}
        if s.bytes is not None:
            entry["bytes"] = int(s.bytes)
        if s.ext_bytes is not None:
            entry["ext_bytes"] = {k: int(v) for k, v in sorted(s.ext_bytes.items())}
        entries.append(entry)
    doc = {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "shards": entries}
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
