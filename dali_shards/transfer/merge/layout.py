"""The merge transfer's batch layout: every worker emits a full-size batch, ``batch_size`` places
long, its own samples in its slice ``[worker * mini_batch, (worker + 1) * mini_batch)``, its table
(table form, ``ipc/packing.py``) in one padding place of another worker's slice (``table_place``),
an empty dummy in every other place. Imports no DALI."""

from __future__ import annotations

from typing import List, Sequence

import numpy as np

from dali_shards.ipc.packed import EMPTY, Packed
from dali_shards.ipc.packing import Packing


def table_place(worker: int, py_num_workers: int, mini_batch: int) -> int:
    """The padding place in which ``worker`` puts its table: the first place of the next worker."""
    return (worker + 1) % py_num_workers * mini_batch


def worker_batch(packing: Packing, samples: Sequence[Packed], worker: int, py_num_workers: int,
                 batch_size: int) -> List[np.ndarray]:  # fmt: skip
    """The full-size batch local worker ``worker`` emits (see the module)."""
    m = len(samples)
    batch = [EMPTY] * batch_size
    base = worker * m
    for i, packed in enumerate(samples):
        batch[base + i] = packing.place_array(packed)
    if packing.table:
        batch[table_place(worker, py_num_workers, m)] = packing.table_array(samples)
    return batch
