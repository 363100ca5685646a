"""Whether the counts a manifest gives fit in the shards they describe: checked at the start, before
an epoch is planned for them (a count far beyond a shard's samples would be planned, sample by
sample, before the shard is read).

A tar of ``n > 0`` samples holds ``512 * (n + 1)`` bytes at least (a 512-byte header per sample
and the end-of-archive block), besides the ``ext_bytes`` of its members. A shard's size is its
manifest's ``bytes``, else a local file's size; a remote shard without ``bytes`` is not checked
here (it fails when read). Where a plain tar of that size could not hold the counts, the shard's
first bytes say whether it is compressed: a plain tar is refused; a gzip stream inflates at most
1032-fold (deflate's bound: a 258-byte match in two bits), so its tar is bounded that much; bzip2
and xz have no useful bound and are not refused.
"""

from __future__ import annotations

import os
import stat
from concurrent.futures import ThreadPoolExecutor
from typing import List, Optional, Sequence, Tuple

from dali_shards.catalog.entries import BLOCK
from dali_shards.catalog.shardinfo import ShardInfo
from dali_shards.errors import ConfigError, ShardError
from dali_shards.io.filesystems import is_remote
from dali_shards.io.ranged import RangeReader
from dali_shards.io.storage import compression_of, local_path
from dali_shards.options import StorageOptions

GZIP_RATIO = 1032


def local_file_size(url: str) -> Optional[int]:
    """The size of a local shard that is a regular file (None otherwise: found when opened)."""
    path = local_path(url)
    try:
        st = os.stat(path) if path is not None else None
    except OSError:
        return None
    return st.st_size if st is not None and stat.S_ISREG(st.st_mode) else None


def least_tar_bytes(samples: int, member_bytes: int) -> int:
    """The fewest bytes a tar of ``samples`` samples holding ``member_bytes`` of data takes."""
    return BLOCK * (samples + 1) + member_bytes if samples else member_bytes


def first_bytes(url: str, config: StorageOptions, size: Optional[int]) -> Optional[bytes]:
    """A shard's first 6 bytes (enough for any compression's magic); None if it cannot be read now,
    or is no regular local file (that is found when it is opened)."""
    try:
        if not is_remote(url):
            path = local_path(url)
            if path is None or local_file_size(url) is None:  # missing, or a pipe or device: never waited on
                return None
            with open(path, "rb") as f:
                return f.read(6)
        reader = RangeReader(url, config, size)
        try:
            return reader.read(0, 6)
        finally:
            reader.close()
    except (OSError, ShardError):
        return None


def check_counts(
    shards: Sequence[ShardInfo], slots: Sequence[int], origins: Sequence[str], config: StorageOptions
) -> None:
    """ConfigError naming the manifest entry (``origins[slot]``) and the shard if the counts of
    ``shards[slot]`` cannot fit in it (see the module); one read of its first
    bytes where a plain tar of its size could not hold them."""
    doubtful: List[Tuple[int, int, int]] = []  # (slot, size, least bytes)
    for slot in slots:
        info = shards[slot]
        member_bytes = sum(info.ext_bytes.values()) if info.ext_bytes else 0
        size = info.bytes if info.bytes is not None else local_file_size(info.url)
        least = least_tar_bytes(info.samples, member_bytes)
        if size is not None and least > size:
            doubtful.append((slot, size, least))
    if not doubtful:
        return
    read = lambda d: first_bytes(shards[d[0]].url, config, shards[d[0]].bytes)  # noqa: E731
    with ThreadPoolExecutor(max_workers=min(16, len(doubtful))) as pool:
        heads = list(pool.map(read, doubtful))
    for (slot, size, least), head in zip(doubtful, heads):
        kind = compression_of(head) if head is not None else "unknown"
        limit = size if kind is None else GZIP_RATIO * size if kind == "gzip" else None
        if limit is not None and least > limit:
            raise _too_many(shards[slot], origins[slot], size, kind, limit)


def _too_many(info: ShardInfo, origin: str, size: int, kind: Optional[str], limit: int) -> ConfigError:
    member_bytes = sum(info.ext_bytes.values()) if info.ext_bytes else 0
    most = max(0, (limit - member_bytes) // BLOCK - 1)
    members = f' with {member_bytes} bytes of members ("ext_bytes")' if member_bytes else ""
    how = "not compressed" if kind is None else f"gzip-compressed, which inflates at most {GZIP_RATIO}-fold"
    return ConfigError(
        f"{origin}: shard {info.url!r} cannot hold {info.samples} samples{members}: it has {size} bytes ({how}), "
        f"and each sample takes a 512-byte tar header at least (the archive's end one 512-byte block more)"
        f"{', besides the members' if member_bytes else ''}: at most {most} samples fit. The manifest is damaged "
        "or was edited: run `dali-shards index` on the shards again to rewrite it"
    )
