"""A dataset's shard sizes as one read-only int64 array that compares, hashes and iterates as the
tuple of its values: a plan spec over a million shards holds 8 MB, not a million Python ints, and
travels to a worker as the catalog it came from where that one is mapped (``catalog.columns``)."""

from __future__ import annotations

import hashlib
from typing import Any, Iterator, Optional, Sequence

import numpy as np


class ShardSizes(Sequence[int]):
    """Each shard's sample count (``array``); ``source``: the catalog whose ``samples`` they are,
    pickled in their stead when it is a mapped one (its ``path`` set)."""

    def __init__(self, values: Any, source: Optional[Any] = None):
        array = np.asarray(values, dtype=np.int64).reshape(-1)
        if array.flags.writeable:  # (the caller's array left as it was)
            array = array.copy() if array is values or array.base is not None else array
            array.setflags(write=False)
        self.array = array
        self.source = source

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return tuple(self.array[i].tolist())
        return int(self.array[i])

    def __iter__(self) -> Iterator[int]:
        return iter(self.array.tolist())

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self.array if dtype is None or np.dtype(dtype) == self.array.dtype else self.array.astype(dtype)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ShardSizes):
            return other.array is self.array or bool(np.array_equal(self.array, other.array))
        if isinstance(other, (tuple, list)):
            if len(other) != len(self.array):
                return False
            try:
                return bool(np.array_equal(self.array, np.array(other, dtype=np.int64)))
            except (TypeError, ValueError, OverflowError):
                return False
        return NotImplemented

    def __hash__(self) -> int:
        return hash((len(self.array), hashlib.sha1(self.array.tobytes()).hexdigest()))

    def __repr__(self) -> str:
        shown = ", ".join(str(v) for v in self.array[:8].tolist())
        return f"ShardSizes([{shown}{', ...' if len(self.array) > 8 else ''}], {len(self.array)} shards)"

    def __reduce__(self) -> Any:
        if getattr(self.source, "path", None) is not None:
            return (_of_source, (self.source,))
        return (ShardSizes, (self.array,))


def _of_source(source: Any) -> ShardSizes:
    return ShardSizes(source.samples, source)


def as_sizes(values: Sequence[int]) -> ShardSizes:
    """``values`` as ``ShardSizes`` (themselves if they are)."""
    return values if isinstance(values, ShardSizes) else ShardSizes(values)
