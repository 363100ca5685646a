"""The class mix the loaders really deliver, read from class-sorted shards on disk: dali_shards
(its default planner, and contiguous runs: the planner before), DALI's ``fn.readers.webdataset`` with ``random_shuffle``, and WebDataset +
DataLoader with ``shardshuffle`` and ``shuffle(1000)``, one rank, as their documentation sets them
up. Used by ``shuffle_quality.py --peers``; each loader's mean distinct classes per batch is
divided by the exact ideal."""

from __future__ import annotations

import functools
import itertools
import os
from typing import Callable, Dict, Iterable, List

import numpy as np


def write_class_sorted(root: str, classes: int, per_class: int, shard_size: int) -> List[str]:
    """Tiny class-sorted shards (a 16-byte ``bin`` and the ``cls`` label per sample)."""
    from dali_shards.tools.writer import ShardWriter

    os.makedirs(root, exist_ok=True)
    with ShardWriter(os.path.join(root, "s-%05d.tar"), max_count=shard_size) as writer:
        for i in range(classes * per_class):
            writer.write({"__key__": f"{i:08d}", "bin": b"x" * 16, "cls": i // per_class})
    return writer.paths


def _distinct(batches: Iterable[np.ndarray], steps: int) -> float:
    return float(np.mean([len(np.unique(b)) for b in itertools.islice(batches, steps)]))


def dali_shards_labels(paths: List[str], batch: int, workers: int, shuffle_block: int = 256) -> Iterable[np.ndarray]:
    from dali_shards import sharded_pipeline
    from dali_shards.pytorch import DALIShardedIterator

    @sharded_pipeline(paths, fields=("cls",), batch_size=batch, py_num_workers=workers, shuffle=True, seed=1,
                      world_size=1, rank=0, num_threads=2, device_id=None, shuffle_block=shuffle_block)
    def pipe(cls):
        return cls

    for (b,) in DALIShardedIterator(pipe(), ["cls"]):
        yield b["cls"].numpy().ravel()


def dali_reader_labels(paths: List[str], batch: int, workers: int) -> Iterable[np.ndarray]:
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=batch, num_threads=2, device_id=None, seed=2)
    def pipe():
        cls = fn.readers.webdataset(paths=paths, ext=["cls"], dtypes=[types.UINT8], random_shuffle=True,
                                       initial_fill=1024, name="r")
        return cls

    p = pipe()
    p.build()
    while True:
        (out,) = p.run()
        yield np.array([int(bytes(np.array(out[i]))) for i in range(len(out))])


def webdataset_labels(paths: List[str], batch: int, workers: int) -> Iterable[np.ndarray]:
    import torch
    import webdataset as wds

    data = wds.WebDataset(paths, shardshuffle=100, seed=3, empty_check=False).shuffle(1000).to_tuple("cls")
    loader = torch.utils.data.DataLoader(data.map(lambda s: int(s[0])), batch_size=batch, num_workers=workers)
    for b in loader:
        yield b.numpy()


PEERS: Dict[str, Callable[..., Iterable[np.ndarray]]] = {
    "dali_shards": dali_shards_labels,
    "dali_shards contiguous (shuffle_block=0)": functools.partial(dali_shards_labels, shuffle_block=0),
    "DALI readers.webdataset (random_shuffle)": dali_reader_labels,
    "webdataset + DataLoader (shuffle 1000)": webdataset_labels,
}


def measure_peers(root: str, classes: int, per_class: int, shard_size: int, batch: int, workers: int, steps: int,
                  ideal: float) -> Dict[str, float]:
    """Each loader's mean distinct classes per batch as a fraction of ``ideal``."""
    paths = write_class_sorted(root, classes, per_class, shard_size)
    return {name: round(_distinct(make(paths, batch, workers), steps) / ideal, 3) for name, make in PEERS.items()}
