"""The plain workaround from DALI issue #4892, as users write it, for comparison.

One parallel external source per worker, each owning ``shards[worker::N]``, reading samples with
``tarfile`` one member at a time, returning a full-size batch (separate jpg and label outputs)
padded with empty arrays outside its slice; a per-sample callable gives each slot's index, and a
linear ``if/elif`` chain picks the owner of each slot. It assumes equally sized worker shares
(no padding, no ranks): the benchmark data is built so that it holds.
"""

from __future__ import annotations

import tarfile

import numpy as np
from nvidia.dali import fn, pipeline_def


class TarfileSource:
    """Worker ``worker`` of ``num_workers``: its mini-batch in its slice of every batch."""

    def __init__(self, shards, worker, num_workers, batch_size):
        self.shards = list(shards)[worker::num_workers]
        self.worker = worker
        self.mini = batch_size // num_workers
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

    def __next__(self):
        jpegs = [np.array([], dtype=np.uint8)] * self.batch_size
        labels = [np.array([], dtype=np.int64)] * self.batch_size
        start = self.worker * self.mini
        for i in range(self.mini):
            sample = next(self.it)  # StopIteration ends the epoch
            jpegs[start + i] = np.frombuffer(sample["jpg"], dtype=np.uint8)
            labels[start + i] = np.array([int(sample["cls"])], dtype=np.int64)
        return jpegs, labels


class SlotIndex:
    def __call__(self, sample_info):
        return np.array(sample_info.idx_in_batch, dtype=np.int32)


def _linear_merge(idx, outs, mini, k=0):
    if k == len(outs) - 1:
        return outs[k]
    if idx < (k + 1) * mini:
        jpg, label = outs[k]
    else:
        jpg, label = _linear_merge(idx, outs, mini, k + 1)
    return jpg, label


def plain_pipeline(shards, batch_size, num_workers, post, **kwargs):
    """The #4892 workaround pipeline; ``post(jpg, label)`` adds the benchmark's processing."""

    @pipeline_def(batch_size=batch_size, py_num_workers=num_workers, enable_conditionals=True, **kwargs)
    def pipe():
        idx = fn.external_source(source=SlotIndex(), batch=False)
        outs = [
            fn.external_source(
                source=TarfileSource(shards, w, num_workers, batch_size),
                num_outputs=2,
                parallel=True,
                batch=True,
                cycle="raise",
            )
            for w in range(num_workers)
        ]
        jpg, label = _linear_merge(idx, outs, batch_size // num_workers)
        return post(jpg, label)

    return pipe()
