"""Planner v6 (and v5), contiguous runs (``shuffle_block=0``, no shuffle, or too few shards to interleave):
each shard read by one worker, two where a run ends inside it. Pure, no I/O, no DALI.

The units, in a random order every epoch when shuffling (the same in every process), are laid end
to end, and (plan version 6) the sequence starts at a random sample of it every epoch, going round:
so that the workers' (and ranks') runs change every epoch however few the shards (one shard too).
Virtual worker ``v`` of ``V`` takes samples ``[v T / V, (v + 1) T / V)`` of that sequence
(``[v S m, (v + 1) S m)`` with ``last_batch="drop"``): its *run*. It emits its run in chunks of
``shuffle_buffer`` samples, each chunk in a seeded order (so it holds one chunk at a time), or in
order without shuffling. What it delivered in its first ``c`` samples is its whole chunks and a
known part of the next: the rest of an epoch is stretches of shards and at most a chunk's samples
per worker.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np

from dali_shards.plan.drawn import Drawn, Laid
from dali_shards.plan.random import TAG_CHUNK, TAG_RUN_START, TAG_SHARD_ORDER, bitgen, permutation
from dali_shards.plan.units import Streams, Units


class Runs:
    """The units of an epoch laid end to end (shuffled or not), cut into ``workers`` runs of the
    ``planned`` samples delivered (``share`` each with ``last_batch="drop"``); a mix's draws
    (``Drawn``) laid without listing them all (``drawn.Laid``: the same order)."""

    def __init__(
        self, units: Units | Drawn, workers: int, planned: int, drop: bool, shuffle: bool, seed: int, epoch: int,
        turn: bool = True,
    ):  # fmt: skip
        self.workers, self.planned, self.drop = workers, planned, drop
        self.total = units.total
        # plan v6 (``turn``): the sequence starts at a random sample of it, going round
        self.at = int(bitgen(TAG_RUN_START, seed, epoch).random_raw() % self.total) if shuffle and turn and self.total > 1 else 0
        self._lazy: Optional[Laid] = None
        if isinstance(units, Drawn):
            if units.nonempty == len(units):
                self._lazy = Laid(units, (TAG_SHARD_ORDER, seed, epoch) if shuffle else None)
                return
            units = units.units()
        order = permutation(len(units), TAG_SHARD_ORDER, seed, epoch) if shuffle else np.arange(len(units))
        self.laid = Streams(units, order.astype(np.int64), np.zeros(len(units), np.int64), units.sizes[order])
        self.ends = np.cumsum(self.laid.length)

    def span(self, v: int) -> Tuple[int, int]:
        """Worker ``v``'s run ``[a, b)`` of the laid sequence."""
        if self.drop:
            share = self.planned // self.workers
            return v * share, (v + 1) * share
        return v * self.planned // self.workers, (v + 1) * self.planned // self.workers

    def streams(self, a: int, b: int) -> Streams:
        """Samples ``[a, b)`` of the laid sequence (from its start sample on, going round), as streams
        of its units."""
        a, b, total = a + self.at, b + self.at, self.total
        if a >= total:
            return self._window(a - total, b - total)
        if b <= total:
            return self._window(a, b)
        return Streams.concat(self._window(a, total), self._window(0, b - total))

    def _window(self, a: int, b: int) -> Streams:
        """Samples ``[a, b)`` of the units laid in their order (not turned)."""
        if self._lazy is not None:
            return self._lazy.window(a, b)
        return self.laid.window(a, b, self.ends)

    def run(self, v: int) -> Streams:
        return self.streams(*self.span(v))


def chunk_order(n: int, chunk: int, seed: int, epoch: int, v: int) -> np.ndarray:
    """The order in which a worker emits the ``n`` samples of its run: chunk by chunk, each in a
    seeded order."""
    pieces: List[np.ndarray] = []
    for c, start in enumerate(range(0, n, chunk)):
        size = min(chunk, n - start)
        pieces.append(start + permutation(size, TAG_CHUNK, seed, epoch, v, c))
    return np.concatenate(pieces) if pieces else np.zeros(0, np.int64)


def chunk_done(n: int, chunk: int, done: int, seed: int, epoch: int, v: int) -> Tuple[int, np.ndarray]:
    """What the first ``done`` samples of ``chunk_order`` are: every sample before the returned
    offset, and these run offsets of the chunk after it."""
    whole = min(done, n) // chunk * chunk
    if done >= n or done == whole:
        return min(done, n), np.zeros(0, np.int64)
    size = min(chunk, n - whole)
    taken = whole + permutation(size, TAG_CHUNK, seed, epoch, v, whole // chunk)[: done - whole]
    return whole, np.sort(taken)
