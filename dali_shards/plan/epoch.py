"""Who reads which samples, in which order, in each epoch: a pure function with no DALI import.

The plan for an epoch depends only on (shard sizes, seed, epoch, world size, workers per rank,
per-rank batch size, last-batch mode, shuffle settings):

1. The shard order is shuffled with an RNG keyed by ``(seed, epoch)`` -- identical in every
   process -- or kept canonical when ``shuffle=False``.
2. The samples, in that shard order, form one sequence. When shuffling with ``shuffle_block`` > 0
   (and enough shards, see ``interleave``), each rank reads a piece of every shard, blocks of
   shards at a time, and visits the pieces interleaved; its workers share the visits batch by
   batch, each reading a contiguous part of every piece it visits: batches as mixed as a global
   shuffle even from class-sorted shards. Otherwise virtual worker
   ``v = rank * py_num_workers + worker`` (of ``V = world_size * py_num_workers``) gets the balanced
   contiguous run ``[v * T // V, (v + 1) * T // V)`` and emits it through a buffer shuffle keyed by
   ``(seed, epoch, v)`` (or in order). Either way workers' shares differ by at most one sample.
3. Each worker emits ``mini_batch = batch_size // py_num_workers`` samples per step, for ``steps`` steps -- the same
   number on every rank. With ``last_batch="pad"`` the tail is padded with a real sample marked
   invalid; with ``last_batch="drop"`` only whole global batches are planned and the rest of the
   sequence is left out (different samples each epoch when shuffling).

Random streams come from PCG64 raw output, which NumPy keeps stable across releases, so a plan is
reproducible run after run and across machines. ``PLAN_VERSION`` changes whenever this changes.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from dali_shards.errors import ConfigError, EmptyDatasetError
from dali_shards.options import LastBatch, option_default
from dali_shards.plan import geometry
from dali_shards.plan.geometry import BatchLayout, Segment, check_positive
from dali_shards.plan import bucket, interleave
from dali_shards.plan.random import buffer_shuffle_order, shard_permutation

PLAN_VERSION = 4
# plan versions whose states still resume exactly (3: rank pieces cut at the same places every epoch)
RESUMABLE_PLAN_VERSIONS = (3, 4)
Lengths = Callable[["EpochPlan", np.ndarray], np.ndarray]  # (plan, positions) -> the samples' lengths
LAST_BATCH_MODES = tuple(m.value for m in LastBatch)


@dataclass(frozen=True)
class PlanSpec(BatchLayout):
    """Everything a plan depends on except the epoch; validated on construction."""

    shard_sizes: Tuple[int, ...]
    shuffle_buffer: int = field(default=option_default("shuffle_buffer"), kw_only=True)
    shuffle_block: int = field(default=option_default("shuffle_block"), kw_only=True)
    bucket_window: int = field(default=0, kw_only=True)  # samples per worker bucketed at once (0: none)

    def __post_init__(self) -> None:
        object.__setattr__(self, "shard_sizes", tuple(int(s) for s in self.shard_sizes))
        check_positive(self, "shuffle_buffer")
        for name, what in (("shuffle_block", "0: a contiguous run per worker"), ("bucket_window", "0: no bucketing")):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise ConfigError(f"{name} must be an integer >= 0 ({what}), got {value!r}")
        self._check_layout()
        if any(s < 0 for s in self.shard_sizes):
            raise ConfigError(f"shard sizes must be non-negative, got {self.shard_sizes}")
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
    def num_samples(self) -> int:
        """Samples in the dataset (T)."""
        return sum(self.shard_sizes)

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

    def worker_span(self, v: int) -> Tuple[int, int]:
        """Positions ``[start, stop)`` of worker ``v``'s run in every (full) epoch's sample sequence."""
        return self.epoch(0).worker_span(v)

    def worker_valid_count(self, v: int) -> int:
        """Valid samples worker ``v`` emits in every (full) epoch."""
        return self.epoch(0).worker_valid_count(v)

    def valid_mask(self, rank: int, step: int) -> np.ndarray:
        """Which slots of ``rank``'s batch at ``step`` hold real samples (same every epoch)."""
        return self.epoch(0).valid_mask(rank, step)

    def epoch(self, epoch: int) -> "EpochPlan":
        return EpochPlan(self, int(epoch))

    def _check_worker(self, v: int) -> None:
        if not 0 <= v < self.num_virtual_workers:
            raise IndexError(f"virtual worker {v} outside 0..{self.num_virtual_workers - 1}")


@dataclass(frozen=True)
class EpochPlan(interleave.Interleaving):
    """The plan of one epoch: shard order, each worker's reads and emission order.

    A resumed epoch plans only ``subset`` (sorted positions of the epoch's sample sequence still to
    deliver, after an elastic resume) and/or starts at ``start_step`` (after a resume with the same
    layout); steps are counted from the plan's start either way. ``version`` is the plan version
    it follows (an older one only to finish an epoch whose state was saved under it).
    """

    spec: PlanSpec
    epoch: int
    subset: Optional[np.ndarray] = field(default=None, compare=False, repr=False)
    start_step: int = 0
    version: int = PLAN_VERSION

    def __post_init__(self) -> None:
        if self.version not in RESUMABLE_PLAN_VERSIONS:
            raise ConfigError(f"plan version {self.version} is not one this dali_shards plans ({RESUMABLE_PLAN_VERSIONS})")

    # -- sizes ---------------------------------------------------------------------------
    @cached_property
    def available(self) -> int:
        """Samples this plan may deliver (the whole sequence, or the subset)."""
        return self.spec.num_samples if self.subset is None else len(self.subset)

    @cached_property
    def steps(self) -> int:
        """Batches every rank delivers under this plan (``steps_per_epoch`` for a full epoch)."""
        return geometry.steps_for(self.available, self.spec.global_batch, self.spec.last_batch)

    @cached_property
    def planned(self) -> int:
        """Samples delivered as valid under this plan, over all ranks."""
        return geometry.planned_for(self.available, self.spec.global_batch, self.spec.last_batch)

    def worker_span(self, v: int) -> Tuple[int, int]:
        """Worker ``v``'s balanced contiguous run ``[start, stop)`` of the planned samples."""
        self.spec._check_worker(v)
        return geometry.span(v, self.planned, self.spec.num_virtual_workers)

    def worker_valid_count(self, v: int) -> int:
        """Valid samples worker ``v`` emits under this plan."""
        if self.interleaving:
            self.spec._check_worker(v)
            return int(self._piece_counts[v])
        start, stop = self.worker_span(v)
        return stop - start

    def valid_mask(self, rank: int, step: int) -> np.ndarray:
        """Which slots of ``rank``'s batch at ``step`` hold real samples."""
        if not 0 <= step < self.steps:
            raise IndexError(f"step {step} outside 0..{self.steps - 1}")
        counts = [self.worker_valid_count(v) for v in self.spec.rank_workers(rank)]
        return geometry.valid_mask(counts, step, self.spec.mini_batch)

    # -- sequence ------------------------------------------------------------------------
    @cached_property
    def shard_order(self) -> np.ndarray:
        n = len(self.spec.shard_sizes)
        if self.spec.shuffle:
            return shard_permutation(n, self.spec.seed, self.epoch)
        return np.arange(n, dtype=np.int64)

    @cached_property
    def _sizes(self) -> np.ndarray:
        return np.asarray(self.spec.shard_sizes, dtype=np.int64)

    @cached_property
    def _sequence_ends(self) -> np.ndarray:
        return np.cumsum(self._sizes[self.shard_order])

    @cached_property
    def canonical_starts(self) -> np.ndarray:
        """``__index__`` of the first sample of each shard (shards in the order given)."""
        return np.concatenate([[0], np.cumsum(self._sizes)[:-1]]).astype(np.int64)

    def position(self, index: int) -> int:
        """The sequence position of the plan's ``index``-th sample."""
        return index if self.subset is None else int(self.subset[index])

    def locate(self, positions: Sequence[int] | np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """(shard, sample-in-shard) of epoch-sequence positions."""
        pos = np.asarray(positions, dtype=np.int64)
        slot = np.searchsorted(self._sequence_ends, pos, side="right")
        shard = self.shard_order[slot]
        local = pos - (self._sequence_ends[slot] - self._sizes[shard])
        return shard, local

    def canonical_index(self, positions: Sequence[int] | np.ndarray) -> np.ndarray:
        """``__index__`` of epoch-sequence positions: offset of the shard in the given order plus
        the sample's position in the tar."""
        shard, local = self.locate(positions)
        return self.canonical_starts[shard] + local

    # -- workers -------------------------------------------------------------------------
    def _valid_order(self, v: int) -> Iterator[int]:
        if self.interleaving:
            return self._interleaved_emissions(v)
        start, stop = self.worker_span(v)
        if not self.spec.shuffle:
            local: Iterator[int] = iter(range(stop - start))
        else:
            local = buffer_shuffle_order(stop - start, self.spec.shuffle_buffer, self.spec.seed, self.epoch, v)
        if self.subset is None:
            return (start + x for x in local)
        subset = self.subset
        return (int(subset[start + x]) for x in local)

    def pad_position(self, v: int) -> int:
        """The sample whose copies pad worker ``v``'s last slots: its last emitted sample, or, for
        a worker with an empty run, the sample at its run's place in the sequence."""
        if self.worker_valid_count(v):
            *_, last = self._valid_order(v)
            return last
        start = v * self.available // self.spec.num_virtual_workers
        return self.position(min(start, self.available - 1))

    def iter_worker_order(self, v: int) -> Iterator[Tuple[int, bool]]:
        """(epoch position, valid) of every slot worker ``v`` fills under this plan, from step 0."""
        count = 0
        last = None
        for pos in self._valid_order(v):
            yield pos, True
            last = pos
            count += 1
        total = self.steps * self.spec.mini_batch
        if count < total:
            pad = last if last is not None else self.pad_position(v)
            for _ in range(total - count):
                yield pad, False

    def worker_emissions(self, v: int, first: Optional[int] = None) -> List[Tuple[int, bool]]:
        """What worker ``v`` emits from slot ``first`` of its order on (default: from
        ``start_step``, what it still emits)."""
        skip = self.start_step * self.spec.mini_batch if first is None else first
        return list(itertools.islice(self.iter_worker_order(v), skip, None))

    def worker_order(self, v: int) -> Tuple[np.ndarray, np.ndarray]:
        """Arrays of epoch positions and valid flags, ``steps * mini_batch`` long (from step 0)."""
        pairs = list(self.iter_worker_order(v))
        return (
            np.fromiter((p for p, _ in pairs), dtype=np.int64, count=len(pairs)),
            np.fromiter((ok for _, ok in pairs), dtype=bool, count=len(pairs)),
        )

    def reads_covering(self, first: int, stop: int) -> List[Segment]:
        """Segments of shards covering sequence positions ``[first, stop)``, in reading order."""
        segments = []
        slot = int(np.searchsorted(self._sequence_ends, first, side="right"))
        pos = first
        while pos < stop:
            shard = int(self.shard_order[slot])
            end = int(self._sequence_ends[slot])
            begin = end - int(self._sizes[shard])
            if end > pos:
                segments.append(Segment(shard, pos - begin, min(stop, end) - begin, pos))
                pos = min(stop, end)
            slot += 1
        return segments

    def worker_reads(self, v: int) -> List[Segment]:
        """The stretch of samples worker ``v`` reads under this plan (from step 0), as segments in
        reading order: its run (its pieces, when interleaving), or the one sample it pads with if it
        has none."""
        if self.interleaving and self.worker_valid_count(v):
            return self.worker_pieces(v)
        start, stop = self.worker_span(v)
        if stop == start or self.interleaving:
            pad = self.pad_position(v)
            return self.reads_covering(pad, pad + 1)
        if self.subset is None:
            return self.reads_covering(start, stop)
        return self.reads_covering(int(self.subset[start]), int(self.subset[stop - 1]) + 1)

    def rank_batches(self, rank: int) -> Tuple[np.ndarray, np.ndarray]:
        """``__index__`` and ``__valid__`` of every slot of ``rank``'s batches under this plan (from
        step 0): two ``(steps, batch_size)`` arrays -- what that rank's pipeline delivers."""
        spec = self.spec
        if not 0 <= rank < spec.world_size:
            raise IndexError(f"rank {rank} outside 0..{spec.world_size - 1}")
        steps, m = self.steps, spec.mini_batch
        index = np.empty((steps, spec.batch_size), dtype=np.int64)
        valid = np.empty((steps, spec.batch_size), dtype=bool)
        for w in range(spec.py_num_workers):
            pos, ok = self.worker_order(spec.virtual_worker(rank, w))
            index[:, w * m : (w + 1) * m] = self.canonical_index(pos).reshape(steps, m)
            valid[:, w * m : (w + 1) * m] = ok.reshape(steps, m)
        return index, valid

    # -- progress ------------------------------------------------------------------------
    def consumed(self, steps: int, lengths: Optional[Lengths] = None) -> np.ndarray:
        """Sequence positions delivered as valid in this plan's first ``steps`` steps (all ranks).
        With bucketing, a worker stopped inside a window delivered the window's shortest-first
        mini-batches of a seeded order: ``lengths(plan, positions)`` gives the lengths of that
        window's samples (a ConfigError without it)."""
        m = self.spec.mini_batch
        out: List[int] = []
        for v in range(self.spec.num_virtual_workers):
            count = self.worker_valid_count(v)
            valid = min(count, steps * m)
            span = bucket.window_steps(self.spec.bucket_window, m) * m
            if span and valid % span and valid < count:
                out.extend(bucket.delivered(self, v, valid, span, lengths))
            else:
                out.extend(itertools.islice(self._valid_order(v), valid))
        return np.sort(np.asarray(out, dtype=np.int64))

    def remaining(self, steps: int, lengths: Optional[Lengths] = None) -> np.ndarray:
        """Sorted sequence positions of the plan's samples not delivered in its first ``steps``
        steps (``lengths``: see ``consumed``)."""
        everything = np.arange(self.spec.num_samples, dtype=np.int64) if self.subset is None else self.subset
        return np.setdiff1d(everything, self.consumed(steps, lengths), assume_unique=True)


def plan_epoch(shard_sizes: Sequence[int], *, epoch: int, **spec: Any) -> EpochPlan:
    """The plan of one epoch (see the module docstring); ``spec`` holds ``PlanSpec``'s keywords
    (``world_size``, ``py_num_workers``, ``batch_size``, ``seed``, ``shuffle``, ``last_batch``,
    ``shuffle_buffer``)."""
    return PlanSpec(tuple(shard_sizes), **spec).epoch(epoch)
