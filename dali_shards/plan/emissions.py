"""What a plan's workers emit, slot by slot, and what a rank's batches hold: the same for every
plan version, given each worker's valid emission order. Pure, no I/O, no DALI."""

from __future__ import annotations

import itertools
from functools import cached_property
from typing import TYPE_CHECKING, Any, Callable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from dali_shards.plan import bucket, geometry

if TYPE_CHECKING:
    from dali_shards.plan.epoch import PlanSpec


class Emissions:
    """Steps, slots and batches from ``available``, ``valid_order(v)``, ``worker_valid_count(v)``
    and ``pad_position(v)`` (which the plan provides, with ``spec``, ``start_step`` and
    ``canonical_index``)."""

    if TYPE_CHECKING:  # what the plan provides

        @property
        def spec(self) -> PlanSpec: ...
        @property
        def available(self) -> int: ...
        @property
        def start_step(self) -> int: ...
        def worker_valid_count(self, v: int) -> int: ...
        def valid_order(self, v: int) -> Iterator[int] | np.ndarray: ...
        def pad_position(self, v: int) -> int: ...
        def canonical_index(self, positions: Sequence[int] | np.ndarray) -> np.ndarray: ...

    @cached_property
    def steps(self) -> int:
        """Batches every rank delivers under this plan (``steps_per_epoch`` for a full epoch)."""
        return geometry.steps_for(self.available, self.spec.global_batch, self.spec.last_batch)

    @cached_property
    def planned(self) -> int:
        """Samples delivered as valid under this plan, over all ranks."""
        return geometry.planned_for(self.available, self.spec.global_batch, self.spec.last_batch)

    def iter_worker_order(self, v: int) -> Iterator[Tuple[int, bool]]:
        """(position, valid) of every slot worker ``v`` fills under this plan, from step 0: its valid
        samples, then copies of its last one (or of ``pad_position``) marked invalid."""
        pos, ok = self.worker_order(v)
        return zip(pos.tolist(), ok.tolist())

    def worker_emissions(self, v: int, first: Optional[int] = None) -> List[Tuple[int, bool]]:
        """What worker ``v`` emits from slot ``first`` of its order on (default: from
        ``start_step``, what it still emits)."""
        skip = self.start_step * self.spec.mini_batch if first is None else first
        pos, ok = self.worker_order(v)
        return list(zip(pos[skip:].tolist(), ok[skip:].tolist()))

    def worker_order(self, v: int) -> Tuple[np.ndarray, np.ndarray]:
        """Arrays of positions and valid flags, ``steps * mini_batch`` long (from step 0)."""
        count, total = self.worker_valid_count(v), self.steps * self.spec.mini_batch
        valid = self.delivered_order(v, count)
        pad = int(valid[-1]) if len(valid) else (self.pad_position(v) if total > count else 0)
        pos = np.concatenate([valid, np.full(max(0, total - count), pad, dtype=np.int64)])
        ok = np.arange(len(pos)) < count
        return pos, ok

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

    def consumed(self, steps: int, lengths: Optional[Callable[[Any, np.ndarray], np.ndarray]] = None) -> np.ndarray:
        """Positions delivered as valid in this plan's first ``steps`` steps (all ranks), sorted.
        With bucketing, a worker stopped inside a window delivered the window's shortest-first
        mini-batches of a seeded order: ``lengths(plan, positions)`` gives the lengths of that
        window's samples (a ConfigError without it)."""
        out = [self.worker_consumed(v, steps, lengths) for v in range(self.spec.num_virtual_workers)]
        return np.sort(np.concatenate(out)) if out else np.zeros(0, np.int64)

    def worker_consumed(self, v: int, steps: int, lengths: Optional[Callable[[Any, np.ndarray], np.ndarray]] = None) -> np.ndarray:
        """What worker ``v`` delivered as valid in this plan's first ``steps`` steps (see ``consumed``)."""
        m = self.spec.mini_batch
        span = bucket.window_steps(getattr(self.spec, "bucket_window", 0), m) * m
        count = self.worker_valid_count(v)
        valid = min(count, steps * m)
        if span and valid % span and valid < count:
            return np.asarray(bucket.delivered(self, v, valid, span, lengths), dtype=np.int64)
        return self.delivered_order(v, valid)

    def delivered_order(self, v: int, count: int) -> np.ndarray:
        """The first ``count`` positions of worker ``v``'s valid order."""
        order = self.valid_order(v)
        if isinstance(order, np.ndarray):
            return order[:count].astype(np.int64, copy=False)
        return np.fromiter(itertools.islice(order, count), dtype=np.int64, count=count)
