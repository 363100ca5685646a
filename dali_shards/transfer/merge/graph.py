"""The merge transfer in DALI's graph: one parallel external source per worker (``merged_inputs``),
their padded batches merged, and the samples' fields unpacked.

The merge uses DALI's conditional split and merge operators directly, so it needs neither
``enable_conditionals`` nor AutoGraph (which would write a generated file per converted function);
the functions here are marked ``do_not_convert`` for pipelines whose user code does use ``if``.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np
from nvidia.dali import fn
from nvidia.dali.data_node import DataNode
from nvidia.dali.pipeline import do_not_convert
from nvidia.dali.types import DALIDataType, to_dali_type

from dali_shards.ipc.packing import Packing
from dali_shards.transfer.merge.layout import table_place
from dali_shards.transfer.merge.source import Carried, MergeSource
from dali_shards.fields import DALI_DTYPES, FieldKind


class SlotOwners:
    """Source of the constant per-slot owner ids ``[0]*m + [1]*m + ...`` (worker of each slot)."""

    def __init__(self, py_num_workers: int, mini_batch: int):
        self.owners = np.repeat(np.arange(py_num_workers, dtype=np.int32), mini_batch)

    def __call__(self) -> np.ndarray:
        return self.owners


class RowOffsets:
    """Source of the constant per-slot byte offset of the slot's row in its worker's table."""

    def __init__(self, py_num_workers: int, mini_batch: int, row_bytes: int):
        rows = np.tile(np.arange(mini_batch, dtype=np.int32), py_num_workers)
        self.offsets = (rows * row_bytes).reshape(-1, 1)

    def __call__(self) -> np.ndarray:
        return self.offsets


@do_not_convert
def merge_slices(owner: DataNode, slices: Sequence[Tuple[DataNode, ...]]) -> Tuple[DataNode, ...]:
    """One batch whose slot ``i`` comes from ``slices[owner[i]]``; each slice is a tuple of
    DataNodes (all merged alike), and so is the result.

    A balanced tree of conditional splits and merges: ``log2(N)`` levels deep, ``O(N log N)``
    operators in all (a linear ``if/elif`` chain needs ``O(N^2)``).
    """
    return _merge_range(owner, list(slices), 0)


@do_not_convert
def _merge_range(owner: DataNode, slices: List[Tuple[DataNode, ...]], lo: int) -> Tuple[DataNode, ...]:
    """The slots owned by workers ``lo .. lo + len(slices) - 1``: the batch is split at the middle
    worker, each half merged the same way, and the halves merged back."""
    if len(slices) == 1:
        return slices[0]
    half = len(slices) // 2
    below = owner < lo + half
    # fn._conditional (DALI's split and merge operators) is private, not in DALI's stubs: hence the ignores
    owner_lo, owner_hi = fn._conditional.split(owner, predicate=below)  # type: ignore[attr-defined]
    left = [
        tuple(fn._conditional.split(node, predicate=below)[0] for node in s)  # type: ignore[attr-defined]
        for s in slices[:half]
    ]
    right = [
        tuple(fn._conditional.split(node, predicate=below)[1] for node in s)  # type: ignore[attr-defined]
        for s in slices[half:]
    ]
    merged = zip(_merge_range(owner_lo, left, lo), _merge_range(owner_hi, right, lo + half))
    return tuple(fn._conditional.merge(a, b, predicate=below) for a, b in merged)  # type: ignore[attr-defined]


@do_not_convert
def _cut(data: DataNode, offset: DataNode, length: DataNode | np.ndarray) -> DataNode:
    return fn.slice(data, offset, length, axes=[0], normalized_anchor=False, normalized_shape=False)


# the dtypes an array may travel as: one list (``fields.py``), which the packing checks
_DALI_TYPES = {name: to_dali_type(name) for name in sorted(DALI_DTYPES)}


@do_not_convert
def _array(data: DataNode, header: DataNode, spec) -> DataNode:
    """An array field: its bytes as its dtype, in the shape its header columns give."""
    typed = data if spec.dtype == "uint8" else fn.reinterpret(data, dtype=_DALI_TYPES[spec.dtype])
    if spec.ndim == 0:
        return fn.reshape(typed, shape=[])
    if spec.ndim == 1:
        return typed
    return fn.reshape(typed, shape=fn.cast(header[spec.shape_columns], dtype=DALIDataType.INT32))


@do_not_convert
def _fields(header: DataNode, heap: DataNode, payload, packing: Packing) -> List[DataNode]:
    out = []
    for spec in packing.fields:
        if spec.kind == FieldKind.PAYLOAD:
            out.append(payload if spec.dtype is None else _array(payload, header, spec))
        elif spec.kind in (FieldKind.BYTES, FieldKind.KEY, FieldKind.ARRAY):
            offset, length = spec.offset_column, spec.length_column
            data = _cut(heap, header[offset : offset + 1], header[length : length + 1])
            out.append(data if spec.kind != FieldKind.ARRAY else _array(data, header, spec))
        elif spec.kind == FieldKind.VALID:
            out.append(header[spec.column] == 1)  # status: 1 valid, 0 padding, -1 skipped
        elif spec.kind == FieldKind.STREAM:
            out.append(fn.cast(header[spec.column], dtype=DALIDataType.INT32))
        else:
            out.append(header[spec.column])
    return out


@do_not_convert
def assemble_fields(
    outputs: Sequence[DataNode], packing: Packing, batch_size: int
) -> Tuple[List[DataNode], DataNode]:
    """The requested fields, in the packing's order, from the workers' external-source outputs
    (byte fields as 1-D uint8, ``.cls`` and ``__index__`` as int64 scalars, ``__valid__`` bool),
    and each slot's ``[index, status]`` (int64) for the iterator."""
    if not packing.table:
        (blob,) = outputs
        header = fn.reinterpret(blob[0 : packing.header_bytes], dtype=DALIDataType.INT64)
        return _fields(header, blob, None, packing), header[0:2]
    py_num_workers = len(outputs)
    mini_batch = batch_size // py_num_workers
    tables = [
        fn.permute_batch(out, indices=[table_place(w, py_num_workers, mini_batch)] * batch_size)
        for w, out in enumerate(outputs)
    ]
    owner = fn.external_source(source=SlotOwners(py_num_workers, mini_batch), batch=True)
    payload, table = merge_slices(owner, list(zip(outputs, tables)))
    rows = fn.external_source(source=RowOffsets(py_num_workers, mini_batch, packing.header_bytes), batch=True)
    row = _cut(table, rows, np.array([packing.header_bytes], dtype=np.int32))
    header = fn.reinterpret(row, dtype=DALIDataType.INT64)
    return _fields(header, table, payload, packing), header[0:2]


def merged_inputs(sources: Sequence[MergeSource], batch_size: int, worker_prefetch: int,
                  hint: Optional[int]) -> Tuple[List[DataNode], DataNode]:  # fmt: skip
    """The requested fields and the slots' status (``assemble_fields``) from one parallel external
    source per worker (``sources``, in worker order), each keeping ``worker_prefetch`` batches ahead
    in slots sized from ``hint``."""
    outputs = [
        fn.external_source(source=Carried(source), batch=True, parallel=True, cycle="raise",
                           prefetch_queue_depth=worker_prefetch, bytes_per_sample_hint=hint)
        for source in sources
    ]  # fmt: skip
    return assemble_fields(outputs, sources[0].config.packing, batch_size)
