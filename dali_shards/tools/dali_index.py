"""Index files for DALI's own ``fn.readers.webdataset``, written from our scan of the shards.

The format is the one DALI's ``wds2idx`` writes (version ``v1.2``): a first line
``v1.2 <samples>``, then one line per sample listing ``<ext> <data offset> <size> <member name>``
for each of its members. With it, DALI's reader opens the same shards without scanning them.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Sequence, Tuple

from dali_shards.catalog.sources import SHARD_SUFFIXES
from dali_shards.errors import ConfigError, ShardFormatError
from dali_shards.catalog.scan import scan_shard
from dali_shards.catalog.shardinfo import ShardInfo
from dali_shards.options import StorageOptions
from dali_shards.io.storage import local_path, open_shard, shard_size
from dali_shards.tar.format import BLOCK, TarReader
from dali_shards.tar.scan import ShardStats, key_fingerprints

INDEX_VERSION = "v1.2"


def index_path_for(url: str) -> str:
    """Where the index of a shard goes: beside it, named like the shard without its tar suffix
    (``train.000.tar`` -> ``train.000.idx``)."""
    path = local_path(url) or url
    for suffix in SHARD_SUFFIXES:
        if path.endswith(suffix):
            return path[: -len(suffix)] + ".idx"
    return path + ".idx"


def check_distinct_index_paths(urls: Sequence[str]) -> None:
    """ConfigError if two shards would share an index file (e.g. ``a.tar`` and ``a.tgz``)."""
    seen: Dict[str, str] = {}
    for url in urls:
        other = seen.setdefault(index_path_for(url), url)
        if other != url:
            raise ConfigError(
                f"shards {other!r} and {url!r} would share the index file {index_path_for(url)!r}; "
                "rename one of them or pass --no-idx"
            )


def write_dali_index(url: str, idx_path: Optional[str] = None) -> ShardInfo:
    """Scan a shard, write its DALI index (uncompressed shards only: DALI's reader cannot read
    compressed ones), and return its ShardInfo for a manifest."""
    idx_path = idx_path or index_path_for(url)
    samples: List[List[str]] = []
    starts: List[int] = []
    stats = ShardStats()
    with open_shard(url) as stream:
        if not stream.seekable():  # decompressing streams are not
            raise ShardFormatError(
                url,
                "is compressed; DALI's webdataset reader reads only uncompressed tars",
                hint="write uncompressed shards (or pass --no-idx to write only the manifest)",
            )
        reader = TarReader(stream, url)
        for position, key, ext, member in reader.scan():
            raw_ext = member.name[len(key) + 1 :]  # DALI matches extensions case-sensitively by default
            entry = f"{raw_ext} {member.header_offset + BLOCK} {member.size} {member.name}"
            if position == len(samples):
                samples.append([entry])
                starts.append(member.start if position else 0)
                stats.keys.append(key)
            else:
                samples[-1].append(entry)
            stats.add(ext, member.size)
    if any(" " in entry.split(" ", 3)[3] for sample in samples for entry in sample):
        raise ShardFormatError(
            url,
            "has member names with spaces, which DALI's index format cannot hold",
            hint="rename the members or pass --no-idx",
        )
    tmp = f"{idx_path}.tmp{os.getpid()}.{threading.get_ident()}"  # several threads index at once
    with open(tmp, "w") as f:
        f.write(f"{INDEX_VERSION} {len(samples)}\n")
        for sample in samples:
            f.write(" ".join(sample) + "\n")
    os.replace(tmp, idx_path)
    if samples:
        assert reader.end_offset is not None  # the scan ended at the end-of-archive marker
        offsets = ShardInfo.offsets_from(starts + [reader.end_offset])
    else:
        offsets = ShardInfo.offsets_from([0])
    return ShardInfo(url, len(samples), shard_size(url), stats.ext_bytes, offsets, key_fingerprints(stats.keys))


def index_one(url: str, config: StorageOptions, no_idx: bool) -> ShardInfo:
    """A shard's manifest entry from a scan of its headers (and its DALI index, unless ``no_idx``)."""
    return scan_shard(url, config=config) if no_idx else write_dali_index(url)


def _index_task(task: Tuple[Sequence[str], StorageOptions, bool, int]) -> List[ShardInfo]:
    urls, config, no_idx, threads = task
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(urls)))) as pool:
        return list(pool.map(lambda u: index_one(u, config, no_idx), urls))


def index_shards(urls: Sequence[str], config: StorageOptions, *, no_idx: bool, threads: int = 8,
                 engine: str = "local", address: Optional[str] = None, progress: bool = False) -> List[ShardInfo]:  # fmt: skip
    """The entries of ``urls`` in order, scanned by ``threads`` threads here (``engine="local"``),
    or in Ray tasks of a few shards each, ``threads`` threads in each (``engine="ray"``)."""
    from tqdm import tqdm

    from dali_shards.engines.base import check_engine, make_engine

    check_engine(engine, None, address)
    if engine == "local":
        with ThreadPoolExecutor(max_workers=max(1, min(threads, len(urls)))) as pool:
            return list(tqdm(pool.map(lambda u: index_one(u, config, no_idx), urls), total=len(urls),
                             disable=not progress, desc="indexing"))  # fmt: skip
    runner = make_engine(engine, None, address)
    try:
        per = max(1, -(-len(urls) // (4 * runner.workers)))  # about 4 tasks per CPU
        chunks = [list(urls[i : i + per]) for i in range(0, len(urls), per)]
        found: List[Optional[List[ShardInfo]]] = [None] * len(chunks)
        with tqdm(total=len(urls), disable=not progress, desc="indexing") as bar:
            for i, infos in runner.run(_index_task, [(c, config, no_idx, threads) for c in chunks]):
                found[i] = infos
                bar.update(len(infos))
    finally:
        runner.close()
    return [info for infos in found for info in infos or []]
