"""``RunSession``: everything a run of a sharded pipeline does between DALI and the framework that
takes its batches, framework-free: epochs and ``len()``, padding masks, ``state_dict()`` and
resume, the cross-rank plan check, the watchdog and the workers' failures (``guard.py``), a DALI
operator's failures skipped by rebuilding the pipeline (``incidents.py``), the audit
(``audit.py``). A framework's adapter (``dali_shards.pytorch``) gives it a ``Feed`` (its iterator
over DALI's outputs) and ``Ranks`` (its collectives), and turns each batch's mask into its own
types. Imports no framework and no DALI."""

from __future__ import annotations

import gc
import logging
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, TypeVar, cast

import numpy as np

from dali_shards.errors import ConfigError, WorkerError
from dali_shards.options import OnError
from dali_shards.plan.audit import EpochRecord
from dali_shards.plan.mode import Streaming
from dali_shards.session.audit import audit_epoch
from dali_shards.session.feed import STATUS_OUTPUT, Alone, Feed, Ranks, check_output_map
from dali_shards.session.guard import Guard
from dali_shards.session.incidents import SampleFailure, excluded_after, log_skips
from dali_shards.session.plancheck import check_same_plan, plan_fingerprint
from dali_shards.setup.info import ShardedPipelineInfo

log = logging.getLogger(__name__)
T = TypeVar("T")


def info_of(pipeline: Any) -> ShardedPipelineInfo:
    """The ``ShardedPipelineInfo`` of a pipeline made by ``@sharded_pipeline`` (a ``NotAPipelineError``
    saying what was given instead)."""
    info = getattr(pipeline, "dali_shards", None)
    if isinstance(info, ShardedPipelineInfo):
        return info
    from dali_shards.pipeline.decorator import pipeline_info  # DALI: only to say what else was given

    return pipeline_info(pipeline)


class RunSession:
    """One run of a sharded pipeline, epoch after epoch, whatever the framework.

    ``next()`` is the next batch as the ``feed`` gives it and which of its samples are valid (the
    padding and the skipped samples are not); ``StopIteration`` ends an epoch, and the next call
    starts the next. ``len()``, ``step``, ``epoch``, ``state_dict()``, ``load_state_dict()``,
    ``reset()``, ``audits`` and ``incidents`` are those of ``DALIShardedIterator``, which says what
    each means. The session adds an output to the pipeline (``STATUS_OUTPUT``: each slot's index and
    status) where it builds it, names the outputs ``output_map`` and checks, before its first batch,
    that every rank of ``ranks`` planned the same epoch."""

    def __init__(
        self,
        pipeline: Any,
        output_map: Sequence[str],
        feed: Feed,
        ranks: Optional[Ranks] = None,
        *,
        audit: bool = False,
    ) -> None:
        self.names = list(output_map)
        self.audit = audit
        self.audits: List[Dict[str, Any]] = []
        self.incidents: List[Dict[str, Any]] = []
        self.ranks: Ranks = ranks if ranks is not None else Alone()
        self._feed = feed
        self._last_good: Optional[int] = None  # a sample DALI took (stands in for skipped ones after a rebuild)
        self._held_plan: Optional[Tuple[int, Any]] = None  # (epoch, its plan) from before a rebuild inside it
        self._attach(pipeline)

    def _attach(self, pipeline: Any) -> None:
        info = info_of(pipeline)
        check_output_map(self.names, len(info.outputs))
        if getattr(pipeline, "_dali_shards_iterated", False):
            raise ConfigError(
                "this pipeline already feeds a DALIShardedIterator: a pipeline has one consumer. Make another "
                "pipeline (call the @sharded_pipeline function again) for a second iterator, or reuse the first one"
            )
        pipeline._dali_shards_iterated = True  # our marker on DALI's Pipeline
        if self.audit and isinstance(info.mode, Streaming):
            raise ConfigError(
                "audit=True checks exactly-once delivery, which the streaming mode (samples_per_epoch=) "
                "does not promise; give the shards' sample counts (a manifest) to audit"
            )
        self.info = info
        self.epoch = info.start_epoch
        self._step = info.plan(self.epoch).start_step
        self._record = EpochRecord()
        self._plan_checked = False
        names = list(self.names)
        self.status = not getattr(pipeline, "_built", False) and info.slot_status is not None
        if self.status:
            pipeline.set_outputs(*info.outputs, info.slot_status)
            names.append(STATUS_OUTPUT)
        elif info.on_error is OnError.SKIP or self.audit:
            raise ConfigError(
                "DALIShardedIterator needs to build the pipeline itself (it adds an output to see skipped "
                "samples and to audit): do not call pipe.build() before creating it"
            )
        keys, varying = [names[i] for i in info.key_outputs], [names[i] for i in info.varying_outputs]
        self._pipeline = pipeline
        self._guard = Guard(info, pipeline)
        self._call(pipeline.build)  # starts the workers: watch them before the first batch
        self._guard.watch(self)
        try:
            self._call(lambda: self._feed.open(pipeline, names, keys, varying))
        except SampleFailure as failure:  # in the first batch
            self._skip(failure)

    @property
    def step(self) -> int:
        """Steps of the current epoch taken so far on this rank (``DALIShardedIterator.step``)."""
        return self._step + sum(int(entry["steps"]) for entry in self.info.prior(self.epoch))

    def __len__(self) -> int:
        """Batches this session delivers in the current epoch, from where it started it."""
        plan = self._plan()
        return plan.steps - plan.start_step

    def state_dict(self) -> Dict[str, Any]:
        """Where the epoch stands: a small JSON-able dict, the same on every rank."""
        return cast(Dict[str, Any], self.info.state(self.epoch, self._step))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a ``state_dict()``: the pipeline is rebuilt to resume there."""
        self.info.resume_point(dict(state))  # refuse an incompatible state before stopping anything
        self._held_plan = None  # the epoch is the state's, counted from where it stands
        self._rebuild(state)

    def _rebuild(self, state: Mapping[str, Any]) -> None:
        rebuild = self.info.rebuild
        assert rebuild is not None  # build_sharded_pipeline gives every pipeline one
        self._guard.stop()
        self._feed.close()
        self._pipeline = None
        gc.collect()  # the old pipeline's worker processes stop when it is collected
        self._attach(rebuild(resume_from=state))

    def _skip(self, failure: SampleFailure, at_step: Optional[int] = None) -> None:
        """Go on without the samples of ``failure`` (``on_error="skip"``): the pipeline rebuilt from
        the state at the failing step (or ``at_step``), those samples excluded for the rest of the
        run; this rank alone, in the same step. The incident goes into ``incidents``."""
        started = time.perf_counter()
        # the failure's frames hold the failed pipeline (and what DALI allocated for the sample, up to
        # gigabytes for a decompression bomb): let it go before the new one starts its workers
        failure.__traceback__ = failure.__cause__ = failure.__context__ = None
        excluded = excluded_after(self.info.resolved, failure)
        if len(excluded) == len(set(self.info.resolved.excluded)):  # the same samples again: nothing to gain
            raise WorkerError(
                f"dali_shards internal error: DALI failed again on samples already skipped ({failure.samples}); "
                "please report it"
            ) from failure
        state: Dict[str, Any] = dict(self.info.state(failure.epoch, failure.step if at_step is None else at_step))
        state["excluded"] = excluded
        good = self._last_good if self._last_good is not None else failure.good
        if good is not None:  # what the workers put in the skipped samples' places: a sample DALI took
            state["stand_in"] = good
        record, checked, held = self._record, self._plan_checked, self._held_plan
        if held is None or held[0] != failure.epoch:  # len() and the audit go on counting the whole epoch
            held = (failure.epoch, self.info.plan(failure.epoch))
        self._rebuild(state)
        self._record, self._plan_checked, self._held_plan = record, checked, held  # the epoch goes on
        self.incidents.append(log_skips(failure, time.perf_counter() - started))

    def next(self) -> Tuple[Any, np.ndarray]:
        """The next batch of the epoch, as the feed gives it, and a bool array saying which of its
        samples are valid; ``StopIteration`` at the epoch's end (the next call starts the next)."""
        self._check_plan()
        while True:
            try:
                batch, status = self._call(self._feed.next)
                break
            except StopIteration:
                self._end_epoch()
                raise
            except SampleFailure as failure:
                self._skip(failure)
        step = self._step
        self._step += 1
        return batch, self._mask(status, step)

    def _check_plan(self) -> None:
        """Before the first batch: every rank planned the same epoch (``plancheck.py``)."""
        if self._plan_checked:
            return
        self._plan_checked = True
        summary = lambda: plan_fingerprint(self.state_dict(), len(self), self.info.spec, self.info.rank)  # noqa: E731
        check_same_plan(self.ranks, self.info.spec.world_size, summary, self._pipeline.device_id)

    def loop(self) -> None:
        """Where a new loop starts: the current epoch where it stands (after every batch of an epoch
        was taken, the next epoch)."""
        if self._step >= self._plan().steps:
            self.reset()

    def reset(self) -> None:
        """Leave the current epoch and get ready for the next one; nothing to do at its start. The
        batches the workers may already have prepared are read and discarded."""
        plan = self._plan()
        if self._step == plan.start_step:
            return
        delivered, steps = self._step - plan.start_step, plan.steps - plan.start_step
        end = self._cut_short(delivered, steps)
        while True:  # read and discard what is left: at most ``end - delivered`` batches
            try:
                self._call(self._feed.next)
                self._step += 1
            except StopIteration:
                break
            except SampleFailure as failure:  # in a batch to discard: start the next epoch without it
                self._skip(failure, at_step=plan.steps)  # (the state at an epoch's end: the next one's start)
                self._record = EpochRecord()
                return
        if delivered < steps:
            log.info("dali_shards: epoch %d left after %d of %d batches", self.epoch, delivered, steps)
        if end is not None:
            self._check_cut(end)
        self._end_epoch(audit=delivered >= steps)

    def _cut_short(self, delivered: int, steps: int) -> Optional[int]:
        """Tell the workers to end the epoch after ``delivered`` plus what they may already have
        prepared; the step they end at, or None where that is the epoch's end anyway."""
        control = self.info.control
        if control is None:
            return None
        end = delivered + self.info.transfer.in_flight(self._pipeline)
        if end >= steps:
            return None
        control.cut(self.epoch, end)
        return end

    def _check_cut(self, end: int) -> None:
        control = self.info.control
        assert control is not None  # _cut_short cut the epoch through it
        steps = {w.worker: w.step for w in control.snapshot() if w.epoch == self.epoch}
        if any(step != end for step in steps.values()):
            raise WorkerError(
                f"dali_shards internal error: the workers of rank {self.info.rank} ended epoch {self.epoch} at steps "
                f"{steps} instead of {end}; please report it. Restart from the last state_dict() to go on"
            )

    def _end_epoch(self, audit: bool = True) -> None:
        if self.audit and audit:
            self.audits.append(audit_epoch(self.info, self.epoch, self._plan(), self._record, self.ranks))
        self._call(self._feed.reset)  # waits for the next epoch's first batches
        self.epoch += 1
        self._step = self.info.plan(self.epoch).start_step
        self._record = EpochRecord()

    def _plan(self) -> Any:
        """The current epoch's plan from where this session started it (a rebuild after a skipped
        sample starts a pipeline in the middle of it)."""
        held = self._held_plan
        return held[1] if held is not None and held[0] == self.epoch else self.info.plan(self.epoch)

    def _call(self, call: Callable[[], T]) -> T:
        """A call into DALI, its failures said in our words (``guard.py``)."""
        step = self._step + (1 if self._feed.fetched_ahead() else 0)  # the batch it fetches (the first: ahead)
        return self._guard.call(call, self.epoch, step, self._last_good)

    def _mask(self, status: Optional[np.ndarray], step: int) -> np.ndarray:
        """Which samples of the batch at ``step`` are valid: from the status output where the session
        added it (a sample DALI took noted, the audit's record kept), else from the plan."""
        if status is None:
            return self.info.plan(self.epoch).valid_mask(self.info.rank, step)
        rows = status.reshape(-1, 2)
        mask = rows[:, 1] == 1
        if mask.any():
            self._last_good = int(rows[mask, 0][-1])
        if self.audit:
            self._record.add(rows[mask, 0], rows[rows[:, 1] == -1, 0])
        return mask
