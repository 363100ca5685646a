"""Who reads which samples, in which order, in each epoch: a pure function with no DALI import.

The plan for an epoch depends only on (shard sizes, seed, epoch, world size, workers per rank,
per-rank batch size, last-batch mode, shuffle settings), and a process computes only what it
reads: arrays over the shards (or their pieces), never over all samples or all ranks (a mix: never
over the passes it draws of a stream either, ``drawn``).

1. When shuffling with ``shuffle_block`` > 0 (and enough shards), the shards are cut into about
   ``max(shards, batch_size * world_size)`` pieces, dealt to the ranks in a new random order every
   epoch, a rank's pieces shared by its workers block by block and read interleaved: batches as
   mixed as a global shuffle even from class-sorted shards, each shard read by about
   ``max(1, batch_size * world_size / shards)`` workers (``deal``).
2. Otherwise the shards, in a new random order every epoch when shuffling, are laid end to end
   from a random sample on (going round: the runs change every epoch however few the shards) and
   virtual worker ``v = rank * py_num_workers + worker`` (of ``V = world_size * py_num_workers``)
   reads the balanced contiguous run ``[v T / V, (v + 1) T / V)``, chunk by chunk of
   ``shuffle_buffer`` samples in a seeded order (``runs``): each shard read once, but at a run's
   ends (pre-shuffled shards need no more).
3. Either way workers' shares differ by at most one sample; each worker emits ``mini_batch =
   batch_size // py_num_workers`` samples per step, for ``steps`` steps -- the same number on every
   rank. With ``last_batch="pad"`` the tail is padded with a real sample marked invalid; with
   ``last_batch="drop"`` only whole global batches are planned and the rest is left out (different
   samples each epoch when shuffling).

Positions are samples' ``__index__``. Random streams come from PCG64 raw output, which NumPy keeps
stable across releases, so a plan is reproducible run after run and across machines.
``PLAN_VERSION`` changes whenever this changes; ``legacy`` plans the versions before, to finish an
epoch saved under one of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from dali_shards.errors import ConfigError, EmptyDatasetError
from dali_shards.options import Batching, LastBatch, option_default
from dali_shards.plan import geometry, progress
from dali_shards.plan.deal import Deal, RankParts, interleave_order
from dali_shards.plan.drawn import Drawn
from dali_shards.plan.emissions import Emissions
from dali_shards.plan.reads import Reads
from dali_shards.plan.mixture import MixSpec
from dali_shards.plan.geometry import BatchLayout, check_positive, shard_of
from dali_shards.plan.random import TAG_BATCH_ORDER, permutation
from dali_shards.plan.runs import Runs, chunk_order
from dali_shards.plan.sizes import as_sizes
from dali_shards.plan.stratified import StratifiedParts
from dali_shards.plan.units import Streams, Units

PLAN_VERSION = 6
# plan versions whose states still resume exactly (3, 4: planned by ``legacy``; 5: as 6, but that
# contiguous runs start at the laid sequence's first sample every epoch)
RESUMABLE_PLAN_VERSIONS = (3, 4, 5, 6)
PLANNED_VERSIONS = (5, 6)  # the versions ``EpochPlan`` plans
MIN_SHARDS = 8  # fewer non-empty shards than this (or than a worker's mini-batch): contiguous runs
Lengths = Callable[[Any, np.ndarray], np.ndarray]  # (plan, positions) -> the samples' lengths


@dataclass(frozen=True)
class PlanSpec(BatchLayout):
    """Everything a plan depends on except the epoch; validated on construction."""

    shard_sizes: Sequence[int]  # held as ``ShardSizes``: one array, compared as a tuple
    shuffle_buffer: int = field(default=option_default("shuffle_buffer"), kw_only=True)
    shuffle_block: int = field(default=option_default("shuffle_block"), kw_only=True)
    bucket_window: int = field(default=0, kw_only=True)  # samples per worker bucketed at once (0: none)
    mixture: Optional[MixSpec] = field(default=None, kw_only=True)  # a mix of streams: each one's draws per epoch

    def __post_init__(self) -> None:
        object.__setattr__(self, "shard_sizes", as_sizes(self.shard_sizes))  # fast at a million shards
        sizes = as_sizes(self.shard_sizes).array
        check_positive(self, "shuffle_buffer")
        for name, what in (("shuffle_block", "0: a contiguous run per worker"), ("bucket_window", "0: no bucketing")):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise ConfigError(f"{name} must be an integer >= 0 ({what}), got {value!r}")
        self._check_layout()
        if (sizes < 0).any():
            raise ConfigError(f"shard sizes must be non-negative, got {sizes[sizes < 0][:5].tolist()}")
        if self.mixture is not None:
            self.mixture.check_plannable(sizes)  # (before any epoch is planned: a mix may ask for too much)
        if self.num_samples == 0:
            raise EmptyDatasetError(
                f"the {len(self.shard_sizes)} shard(s) hold no samples; check the shard paths "
                "and that members are named <key>.<ext>"
            )
        if self.steps_per_epoch == 0:
            raise EmptyDatasetError(
                f"last_batch='drop' with {self.num_samples} samples and a global batch of "
                f"{self.global_batch} (world_size {self.world_size} x batch_size {self.batch_size}) "
                "leaves no complete batch; use last_batch='pad' or a smaller batch"
            )

    # -- sizes -------------------------------------------------------------------------
    @property
    def sizes(self) -> np.ndarray:
        """``shard_sizes`` as a read-only int64 array."""
        return self.shard_sizes.array  # type: ignore[attr-defined]

    @cached_property
    def num_samples(self) -> int:
        """Samples an epoch draws (T): the dataset's, or a mix's ``epoch_size``."""
        return self.mixture.epoch_size if self.mixture is not None else int(self.sizes.sum())

    @property
    def steps_per_epoch(self) -> int:
        """Batches every rank delivers per epoch (the same on all ranks)."""
        return geometry.steps_for(self.num_samples, self.global_batch, self.last_batch)

    @property
    def planned_samples(self) -> int:
        """Samples delivered as valid per epoch over all ranks."""
        return geometry.planned_for(self.num_samples, self.global_batch, self.last_batch)

    @property
    def padding_per_epoch(self) -> int:
        """Slots filled with padding (``__valid__`` false) per epoch over all ranks."""
        return self.steps_per_epoch * self.global_batch - self.planned_samples

    @property
    def dropped_per_epoch(self) -> int:
        return self.num_samples - self.planned_samples

    def epoch(self, epoch: int, **resumed: Any) -> "EpochPlan":
        """The plan of ``epoch`` (``resumed``: a resumed epoch's ``subset``, ``start_step``); a
        stratified mix's is a ``stratified.StratifiedPlan``."""
        stratified = self.mixture is not None and self.mixture.batching is Batching.STRATIFIED
        return (StratifiedPlan if stratified else EpochPlan)(self, int(epoch), **resumed)

    def _check_worker(self, v: int) -> None:
        if not 0 <= v < self.num_virtual_workers:
            raise IndexError(f"virtual worker {v} outside 0..{self.num_virtual_workers - 1}")


@dataclass(frozen=True)
class EpochPlan(Reads, Emissions):
    """The plan of one epoch (plan version 6, or 5 to finish an epoch saved under it): each worker's
    reads and emission order.

    A resumed epoch plans only ``subset`` (the stretches of shards still to deliver, after an
    elastic resume) and/or starts at ``start_step`` (after a resume with the same layout); steps are
    counted from the plan's start either way. Positions are samples' ``__index__``.
    """

    spec: PlanSpec
    epoch: int
    subset: Optional[Units] = field(default=None, compare=False, repr=False)
    start_step: int = 0
    version: int = PLAN_VERSION

    def __post_init__(self) -> None:
        if self.version not in PLANNED_VERSIONS:
            raise ConfigError(f"plan version {self.version} is planned by dali_shards.plan.legacy")

    # -- sizes ---------------------------------------------------------------------------
    @cached_property
    def units(self) -> Units:
        """What this plan delivers, one row per stretch of a shard (``stretches``, listed)."""
        return self.stretches.units() if isinstance(self.stretches, Drawn) else self.stretches

    @cached_property
    def stretches(self) -> Units | Drawn:
        """What this plan delivers: every shard, or the subset, or a fresh mix's draws of this epoch
        kept compact (``Drawn``: a stream drawn many times its size costs what it costs drawn once)."""
        spec = self.spec
        if self.subset is not None:
            return self.subset
        if spec.mixture is not None:
            return Drawn.concat(spec.mixture.draws(spec.sizes, self.epoch, spec.seed, spec.shuffle))
        return Units.whole(spec.sizes)

    @cached_property
    def available(self) -> int:
        return self.stretches.total

    @cached_property
    def interleaving(self) -> bool:
        """True when workers read pieces of many shards at once: shuffling, ``shuffle_block`` > 0,
        and at least ``MIN_SHARDS`` non-empty units and as many as samples a worker puts in a batch
        (with fewer, contiguous runs through chunk shuffles mix better)."""
        spec = self.spec
        if not (spec.shuffle and spec.shuffle_block > 0):
            return False
        return self.stretches.nonempty >= max(MIN_SHARDS, spec.mini_batch)

    @property
    def block(self) -> int:
        """Pieces interleaved at once per rank: ``shuffle_block``, and at least a rank's batch."""
        return max(self.spec.shuffle_block, self.spec.batch_size)

    @cached_property
    def canonical_starts(self) -> np.ndarray:
        """``__index__`` of the first sample of each shard (shards in the order given)."""
        return np.concatenate([[0], np.cumsum(self.spec.sizes)[:-1]]).astype(np.int64)

    def locate(self, positions: Sequence[int] | np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """(shard, sample-in-shard) of positions (``__index__``)."""
        return shard_of(self.canonical_starts, positions)

    def canonical_index(self, positions: Sequence[int] | np.ndarray) -> np.ndarray:
        return np.asarray(positions, dtype=np.int64)

    # -- who reads what ------------------------------------------------------------------
    @cached_property
    def _deal(self) -> Deal:
        spec = self.spec
        drop = spec.last_batch is LastBatch.DROP
        return Deal(self.stretches, spec.world_size, spec.batch_size, self.planned, drop, spec.seed, self.epoch)

    @cached_property
    def _runs(self) -> Runs:
        spec = self.spec
        drop = spec.last_batch is LastBatch.DROP
        turn = self.version >= 6
        return Runs(self.stretches, spec.num_virtual_workers, self.planned, drop, spec.shuffle, spec.seed, self.epoch, turn)

    @cached_property
    def _ranks(self) -> Dict[int, RankParts]:
        return {}

    def rank_parts(self, rank: int) -> RankParts:
        """Rank ``rank``'s pieces cut into its workers' parts (interleaving; computed once)."""
        if rank not in self._ranks:
            spec = self.spec
            streams = self._deal.rank_streams(rank)
            self._ranks[rank] = RankParts(streams, self.block, spec.py_num_workers, spec.seed, self.epoch, rank)
        return self._ranks[rank]

    def worker_progress(self, v: int, done: int) -> List[Tuple[Streams, int]]:
        """Worker ``v``'s parts, each with how many of its samples its first ``done`` took."""
        return progress.in_turn(self.worker_parts(v), done)

    def worker_valid_count(self, v: int) -> int:
        """Valid samples worker ``v`` emits under this plan."""
        self.spec._check_worker(v)
        if self.interleaving:
            rank, worker = divmod(v, self.spec.py_num_workers)
            return int(self.rank_parts(rank).counts[worker])
        a, b = self._runs.span(v)
        return b - a

    def valid_mask(self, rank: int, step: int) -> np.ndarray:
        """Which slots of ``rank``'s batch at ``step`` hold real samples."""
        if not 0 <= step < self.steps:
            raise IndexError(f"step {step} outside 0..{self.steps - 1}")
        counts = [self.worker_valid_count(v) for v in self.spec.rank_workers(rank)]
        return geometry.valid_mask(counts, step, self.spec.mini_batch)

    def worker_parts(self, v: int) -> List[Streams]:
        """Worker ``v``'s parts, block by block (interleaving), or its run (one part)."""
        if not self.interleaving:
            return [self._runs.run(v)]
        rank, worker = divmod(v, self.spec.py_num_workers)
        return self.rank_parts(rank).parts(worker)

    def worker_read_order(self, v: int) -> np.ndarray:
        """The order in which worker ``v`` reads its samples: each block's parts interleaved (see
        ``deal``), or its run in order."""
        starts, out = self.canonical_starts, []
        for part in self.worker_parts(v):
            flat = part.flat_positions(starts)
            if not self.interleaving:
                out.append(flat)
                continue
            which, t = interleave_order(part.length)
            out.append(flat[(np.cumsum(part.length) - part.length)[which] + t])
        return np.concatenate(out) if out else np.zeros(0, np.int64)

    def valid_order(self, v: int) -> np.ndarray:
        """Worker ``v``'s emission order of its valid samples: its reading order shuffled within each
        step (interleaving), chunk by chunk (a run, shuffling), or as read (the last one asked for
        is kept: a worker asks for its own again and again)."""
        last = self._last_order
        if last and last[0] == v:
            return last[1]
        spec, read = self.spec, self.worker_read_order(v)
        if self.interleaving:
            perm = permutation(len(read), TAG_BATCH_ORDER, spec.seed, self.epoch, v)
            order = read[np.lexsort((perm, np.arange(len(read)) // spec.mini_batch))]
        elif spec.shuffle:
            order = read[chunk_order(len(read), spec.shuffle_buffer, spec.seed, self.epoch, v)]
        else:
            order = read
        order.setflags(write=False)
        last[:] = [v, order]
        return order

    @cached_property
    def _last_order(self) -> list:
        return []

    def pad_position(self, v: int) -> int:
        """The sample whose copies pad worker ``v``'s last slots: its last emitted sample, or, for a
        worker without samples, the one at its place in the epoch's sequence."""
        order = self.valid_order(v) if self.worker_valid_count(v) else None
        if order is not None and len(order):
            return int(order[-1])
        at = min(v * self.available // self.spec.num_virtual_workers, self.available - 1)
        laid = self._deal.laid(at, at + 1) if self.interleaving else self._runs.streams(at, at + 1)
        return int(laid.positions(self.canonical_starts)[0][0])

    def remaining(self, steps: int, lengths: Optional[Lengths] = None) -> Units:
        """What is left of this plan after its first ``steps`` steps, as stretches of shards
        (``lengths``: see ``consumed``; ``progress`` says how)."""
        return progress.remaining(self, steps, lengths)


class StratifiedPlan(StratifiedParts, EpochPlan):
    """The plan of an epoch of a mix with stratified batches (``stratified``): the same interface."""


def plan_epoch(shard_sizes: Sequence[int], *, epoch: int, **spec: Any) -> EpochPlan:
    """The plan of one epoch (see the module docstring); ``spec`` holds ``PlanSpec``'s keywords
    (``world_size``, ``py_num_workers``, ``batch_size``, ``seed``, ``shuffle``, ``last_batch``,
    ``shuffle_buffer``, ``shuffle_block``)."""
    return PlanSpec(tuple(shard_sizes), **spec).epoch(epoch)
