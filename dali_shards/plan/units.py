"""The stretches of shards an epoch plans over, and streams through them. Pure, no I/O, no DALI.

A fresh epoch plans over every shard whole; an epoch resumed under another layout plans over what
was left of it: stretches of shards (``Units``), a few hundred thousand numbers at most, never a
list of samples. A *stream* is ``n`` samples of one unit read from unit offset ``s`` on, around the
unit as on a circle (``(s + t) % size`` for ``t < n``): at most two stretches of its shard.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from dali_shards.plan.geometry import Stretch


def _frozen(values: Sequence[int] | np.ndarray) -> np.ndarray:
    array = np.array(values, dtype=np.int64, copy=True).reshape(-1)
    array.setflags(write=False)
    return array


@dataclass(frozen=True, eq=False)
class Units:
    """Unit ``i`` is samples ``[lo[i], hi[i])`` of shard ``shard[i]``; units are disjoint, in the
    same order in every process."""

    shard: np.ndarray
    lo: np.ndarray
    hi: np.ndarray

    @classmethod
    def of(cls, shard: Sequence[int] | np.ndarray, lo: Sequence[int] | np.ndarray, hi: Sequence[int] | np.ndarray) -> "Units":
        units = cls(_frozen(shard), _frozen(lo), _frozen(hi))
        if not len(units.shard) == len(units.lo) == len(units.hi) or (units.hi < units.lo).any():
            raise ValueError("units need one shard, lo and hi each, with lo <= hi")
        return units

    @classmethod
    def whole(cls, sizes: Sequence[int] | np.ndarray) -> "Units":
        """Every shard whole."""
        sizes = np.asarray(sizes, dtype=np.int64)
        return cls.of(np.arange(len(sizes)), np.zeros(len(sizes), np.int64), sizes)

    @classmethod
    def concat(cls, parts: Sequence["Units"]) -> "Units":
        parts = [p for p in parts if len(p)]
        if not parts:
            return cls.of([], [], [])
        return cls.of(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("shard", "lo", "hi")))

    def __len__(self) -> int:
        return len(self.shard)

    @cached_property
    def sizes(self) -> np.ndarray:
        return self.hi - self.lo

    @cached_property
    def total(self) -> int:
        return int(self.sizes.sum())

    @cached_property
    def nonempty(self) -> int:
        """Units holding samples."""
        return int((self.sizes > 0).sum())

    def positions(self, starts: np.ndarray) -> np.ndarray:
        """Every sample of the units as ``__index__`` (``starts``: each shard's first index)."""
        if not len(self):
            return np.zeros(0, np.int64)
        sizes = self.sizes
        first = starts[self.shard] + self.lo
        return np.repeat(first - np.concatenate([[0], np.cumsum(sizes)[:-1]]), sizes) + np.arange(int(sizes.sum()))


@dataclass(frozen=True)
class Streams:
    """Streams through ``units``: stream ``j`` reads ``length[j]`` samples of unit ``unit[j]``
    from unit offset ``start[j]`` on, around the unit (see the module)."""

    units: Units
    unit: np.ndarray
    start: np.ndarray
    length: np.ndarray

    def __len__(self) -> int:
        return len(self.unit)

    def take(self, rows: np.ndarray | Sequence[int]) -> "Streams":
        rows = np.asarray(rows, dtype=np.int64)
        return Streams(self.units, self.unit[rows], self.start[rows], self.length[rows])

    def clip(self, first: np.ndarray, stop: np.ndarray) -> "Streams":
        """Each stream's samples ``[first, stop)`` (offsets into the stream), as streams."""
        size = self.units.sizes[self.unit]
        start = np.where(size > 0, (self.start + first) % np.maximum(size, 1), 0)
        return Streams(self.units, self.unit, start, np.maximum(stop - first, 0))

    @staticmethod
    def concat(*parts: "Streams") -> "Streams":
        """``parts`` one after the other (through their units, joined where they are not the same)."""
        if all(p.units is parts[0].units for p in parts):
            units, offsets = parts[0].units, [0] * len(parts)
        else:
            units = Units.concat([p.units for p in parts])
            offsets = np.cumsum([0] + [len(p.units) for p in parts[:-1]]).tolist()
        unit = np.concatenate([p.unit + o for p, o in zip(parts, offsets)]).astype(np.int64)
        start, length = (np.concatenate([getattr(p, f) for p in parts]).astype(np.int64) for f in ("start", "length"))
        return Streams(units, unit, start, length)

    def window(self, a: int, b: int, ends: Optional[np.ndarray] = None) -> "Streams":
        """Samples ``[a, b)`` of the streams laid end to end, as streams (the two at its ends cut;
        ``ends``: the streams' cumulative lengths, where known)."""
        ends = np.cumsum(self.length) if ends is None else ends
        if b <= a:
            return self.take([])
        first = int(np.searchsorted(ends, a, side="right"))
        last = int(np.searchsorted(ends, b, side="left"))
        rows = np.arange(first, last + 1)
        begins = ends[rows] - self.length[rows]
        return self.take(rows).clip(np.maximum(a - begins, 0), np.minimum(b, ends[rows]) - begins)

    def stretches(self, j: int) -> List[Tuple[int, int, int]]:
        """Stream ``j`` as (shard, first, stop) stretches of its shard, in reading order."""
        u = int(self.unit[j])
        lo, size = int(self.units.lo[u]), int(self.units.hi[u] - self.units.lo[u])
        s, n, shard = int(self.start[j]), int(self.length[j]), int(self.units.shard[u])
        if n == 0:
            return []
        if s + n <= size:
            return [(shard, lo + s, lo + s + n)]
        return [(shard, lo + s, lo + size), (shard, lo, lo + s + n - size)]

    def segments(self, j: int, starts: np.ndarray) -> List[Stretch]:
        """Stream ``j``'s stretches as segments (their first sample's ``__index__`` as position)."""
        return [Stretch(s, a, b, int(starts[s]) + a) for s, a, b in self.stretches(j)]

    def started(self, interleaved: bool, starts: np.ndarray) -> List[Stretch]:
        """The streams' stretches as segments, in the order a worker starts them: by the first
        interleave key (the longest first: ``deal.interleave_order``), or as laid."""
        first = -self.length if interleaved else np.arange(len(self))
        return [seg for j in np.lexsort((np.arange(len(self)), first)).tolist() for seg in self.segments(j, starts)]

    def positions(self, starts: np.ndarray) -> List[np.ndarray]:
        """Per stream, its samples' ``__index__`` in reading order."""
        return np.split(self.flat_positions(starts), np.cumsum(self.length)[:-1]) if len(self) else []

    def flat_positions(self, starts: np.ndarray) -> np.ndarray:
        """The streams' samples' ``__index__``, stream after stream, each in reading order."""
        units, length = self.units, np.maximum(self.length, 0)
        size = np.maximum(units.sizes[self.unit], 1)
        first = starts[units.shard[self.unit]] + units.lo[self.unit]
        begins = np.cumsum(length) - length
        stream = np.repeat(np.arange(len(self), dtype=np.int64), length)
        t = np.arange(len(stream), dtype=np.int64) - begins[stream] + self.start[stream]  # offset into the unit
        return first[stream] + t % size[stream]

    def as_units(self) -> Units:
        """The streams' samples as units: each stream's one or two stretches (empty ones left out)."""
        units = self.units
        size = units.sizes[self.unit]
        lo, shard = units.lo[self.unit], units.shard[self.unit]
        end = self.start + self.length
        first_hi = lo + np.minimum(end, size)
        wrapped = np.maximum(end - size, 0)
        both_shard = np.stack([shard, shard], 1).ravel()
        both_lo = np.stack([lo + self.start, lo], 1).ravel()
        both_hi = np.stack([first_hi, lo + wrapped], 1).ravel()
        keep = both_hi > both_lo
        return Units.of(both_shard[keep], both_lo[keep], both_hi[keep])

    def remainder(self, done: np.ndarray) -> Units:
        """What is left of each stream after its first ``done`` samples, as units."""
        return self.clip(np.asarray(done, np.int64), self.length).as_units()


def holding(segments: Optional[List[Stretch]], positions: np.ndarray, locate: Any, starts: np.ndarray) -> List[Stretch]:
    """The ``segments`` (in order) that hold some of ``positions``, each cut to the first and last of
    them; without segments, the one sample ``positions`` holds."""
    wanted = np.unique(positions)
    if not len(wanted):
        return []
    shard, local = locate(wanted)
    if not segments:
        return [Stretch(int(shard[0]), int(local[0]), int(local[0]) + 1, int(wanted[0]))]
    out = []
    for seg in segments:
        inside = (shard == seg.shard) & (local >= seg.first) & (local < seg.stop)
        if inside.any():
            a, b = int(local[inside].min()), int(local[inside].max()) + 1
            out.append(Stretch(seg.shard, a, b, int(starts[seg.shard]) + a))
    return out
