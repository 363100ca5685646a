"""The plan of an epoch of a mix with ``batching="stratified"``: every global batch holds each
stream's share (``shares``), every stream dealt like a dataset of its own. Pure, no I/O, no DALI.

1. **Counts.** ``shares.Strata`` gives every worker its count of each stream in every step, and
   so each worker's and each rank's total of each stream.
2. **Streams.** Each stream's draws of the epoch are cut into pieces and dealt in a random order
   (``deal.Deal``, keyed by the stream): rank ``r`` takes the stretch of that order that the ranks
   before it do not, as long as its workers' totals of the stream.
3. **Workers.** A rank's pieces of a stream are laid in a seeded order and cut into blocks of
   about ``block`` times the stream's share of pieces; worker ``w`` takes ``floor(N_w B_k / T) -
   floor(N_w B_{k-1} / T)`` samples of block ``k`` (its total ``N_w`` spread over the blocks as
   they come, ``B_k`` the samples of the first ``k`` blocks), read interleaved as in ``deal``.
4. **Order.** A worker's step takes its count of each stream from that stream's reading, in the
   order read; its step is then shuffled as in any plan.

What a worker delivered in its first ``c`` samples is, per stream, a prefix of its reading of that
stream: an elastic resume again describes the rest as stretches of shards.
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

import numpy as np

from dali_shards.options import LastBatch
from dali_shards.plan import geometry
from dali_shards.plan.deal import Deal, block_sizes, interleave_order
from dali_shards.plan.drawn import Drawn
from dali_shards.plan.mixture import largest_remainder
from dali_shards.plan.random import TAG_BLOCK, permutation
from dali_shards.plan.shares import Strata, labels
from dali_shards.plan.units import Streams, Units


class ShareParts:
    """A rank's pieces of one stream cut into its workers' parts of ``totals`` samples each, block
    by block (step 3 of the module)."""

    def __init__(self, streams: Streams, block: int, totals: np.ndarray, key: Tuple[int, ...]):
        order = permutation(len(streams), TAG_BLOCK, *key)
        laid = streams.take(order)
        ends = np.cumsum(laid.length)
        whole = int(ends[-1]) if len(ends) else 0
        assert whole == int(totals.sum()), "a rank's pieces of a stream are its workers' totals"
        cuts = np.cumsum(block_sizes(len(laid), block))  # pieces at each block's end
        nominal = np.concatenate([[0], ends[cuts - 1]]) if len(laid) else np.zeros(1, np.int64)
        # per block boundary, per worker: its samples before it (its total spread as the blocks come)
        self.taken = (totals[None, :] * nominal[:, None]) // max(whole, 1)
        self.starts = self.taken.sum(axis=1)  # where each block begins among the laid samples
        self.laid, self.ends = laid, ends

    @property
    def blocks(self) -> int:
        return len(self.starts) - 1

    def part(self, worker: int, b: int) -> Streams:
        """Worker ``worker``'s part of block ``b``."""
        sizes = self.taken[b + 1] - self.taken[b]
        a = int(self.starts[b] + sizes[:worker].sum())
        return self.laid.window(a, a + int(sizes[worker]), self.ends)


class StratifiedParts:
    """What a stratified mix's plan does its own way (see the module): mixed into ``EpochPlan`` as
    ``epoch.StratifiedPlan``, which it takes ``spec``, ``epoch``, ``units``, ``planned``, ``block``
    and ``canonical_starts`` from."""

    if TYPE_CHECKING:  # what the plan provides
        from dali_shards.plan.epoch import PlanSpec

        spec: PlanSpec
        epoch: int
        units: Units
        subset: Optional[Units]
        planned: int
        block: int
        canonical_starts: np.ndarray

    @cached_property
    def interleaving(self) -> bool:
        return True

    @cached_property
    def stream_units(self) -> Sequence[Units | Drawn]:
        """Per stream, what this plan delivers of it (a fresh epoch's draws kept compact)."""
        spec, mix = self.spec, self.spec.mixture
        assert mix is not None  # a stratified plan is a mix's
        if self.subset is None:
            return mix.draws(spec.sizes, self.epoch, spec.seed, spec.shuffle)
        units = self.units
        stream = mix.stream_of(units.shard)
        return [Units.of(units.shard[stream == i], units.lo[stream == i], units.hi[stream == i]) for i in range(len(mix.counts))]

    @cached_property
    def strata(self) -> Strata:
        spec = self.spec
        sizes = [u.total for u in self.stream_units]
        totals = largest_remainder(self.planned, sizes) if self.planned < sum(sizes) else sizes
        return Strata(totals, spec.num_virtual_workers, spec.mini_batch, spec.seed, self.epoch, spec.shuffle)

    @cached_property
    def _deals(self) -> Dict[int, Deal]:
        return {}

    def _stream_deal(self, i: int) -> Deal:
        """Stream ``i``'s pieces dealt in a random order of their own (computed once)."""
        if i not in self._deals:
            self._deals[i] = self._deal_of(i)
        return self._deals[i]

    def _deal_of(self, i: int) -> Deal:
        spec, p = self.spec, self.strata.totals
        wanted = max(1, -(-spec.global_batch * int(p[i]) // max(1, int(p.sum()))))
        return Deal(self.stream_units[i], spec.world_size, spec.batch_size, int(p[i]), spec.last_batch is LastBatch.DROP,
                    spec.seed, self.epoch, wanted=wanted, salt=(i,))  # fmt: skip

    @cached_property
    def _shares(self) -> Dict[int, List[ShareParts]]:
        return {}

    def share_parts(self, rank: int) -> List[ShareParts]:
        """Per stream, rank ``rank``'s pieces cut into its workers' parts (computed once)."""
        if rank not in self._shares:
            spec, strata = self.spec, self.strata
            first = spec.virtual_worker(rank, 0)
            counts = strata.workers_counts(first, first + spec.py_num_workers).sum(axis=1)  # (workers, streams)
            lo, hi = strata.counts_before(first), strata.counts_before(first + spec.py_num_workers)
            share = strata.totals / max(1, int(strata.totals.sum()))
            out = []
            for i in range(strata.streams):
                streams = self._stream_deal(i).laid(int(lo[i]), int(hi[i]))
                block = max(1, round(self.block * float(share[i])))
                out.append(ShareParts(streams, block, counts[:, i], (spec.seed, self.epoch, rank, i)))
            self._shares[rank] = out
        return self._shares[rank]

    def worker_valid_count(self, v: int) -> int:
        self.spec._check_worker(v)
        a, b = geometry.span(v, self.planned, self.spec.num_virtual_workers)
        return b - a

    def _worker_streams(self, v: int) -> List[List[Streams]]:
        """Per stream, worker ``v``'s parts of it, block by block."""
        rank, worker = divmod(v, self.spec.py_num_workers)
        return [[s.part(worker, b) for b in range(s.blocks)] for s in self.share_parts(rank)]

    def worker_parts(self, v: int) -> List[Streams]:
        per = self._worker_streams(v)
        blocks = max((len(p) for p in per), default=0)
        return [p[b] for b in range(blocks) for p in per if b < len(p)]

    def worker_progress(self, v: int, done: int) -> List[Tuple[Streams, int]]:
        """Worker ``v``'s parts, each with how many of its samples the worker's first ``done`` took:
        per stream, a prefix of its reading of that stream."""
        taken = np.bincount(labels(self.strata.worker_counts(v))[:done], minlength=self.strata.streams)
        out = []
        for i, parts in enumerate(self._worker_streams(v)):
            before = 0
            for part in parts:
                total = int(part.length.sum())
                out.append((part, min(max(int(taken[i]) - before, 0), total)))
                before += total
        return out

    def worker_read_order(self, v: int) -> np.ndarray:
        """Each stream's parts read interleaved block by block, merged step by step by the worker's
        counts (see the module)."""
        starts = self.canonical_starts
        slots = labels(self.strata.worker_counts(v))
        out = np.zeros(len(slots), np.int64)
        for i, parts in enumerate(self._worker_streams(v)):
            seq = []
            for part in parts:
                flat = part.flat_positions(starts)
                which, t = interleave_order(part.length)
                seq.append(flat[(np.cumsum(part.length) - part.length)[which] + t])
            out[slots == i] = np.concatenate(seq) if seq else np.zeros(0, np.int64)
        return out
