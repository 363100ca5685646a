"""A mix's draws of an epoch kept compact, and windows of them laid in a seeded order, at a cost
that follows the window. Pure, no I/O, no DALI.

A stream drawn many times its size draws its whole pass again and again: its draws are the part
of a first pass, ``k`` whole passes and the part of a last one (``passes``). ``Drawn`` keeps them
so, blocks of stretches each repeated some times: a few arrays over the streams' shards, whatever
``k``. ``Laid`` lays a ``Drawn``'s stretches end to end, each whole, in the order of one raw random
number per stretch (``bitgen(*key).random_raw``, ties by index: the order ``random.permutation``
gives) and answers samples ``[a, b)`` of that sequence, as ``Streams``: it reads the random numbers
chunk by chunk, counts the samples of the stretches whose number falls below the window's and keeps
those near it, so that a window costs one pass over the random numbers and memory for its own
stretches, never arrays over all of them. The result is the same as sorting every stretch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np

from dali_shards.plan.random import bitgen
from dali_shards.plan.units import Streams, Units

CHUNK = 1 << 16  # stretches per chunk of random numbers
SPREAD = 8.0  # the window's margin, in standard deviations of the samples below a random number
FULL_AFTER = 2  # windows laid one by one; the next one sorts every stretch once, for all that follow


@dataclass(frozen=True, eq=False)
class Drawn:
    """Stretches of shards, block after block: block ``k`` is ``blocks[k]`` laid ``times[k]``
    times over (see the module). Its rows are the stretches in that order."""

    blocks: Tuple[Units, ...]
    times: Tuple[int, ...]

    @classmethod
    def of(cls, units: Units, times: int = 1) -> "Drawn":
        return cls.concat([cls((units,), (int(times),))])

    @classmethod
    def concat(cls, parts: Sequence["Drawn"]) -> "Drawn":
        """The parts' rows one part after the other (empty blocks left out, blocks laid once
        joined with the next such)."""
        kept: List[Tuple[List[Units], int]] = []
        for u, t in ((u, t) for p in parts for u, t in zip(p.blocks, p.times) if len(u) and t > 0):
            if t == 1 and kept and kept[-1][1] == 1:
                kept[-1][0].append(u)
            else:
                kept.append(([u], t))
        return cls(tuple(us[0] if len(us) == 1 else Units.concat(us) for us, _ in kept), tuple(t for _, t in kept))

    def shifted(self, by: int) -> "Drawn":
        """The same stretches with every shard index ``by`` higher."""
        return Drawn(tuple(Units.of(u.shard + by, u.lo, u.hi) for u in self.blocks), self.times)

    def __len__(self) -> int:
        return int(self.row_starts[-1])

    @cached_property
    def total(self) -> int:
        """Samples in all rows."""
        return sum(u.total * t for u, t in zip(self.blocks, self.times))

    @cached_property
    def nonempty(self) -> int:
        """Rows holding samples."""
        return sum(int((u.sizes > 0).sum()) * t for u, t in zip(self.blocks, self.times))

    @cached_property
    def largest(self) -> int:
        """The largest row's size."""
        return max((int(u.sizes.max()) for u in self.blocks), default=0)

    @cached_property
    def square_sizes(self) -> int:
        """The sum of every row's size squared."""
        return sum(int((u.sizes**2).sum()) * t for u, t in zip(self.blocks, self.times))

    @cached_property
    def row_starts(self) -> np.ndarray:
        """Where each block's rows begin (and the last ends)."""
        return np.cumsum([0] + [len(u) * t for u, t in zip(self.blocks, self.times)]).astype(np.int64)

    def rows(self, index: np.ndarray) -> Units:
        """Rows ``index`` (in that order), as units."""
        index = np.asarray(index, dtype=np.int64)
        block = np.searchsorted(self.row_starts, index, side="right") - 1
        fields = [np.zeros(len(index), np.int64) for _ in range(3)]
        for k in np.unique(block).tolist():
            here = block == k
            u = self.blocks[k]
            j = (index[here] - self.row_starts[k]) % len(u)
            for out, values in zip(fields, (u.shard, u.lo, u.hi)):
                out[here] = values[j]
        return Units.of(*fields)

    def units(self) -> Units:
        """Every row, as units (arrays over all rows: for what needs each stretch)."""
        if self.times == (1,):
            return self.blocks[0]
        return Units.concat([Units.of(*(np.tile(getattr(u, f), t) for f in ("shard", "lo", "hi"))) for u, t in zip(self.blocks, self.times)])

    def chunks(self) -> Iterator[Tuple[int, np.ndarray]]:
        """(first row, sizes) of every row, about ``CHUNK`` rows at a time, in row order."""
        for u, t, first in zip(self.blocks, self.times, self.row_starts.tolist()):
            sizes, n = u.sizes, len(u)
            if n >= CHUNK:
                for r in range(t):
                    for a in range(0, n, CHUNK):
                        yield first + r * n + a, sizes[a : a + CHUNK]
                continue
            step = max(1, CHUNK // n)
            for r in range(0, t, step):
                yield first + r * n, np.tile(sizes, min(step, t - r))


class Laid:
    """The rows of ``drawn`` (every row non-empty), each whole, laid end to end in the order of
    ``bitgen(*key)``'s raw numbers (see the module), or as they are (``key`` None)."""

    def __init__(self, drawn: Drawn, key: Optional[Tuple[int, ...]]):
        if drawn.nonempty != len(drawn):
            raise ValueError("a laid sequence of stretches needs every stretch non-empty")
        self.drawn, self.key, self.calls = drawn, key, 0

    def window(self, a: int, b: int) -> Streams:
        """Samples ``[a, b)`` of the laid sequence, as streams of whole rows (the two at its ends
        cut), in the laid order."""
        a, b = max(int(a), 0), min(int(b), self.drawn.total)
        self.calls += 1
        if self.key is not None and self.calls > FULL_AFTER:
            laid, ends = self._sorted
            return laid.window(a, b, ends)
        if b <= a:
            return _whole(Units.of([], [], []))
        begin, rows = self._in_order(a, b) if self.key is None else self._by_key(a, b)
        return _whole(self.drawn.rows(rows)).window(a - begin, b - begin)

    def _in_order(self, a: int, b: int) -> Tuple[int, np.ndarray]:
        """(where the first begins, the rows) of the rows as they are that hold samples ``[a, b)``."""
        begin, first = self._row_at(a)
        return begin, np.arange(first, self._row_at(b - 1)[1] + 1, dtype=np.int64)

    def _row_at(self, s: int) -> Tuple[int, int]:
        """(where it begins, row) of the row holding sample ``s`` of the rows as they are."""
        begin, drawn = 0, self.drawn
        for u, t, first in zip(drawn.blocks, drawn.times, drawn.row_starts.tolist()):
            if s < begin + u.total * t:
                ends = np.cumsum(u.sizes)
                rep, inside = divmod(s - begin, u.total)
                j = int(np.searchsorted(ends, inside, side="right"))
                return begin + rep * u.total + int(ends[j] - u.sizes[j]), first + rep * len(u) + j
            begin += u.total * t
        raise IndexError(f"sample {s} outside 0..{drawn.total - 1}")

    def _by_key(self, a: int, b: int) -> Tuple[int, np.ndarray]:
        """(where the first begins, the rows in laid order) of the rows holding samples ``[a, b)``:
        one pass over the random numbers keeps the rows whose number lies near the window's, the
        margin widened until the window's rows are surely among them."""
        drawn, full = self.drawn, 1 << 64
        spread = SPREAD * math.sqrt(drawn.square_sizes) / 2 + drawn.largest
        while True:
            low = max(0, math.floor((a - spread) / drawn.total * full))
            high = min(full, math.ceil((b + spread) / drawn.total * full))
            below, rows, keys, sizes = self._scan(low, high)
            if below <= a and below + int(sizes.sum()) >= b:
                break
            spread *= 4
        order = np.lexsort((rows, keys))
        rows, sizes = rows[order], sizes[order]
        ends = below + np.cumsum(sizes)
        first, last = int(np.searchsorted(ends, a, side="right")), int(np.searchsorted(ends, b, side="left"))
        return int(ends[first] - sizes[first]), rows[first : last + 1]

    def _scan(self, low: int, high: int) -> Tuple[int, np.ndarray, np.ndarray, np.ndarray]:
        """(samples of the rows whose number is below ``low``; the rows, numbers and sizes of those
        in ``[low, high)``), the numbers drawn chunk by chunk."""
        assert self.key is not None
        generator, below, full = bitgen(*self.key), 0, 1 << 64
        kept: List[Tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        for first, size in self.drawn.chunks():
            raw = generator.random_raw(len(size))
            under = raw < np.uint64(low)
            below += int(size[under].sum())
            near = np.flatnonzero(~under & (raw < np.uint64(high))) if high < full else np.flatnonzero(~under)
            kept.append((first + near, raw[near], size[near]))
        rows, keys, sizes = (np.concatenate([k[i] for k in kept]) for i in range(3))
        return below, rows, keys, sizes

    @cached_property
    def _sorted(self) -> Tuple[Streams, np.ndarray]:
        """Every row laid (sorted once), and where each ends: for a process asking for many windows."""
        assert self.key is not None
        units = self.drawn.units()
        order = np.argsort(bitgen(*self.key).random_raw(len(units)), kind="stable").astype(np.int64)
        laid = Streams(units, order, np.zeros(len(units), np.int64), units.sizes[order])
        return laid, np.cumsum(laid.length)


def _whole(units: Units) -> Streams:
    """Every unit whole, one stream each, in order."""
    return Streams(units, np.arange(len(units), dtype=np.int64), np.zeros(len(units), np.int64), units.sizes.copy())
