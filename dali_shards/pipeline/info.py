"""``pipe.dali_shards``: what a sharded pipeline reads and how, for the iterator and the user."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from dali_shards.catalog.manifest import ShardInfo
from dali_shards.options import OnError, ShardedOptions
from dali_shards.plan.epoch import PLAN_VERSION, EpochPlan, PlanSpec
from dali_shards.plan.resampled import StreamingSpec
from dali_shards.plan.resume import make_state
from dali_shards.pipeline.resolve import Resolved
from dali_shards.worker.control import ControlBlock
from dali_shards.worker.layout import SampleLayout


@dataclass(frozen=True, kw_only=True)
class ShardedPipelineInfo:
    """What a sharded pipeline reads and how: attached to it as ``pipe.dali_shards``.

    ``resolved`` holds the options, the world, the shards, the layout and the plan spec; a resumed
    pipeline starts at ``start_epoch`` with ``resume_plan`` (the rest of that epoch).
    ``outputs`` are the graph function's outputs and ``slot_status`` each slot's index and status
    (the iterator adds it as an output); ``rebuild(**options)`` makes the same pipeline anew.
    """

    resolved: Resolved
    rebuild: Optional[Callable[..., Any]] = field(default=None, compare=False, repr=False)
    outputs: Tuple[Any, ...] = field(default=(), compare=False, repr=False)
    slot_status: Any = field(default=None, compare=False, repr=False)
    control: Optional[ControlBlock] = field(default=None, compare=False, repr=False)
    plan_version: int = PLAN_VERSION

    @property
    def options(self) -> ShardedOptions:
        return self.resolved.options

    @property
    def spec(self) -> PlanSpec:
        return self.resolved.spec

    @property
    def rank(self) -> int:
        return self.resolved.rank

    @property
    def start_epoch(self) -> int:
        return self.resolved.start_epoch

    @property
    def shards(self) -> Tuple[ShardInfo, ...]:
        return self.resolved.shards

    @property
    def layout(self) -> SampleLayout:
        return self.resolved.layout

    @property
    def resume_plan(self) -> Optional[EpochPlan]:
        return self.resolved.resume_plan

    @property
    def on_error(self) -> OnError:
        return self.resolved.options.on_error

    @property
    def streaming(self) -> Optional[StreamingSpec]:
        """The streaming (resampled) mode's spec, None in the planned mode."""
        return self.resolved.streaming

    @property
    def steps_per_epoch(self) -> int:
        return self.spec.steps_per_epoch

    @property
    def fields(self) -> Tuple[str, ...]:
        return tuple(f.name for f in self.layout.fields)

    def plan(self, epoch: int) -> EpochPlan:
        """The plan of an epoch (the resumed plan for the epoch a resumed pipeline starts in)."""
        resumed = self.resume_plan
        if resumed is not None and resumed.epoch == epoch:
            return resumed
        return self.spec.epoch(epoch)

    def prior(self, epoch: int) -> List[Dict[str, Any]]:
        """The layouts that ran in ``epoch`` before this pipeline's plan of it."""
        resumed = self.resume_plan
        return list(self.resolved.resume_prior) if resumed is not None and resumed.epoch == epoch else []

    def state(self, epoch: int, steps: int) -> Dict[str, Any]:
        """The resumable state after ``steps`` batches of ``epoch`` (counted from its plan's step 0)."""
        return make_state(self.spec, epoch, self.prior(epoch), self.plan(epoch), steps)
