"""``pipe.dali_shards``: what a sharded pipeline reads and how, for the iterator and the user."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from dali_shards.options import OnError
from dali_shards.plan.mixture import MixSpec
from dali_shards.plan.resume import Plan, draws_left, epoch_plan, make_state, resume_point
from dali_shards.plan.statecheck import State
from dali_shards.setup.resolve import Resolved
from dali_shards.ipc.control import ControlBlock
from dali_shards.transfer.base import Handover


def _resolved(name: str, doc: str = "") -> Any:
    """A read-only attribute of the info that is the resolved pipeline's attribute ``name``."""
    return property(lambda self: getattr(self.resolved, name), doc=doc or f"``resolved.{name}``")


@dataclass(frozen=True, kw_only=True)
class ShardedPipelineInfo:
    """What a sharded pipeline reads and how: attached to it as ``pipe.dali_shards``.

    ``resolved`` holds the options, the world, the shards, the packing and the plan spec; a resumed
    pipeline starts at ``start_epoch`` with ``resume_plan`` (the rest of that epoch).
    ``outputs`` are the graph function's outputs and ``slot_status`` each slot's index and status
    (the iterator adds it as an output); ``key_outputs`` the positions of the outputs that are
    the ``__key__`` field as it comes (the iterator gives them as strings), ``varying_outputs`` those
    that are a bytes field as it comes (ragged unless ``ragged_outputs`` says otherwise); ``rebuild(**options)`` makes the same pipeline anew;
    ``transfer`` brings the workers' samples to the pipeline (``dali_shards.transfer.base.Handover``); ``probe(packing)``
    runs chosen samples through the same definition (``pipeline/probe.py``).
    """

    resolved: Resolved
    transfer: Handover = field(compare=False, repr=False)
    rebuild: Optional[Callable[..., Any]] = field(default=None, compare=False, repr=False)
    outputs: Tuple[Any, ...] = field(default=(), compare=False, repr=False)
    slot_status: Any = field(default=None, compare=False, repr=False)
    key_outputs: Tuple[int, ...] = field(default=(), compare=False, repr=False)
    varying_outputs: Tuple[int, ...] = field(default=(), compare=False, repr=False)
    control: Optional[ControlBlock] = field(default=None, compare=False, repr=False)
    probe: Optional[Callable[..., Any]] = field(default=None, compare=False, repr=False)  # Packing -> pipeline.probe.Probe

    # the resolved pipeline's options, spec (PlanSpec), rank, start_epoch, shards (a Catalog: ShardInfo views),
    # packing, resume_plan and mode, as attributes
    options = _resolved("options")
    spec = _resolved("spec", "the plan spec steps, masks and states follow")
    mode = _resolved("mode", "how epochs are delivered: ``plan.mode.Planned`` or ``Streaming``")
    rank = _resolved("rank")
    start_epoch = _resolved("start_epoch")
    shards = _resolved("shards")
    packing = _resolved("packing")
    resume_plan = _resolved("resume_plan")

    @property
    def plan_version(self) -> int:
        """The plan version of the epoch the pipeline starts in (an older one only to finish an
        epoch whose state was saved under it; the epochs after it follow ``PLAN_VERSION``)."""
        return self.plan(self.start_epoch).version

    @property
    def mixture(self) -> Optional[MixSpec]:
        """A mix's streams and their draws per epoch (None: one dataset)."""
        return self.spec.mixture

    @property
    def on_error(self) -> OnError:
        return self.resolved.options.on_error

    @property
    def steps_per_epoch(self) -> int:
        return self.spec.steps_per_epoch

    @property
    def fields(self) -> Tuple[str, ...]:
        return tuple(f.name for f in self.packing.fields)

    def plan(self, epoch: int) -> Plan:
        """The plan of an epoch (the resumed plan for the epoch a resumed pipeline starts in)."""
        return epoch_plan(self.spec, self.resume_plan, epoch)

    def prior(self, epoch: int) -> List[Dict[str, Any]]:
        """The layouts that ran in ``epoch`` before this pipeline's plan of it."""
        resumed = self.resume_plan
        return list(self.resolved.resume_prior) if resumed is not None and resumed.epoch == epoch else []

    def resume_point(self, state: Dict[str, Any]) -> Tuple[int, Optional[Plan], List[Dict[str, Any]]]:
        """Where this pipeline would resume ``state`` (a ConfigError if it cannot). A check: where a
        bucketed layout stopped inside a window, which samples it delivered is left undecided."""
        lengths = _any_lengths if self.options.bucket_by is not None else None
        return resume_point(self.spec, state, self.resolved.dataset, lengths)

    def draws_left(self, epoch: int) -> Optional[np.ndarray]:
        """The draws of ``epoch`` that the state this pipeline resumed had left (``resume.draws_left``,
        for the audit's check of the resumed plan); None where the pipeline did not resume in it."""
        resumed, state = self.resume_plan, self.options.resume_from
        if resumed is None or resumed.epoch != epoch or state is None:
            return None
        return draws_left(self.spec, dict(state), self.resolved.dataset, self.resolved.lengths)

    def state(self, epoch: int, steps: int) -> State:
        """The resumable state after ``steps`` batches of ``epoch`` (counted from its plan's step 0)."""
        resolved = self.resolved
        return make_state(self.spec, epoch, self.prior(epoch), self.plan(epoch), steps, resolved.dataset, resolved.excluded)


def _any_lengths(plan: Plan, positions: np.ndarray) -> np.ndarray:
    """Lengths that decide nothing: enough to check that a state can be resumed, not to resume it."""
    return np.zeros(len(positions), dtype=np.int64)
