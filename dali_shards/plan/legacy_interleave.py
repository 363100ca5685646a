"""The interleaved planner: every worker reads pieces of many shards at once and emits their
samples interleaved, so that batches are as mixed as a global shuffle even from class-sorted
shards. Pure, no I/O, no DALI.

In the epoch's shuffled shard order, shards form blocks of ``block`` shards. Each shard's
available samples are cut into ``world_size`` contiguous *rank pieces*, sizes differing by at most
one, the larger pieces dealt round-robin across shards so that the ranks' totals differ by at most
one sample. Where the cuts fall is drawn anew for every (seed, epoch, shard): the pieces are laid
around the shard as on a circle from a random first sample, so that which part of a shard a rank
reads changes every epoch (shuffle before shard at the rank level too); a piece that passes the
shard's end goes on at its start (two stretches of the shard, read in shard order). In each block, a rank's pieces are laid end to end in a seeded order (the same in
every process, new every epoch) and cut into ``py_num_workers`` contiguous parts, sizes differing
by at most one (carried over from block to block, so that every worker's total differs from any
other's by at most one): a worker reads whole pieces (and at most two partial ones, at the ends of
its part) of about ``block / py_num_workers`` shards, and no two workers of a rank read the same
samples.

A worker emits its pieces of a block interleaved: sample ``k`` of a piece of ``p`` samples has key
``(k + j / n) / p`` for the ``j``-th of its ``n`` pieces, so that, sorted by key, consecutive
samples come from different shards and every piece is spread evenly over the block. A rank's batch
takes ``mini_batch`` consecutive samples from each worker: from as many shards as it has samples
when the block has that many (``block >= batch_size``) and they are of similar size. A worker reads about
``block / py_num_workers`` shards at once (``worker/pieces.py`` says what that costs in memory).
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from dali_shards.plan.geometry import Stretch
from dali_shards.plan.random import TAG_BATCH_ORDER, TAG_BLOCK, TAG_RANK_CUT, bitgen, permutation

if TYPE_CHECKING:
    from dali_shards.plan.epoch import PlanSpec


MIN_SHARDS = 8
DRAWN_CUTS_SINCE = 4  # plan version 3 cut every shard at the same places each epoch (kept to resume its states)


def piece_bounds(size: int, parts: int, carry: int) -> Tuple[np.ndarray, int]:
    """Start offsets (``parts + 1``) of the pieces of a run of ``size`` samples, the extra
    samples going to parts ``carry, carry + 1, ...`` (mod ``parts``); and the next carry."""
    q, r = divmod(size, parts)
    extra = ((np.arange(parts) - carry) % parts < r).astype(np.int64)
    return np.concatenate([[0], np.cumsum(q + extra)]), (carry + r) % parts


def cut_offsets(num_shards: int, seed: int, epoch: int) -> np.ndarray:
    """Per shard (canonical index), a random 64-bit number that places its rank pieces this epoch."""
    return bitgen(TAG_RANK_CUT, seed, epoch).random_raw(num_shards)


def rank_pieces(runs: Sequence[np.ndarray], world: int, rank: int, starts: Sequence[int] = ()) -> List[np.ndarray]:
    """Rank ``rank``'s piece (positions, ascending) of each run; ``runs`` are the positions
    available in each shard, shards in the epoch's order, and ``starts[i]`` where the first piece of
    run ``i`` begins (the pieces go on around the run as on a circle; default: at its start)."""
    carry, pieces = 0, []
    for i, run in enumerate(runs):
        bounds, carry = piece_bounds(len(run), world, carry)
        a = (int(starts[i]) if len(starts) else 0) + int(bounds[rank])
        z = a + int(bounds[rank + 1] - bounds[rank])
        if a >= len(run):
            a, z = a - len(run), z - len(run)
        pieces.append(run[a:z] if z <= len(run) else np.concatenate([run[: z - len(run)], run[a:]]))
    return pieces


def block_order(first: int, width: int, b: int, seed: int, epoch: int) -> List[int]:
    """The runs of block ``b`` (``width`` runs from ``first``) in the order the rank's workers
    share them (seeded, the same in every process)."""
    return (first + np.argsort(permutation(width, TAG_BLOCK, seed, epoch, b), kind="stable")).tolist()


def block_totals(lengths: Sequence[int], block: int) -> List[int]:
    """Samples per block, given each run's piece length."""
    return [int(sum(lengths[i : i + block])) for i in range(0, len(lengths), block)]


def worker_parts(
    pieces: Sequence[np.ndarray], block: int, workers: int, worker: int, seed: int, epoch: int
) -> List[List[Tuple[int, np.ndarray]]]:
    """Per block, the ``(run index, positions)`` parts of the rank's ``pieces`` that ``worker``
    reads (see the module)."""
    carry, blocks = 0, []
    for b, first in enumerate(range(0, len(pieces), block)):
        order = block_order(first, min(block, len(pieces) - first), b, seed, epoch)
        lengths = [len(pieces[i]) for i in order]
        bounds, carry = piece_bounds(sum(lengths), workers, carry)
        lo, hi = int(bounds[worker]), int(bounds[worker + 1])
        parts, start = [], 0
        for i, n in zip(order, lengths):
            a, z = max(lo, start) - start, min(hi, start + n) - start
            if a < z:
                parts.append((i, pieces[i][a:z]))
            start += n
        blocks.append(parts)
    return blocks


def interleaved(parts: Sequence[Tuple[int, np.ndarray]]) -> np.ndarray:
    """The positions of one block's parts, interleaved (see the module)."""
    if not parts:
        return np.zeros(0, dtype=np.int64)
    n = len(parts)
    keys = np.concatenate([(np.arange(len(p)) + j / n) / len(p) for j, (_, p) in enumerate(parts)])
    return np.concatenate([p for _, p in parts])[np.argsort(keys, kind="stable")]


class Interleaving:
    """The interleaved planner's part of ``EpochPlan`` (which provides ``spec``, ``epoch``,
    ``subset``, ``steps``, ``shard_order``, ``locate`` and the sequence's sizes)."""

    if TYPE_CHECKING:  # what EpochPlan provides (read-only there)

        @property
        def spec(self) -> PlanSpec: ...
        @property
        def epoch(self) -> int: ...
        @property
        def subset(self) -> Optional[np.ndarray]: ...
        @property
        def version(self) -> int: ...
        @property
        def steps(self) -> int: ...
        @property
        def shard_order(self) -> np.ndarray: ...
        @property
        def _sizes(self) -> np.ndarray: ...
        @property
        def _sequence_ends(self) -> np.ndarray: ...
        def worker_valid_count(self, v: int) -> int: ...
        def locate(self, positions: Sequence[int] | np.ndarray) -> Tuple[np.ndarray, np.ndarray]: ...

    @property
    def interleaving(self) -> bool:
        """True when workers read pieces of many shards at once: shuffling, ``shuffle_block`` > 0,
        and at least ``MIN_SHARDS`` non-empty shards and as many as samples a worker puts in a
        batch. With fewer, a batch could not draw from distinct shards and the order would hardly
        change from epoch to epoch: contiguous runs through the shuffle buffer mix better."""
        spec = self.spec
        if not (spec.shuffle and spec.shuffle_block > 0):
            return False
        return int(np.count_nonzero(spec.sizes)) >= max(MIN_SHARDS, spec.mini_batch)

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
    def _rank_pieces(self) -> Dict[int, List[np.ndarray]]:
        return {}

    @cached_property
    def _cut_starts(self) -> List[int]:
        """Where each run's first rank piece begins (runs in the epoch's order; see the module)."""
        if self.version < DRAWN_CUTS_SINCE:
            return []
        drawn = cut_offsets(len(self.spec.shard_sizes), self.spec.seed, self.epoch)[self.shard_order]
        return [int(x % len(run)) if len(run) else 0 for x, run in zip(drawn.tolist(), self._runs)]

    def _pieces_of(self, rank: int) -> List[np.ndarray]:
        """Rank ``rank``'s pieces (computed once per plan)."""
        if rank not in self._rank_pieces:
            self._rank_pieces[rank] = rank_pieces(self._runs, self.spec.world_size, rank, self._cut_starts)
        return self._rank_pieces[rank]

    @cached_property
    def _piece_counts(self) -> np.ndarray:
        """Valid samples per virtual worker: its parts' sizes (at most its share of ``planned``)."""
        spec, carry = self.spec, 0
        lengths = np.zeros((spec.world_size, len(self._runs)), dtype=np.int64)
        for s, run in enumerate(self._runs):
            bounds, carry = piece_bounds(len(run), spec.world_size, carry)
            lengths[:, s] = np.diff(bounds)
        counts = np.zeros(spec.num_virtual_workers, dtype=np.int64)
        for rank in range(spec.world_size):
            carry = 0
            for total in block_totals(lengths[rank], self.block):
                bounds, carry = piece_bounds(total, spec.py_num_workers, carry)
                workers = spec.rank_workers(rank)
                counts[workers.start : workers.stop] += np.diff(bounds)
        return np.minimum(counts, self.steps * spec.mini_batch)

    def _worker_blocks(self, v: int) -> List[List[Tuple[int, np.ndarray]]]:
        spec = self.spec
        rank, worker = divmod(v, spec.py_num_workers)
        return worker_parts(self._pieces_of(rank), self.block, spec.py_num_workers, worker, spec.seed, self.epoch)

    def worker_read_order(self, v: int) -> np.ndarray:
        """The order in which worker ``v`` reads its samples when interleaving (it emits them in
        this order, shuffled within each step)."""
        order = [interleaved(parts) for parts in self._worker_blocks(v)]
        seq = np.concatenate(order) if order else np.zeros(0, dtype=np.int64)
        return seq[: self.worker_valid_count(v)]

    def worker_pieces(self, v: int) -> List[Stretch]:
        """The pieces worker ``v`` reads under this plan, in reading order (interleaving only): per
        shard, the stretch from its first sample there to its last -- two stretches where its part
        goes on past the shard's end at its start."""
        out, left = [], self.worker_valid_count(v)
        for parts in self._worker_blocks(v):
            first_keys = [j / len(parts) / len(piece) for j, (_, piece) in enumerate(parts)]
            for k in np.argsort(first_keys, kind="stable"):
                i, piece = parts[k]
                at = np.searchsorted(self._runs[i], piece)  # where the part's samples lie in the run
                for stretch in np.split(piece, np.flatnonzero(np.diff(at) > 1) + 1):
                    shard, local = self.locate(stretch[[0, -1]])
                    out.append(Stretch(int(shard[0]), int(local[0]), int(local[1]) + 1, int(stretch[0])))
            left -= sum(len(p) for _, p in parts)
            if left <= 0:  # what 'drop' leaves out is not read
                break
        return out

    def _interleaved_emissions(self, v: int) -> Iterator[int]:
        """Worker ``v``'s emission order: its reading order, shuffled within each step's share (a
        step keeps its samples, from as many shards as it has samples)."""
        seq = self.worker_read_order(v)
        perm = permutation(len(seq), TAG_BATCH_ORDER, self.spec.seed, self.epoch, v)
        order = np.lexsort((perm, np.arange(len(seq)) // self.spec.mini_batch))  # by step, then at random
        return iter(seq[order].tolist())
