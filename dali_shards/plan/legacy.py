"""Plans of versions 3 and 4, kept to finish an epoch whose resume state was saved under one of
them (the interleaved planner of ``interleave``: each rank's piece of every shard). New epochs are
planned by ``epoch.EpochPlan`` (version 6, and 5 to finish an epoch saved under it). Pure, no I/O, no DALI."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Collection, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from dali_shards.errors import ConfigError
from dali_shards.plan import geometry, legacy_interleave
from dali_shards.plan.emissions import Emissions
from dali_shards.plan.epoch import Lengths, PlanSpec
from dali_shards.plan.geometry import Stretch
from dali_shards.plan.random import buffer_shuffle_order, shard_permutation

LEGACY_VERSIONS = (3, 4)


@dataclass(frozen=True)
class LegacyPlan(Emissions, legacy_interleave.Interleaving):
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
    version: int = LEGACY_VERSIONS[-1]

    def __post_init__(self) -> None:
        if self.version not in LEGACY_VERSIONS:
            raise ConfigError(f"plan version {self.version} is not one this module plans ({LEGACY_VERSIONS})")

    # -- sizes ---------------------------------------------------------------------------
    @cached_property
    def available(self) -> int:
        """Samples this plan may deliver (the whole sequence, or the subset)."""
        return self.spec.num_samples if self.subset is None else len(self.subset)

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
    def valid_order(self, v: int) -> Iterator[int]:
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
            *_, last = self.valid_order(v)
            return last
        start = v * self.available // self.spec.num_virtual_workers
        return self.position(min(start, self.available - 1))

    def reads_covering(self, first: int, stop: int) -> List[Stretch]:
        """Segments of shards covering sequence positions ``[first, stop)``, in reading order."""
        segments = []
        slot = int(np.searchsorted(self._sequence_ends, first, side="right"))
        pos = first
        while pos < stop:
            shard = int(self.shard_order[slot])
            end = int(self._sequence_ends[slot])
            begin = end - int(self._sizes[shard])
            if end > pos:
                segments.append(Stretch(shard, pos - begin, min(stop, end) - begin, pos))
                pos = min(stop, end)
            slot += 1
        return segments

    def reads_of(self, v: int, positions: Collection[int]) -> List[Stretch]:
        """The segments covering ``positions`` (of worker ``v``), in reading order."""
        wanted = list(positions)
        return self.reads_covering(min(wanted), max(wanted) + 1) if wanted else []

    def worker_reads(self, v: int) -> List[Stretch]:
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

    def remaining(self, steps: int, lengths: Optional[Lengths] = None) -> np.ndarray:
        """Sorted sequence positions of the plan's samples not delivered in its first ``steps``
        steps (``lengths``: see ``consumed``)."""
        everything = np.arange(self.spec.num_samples, dtype=np.int64) if self.subset is None else self.subset
        return np.setdiff1d(everything, self.consumed(steps, lengths), assume_unique=True)
