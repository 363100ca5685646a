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
from typing import Callable, List, Optional, Tuple

import numpy as np

from dali_shards.catalog.entries import BLOCK
from dali_shards.catalog.columns import CHUNK, Catalog
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


def local_sizes(catalog: Catalog, rows: np.ndarray) -> np.ndarray:
    """The sizes of shards ``rows`` (ascending) of ``catalog`` that are regular local files (-1 for
    the others: remote, missing, a pipe or a device), one ``stat`` each."""
    out = np.full(len(rows), -1, np.int64)
    remote = np.array([is_remote(p) for p in catalog.prefixes], bool)
    prefix = catalog.columns["prefix"]
    rows = np.asarray(rows, np.int64)
    for lo in range(0, len(catalog), CHUNK):
        at = np.flatnonzero((rows >= lo) & (rows < lo + CHUNK)) if len(rows) != len(catalog) else np.arange(lo, min(lo + CHUNK, len(rows)))
        if not len(at):
            continue
        names = catalog.names.slice(lo, lo + CHUNK)
        for k, i in zip(at.tolist(), rows[at].tolist()):
            p = int(prefix[i])
            if not remote[p]:
                size = local_file_size(catalog.prefixes[p] + names[i - lo])
                out[k] = -1 if size is None else size
    return out


def check_counts(catalog: Catalog, rows: np.ndarray, origin_of: Callable[[int], str], config: StorageOptions) -> None:
    """ConfigError naming the manifest entry (``origin_of(row)``) and the shard if the counts of
    shard ``row`` of ``catalog`` (each of ``rows``, in order) cannot fit in it (see the module): its
    counts against its size at array speed, and one read of its first bytes where a plain tar of
    its size could not hold them."""
    rows = np.asarray(rows, np.int64)
    size = catalog.sizes[rows].copy()
    unknown = np.flatnonzero(size < 0)
    if len(unknown):
        size[unknown] = local_sizes(catalog, rows[unknown])
    samples, member = catalog.samples[rows], catalog.member_bytes[rows]
    least = np.where(samples > 0, BLOCK * (samples.astype(np.float64) + 1), 0) + member.astype(np.float64)
    near = np.flatnonzero((size >= 0) & (least >= size.astype(np.float64) - 1e6))  # (float64: exact below)
    doubtful: List[Tuple[int, int, int]] = []  # (row, size, least bytes)
    for k in near.tolist():
        exact = least_tar_bytes(int(samples[k]), int(member[k]))
        if exact > int(size[k]):
            doubtful.append((int(rows[k]), int(size[k]), exact))
    if not doubtful:
        return
    read = lambda d: first_bytes(catalog.url(d[0]), config, _known(catalog, d[0]))  # noqa: E731
    with ThreadPoolExecutor(max_workers=min(16, len(doubtful))) as pool:
        heads = list(pool.map(read, doubtful))
    for (row, size_k, least_k), head in zip(doubtful, heads):
        kind = compression_of(head) if head is not None else "unknown"
        limit = size_k if kind is None else GZIP_RATIO * size_k if kind == "gzip" else None
        if limit is not None and least_k > limit:
            raise _too_many(catalog.info(row), origin_of(row), size_k, kind, limit)


def _known(catalog: Catalog, row: int) -> Optional[int]:
    size = int(catalog.sizes[row])
    return None if size < 0 else size


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
