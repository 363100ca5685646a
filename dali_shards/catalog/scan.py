"""Counting a shard's samples from its tar headers (member data is seeked over, not read): where a
shard is listed without a manifest, or its manifest is stale."""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Sequence, Tuple

from dali_shards.catalog.shardinfo import ShardInfo
from dali_shards.errors import ShardAccessError, ShardError
from dali_shards.io.filesystems import DEFAULT_STORAGE, is_remote
from dali_shards.io.ranged import RangeReader
from dali_shards.io.storage import local_path, open_shard, shard_size
from dali_shards.tar.scan import ShardStats, key_fingerprints, scan_tar
from dali_shards.options import OnError, StorageOptions, enum_option, option_default

log = logging.getLogger("dali_shards")


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


def scan_shard(
    url: str, on_error: OnError | str = option_default("on_error"), config: StorageOptions = DEFAULT_STORAGE
) -> ShardInfo:
    """Count a shard's samples from its tar headers (member data is seeked over, not read).

    With ``on_error="skip"`` a damaged shard counts the samples before the damage, and a shard
    that cannot be opened counts none (both with a warning)."""
    on_error = enum_option(OnError, "on_error", on_error)
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
            if on_error is OnError.RAISE:
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
    urls: Sequence[str], max_threads: int = 16, on_error: OnError | str = option_default("on_error"),
    config: StorageOptions = DEFAULT_STORAGE,
) -> List[ShardInfo]:
    """Scan many shards concurrently; results in the order given."""
    on_error = enum_option(OnError, "on_error", on_error)
    missing = [u for u in urls if (p := local_path(u)) is not None and not os.path.exists(p)]
    if missing and on_error is OnError.SKIP:
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
