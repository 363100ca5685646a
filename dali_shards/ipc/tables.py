"""A step's table as a worker hands it to the ring: something that writes itself into a slot.

The ring's producer offers a slot of at least ``capacity`` bytes and calls ``write(out)``, which
returns the bytes it took, or raises ``Grow`` when it needs a larger slot (the producer then offers
one and calls again). ``PackedTable`` is the general case, a mini-batch of packed samples (what
``Packing.table_array`` writes); ``worker/direct.py`` writes a step's samples straight from
the shards. Imports no DALI.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from dali_shards.ipc.packed import Packed
from dali_shards.ipc.packing import Packing


class Grow(Exception):
    """The step's table needs ``size`` bytes, more than the slot offered."""

    def __init__(self, size: int):
        super().__init__(size)
        self.size = size


class PackedTable:
    """The table of a mini-batch of packed samples."""

    def __init__(self, packing: Packing, samples: Sequence[Packed]):
        self.packing, self.samples = packing, samples
        self.capacity = packing.table_size(samples)

    def __len__(self) -> int:
        return len(self.samples)

    def write(self, out: np.ndarray) -> int:
        self.packing.table_array(self.samples, out=out[: self.capacity])
        return self.capacity


def as_table(packing: Packing, batch: Any) -> Any:
    """``batch`` as a table writer: a list of packed samples is wrapped, a writer stays itself."""
    return batch if hasattr(batch, "write") else PackedTable(packing, batch)
