"""Stratified batches of a mix: how many samples of each stream every worker puts in every batch,
so that every global batch holds each stream's share. Pure, no I/O, no DALI.

The epoch's ``p[i]`` samples of stream ``i`` (``P`` in all) fill ``F`` full global batches of ``G``
slots and, with ``last_batch="pad"``, one last partial batch of ``L = P - F G``:

- every batch of ``g`` slots holds ``floor`` or ``ceil`` of ``g p[i] / P`` of stream ``i``, and
  every stream's total is exact (a rounding that always exists);
- the last batch's counts are chosen first (by the largest remainder, among those that leave the
  full batches a total they can hold);
- of the full batches, stream ``i`` takes its ceiling in ``e[i]`` of them: a cyclic run of a
  seeded order of the batches, the streams' runs one after the other, so that every batch takes as
  many ceilings as its slots need. So the full batches hold at most ``2 n + 1`` different
  *patterns* of counts (``n`` streams).

Within a batch the slots are labelled by stream in an interleaved order of its counts
(``deal.interleave_order``: each stream spread evenly); the workers take the batch's blocks of
``m`` slots turned by a seeded number of blocks (worker ``v`` block ``(v + k) mod V``) and, in the
last batch, their valid slots one after the other, turned by a seeded offset. So every rank's and
every worker's part of a batch holds about its share too, and a worker's counts in a full batch
are one of ``(2 n + 1) V`` blocks: a process computes only the blocks it asks about (arrays of
steps x streams), never anything per sample.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence

import numpy as np

from dali_shards.plan.deal import consumed_counts_rows
from dali_shards.plan.random import TAG_STRATA, TAG_TURN, bitgen, permutation


class Strata:
    """The slots of an epoch's batches labelled by stream (see the module): ``totals[i]`` samples
    of stream ``i`` over ``workers`` virtual workers of ``mini_batch`` slots per step."""

    def __init__(self, totals: Sequence[int], workers: int, mini_batch: int, seed: int, epoch: int, shuffle: bool):
        self.totals = np.asarray(totals, dtype=np.int64)
        self.workers, self.mini_batch = workers, mini_batch
        self._counts: Dict[int, np.ndarray] = {}
        self._table: Optional[np.ndarray] = None
        self._known = np.zeros((0, 0), bool)
        planned, batch = int(self.totals.sum()), workers * mini_batch
        self.planned, self.full, last = planned, planned // batch, planned % batch
        self.tail = self._last_row(last, batch)
        self._full_patterns(self.totals - self.tail, batch, seed, epoch, shuffle)
        turns = bitgen(TAG_TURN, seed, epoch).random_raw(self.full + 1).astype(np.uint64)
        self.shifts = (turns[:-1] % np.uint64(workers)).astype(np.int64) if shuffle else np.zeros(self.full, np.int64)
        self.tail_turn = int(turns[-1] % np.uint64(max(last, 1))) if shuffle else 0

    def _last_row(self, last: int, batch: int) -> np.ndarray:
        """The last, partial batch's count of each stream: floor or ceil of its share, and such that
        the full batches can hold the rest within floor or ceil of theirs (see the module)."""
        p, planned, full = self.totals, self.planned, self.full
        if not last:
            return np.zeros(len(p), np.int64)
        lo = np.maximum(last * p // planned, p - full * -(-batch * p // planned))
        hi = np.minimum(-(-last * p // planned), p - full * (batch * p // planned))
        room = np.flatnonzero(hi > lo)
        by_remainder = room[np.lexsort((room, -((last * p) % planned)[room]))]
        row = lo.copy()
        row[by_remainder[: last - int(lo.sum())]] += 1
        return row

    def _full_patterns(self, totals: np.ndarray, batch: int, seed: int, epoch: int, shuffle: bool) -> None:
        """The full batches' patterns of counts (``patterns``, one row each) and each full batch's
        (``pattern``): floor or ceil of every stream's share, exact totals (see the module)."""
        full, streams = self.full, len(totals)
        if not full:
            self.patterns, self.pattern = np.zeros((0, streams), np.int64), np.zeros(0, np.int64)
            return
        base = batch * self.totals // self.planned
        extra = totals - full * base  # ceilings, at most one per batch
        first = np.cumsum(extra) - extra  # where each stream's run of ceilings starts
        order = permutation(full, TAG_STRATA, seed, epoch) if shuffle else np.arange(full)
        starts = np.unique(np.concatenate([[0], first % full, (first + extra) % full]))  # where the pattern changes
        ceil = (starts[:, None] - first[None, :]) % full < extra[None, :]
        self.patterns = (base[None, :] + ceil).astype(np.int64)
        self.pattern = np.searchsorted(starts, order, side="right") - 1
        assert (self.patterns.sum(axis=1) == batch).all() and (extra >= 0).all() and (extra <= full).all()

    @property
    def streams(self) -> int:
        return len(self.totals)

    @property
    def quotas(self) -> np.ndarray:
        """Every batch's count of each stream: ``(steps, streams)``."""
        rows = self.patterns[self.pattern]
        return np.vstack([rows, self.tail[None, :]]) if self.tail.any() else rows

    @property
    def steps(self) -> int:
        return self.full + int(self.tail.any())

    @property
    def sizes(self) -> np.ndarray:
        return self.quotas.sum(axis=1)

    def _prefix(self, pattern: np.ndarray, blocks: np.ndarray) -> np.ndarray:
        """Each stream's count among the first ``blocks`` blocks of ``m`` slots of a full batch of
        ``pattern``: ``pattern.shape + (streams,)`` (each pair counted once, then kept)."""
        if self._table is None:  # untouched pages cost nothing: only the pairs counted take memory
            self._table = np.zeros((len(self.patterns), self.workers + 1, self.streams), np.int64)
            self._known = np.zeros((len(self.patterns), self.workers + 1), bool)
        pattern, blocks = np.broadcast_arrays(pattern, blocks)
        need = ~self._known[pattern, blocks]
        if need.any():
            key = np.unique(pattern[need] * (self.workers + 1) + blocks[need])
            p, b = key // (self.workers + 1), key % (self.workers + 1)
            self._table[p, b] = consumed_counts_rows(self.patterns[p], b * self.mini_batch)
            self._known[p, b] = True
        return self._table[pattern, blocks]

    def _full_range(self, first: np.ndarray, count: "np.ndarray | np.integer") -> np.ndarray:
        """Per full batch, each stream's count in ``count`` blocks from block ``first`` on, around
        the batch (arrays over the full batches, or rows of them): ``(..., full, streams)``."""
        pattern, end = self.pattern, first + count
        inside = self._prefix(pattern, np.minimum(end, self.workers)) - self._prefix(pattern, first)
        return inside + self._prefix(pattern, np.maximum(end - self.workers, 0))

    def _tail_before(self, v: np.ndarray) -> np.ndarray:
        """Each stream's count among the last batch's valid slots of the workers before each of
        ``v`` (an array): ``(len(v), streams)``."""
        v = np.asarray(v, dtype=np.int64)
        a = np.minimum(v * self.planned // self.workers, self.planned)  # geometry.span's starts
        slots, size, turn = a - v * self.full * self.mini_batch, int(self.tail.sum()), self.tail_turn
        ends = np.concatenate([np.full(len(v), turn), np.minimum(turn + slots, size), np.maximum(turn + slots - size, 0)])
        counts = consumed_counts_rows(np.broadcast_to(self.tail, (len(ends), self.streams)), ends).reshape(3, len(v), -1)
        return counts[1] - counts[0] + counts[2]

    def workers_counts(self, first: int, stop: int) -> np.ndarray:
        """Per step, the count of each stream of virtual workers ``first`` to ``stop - 1``:
        ``(workers, steps, streams)`` (kept)."""
        missing = np.array([v for v in range(first, stop) if v not in self._counts], dtype=np.int64)
        if len(missing):
            full = self._full_range((missing[:, None] + self.shifts[None, :]) % self.workers, np.int64(1))
            parts = [full]
            if self.tail.any():
                edges = self._tail_before(np.concatenate([missing, missing + 1]))
                parts.append((edges[len(missing):] - edges[: len(missing)])[:, None, :])
            for v, counts in zip(missing.tolist(), np.concatenate(parts, axis=1)):
                self._counts[v] = counts
        return np.stack([self._counts[v] for v in range(first, stop)]) if stop > first else np.zeros((0, self.steps, self.streams), np.int64)

    def worker_counts(self, v: int) -> np.ndarray:
        """Per step, virtual worker ``v``'s count of each stream: ``(steps, streams)``."""
        return self.workers_counts(v, v + 1)[0]

    def counts_before(self, v: int) -> np.ndarray:
        """Per stream, the samples the workers before virtual worker ``v`` hold over the epoch."""
        full = self._full_range(self.shifts, np.int64(v)).sum(axis=0) if self.full else np.zeros(self.streams, np.int64)
        return full + (self._tail_before(np.array([v]))[0] if self.tail.any() else 0)


def labels(counts: np.ndarray) -> np.ndarray:
    """A worker's slots in step order, each as its stream, from its per-step counts (``(steps,
    streams)``): a step's slots stream by stream."""
    steps, streams = counts.shape
    return np.repeat(np.tile(np.arange(streams, dtype=np.int64), steps), counts.reshape(-1))
