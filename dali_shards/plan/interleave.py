"""The interleaved planner: every worker reads a piece of many shards at once and emits their
samples interleaved, so that batches are as mixed as a global shuffle even from class-sorted
shards. Pure, no I/O, no DALI.

In the epoch's shuffled shard order, shards form blocks of ``block`` shards. Each shard's
available samples are cut into ``V`` contiguous pieces (``V`` = all ranks' workers), sizes
differing by at most one, the larger pieces dealt round-robin across shards so that every
worker's total differs from any other's by at most one sample. Virtual worker ``v`` reads piece
``v`` of every shard of a block, each piece sequentially, and emits the block's pieces
interleaved: sample ``k`` of a piece of ``p`` samples has key ``(k + phase) / p``, where the
phase spreads the block's shards evenly over ``[0, 1)`` (by a seeded rank shared by all workers,
offset by ``v * mini_batch`` so that the workers of a rank stand at different shards). Sorted by
key, consecutive samples come from different shards, and a per-rank batch from as many shards as
it has samples when the block has that many.

A worker holds one open piece per shard of the current block: memory ``block x (one sample +
the reader's buffer)``, whatever the dataset's size.
"""

from __future__ import annotations

from functools import cached_property
from typing import Iterator, List, Sequence, Tuple

import numpy as np

from dali_shards.plan.geometry import Segment
from dali_shards.plan.random import TAG_BATCH_ORDER, TAG_BLOCK, permutation


MIN_SHARDS = 8


def piece_bounds(size: int, workers: int, carry: int) -> Tuple[np.ndarray, int]:
    """Start offsets (``workers + 1``) of the pieces of a run of ``size`` samples, the extra
    samples going to workers ``carry, carry + 1, ...`` (mod ``workers``); and the next carry."""
    q, r = divmod(size, workers)
    extra = ((np.arange(workers) - carry) % workers < r).astype(np.int64)
    return np.concatenate([[0], np.cumsum(q + extra)]), (carry + r) % workers


def worker_pieces(
    runs: Sequence[np.ndarray], workers: int, v: int, block: int
) -> List[List[Tuple[int, np.ndarray]]]:
    """Per block, the ``(run index, positions)`` pieces worker ``v`` reads; ``runs`` are the
    positions available in each shard, shards in the epoch's order."""
    carry, blocks = 0, []
    for first in range(0, len(runs), block):
        pieces = []
        for i in range(first, min(first + block, len(runs))):
            bounds, carry = piece_bounds(len(runs[i]), workers, carry)
            piece = runs[i][bounds[v] : bounds[v + 1]]
            if len(piece):
                pieces.append((i, piece))
        blocks.append(pieces)
    return blocks


def interleaved(
    runs: Sequence[np.ndarray], workers: int, v: int, block: int, mini_batch: int, seed: int, epoch: int
) -> np.ndarray:
    """Worker ``v``'s emission order (positions), block after block (see the module)."""
    out = []
    for b, pieces in enumerate(worker_pieces(runs, workers, v, block)):
        if not pieces:
            continue
        width = min(block, len(runs) - b * block)
        rank = permutation(width, TAG_BLOCK, seed, epoch, b)  # each shard's place, shared by all workers
        keys, positions = [], []
        for i, piece in pieces:
            phase = ((rank[i - b * block] + v * mini_batch) % width) / width
            keys.append((np.arange(len(piece)) + phase) / len(piece))
            positions.append(piece)
        keys_all = np.concatenate(keys)
        out.append(np.concatenate(positions)[np.argsort(keys_all, kind="stable")])
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


class Interleaving:
    """The interleaved planner's part of ``EpochPlan`` (which provides ``spec``, ``epoch``,
    ``subset``, ``steps``, ``shard_order``, ``locate`` and the sequence's sizes)."""

    @property
    def interleaving(self) -> bool:
        """True when workers read pieces of many shards at once: shuffling, ``shuffle_block`` > 0,
        and at least ``MIN_SHARDS`` non-empty shards and as many as samples a worker puts in a
        batch. With fewer, a batch could not draw from distinct shards and the order would hardly
        change from epoch to epoch: contiguous runs through the shuffle buffer mix better."""
        spec = self.spec
        if not (spec.shuffle and spec.shuffle_block > 0):
            return False
        return sum(1 for n in spec.shard_sizes if n) >= max(MIN_SHARDS, spec.mini_batch)

    @property
    def block(self) -> int:
        """Shards interleaved at once: ``shuffle_block``, and at least a rank's batch, so that a
        batch can draw every sample from another shard."""
        return max(self.spec.shuffle_block, self.spec.batch_size)

    @cached_property
    def _runs(self) -> List[np.ndarray]:
        """The positions available in each shard, shards in the epoch's order."""
        ends = self._sequence_ends
        starts = ends - self._sizes[self.shard_order]
        if self.subset is None:
            return [np.arange(a, b, dtype=np.int64) for a, b in zip(starts, ends)]
        cut = np.searchsorted(self.subset, np.concatenate([starts[:1], ends]))
        return [self.subset[cut[i] : cut[i + 1]] for i in range(len(ends))]

    @cached_property
    def _piece_counts(self) -> np.ndarray:
        """Valid samples per virtual worker: its pieces' sizes (at most its share of ``planned``)."""
        workers, carry = self.spec.num_virtual_workers, 0
        counts = np.zeros(workers, dtype=np.int64)
        for run in self._runs:
            bounds, carry = piece_bounds(len(run), workers, carry)
            counts += np.diff(bounds)
        return np.minimum(counts, self.steps * self.spec.mini_batch)

    def worker_read_order(self, v: int) -> np.ndarray:
        """The order in which worker ``v`` reads its samples when interleaving (its emission order
        is this one through its shuffle buffer)."""
        return self._interleaved(v)

    def _interleaved(self, v: int) -> np.ndarray:
        spec = self.spec
        order = interleaved(
            self._runs, spec.num_virtual_workers, v, self.block, spec.mini_batch, spec.seed, self.epoch
        )
        return order[: self.worker_valid_count(v)]

    def worker_pieces(self, v: int) -> List[Segment]:
        """The pieces worker ``v`` reads under this plan, in reading order (interleaving only)."""
        pieces = worker_pieces(self._runs, self.spec.num_virtual_workers, v, self.block)
        out = []
        for _, piece in (p for block in pieces for p in block):
            shard, local = self.locate(piece[[0, -1]])
            out.append(Segment(int(shard[0]), int(local[0]), int(local[1]) + 1, int(piece[0])))
        return out

    def _interleaved_emissions(self, v: int) -> Iterator[int]:
        """Worker ``v``'s emission order: the interleaved order, shuffled within each step's share
        (a step keeps its samples, from as many shards as it has samples)."""
        seq = self._interleaved(v)
        perm = permutation(len(seq), TAG_BATCH_ORDER, self.spec.seed, self.epoch, v)
        order = np.lexsort((perm, np.arange(len(seq)) // self.spec.mini_batch))  # by step, then at random
        return iter(seq[order].tolist())
