"""Many short strings in two arrays: their UTF-8 bytes one after the other (``data``) and where each
ends (``ends``, one more than the strings, starting at 0). A million shard names take their bytes
and 8 bytes each, no Python object; one string is made only when it is asked for. Names that follow
one numbered pattern (``train-000000.tar`` ... ``train-999999.tar``) are recognised, and names
compared for duplicates, with NumPy over all of them at once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Hashable, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

_FNV_PRIME = np.uint64(1099511628211)
_FNV_OFFSET = np.uint64(14695981039346656037)


@dataclass(frozen=True, eq=False)
class StringTable:
    """Strings ``i`` = ``data[ends[i]:ends[i + 1]]`` decoded as UTF-8."""

    data: np.ndarray  # uint8
    ends: np.ndarray  # int64, len(strings) + 1

    @classmethod
    def of(cls, strings: Iterable[str]) -> "StringTable":
        encoded = [s.encode("utf-8", "surrogateescape") for s in strings]
        ends = np.zeros(len(encoded) + 1, np.int64)
        np.cumsum([len(b) for b in encoded], out=ends[1:])
        return cls(np.frombuffer(b"".join(encoded), np.uint8), ends)

    def __len__(self) -> int:
        return len(self.ends) - 1

    def __getitem__(self, i: int) -> str:
        i = int(i)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"string {i} of {len(self)}")
        return self.data[self.ends[i] : self.ends[i + 1]].tobytes().decode("utf-8", "surrogateescape")

    def __iter__(self) -> Iterator[str]:
        for lo in range(0, len(self), 65536):
            yield from self.slice(lo, lo + 65536)

    def slice(self, lo: int, hi: int) -> List[str]:
        """Strings ``lo`` to ``hi`` (made at once: a chunk of a long table)."""
        hi = min(hi, len(self))
        if hi <= lo:
            return []
        ends = self.ends[lo : hi + 1]
        raw = self.data[ends[0] : ends[-1]].tobytes()
        cuts = (ends - ends[0]).tolist()
        return [raw[a:b].decode("utf-8", "surrogateescape") for a, b in zip(cuts, cuts[1:])]

    def lengths(self) -> np.ndarray:
        return np.diff(self.ends)

    def count_bytes(self, chars: bytes) -> np.ndarray:
        """Per string, how many of its bytes are any of ``chars`` (one pass over the bytes; work
        beyond it only for the bytes found)."""
        wanted = np.zeros(256, bool)
        wanted[np.frombuffer(chars, np.uint8)] = True
        found = np.flatnonzero(wanted[self.data])
        rows = np.searchsorted(self.ends, found, side="right") - 1
        return np.bincount(rows, minlength=len(self)).astype(np.int64)

    def short(self, most: int) -> np.ndarray:
        """The strings of at most ``most`` bytes (their indices)."""
        return np.flatnonzero(self.lengths() <= most)

    def digests(self, prefix: bytes = b"") -> np.ndarray:
        """A 64-bit FNV-1a digest of each string (of ``prefix`` and each string: the same as of
        their concatenation), computed column by column over all strings."""
        lengths = self.lengths()
        start = _FNV_OFFSET
        with np.errstate(over="ignore"):
            for byte in prefix:
                start = (start ^ np.uint64(byte)) * _FNV_PRIME
        out = np.full(len(self), start, np.uint64)
        if not len(self):
            return out
        with np.errstate(over="ignore"):
            for k in range(int(lengths.max())):
                rows = np.flatnonzero(lengths > k)
                byte = self.data[self.ends[:-1][rows] + k].astype(np.uint64)
                out[rows] = (out[rows] ^ byte) * _FNV_PRIME
            out ^= (lengths + len(prefix)).astype(np.uint64) * _FNV_PRIME  # (a string is not its prefix)
        return out

    def first_repeat(self) -> Optional[Tuple[int, int]]:
        """(first, again): of the strings listed a second time, the one whose second listing comes
        first (``again``) and where it was first listed; None if every string differs. Digests
        sort all strings at once; only strings of equal digests are compared as strings."""
        if len(self) < 2 or numbered(self) is not None:
            return None
        return first_repeat(self.digests(), self.__getitem__)

    @classmethod
    def concat(cls, tables: Sequence["StringTable"]) -> "StringTable":
        if len(tables) == 1:
            return tables[0]
        data = np.concatenate([t.data for t in tables]) if tables else np.zeros(0, np.uint8)
        starts = np.cumsum([0] + [int(t.ends[-1]) for t in tables[:-1]])
        ends = np.concatenate([[0]] + [t.ends[1:] + s for t, s in zip(tables, starts)]).astype(np.int64)
        return cls(data, ends)


@dataclass(frozen=True)
class Numbered:
    """Strings ``head + str(start + i).zfill(width) + tail``, i = 0, 1, ... (a numbered pattern)."""

    head: str
    width: int
    start: int
    tail: str


def numbered(table: StringTable) -> Optional[Numbered]:
    """The numbered pattern every string of ``table`` follows, if one does (all the same length,
    differing only in one run of digits that counts up by one); None otherwise."""
    n = len(table)
    lengths = table.lengths()
    if n < 2 or (lengths != lengths[0]).any() or lengths[0] == 0:
        return None
    rows = table.data[: n * int(lengths[0])].reshape(n, int(lengths[0])) if table.ends[-1] == n * lengths[0] else None
    if rows is None:
        return None
    varies = np.flatnonzero((rows != rows[0]).any(axis=0))
    if not len(varies):
        return None
    lo, hi = int(varies[0]), int(varies[-1]) + 1
    first = rows[0].tobytes()
    while lo > 0 and 48 <= first[lo - 1] <= 57:
        lo -= 1  # the run of digits widened to the left over the digits that do not vary
    digits = rows[:, lo:hi]
    if ((digits < 48) | (digits > 57)).any():
        return None
    values = np.zeros(n, np.int64)
    for k in range(hi - lo):
        values = values * 10 + (digits[:, k] - 48)
    if (np.diff(values) != 1).any():
        return None
    return Numbered(first[:lo].decode("utf-8", "surrogateescape"), hi - lo, int(values[0]),
                    first[hi:].decode("utf-8", "surrogateescape"))  # fmt: skip


def first_repeat(digest: np.ndarray, key_of: Callable[[int], Hashable]) -> Optional[Tuple[int, int]]:
    """(first, again): the places, in listed order, of the first key met a second time, where
    ``digest`` holds each place's 64-bit digest of its key and ``key_of(place)`` the key itself
    (compared only among places whose digests agree); None if no key repeats."""
    if len(digest) < 2:
        return None
    order = np.argsort(digest, kind="stable")
    same = digest[order][1:] == digest[order][:-1]
    if not same.any():
        return None
    grouped = np.zeros(len(order), bool)
    grouped[1:] |= same
    grouped[:-1] |= same
    seen: Dict[Hashable, int] = {}
    for place in np.sort(order[grouped]).tolist():  # in listed order: the first repeat is met first
        key = key_of(place)
        if key in seen:
            return seen[key], place
        seen[key] = place
    return None
