"""The plain workaround from DALI issue #4892, as users write it, for comparison.

One parallel external source per worker, each owning ``shards[v::V]`` (its rank's and worker's
share), reading samples with ``tarfile`` one member at a time and returning a full-size batch (one
output per field) padded with empty arrays outside its slice; a per-sample callable gives each slot's
index, and a linear ``if/elif`` chain picks the owner of each slot. An epoch ends when any worker
runs out of samples, so with uneven shards some samples are never read and ranks run different
numbers of steps (the benchmark's audit shows it).
"""

from __future__ import annotations

import tarfile

import numpy as np
from nvidia.dali import fn, pipeline_def


class TarfileSource:
    """Virtual worker ``v`` of ``num_virtual``: its mini-batch in its slice of every batch."""

    def __init__(self, shards, fields, worker, py_num_workers, rank, world_size, batch_size):
        v = rank * py_num_workers + worker
        self.shards = list(shards)[v :: py_num_workers * world_size]
        self.fields = fields
        self.worker = worker
        self.mini = batch_size // py_num_workers
        self.batch_size = batch_size

    def _samples(self):
        for path in self.shards:
            with tarfile.open(path) as tar:
                sample = {}
                for member in tar:
                    if not member.isfile():
                        continue
                    key, ext = member.name.split(".", 1)
                    if sample and sample["key"] != key:
                        yield sample
                        sample = {}
                    sample["key"] = key
                    sample[ext] = tar.extractfile(member).read()
                if sample:
                    yield sample

    def __iter__(self):
        self.it = self._samples()
        return self

    def _array(self, field, data):
        if field == "cls":
            return np.array([int(data)], dtype=np.int64)
        if field == "id":
            return np.frombuffer(data, dtype=np.int64)
        return np.frombuffer(data, dtype=np.uint8)

    def __next__(self):
        outs = [
            [np.array([], dtype=np.int64 if f in ("cls", "id") else np.uint8)] * self.batch_size for f in self.fields
        ]
        start = self.worker * self.mini
        for i in range(self.mini):
            sample = next(self.it)  # StopIteration ends the epoch
            for out, field in zip(outs, self.fields):
                out[start + i] = self._array(field, sample[field])
        return tuple(outs)


class SlotIndex:
    def __call__(self, sample_info):
        return np.array(sample_info.idx_in_batch, dtype=np.int32)


def _linear_merge(idx, outs, mini, k=0):
    if k == len(outs) - 1:
        return outs[k]
    if idx < (k + 1) * mini:
        merged = outs[k]
    else:
        merged = _linear_merge(idx, outs, mini, k + 1)
    return merged


def plain_pipeline(shards, batch_size, py_num_workers, post, fields=("jpg", "cls"), rank=0, world_size=1, **kwargs):
    """The #4892 workaround pipeline; ``post(*fields)`` adds the benchmark's processing."""

    @pipeline_def(batch_size=batch_size, py_num_workers=py_num_workers, enable_conditionals=True, **kwargs)
    def pipe():
        idx = fn.external_source(source=SlotIndex(), batch=False)
        outs = [
            tuple(
                fn.external_source(
                    source=TarfileSource(shards, fields, w, py_num_workers, rank, world_size, batch_size),
                    num_outputs=len(fields),
                    parallel=True,
                    batch=True,
                    cycle="raise",
                )
            )
            for w in range(py_num_workers)
        ]
        merged = _linear_merge(idx, outs, batch_size // py_num_workers)
        return post(*merged)

    return pipe()
