"""The slot format: what a sample's place in a batch holds, as both sides of the shared memory read
it (the workers write it, the transfers hand it to DALI). Imports nothing above ``ipc/``.

DALI charges a fixed price per place in a batch (the padding dummies included) and copies byte
ranges slowly, so each place carries one array, and the large field (``jpg``) may travel as read:

- *table* form: a sample's place holds its *payload* -- the bytes of its largest requested field,
  exactly as stored (none: every field in the table). Everything else (index, valid flag, ``.cls``
  integers, keys and small byte fields) goes into a per-batch *table*: ``mini_batch`` rows of int64
  header columns, then a heap of bytes. How a transfer lays the table out in its batch is its own
  (``transfer/``).
- *single-array* form (the merge transfer's one worker, the probe): a sample's place holds one
  array, its header row followed by the bytes of all its byte fields.

Header columns: ``[0]`` the sample's ``__index__``, ``[1]`` its status (1 valid, 0 padding, -1 a
sample skipped with ``on_error="skip"``; ``__valid__`` is status == 1), then per field: ``.cls``-like
fields one column (the integer), byte fields other than the payload two (offset and length, in the
table or the single array), arrays (``.npy`` members, a ``map``'s array outputs) two more than
their dimensions (offset, length in bytes, then the shape; only the shape for the payload). A
padding place carries a real sample and its index; a skipped place carries a real sample (to keep
decoders fed) and the skipped sample's index.

Without a ``map`` the requested fields travel; with one (``outputs`` given), its outputs travel
instead, in the same places. How a sample's members become these values is the worker's
(``worker/codec.py``, ``worker/stage.py``).
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from dali_shards.errors import ConfigError
from dali_shards.fields import FieldInfo, FieldKind, OutputSpec, check_carried_type, input_spec
from dali_shards.tar.members import RawSample
from dali_shards.ipc.packed import EMPTY, INDEX_COLUMN, STATUS_VALID, VALID_COLUMN, FieldSpec, Packed, table_rows


def _aligned(size: int) -> int:
    """``size`` rounded up to a multiple of 8."""
    return (size + 7) & ~7


def _specs(inputs: Sequence[FieldInfo], outputs: Optional[Sequence[OutputSpec]], arrays: Mapping[str, Tuple[str, int]],
           table: bool, payload: Optional[str]) -> Tuple[List[FieldSpec], int]:  # fmt: skip
    """The fields that travel (the requested ones, or a ``map``'s outputs) and the header columns."""
    wanted = inputs if outputs is None else [o.info() for o in outputs]
    types = {o.name: (o.dtype, o.ndim) for o in outputs or ()}
    specs, column = [], 2
    for name, kind, exts in wanted:
        dtype, ndim = None, None
        if kind == FieldKind.ARRAY:
            dtype, ndim = (arrays.get(name) or ("uint8", 1)) if outputs is None else types[name]
            check_carried_type(name, dtype)
        if name == payload and table:
            if kind not in (FieldKind.BYTES, FieldKind.ARRAY):
                raise ConfigError(f"payload field {payload!r} must be a member's bytes or an array, not {kind}")
            spec = FieldSpec(name, FieldKind.PAYLOAD, exts, column, dtype, ndim)
        else:
            spec = FieldSpec(name, kind, exts, {FieldKind.INDEX: INDEX_COLUMN, FieldKind.VALID: VALID_COLUMN}.get(kind, column), dtype, ndim)
        specs.append(spec)
        column += spec.columns
    return specs, column


class Packing:
    """The slot format of a pipeline (see the module): the fields that travel (``fields``, their
    ``FieldSpec``s), the header columns, the form (``table``, ``payload``), and the serialisers.
    ``fields`` are the requested fields; ``outputs``, with a ``map``, the specs of what it returns
    (these travel instead); ``arrays``, without one, the dtype and dimensions of ``.npy`` fields
    (from the first sample); ``stream_starts``, in a mix, the ``__index__`` each stream begins at
    (``__stream__`` is found from it). Immutable: a worker receives exactly what the main process
    holds."""

    def __init__(
        self,
        fields: Sequence[str],
        *,
        table: bool = False,
        payload: Optional[str] = None,
        outputs: Optional[Sequence[OutputSpec]] = None,
        arrays: Optional[Mapping[str, Tuple[str, int]]] = None,
        stream_starts: Sequence[int] = (0,),
    ):
        if isinstance(fields, str) or not fields:
            raise ConfigError(
                f"fields must be a non-empty sequence of extensions such as ('jpg', 'cls'), got {fields!r}"
            )
        inputs = [input_spec(name, fields) for name in fields]
        if len({name for name, _, _ in inputs}) != len(inputs):
            raise ConfigError(f"fields must be distinct, got {tuple(fields)!r}")
        self.requested = tuple(fields)
        self.outputs = None if outputs is None else tuple(outputs)
        self.arrays: Dict[str, Tuple[str, int]] = dict(arrays or {})
        self.stream_starts = tuple(int(s) for s in stream_starts)
        specs, column = _specs(inputs, self.outputs, self.arrays, table, payload)
        out_names = [f.name for f in specs]
        if len(set(out_names)) != len(out_names):
            raise ConfigError(f"outputs must be distinct, got {tuple(out_names)!r}")
        if payload is not None and payload not in out_names:
            raise ConfigError(f"payload field {payload!r} is not among the fields {tuple(out_names)!r}")
        self.fields: Tuple[FieldSpec, ...] = tuple(specs)
        self.table = table
        self.payload = payload if table else None
        self.header_columns = column
        self.header_bytes = 8 * column
        self._has_key = any(s.kind == FieldKind.KEY for s in specs)
        # Reading straight into the arrays that go to the pipeline saves a copy per sample (without a
        # map): the payload into an array of its own; in the single-array form, when it is the only byte
        # field besides the key, the byte field into the packed array right after the header.
        plain = outputs is None
        self._payload_exts = frozenset(e for s in specs if plain and s.kind == FieldKind.PAYLOAD and s.dtype is None for e in s.extensions)
        heap = [s for s in specs if s.kind in (FieldKind.BYTES, FieldKind.ARRAY)]
        self._placed = heap[0] if (plain and not table and len(heap) == 1 and heap[0].kind == FieldKind.BYTES) else None
        self._placed_exts = frozenset(self._placed.extensions) if self._placed else frozenset()

    def _args(self) -> Tuple[Any, ...]:
        """What the format is made of (everything else follows from it)."""
        return (self.requested, self.table, self.payload, self.outputs, sorted(self.arrays.items()), self.stream_starts)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Packing) and self._args() == other._args()

    def __hash__(self) -> int:
        return hash(repr(self._args()))

    def __repr__(self) -> str:
        kind = f"table, payload={self.payload!r}" if self.table else "packed"
        return f"Packing({[f.name for f in self.fields]!r}, {kind})"

    def plain(self) -> "Packing":
        """The same fields in the single-array form (one array per sample, no table)."""
        return Packing(self.requested, outputs=self.outputs, arrays=self.arrays, stream_starts=self.stream_starts)

    @property
    def byte_fields(self) -> Tuple[FieldSpec, ...]:
        """The fields that carry member bytes (not integers, keys, index or valid)."""
        return tuple(f for f in self.fields if f.kind in (FieldKind.BYTES, FieldKind.PAYLOAD) and f.extensions)

    def stream_of(self, index: Any) -> Any:
        """The stream of samples at ``index`` (an int, or an array)."""
        return np.searchsorted(np.asarray(self.stream_starts), index, side="right") - 1

    # -- the worker side -------------------------------------------------------------------
    def destination(self, sample: RawSample, ext: str, size: int) -> Optional[np.ndarray]:
        """Where a member's data should be read (see ``tarformat.Destination``): the payload into
        an array of its own, the one byte field of the single-array form into its place."""
        if ext in self._payload_exts:
            return np.empty(size, dtype=np.uint8)
        if ext in self._placed_exts and sample.extra is None:
            key_bytes = len(sample.key.encode("utf-8", "surrogateescape")) if self._has_key else 0
            blob = np.empty(self.header_bytes + size + key_bytes, dtype=np.uint8)
            sample.extra = (ext, size, blob)
            return blob[self.header_bytes : self.header_bytes + size]
        return None

    def placed(self, sample: RawSample, spec: FieldSpec, ext: Optional[str]) -> Optional[Tuple[int, int, np.ndarray]]:
        """(column, size, single array) where the member ``ext`` of ``spec`` was read into its place
        (``destination``), else None."""
        if spec is self._placed and sample.extra is not None and ext is not None and sample.extra[0] == ext:
            return spec.column, sample.extra[1], sample.extra[2]
        return None

    def pack_values(self, values: Mapping[str, Any], index: int, key: str, placed=None) -> Packed:
        """A sample's values (each field as it travels: an int, a uint8 array of bytes, an
        array), ready for batching, marked valid; ``placed``: a field read into its place."""
        parts: List[Tuple[int, Any]] = []
        header = np.empty(self.header_columns, dtype=np.int64)
        header[INDEX_COLUMN], header[VALID_COLUMN] = index, STATUS_VALID
        payload = None
        for spec in self.fields:
            kind = spec.kind
            if kind == FieldKind.KEY:
                parts.append((spec.column, key.encode("utf-8", "surrogateescape")))
            elif kind == FieldKind.INT:
                header[spec.column] = values[spec.name]
            elif kind == FieldKind.STREAM:
                header[spec.column] = self.stream_of(index)
            elif kind in (FieldKind.BYTES, FieldKind.ARRAY, FieldKind.PAYLOAD) and not (placed and spec.column == placed[0]):
                data = values[spec.name]
                if spec.dtype is not None:  # an array: its shape in the header, its bytes travel
                    data = np.ascontiguousarray(data)
                    header[spec.shape_columns] = data.shape
                    data = data.reshape(-1).view(np.uint8)
                if kind == FieldKind.PAYLOAD:
                    payload = data
                else:
                    parts.append((spec.column, data))
        if self.table:
            return Packed(header, payload, parts)
        return self._blob(header, parts, placed)

    def _blob(self, header: np.ndarray, parts: List[Tuple[int, Any]], placed) -> Packed:
        """The single-array form: the header, then the bytes of every field."""
        if placed is not None:
            column, size, blob = placed
            offset = self.header_bytes + size
        else:
            blob = np.empty(self.header_bytes + sum(len(d) for _, d in parts), dtype=np.uint8)
            offset = self.header_bytes
        head = blob[: self.header_bytes].view(np.int64)
        head[:] = header
        if placed is not None:
            head[column] = self.header_bytes
            head[column + 1] = size
        view = memoryview(blob)
        for at, data in parts:
            end = offset + len(data)
            view[offset:end] = data
            head[at] = offset
            head[at + 1] = len(data)
            offset = end
        return Packed(head, blob=blob)

    def place_array(self, packed: Packed) -> np.ndarray:
        """What a sample's own place in the batch carries."""
        if self.table:
            return packed.payload if packed.payload is not None else EMPTY
        return packed.blob

    def table_size(self, samples: Sequence[Packed]) -> int:
        """Bytes of the table of a mini-batch (see ``table_array``)."""
        return len(samples) * self.header_bytes + sum(_aligned(len(d)) for p in samples for _, d in p.parts)

    def table_array(self, samples: Sequence[Packed], out: Optional[np.ndarray] = None) -> np.ndarray:
        """The table of a worker's mini-batch: one header row per sample, then the heap, each piece
        at an offset aligned to 8 bytes (so that arrays in it are aligned; offsets in the rows count
        from the table's start); written into ``out`` (uint8, ``table_size`` bytes) if given."""
        rows = len(samples) * self.header_bytes
        table = np.empty(self.table_size(samples), dtype=np.uint8) if out is None else out
        headers = table_rows(table, len(samples), self.header_columns)
        view = memoryview(table)  # type: ignore[arg-type]  # numpy's stubs: a Buffer only on Python 3.12+
        offset = rows
        for i, p in enumerate(samples):
            headers[i] = p.header
            for at, data in p.parts:
                end = offset + len(data)
                view[offset:end] = data
                headers[i, at] = offset
                headers[i, at + 1] = len(data)
                offset += _aligned(len(data))
                table[end:offset] = 0  # (the padding too: a table's bytes are the same every time)
        return table
