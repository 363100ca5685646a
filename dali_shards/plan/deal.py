"""Planner v5 and v6, interleaved: who reads which pieces of which shards, at a cost that follows what a
process reads. Pure, no I/O, no DALI.

1. **Pieces.** Each unit (a shard, or what was left of one) is cut into ``k`` contiguous pieces
   of about one size, the pieces of all units together about ``max(units, batch_size *
   world_size)``: as many as the ranks need for every per-rank batch to draw from ``batch_size``
   different pieces at one rate, and no more.
   Where a shard holds several pieces, the cuts are laid around it from a random sample, new every
   (seed, epoch): which part of a shard a rank reads changes every epoch.
2. **Ranks.** The pieces are dealt in a random order (seeded by (seed, epoch), the same in every
   process: every shard's first piece, then every shard's second, each round in its own random
   order, so that a rank's pieces are of different shards) and laid end to end; rank ``r`` takes samples ``[r T / W, (r + 1) T / W)`` of that
   sequence (``[r S B, (r + 1) S B)`` with ``last_batch="drop"``, the rest left out), cutting at
   most two pieces. A shard is read by about ``k`` ranks, one where shards outnumber the pieces
   the ranks need; a rank's shards are a new random set every epoch.
3. **Workers.** A rank's pieces form blocks of at least ``block`` pieces; in each block they are
   laid end to end in a seeded order and cut into ``py_num_workers`` contiguous parts (sizes
   balanced over the epoch to within one sample), so a piece is read by one worker (two where a
   part ends inside it).
4. **Order.** A worker reads its parts of a block interleaved: sample ``t`` of a part of ``p``
   samples has key ``(2t + 1) / 2p`` (on an integer grid), ties in part order, so that consecutive
   samples come from different pieces and each part is spread evenly over the block.

A process computes the piece sequence (arrays over the pieces: a few MB at a million shards) and
only its own rank's pieces and parts. A mix's draws of many passes (a piece per stretch, whole
passes kept as one block repeated: ``drawn``) are never listed: a rank's pieces come from one pass
over their random numbers (``drawn.Laid``), in the same order. What any worker delivered in its
first ``c`` samples is a prefix of each of its parts (``consumed_counts``): an elastic resume
describes the rest of an epoch as stretches of shards, not samples.
"""

from __future__ import annotations

from functools import cached_property
from typing import List, Optional, Tuple

import numpy as np

from dali_shards.plan.drawn import Drawn, Laid
from dali_shards.plan.random import TAG_BLOCK, TAG_DEAL, TAG_SPIN, bitgen, permutation
from dali_shards.plan.units import Streams, Units

GRID = 1 << 30  # interleave keys: exact integers for parts of up to 2**30 samples


def balanced(size: int, parts: int, carry: int = 0) -> Tuple[np.ndarray, int]:
    """Start offsets (``parts + 1``) of ``size`` samples cut into ``parts``, the extra samples going
    to parts ``carry, carry + 1, ...`` (mod ``parts``); and the next carry."""
    q, r = divmod(size, parts)
    extra = ((np.arange(parts) - carry) % parts < r).astype(np.int64)
    return np.concatenate([[0], np.cumsum(q + extra)]), (carry + r) % parts


FEWER = 0.95  # pieces per rank as a share of its batch: uniform pieces, a shard's readers kept near the need


def piece_counts(sizes: np.ndarray, wanted: int) -> np.ndarray:
    """Pieces per unit: one each where the units are at least ``wanted``; else pieces of about one
    size (``total / wanted``), ``FEWER`` times as many as wanted rounded up per unit (so that a
    rank's pieces are alike in size, and each emits at one rate), never more pieces than samples."""
    sizes = np.asarray(sizes, dtype=np.int64)
    nonempty = sizes > 0
    if int(nonempty.sum()) >= wanted:
        return nonempty.astype(np.int64)
    share = sizes * (FEWER * wanted / max(1, int(sizes.sum())))  # each unit's share of the pieces
    counts = np.maximum(np.ceil(share - 1e-9), 1)
    return np.where(nonempty, np.minimum(counts, sizes), 0).astype(np.int64)


def cut_pieces(units: Units, counts: np.ndarray, seed: int, epoch: int, salt: Tuple[int, ...] = ()) -> Streams:
    """The pieces of every unit (unit by unit), as streams: ``counts[i]`` balanced pieces of unit
    ``i``, laid around it from a random sample where there are several."""
    sizes = units.sizes
    unit = np.repeat(np.arange(len(units), dtype=np.int64), counts)
    first = np.cumsum(counts) - counts
    j = np.arange(len(unit), dtype=np.int64) - np.repeat(first, counts)  # piece index within its unit
    k, size = counts[unit], sizes[unit]
    q, r = size // np.maximum(k, 1), size % np.maximum(k, 1)
    length = q + (j < r)
    offset = j * q + np.minimum(j, r)
    spin = bitgen(TAG_SPIN, seed, epoch, *salt).random_raw(len(units)).astype(np.uint64)
    turn = np.where(counts > 1, (spin % np.maximum(sizes, 1).astype(np.uint64)).astype(np.int64), 0)[unit]
    return Streams(units, unit, (offset + turn) % np.maximum(size, 1), length)


def deal_order(pieces: Streams, counts: np.ndarray, seed: int, epoch: int, salt: Tuple[int, ...] = ()) -> np.ndarray:
    """The order the pieces are dealt in: every unit's first piece in a random order, then every
    unit's second piece in another, and so on, so that a rank (a run of that order shorter than a
    round) reads pieces of as many different shards as it reads pieces."""
    first = np.cumsum(counts) - counts
    round_ = np.arange(len(pieces), dtype=np.int64) - np.repeat(first, counts)  # which piece of its unit
    return np.lexsort((bitgen(TAG_DEAL, seed, epoch, *salt).random_raw(len(pieces)), round_)).astype(np.int64)


class Deal:
    """The pieces of an epoch dealt to the ranks (steps 1 and 2 of the module): ``planned`` samples
    (those the ranks deliver) of ``units``, over ``world`` ranks taking ``per_rank(r)`` each.
    ``wanted``: pieces wanted (by default ``batch * world``); ``salt``: more key for its random
    choices (a mix's stream). A mix's draws (``Drawn``) of at least ``wanted`` stretches are a
    piece each, dealt without listing them all (``drawn.Laid``: the same order)."""

    def __init__(self, units: Units | Drawn, world: int, batch: int, planned: int, drop: bool, seed: int, epoch: int,
                 wanted: int = 0, salt: Tuple[int, ...] = ()):  # fmt: skip
        self.world, self.planned, self.drop = world, planned, drop
        wanted = wanted or batch * world
        self._laid: Optional[Laid] = None
        if isinstance(units, Drawn):
            if units.nonempty == len(units) >= wanted:  # a piece per stretch, in ``deal_order``'s order
                self._laid = Laid(units, (TAG_DEAL, seed, epoch, *salt))
                return
            units = units.units()
        counts = piece_counts(units.sizes, wanted)
        pieces = cut_pieces(units, counts, seed, epoch, salt)
        self.pieces = pieces.take(deal_order(pieces, counts, seed, epoch, salt))
        self.ends = np.cumsum(self.pieces.length)

    def laid(self, a: int, b: int) -> Streams:
        """Samples ``[a, b)`` of the dealt sequence (the two pieces at its ends cut), in order."""
        if self._laid is not None:
            return self._laid.window(a, b)
        return self.pieces.window(a, b, self.ends)

    def rank_range(self, rank: int) -> Tuple[int, int]:
        """Rank ``rank``'s samples ``[a, b)`` of the dealt sequence."""
        if self.drop:
            share = self.planned // self.world
            return rank * share, (rank + 1) * share
        return rank * self.planned // self.world, (rank + 1) * self.planned // self.world

    def rank_streams(self, rank: int) -> Streams:
        """Rank ``rank``'s pieces (the two at its ends cut to its range), in the dealt order."""
        return self.laid(*self.rank_range(rank))


def block_sizes(count: int, block: int) -> np.ndarray:
    """Pieces per block of a rank's ``count`` pieces: blocks of at least ``block`` (all in one
    where there are fewer), as equal as can be."""
    blocks = max(1, count // max(block, 1))
    q, r = divmod(count, blocks)
    return np.array([q + (b < r) for b in range(blocks)], dtype=np.int64)


class RankParts:
    """A rank's pieces cut into its workers' parts (step 3 of the module)."""

    def __init__(self, streams: Streams, block: int, workers: int, seed: int, epoch: int, rank: int):
        self.streams, self.workers = streams, workers
        self.blocks: List[Streams] = []
        self.bounds: List[np.ndarray] = []  # per block, where each worker's part starts (workers + 1)
        carry, first = 0, 0
        for b, count in enumerate(block_sizes(len(streams), block).tolist()):
            order = first + permutation(count, TAG_BLOCK, seed, epoch, rank, b)
            laid = streams.take(order)
            bounds, carry = balanced(int(laid.length.sum()), workers, carry)
            self.blocks.append(laid)
            self.bounds.append(bounds)
            first += count

    @cached_property
    def counts(self) -> np.ndarray:
        """Samples each worker of the rank reads."""
        if not self.bounds:
            return np.zeros(self.workers, np.int64)
        return np.sum([np.diff(b) for b in self.bounds], axis=0).astype(np.int64)

    def part(self, worker: int, b: int) -> Streams:
        """Worker ``worker``'s part of block ``b``: the streams it reads there."""
        bounds = self.bounds[b]
        return self.blocks[b].window(int(bounds[worker]), int(bounds[worker + 1]))

    def parts(self, worker: int) -> List[Streams]:
        return [self.part(worker, b) for b in range(len(self.blocks))]


def interleave_order(lengths: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(part, sample-in-part) of every sample of parts of ``lengths``, in interleaved order."""
    lengths = np.asarray(lengths, dtype=np.int64)
    part = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    t = np.arange(len(part), dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    key = (2 * t + 1) * GRID // (2 * lengths[part]) if len(part) else t
    order = np.lexsort((part, key))
    return part[order], t[order]


def _before(lengths: np.ndarray, key: np.ndarray | int) -> np.ndarray:
    """Per part, its samples whose key is below ``key``."""
    return np.minimum(np.maximum(-((GRID - 2 * lengths * key) // (2 * GRID)), 0), lengths)


def consumed_counts(lengths: np.ndarray, done: int) -> np.ndarray:
    """Per part, how many of its samples are among the first ``done`` of the interleaved order
    (a prefix of each part): the same as counting ``interleave_order``, without listing samples."""
    return consumed_counts_many([np.asarray(lengths, dtype=np.int64)], [done])[0]


def consumed_counts_many(groups: List[np.ndarray], dones: List[int]) -> List[np.ndarray]:
    """``consumed_counts`` of many groups of parts at once (``consumed_counts_rows`` of the groups
    padded with empty parts)."""
    sizes = [len(g) for g in groups]
    if not groups or not max(sizes):
        return [np.zeros(n, np.int64) for n in sizes]
    rows = np.zeros((len(groups), max(sizes)), np.int64)
    for r, g in enumerate(groups):
        rows[r, : len(g)] = g
    counts = consumed_counts_rows(rows, np.asarray(dones, dtype=np.int64))
    return [counts[r, :n] for r, n in enumerate(sizes)]


def consumed_counts_rows(lengths: np.ndarray, done: np.ndarray) -> np.ndarray:
    """``consumed_counts`` of each row of ``lengths`` (a group of parts; empty parts change nothing)
    with ``done[row]``: one search over all rows at once."""
    lengths = np.asarray(lengths, dtype=np.int64)
    done = np.asarray(done, dtype=np.int64)
    # per row, the largest key with at most ``done`` samples below it: a part of ``L`` samples has
    # ``key * L / GRID`` of them below ``key``, within one, so the search starts near it
    total, margin = lengths.sum(axis=1), 2 * lengths.shape[1] + 2
    lo = np.clip((done - margin) * GRID // np.maximum(total, 1), 0, GRID)
    hi = np.clip(-(-(done + margin) * GRID // np.maximum(total, 1)), lo + 1, GRID + 1)
    wide = (_before(lengths, lo[:, None]).sum(axis=1) > done) | (_before(lengths, hi[:, None]).sum(axis=1) <= done)
    lo, hi = np.where(wide, 0, lo), np.where(wide | (hi > GRID), GRID + 1, hi)
    while (hi - lo > 1).any():
        mid = (lo + hi) // 2
        fits = _before(lengths, mid[:, None]).sum(axis=1) <= done
        lo, hi = np.where(fits, mid, lo), np.where(fits, hi, mid)
    counts = _before(lengths, lo[:, None])
    at_key = _before(lengths, lo[:, None] + 1) > counts  # parts with a sample of key ``lo``: taken in part order
    counts = counts + (at_key & (np.cumsum(at_key, axis=1) <= (done - counts.sum(axis=1))[:, None]))
    return np.where((done >= lengths.sum(axis=1))[:, None], lengths, counts)
