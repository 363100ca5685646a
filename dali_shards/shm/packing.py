"""How a worker packs its samples for the pipeline: one array per place in the batch.

DALI charges a fixed price per place in a batch (the padding dummies included) and copies byte
ranges slowly, so each place carries one array, and the large field (``jpg``) travels as read:

- *table* form (two or more workers): a sample's place holds its *payload* -- the bytes of its
  largest requested field, exactly as stored. Everything else (index, valid flag, ``.cls``
  integers, keys and small byte fields) goes into a per-batch *table* that the worker puts in one
  of its padding places: ``mini_batch`` rows of int64 header columns, then a heap of bytes
  (``shm.schema.TABLE`` declares the columns). The pipeline copies each table to its worker's
  places, merges, and cuts out each sample's row.
- *single-array* form (one worker, no padding place to spare): a sample's place holds one array,
  its header row followed by the bytes of all its byte fields.

Header columns: ``[0]`` the sample's ``__index__``, ``[1]`` its status (1 valid, 0 padding, -1 a
sample skipped with ``on_error="skip"``; ``__valid__`` is status == 1), then per field: ``.cls``-like
fields one column (the integer), byte fields other than the payload two (offset and length, in the
table or the single array), arrays (``.npy`` members, a ``map``'s array outputs) two more than
their dimensions (offset, length in bytes, then the shape; only the shape for the payload). A
padding place carries a real sample and its index; a skipped place carries a real sample (to keep
decoders fed) and the skipped sample's index.

With a ``map`` (``outputs`` given) the fields are what the workers read and decode for it, and
its outputs are what travel, in the same places.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from dali_shards.errors import ConfigError, ShardFormatError
from dali_shards.fields import FieldInfo, FieldKind
from dali_shards.tar.members import RawSample
from dali_shards.tar.header import printable
from dali_shards.options import ImageCheck, option_default
from dali_shards.worker.decoders import decode_int, decode_npy
from dali_shards.worker.imagecheck import IMAGE_EXTENSIONS, image_problem
from dali_shards.worker.outputs import OutputSpec, check_carried_type, check_npy_dtype
from dali_shards.shm.packed import (  # noqa: F401 - the packing's vocabulary, imported from here too
    EMPTY,
    INDEX,
    INDEX_COLUMN,
    KEY,
    SPECIAL_FIELDS,
    STATUS_PADDING,
    STATUS_SKIPPED,
    STATUS_VALID,
    VALID,
    VALID_COLUMN,
    FieldSpec,
    Packed,
    array_type,
    input_spec,
    output_kind,
    table_rows,
    table_place,
)

def _aligned(size: int) -> int:
    """``size`` rounded up to a multiple of 8."""
    return (size + 7) & ~7


class Packing:
    """Field specs, header columns, and the packing of samples. ``fields`` are the
    requested fields (read from the members); ``outputs``, with a ``map``, the specs of what it
    returns (these travel instead); ``arrays``, without one, the dtype and dimensions of ``.npy``
    fields (from the first sample)."""

    def __init__(
        self,
        fields: Sequence[str],
        *,
        table: bool = False,
        payload: Optional[str] = None,
        image_check: str = option_default("image_check"),
        outputs: Optional[Sequence[OutputSpec]] = None,
        arrays: Optional[Mapping[str, Tuple[str, int]]] = None,
    ):
        if isinstance(fields, str) or not fields:
            raise ConfigError(
                f"fields must be a non-empty sequence of extensions such as ('jpg', 'cls'), got {fields!r}"
            )
        inputs = [input_spec(name, fields) for name in fields]
        names = [name for name, _, _ in inputs]
        if len(set(names)) != len(names):
            raise ConfigError(f"fields must be distinct, got {tuple(fields)!r}")
        self.input_fields: Tuple[FieldInfo, ...] = tuple(inputs)
        self.outputs = None if outputs is None else tuple(outputs)
        arrays = dict(arrays or {})
        wanted = inputs if outputs is None else [output_kind(o) for o in outputs]
        specs, column = [], 2
        for name, kind, exts in wanted:
            dtype, ndim = None, None
            if kind == FieldKind.ARRAY:
                dtype, ndim = (arrays.get(name) or ("uint8", 1)) if outputs is None else array_type(outputs, name)
                check_carried_type(name, dtype)
            if name == payload and table:
                if kind not in (FieldKind.BYTES, FieldKind.ARRAY):
                    raise ConfigError(f"payload field {payload!r} must be a member's bytes or an array, not {kind}")
                spec = FieldSpec(name, FieldKind.PAYLOAD, exts, column, dtype, ndim)
            else:
                spec = FieldSpec(name, kind, exts, {FieldKind.INDEX: INDEX_COLUMN, FieldKind.VALID: VALID_COLUMN}.get(kind, column), dtype, ndim)
            specs.append(spec)
            column += spec.columns
        out_names = [f.name for f in specs]
        if len(set(out_names)) != len(out_names):
            raise ConfigError(f"outputs must be distinct, got {tuple(out_names)!r}")
        if payload is not None and payload not in out_names:
            raise ConfigError(f"payload field {payload!r} is not among the fields {tuple(out_names)!r}")
        self.fields: Tuple[FieldSpec, ...] = tuple(specs)
        self.table = table
        self.payload = payload if table else None
        self.image_check = ImageCheck(image_check)
        self.arrays = arrays
        self.header_columns = column
        self.header_bytes = 8 * column
        self.extensions = frozenset(e for _, _, exts in inputs for e in exts)
        self._has_key = any(s.kind == FieldKind.KEY for s in specs)
        # Reading straight into the arrays that go to the pipeline saves a copy per sample (without a
        # map): the payload into an array of its own; in the single-array form, when it is the only byte
        # field besides the key, the byte field into the packed array right after the header.
        plain = outputs is None
        self._payload_exts = frozenset(e for s in specs if plain and s.kind == FieldKind.PAYLOAD and s.dtype is None for e in s.extensions)
        heap = [s for s in specs if s.kind in (FieldKind.BYTES, FieldKind.ARRAY)]
        self._placed = heap[0] if (plain and not table and len(heap) == 1 and heap[0].kind == FieldKind.BYTES) else None
        self._placed_exts = frozenset(self._placed.extensions) if self._placed else frozenset()

    def __repr__(self) -> str:
        kind = f"table, payload={self.payload!r}" if self.table else "packed"
        return f"Packing({[f.name for f in self.fields]!r}, {kind})"

    def __getstate__(self):
        return {
            "fields": [name for name, _, _ in self.input_fields],
            "table": self.table,
            "payload": self.payload,
            "image_check": self.image_check.value,
            "outputs": self.outputs,
            "arrays": self.arrays,
            "stream_starts": self.stream_starts,
        }

    def __setstate__(self, state):
        state = dict(state)
        fields, starts = state.pop("fields"), state.pop("stream_starts", (0,))
        type(self).__init__(self, fields, **state)
        self.set_streams(starts)

    def plain(self) -> "Packing":
        """The same fields in the single-array form (one array per sample, no table)."""
        plain = Packing.__new__(Packing)
        plain.__setstate__({**self.__getstate__(), "table": False, "payload": None})
        return plain

    @property
    def byte_fields(self) -> Tuple[FieldSpec, ...]:
        """The fields that carry member bytes (not integers, keys, index or valid)."""
        return tuple(f for f in self.fields if f.kind in (FieldKind.BYTES, FieldKind.PAYLOAD) and f.extensions)

    # -- worker side ---------------------------------------------------------------------
    def destination(self, sample: RawSample, ext: str, size: int) -> Optional[np.ndarray]:
        """Where a member's data should be read (see ``tarformat.Destination``)."""
        if ext in self._payload_exts:
            return np.empty(size, dtype=np.uint8)
        if ext in self._placed_exts and sample.extra is None:
            key_bytes = len(sample.key.encode("utf-8", "surrogateescape")) if self._has_key else 0
            blob = np.empty(self.header_bytes + size + key_bytes, dtype=np.uint8)
            sample.extra = (ext, size, blob)
            return blob[self.header_bytes : self.header_bytes + size]
        return None

    stream_starts: Tuple[int, ...] = (0,)  # a mix: the __index__ each stream begins at (set_streams)

    def set_streams(self, starts: Sequence[int]) -> None:
        """The ``__index__`` each stream of a mix begins at (``__stream__`` is found from it)."""
        self.stream_starts = tuple(int(s) for s in starts)

    def stream_of(self, index: Any) -> Any:
        """The stream of samples at ``index`` (an int, or an array)."""
        return np.searchsorted(np.asarray(self.stream_starts), index, side="right") - 1

    def pack(self, sample: RawSample, index: int) -> Packed:
        """A sample read from a shard (no ``map``), ready for batching, marked valid; raises
        ShardFormatError (naming the shard and the sample) if it lacks a field or holds bad data."""
        if sample.error:
            raise ShardFormatError(sample.url, sample.error, key=sample.key, hint=sample.hint)
        values: Dict[str, Any] = {}
        placed = None
        for spec in self.fields:
            if spec.kind in (FieldKind.KEY, FieldKind.INDEX, FieldKind.VALID, FieldKind.STREAM):
                continue
            data = self.member(sample, spec.name, spec.extensions)
            if spec.kind == FieldKind.INT:
                values[spec.name] = self._parse_int(sample, spec, data)
            elif spec.kind == FieldKind.ARRAY or (spec.kind == FieldKind.PAYLOAD and spec.dtype is not None):
                values[spec.name] = self._parse_npy(sample, spec, data)
            elif spec is self._placed and sample.extra is not None and sample.extra[0] == self._chosen(sample, spec):
                placed = (spec.column, sample.extra[1], sample.extra[2])
            else:
                values[spec.name] = data if isinstance(data, np.ndarray) else np.frombuffer(data, dtype=np.uint8)
        return self.pack_values(values, index, sample.key, placed)

    def pack_values(self, values: Mapping[str, Any], index: int, key: str, placed=None) -> Packed:
        """A sample's values (each output as it travels: an int, a uint8 array of bytes, an
        array), ready for batching, marked valid."""
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

    def worker_batch(self, samples: Sequence[Packed], worker: int, py_num_workers: int, batch_size: int) -> list:
        """The full-size batch local worker ``worker`` emits: its samples in its own slice, its
        table (table form) in its table place, an empty dummy in every other place."""
        m = len(samples)
        batch = [EMPTY] * batch_size
        base = worker * m
        for i, packed in enumerate(samples):
            batch[base + i] = self.place_array(packed)
        if self.table:
            batch[table_place(worker, py_num_workers, m)] = self.table_array(samples)
        return batch

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

    @staticmethod
    def _chosen(sample: RawSample, spec: FieldSpec) -> Optional[str]:
        for ext in spec.extensions:
            if ext in sample.data:
                return ext
        return None

    def member(self, sample: RawSample, name: str, extensions: Sequence[str]):
        """The data of field ``name``: its first present member, image members checked."""
        for ext in extensions:
            data = sample.data.get(ext)
            if data is not None:
                problem = image_problem(data, self.image_check) if ext in IMAGE_EXTENSIONS else None
                if problem:
                    raise ShardFormatError(
                        sample.url,
                        f"member {printable(sample.key)}.{ext} of field {name!r} {problem}",
                        key=sample.key,
                        hint="re-encode or remove the sample, or pass on_error='skip' to skip such samples",
                    )
                return data
        present = ", ".join(sample.extensions) or "none"
        raise ShardFormatError(
            sample.url,
            f"no member for field {name!r} (the sample has: {present})",
            key=sample.key,
            hint="request fields every sample has, list alternatives as 'jpg;png', or fix the shard",
        )

    @staticmethod
    def _parse_int(sample: RawSample, spec: FieldSpec, data) -> int:
        try:
            return decode_int(data)
        except ValueError as exc:
            what = "an integer that fits in 64 bits" if "64 bits" in str(exc) else "a text integer"
            shown = f"{bytes(data[:40])!r}" + ("..." if len(data) > 40 else "")
            raise ShardFormatError(
                sample.url,
                f"field {spec.name!r} must hold {what}, got {shown} ({exc})",
                key=sample.key,
                hint="write class labels as decimal text, the whole member (e.g. b'281' or b'-3\\n'), or request "
                "the field as bytes under another extension",
            ) from None

    @staticmethod
    def _parse_npy(sample: RawSample, spec: FieldSpec, data) -> np.ndarray:
        try:
            array = decode_npy(data)
        except (ValueError, OSError, EOFError) as exc:
            raise ShardFormatError(
                sample.url, f"field {spec.name!r} is not a readable .npy array ({exc})", key=sample.key,
                hint="write it with np.save (numeric dtypes, no pickled objects)",
            ) from None  # fmt: skip
        check_npy_dtype(sample, spec.name, array)
        if (array.dtype.name, array.ndim) != (spec.dtype, spec.ndim):
            raise ShardFormatError(
                sample.url,
                f"field {spec.name!r} is a {array.dtype.name} array with {array.ndim} dimensions here, but "
                f"{spec.dtype} with {spec.ndim} in the first sample",
                key=sample.key,
                hint="store every sample's .npy with one dtype and number of dimensions",
            )
        return array
