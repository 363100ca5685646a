"""The pieces of a batch slot: field specs and their header columns, and a packed sample (see
``packing``). Imports no DALI."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np

from dali_shards.fields import FieldKind

INDEX_COLUMN, VALID_COLUMN = 0, 1
STATUS_VALID, STATUS_PADDING, STATUS_SKIPPED = 1, 0, -1
EMPTY = np.empty((0,), dtype=np.uint8)


def table_rows(table: np.ndarray, count: int, columns: int) -> np.ndarray:
    """The header rows at the start of a table of ``count`` samples (``columns`` int64 each): a view."""
    return table[: count * 8 * columns].view(np.int64).reshape(count, columns)


@dataclass(frozen=True)
class FieldSpec:
    """One field that travels: its name, kind (payload, bytes, int, array, key, index, valid), the
    extensions that may provide it (first present wins, as in ``"jpg;png"``; none for a ``map``'s
    outputs), its first header column, and for arrays (and an array payload) dtype and dimensions.

    Its columns in a sample's header row, by name: an integer's ``column`` holds its value; bytes,
    keys and arrays hold where their bytes lie (``offset_column``, ``length_column``), arrays then
    their shape (``shape_columns``; the payload, which travels in a place of its own, only its shape);
    the index and the status have the row's first two columns (``INDEX_COLUMN``, ``VALID_COLUMN``)."""

    name: str
    kind: FieldKind
    extensions: Tuple[str, ...]
    column: int
    dtype: Optional[str] = None
    ndim: Optional[int] = None

    @property
    def offset_column(self) -> int:
        return self.column

    @property
    def length_column(self) -> int:
        return self.column + 1

    @property
    def shape_columns(self) -> slice:
        first = self.column + (0 if self.kind == FieldKind.PAYLOAD else 2)
        return slice(first, first + (self.ndim or 0))

    @property
    def columns(self) -> int:
        """Header columns it takes."""
        if self.kind in (FieldKind.INDEX, FieldKind.VALID):
            return 0
        if self.kind == FieldKind.PAYLOAD:
            return (self.ndim or 0) if self.dtype is not None else 0
        return {FieldKind.INT: 1, FieldKind.STREAM: 1, FieldKind.ARRAY: 2 + (self.ndim or 0)}.get(self.kind, 2)


class Packed:
    """A sample ready for batching: its header row, its payload (table packing) and the bytes of
    its other byte fields, or (packed packing) the single array with all of them; and its length
    for bucketing."""

    __slots__ = ("header", "payload", "parts", "blob", "length")

    def __init__(self, header, payload=None, parts=(), blob=None, length: int = 0):
        self.header = header
        self.payload = payload
        self.parts = parts
        self.blob = blob
        self.length = length  # what bucket_by said (0 without it)

    def as_padding(self) -> "Packed":
        """The same sample marked padding (the header is copied, the data shared)."""
        return self._marked(STATUS_PADDING, None)

    def as_skipped(self, index: int) -> "Packed":
        """This (real) sample standing in for skipped sample ``index``."""
        return self._marked(STATUS_SKIPPED, index)

    def _marked(self, status: int, index) -> "Packed":
        if self.blob is not None:
            blob = self.blob.copy()
            header = blob[: self.header.nbytes].view(np.int64)
        else:
            blob, header = None, self.header.copy()
        header[VALID_COLUMN] = status
        if index is not None:
            header[INDEX_COLUMN] = index
        return Packed(header, self.payload, self.parts, blob, self.length)
