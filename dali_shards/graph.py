"""DALI graph pieces: merging the workers' padded batches and unpacking the packed samples.

These functions run while a pipeline is defined with conditionals enabled (AutoGraph converts
them), so the ``if`` on a DataNode below becomes DALI conditional execution.
"""

from __future__ import annotations

from typing import List, Sequence

import numpy as np
from nvidia.dali import fn, types
from nvidia.dali.data_node import DataNode

from .layout import SampleLayout


class SlotOwners:
    """Source of the constant per-slot owner ids ``[0]*m + [1]*m + ...`` (worker of each slot)."""

    def __init__(self, num_workers: int, mini_batch: int):
        self.owners = np.repeat(np.arange(num_workers, dtype=np.int32), mini_batch)

    def __call__(self) -> np.ndarray:
        return self.owners


def merge_slices(owner: DataNode, slices: Sequence[DataNode]) -> DataNode:
    """One batch whose slot ``i`` comes from ``slices[owner[i]]``.

    A balanced tree of conditionals: ``log2(N)`` levels deep, ``O(N log N)`` operators in all
    (a linear ``if/elif`` chain needs ``O(N^2)``).
    """
    return _merge_range(owner, list(slices), 0, len(slices))


def _merge_range(owner: DataNode, slices: List[DataNode], lo: int, hi: int) -> DataNode:
    if hi - lo == 1:
        return slices[lo]
    mid = (lo + hi) // 2
    if owner < mid:
        merged = _merge_range(owner, slices, lo, mid)
    else:
        merged = _merge_range(owner, slices, mid, hi)
    return merged


def unpack_fields(blob: DataNode, layout: SampleLayout) -> List[DataNode]:
    """The requested fields of packed samples, in the layout's order: byte fields as 1-D uint8,
    ``.cls`` and ``__index__`` as int64 scalars, ``__valid__`` as a bool scalar."""
    header = fn.reinterpret(blob[0 : layout.header_bytes], dtype=types.INT64)
    out = []
    for spec in layout.fields:
        if spec.kind in ("bytes", "key"):
            offset, length = header[spec.slot : spec.slot + 1], header[spec.slot + 1 : spec.slot + 2]
            out.append(fn.slice(blob, offset, length, axes=[0], normalized_anchor=False, normalized_shape=False))
        elif spec.kind == "valid":
            out.append(fn.cast(header[spec.slot], dtype=types.BOOL))
        else:
            out.append(header[spec.slot])
    return out
