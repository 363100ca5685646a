"""Writing a tree or list of files (``imagefolder``) into shards, in parallel, deterministically."""

from __future__ import annotations

import logging
import os
import random
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import List, Optional, Sequence, Tuple, cast

from tqdm import tqdm

from dali_shards.catalog.shardinfo import ShardInfo
from dali_shards.errors import ConfigError
from dali_shards.tools.imagefolder import SourceFile
from dali_shards.tools.writer import TarShardFile, check_max_size, member_size, tar_size

log = logging.getLogger("dali_shards")


def partition(files: Sequence[Tuple[str, SourceFile]], max_count: int, max_size: Optional[int]) -> List[list]:
    """Split keyed files into consecutive shards of at most ``max_count`` samples and (when a
    sample fits) ``max_size`` bytes of tar file (headers, padding and end blocks counted)."""
    shards: List[list] = []
    current: list = []
    size = 0
    for keyed in files:
        key, src = keyed
        sample = member_size(f"{key}.{src.ext}", os.path.getsize(src.path))
        if src.label is not None:
            sample += member_size(f"{key}.cls", len(str(src.label)))
        if max_size is not None and tar_size(sample) > max_size:
            log.warning("dali_shards: %s alone makes a %d-byte shard, above max_size: it gets a shard of its own", src.path, tar_size(sample))
        if current and (len(current) >= max_count or (max_size is not None and tar_size(size + sample) > max_size)):
            shards.append(current)
            current, size = [], 0
        current.append(keyed)
        size += sample
    if current:
        shards.append(current)
    return shards


def _write_files_shard(task: Tuple[str, List[Tuple[str, SourceFile]]]) -> ShardInfo:
    path, keyed = task
    with TarShardFile(path) as shard:
        for key, src in keyed:
            with open(src.path, "rb") as f:
                sample = {"__key__": key, src.ext: f.read()}
            if src.label is not None:
                sample["cls"] = str(src.label)
            shard.add(sample)
    return shard.info()


def write_dataset(
    files: Sequence[SourceFile],
    pattern: str,
    *,
    max_count: int = 1000,
    max_size: Optional[int] = None,
    shuffle: bool = True,
    seed: int = 0,
    processes: Optional[int] = None,
    progress: bool = False,
    keys: Optional[Sequence[str]] = None,
) -> List[ShardInfo]:
    """Write files (with their labels as ``.cls``) into shards named by ``pattern``
    (``out/train-%06d.tar``), in parallel, mixed across shards unless ``shuffle=False``. ``keys``
    are the files' keys (e.g. ``imagefolder.stem_keys``); without them keys number the samples
    in the (shuffled, with ``seed``) order. The output is the same for the same input, whatever
    the parallelism."""
    if "%" not in pattern:
        raise ConfigError(f"output pattern {pattern!r} needs a %-format for the shard number, e.g. train-%06d.tar")
    if max_count < 1:
        raise ConfigError("max_count must be positive")
    check_max_size(max_size)
    if keys is not None and (len(keys) != len(files) or len(set(keys)) != len(keys)):
        raise ConfigError(f"keys must give each of the {len(files)} files a key of its own")
    order = list(zip(keys, files)) if keys is not None else [(None, src) for src in files]
    if shuffle:
        random.Random(seed).shuffle(order)
    width = max(8, len(str(len(order) - 1)))
    keyed = [(key if key is not None else f"{i:0{width}d}", src) for i, (key, src) in enumerate(order)]
    tasks = [(pattern % n, part) for n, part in enumerate(partition(keyed, max_count, max_size))]
    bar = tqdm(total=len(order), unit="sample", disable=not progress, desc="writing shards")
    infos: List[Optional[ShardInfo]] = [None] * len(tasks)
    workers = min(processes or os.cpu_count() or 1, len(tasks))
    try:
        if workers <= 1:
            for i, task in enumerate(tasks):
                info = infos[i] = _write_files_shard(task)
                bar.update(info.samples)
        else:
            with ProcessPoolExecutor(max_workers=workers) as pool:
                futures = {pool.submit(_write_files_shard, task): i for i, task in enumerate(tasks)}
                for future in as_completed(futures):
                    info = infos[futures[future]] = future.result()
                    bar.update(info.samples)
    finally:
        bar.close()
    return cast(List[ShardInfo], infos)  # every task's shard was written
