"""The two ways a pipeline delivers an epoch, as one tagged type every consumer dispatches on once:

- ``Planned``: the shards' sample counts are known, and every epoch delivers every sample exactly
  once, as ``spec`` (a ``PlanSpec``) plans it; a resumed pipeline's first epoch is ``resume_plan``.
- ``Streaming`` (``samples_per_epoch``): counts are not needed; each worker draws from an endless
  pass over its own shards (``spec``, a ``StreamingSpec``). Its steps, valid masks and resume
  states follow ``steps``, a plan of the same steps in which every slot is valid; a resumed
  pipeline's first epoch is ``first_steps`` long.

Both give ``steps_spec``: the ``PlanSpec`` that steps, masks and states follow. Pure, no DALI.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional, Union

from dali_shards.plan.epoch import PlanSpec
from dali_shards.plan.resume import Plan
from dali_shards.plan.streaming import StreamingSpec


@dataclass(frozen=True)
class Planned:
    """Every sample exactly once per epoch (see the module)."""

    spec: PlanSpec
    resume_plan: Optional[Plan] = None
    kind: ClassVar[str] = "planned"

    @property
    def steps_spec(self) -> PlanSpec:
        return self.spec


@dataclass(frozen=True)
class Streaming:
    """Samples drawn from an endless stream over each worker's shards (see the module)."""

    spec: StreamingSpec
    steps: PlanSpec
    first_steps: Optional[int] = None
    kind: ClassVar[str] = "streaming"

    @property
    def steps_spec(self) -> PlanSpec:
        return self.steps


Mode = Union[Planned, Streaming]
