"""A step's batch from the workers' mini-batches, field by field, as DALI's external source takes
it: integer fields, ``__index__`` and ``__valid__`` as dense arrays read from the rows with NumPy;
byte fields, keys and arrays as per-sample views of the slots (no copy) -- or, where every sample's
is the same small size (a key, a fixed-size label array), gathered into one dense array, since DALI
spends about 4 us on each sample it is handed apart; and each slot's ``[__index__, status]`` for
the iterator. Sample ``i`` of the batch is sample ``i % mini_batch`` of worker ``i // mini_batch``,
as in the plan. ``wrap`` turns a per-sample view into what DALI takes fastest (its ``TensorCPU``).
Imports no DALI.
"""

from __future__ import annotations

from typing import Any, Callable, List, NamedTuple, Sequence, Tuple

import numpy as np

from dali_shards.ipc.packed import INDEX_COLUMN, STATUS_VALID, VALID_COLUMN, FieldSpec
from dali_shards.ipc.packing import Packing
from dali_shards.fields import FieldKind


class OutputType(NamedTuple):
    """What one external-source output holds: a NumPy dtype name and the samples' dimensions."""

    dtype: str
    ndim: int


def output_types(packing: Packing) -> List[OutputType]:
    """The type of each field's output, in the packing's order, then the slot status output."""
    types = []
    for spec in packing.fields:
        if spec.kind in (FieldKind.INT, FieldKind.INDEX):
            types.append(OutputType("int64", 0))
        elif spec.kind == FieldKind.STREAM:
            types.append(OutputType("int32", 0))
        elif spec.kind == FieldKind.VALID:
            types.append(OutputType("bool", 0))
        elif spec.kind == FieldKind.ARRAY:
            assert spec.dtype is not None and spec.ndim is not None  # an array's are known
            types.append(OutputType(spec.dtype, spec.ndim))
        else:  # bytes, key
            types.append(OutputType("uint8", 1))
    return types + [OutputType("int64", 1)]


DENSE_BYTES = 8 << 10  # samples of one size up to this many bytes are gathered into one array ...
GATHER_BYTES = 256  # ... by one NumPy gather up to this many, by a copy per sample above (measured fastest)


def assemble(packing: Packing, minis: Sequence[Any], wrap: Callable[[np.ndarray], Any] = lambda a: a) -> Tuple[Any, ...]:
    """The step's batches (see the module) from the workers' ``MiniBatch``es, in worker order."""
    rows = np.concatenate([m.rows for m in minis]) if len(minis) > 1 else minis[0].rows
    out: List[Any] = []
    for spec in packing.fields:
        kind = spec.kind
        if kind in (FieldKind.INT, FieldKind.INDEX):
            out.append(np.ascontiguousarray(rows[:, INDEX_COLUMN if kind == FieldKind.INDEX else spec.column]))
        elif kind == FieldKind.STREAM:
            out.append(rows[:, spec.column].astype(np.int32))
        elif kind == FieldKind.VALID:
            out.append(rows[:, VALID_COLUMN] == STATUS_VALID)
        else:  # bytes, key, array
            out.append(_bytes_field(minis, rows, spec, wrap))
    out.append(np.ascontiguousarray(rows[:, INDEX_COLUMN : VALID_COLUMN + 1]))
    return tuple(out)


def _bytes_field(minis: Sequence[Any], rows: np.ndarray, spec: FieldSpec, wrap: Callable[[np.ndarray], Any]) -> Any:
    """A byte (or array) field's batch: dense where every sample has the same small size and shape."""
    lengths = rows[:, spec.length_column]
    shapes = rows[:, spec.shape_columns] if spec.kind == FieldKind.ARRAY else None
    n = int(lengths[0])
    same = n <= DENSE_BYTES and (lengths == n).all() and (shapes is None or (shapes == shapes[0]).all())
    if same:
        dense = _dense(minis, spec.column, n, len(rows))
        if spec.kind != FieldKind.ARRAY:
            return dense
        assert shapes is not None and spec.dtype is not None  # an array's
        return dense.view(spec.dtype).reshape((len(rows), *[int(d) for d in shapes[0]]) if spec.ndim else len(rows))
    if spec.kind != FieldKind.ARRAY:
        return [wrap(b) for m in minis for b in _pieces(m, spec.column)]
    return [wrap(_as_array(b, r, spec)) for m in minis for b, r in zip(_pieces(m, spec.column), m.rows)]


def _dense(minis: Sequence[Any], slot: int, n: int, count: int) -> np.ndarray:
    """The ``n`` bytes of every sample at header slot ``slot``, as one ``(count, n)`` array."""
    if n <= GATHER_BYTES:
        return np.concatenate([m.table[m.rows[:, slot, None] + np.arange(n)] for m in minis])
    out = np.empty((count, n), dtype=np.uint8)
    i = 0
    for m in minis:
        table = m.table
        for offset in m.rows[:, slot].tolist():
            out[i] = table[offset : offset + n]
            i += 1
    return out


def _pieces(mini: Any, slot: int) -> List[np.ndarray]:
    """The bytes each sample of ``mini`` holds at the (offset, length) of header slot ``slot``."""
    table = mini.table
    where = mini.rows[:, slot : slot + 2].tolist()
    return [table[o : o + n] for o, n in where]


def _as_array(data: np.ndarray, row: np.ndarray, spec: FieldSpec) -> np.ndarray:
    assert spec.dtype is not None  # an array's
    typed = data.view(spec.dtype)
    if spec.ndim == 1:
        return typed
    assert spec.ndim is not None  # an array's
    return typed.reshape([int(d) for d in row[spec.shape_columns]])
