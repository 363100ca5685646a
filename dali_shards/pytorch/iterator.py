"""PyTorch iterator for ``@sharded_pipeline`` pipelines."""

from __future__ import annotations

import gc
import logging
import weakref
from typing import Any, Dict, List, Literal, Mapping, Optional, Sequence, cast

import numpy as np
import torch
from nvidia.dali.pipeline import Pipeline
from nvidia.dali.plugin.pytorch import DALIGenericIterator

from dali_shards.plan.audit import EpochRecord, check_plan, expected_indices, gather, lost_shards, summarize
from dali_shards.pytorch.plancheck import check_same_plan, plan_summary
from dali_shards.errors import ConfigError, WorkerError
from dali_shards.pipeline.decorator import pipeline_info
from dali_shards.plan.mode import Streaming
from dali_shards.supervise import Watchdog
from dali_shards.pytorch.failures import guarded
from dali_shards.pytorch.incidents import SampleFailure, skip
from dali_shards.pytorch.outputs import STATUS_OUTPUT, BatchOutputs, check_output_map, device_of, select

log = logging.getLogger(__name__)


class DALIShardedIterator(DALIGenericIterator):
    """A ``DALIGenericIterator`` for one sharded pipeline that knows its epoch.

    - ``len(it)`` is the number of batches this iterator delivers in the current epoch from where
      it started it: the steps per epoch, identical on every rank (after a resume in the middle of
      an epoch: what is left of it).
    - Padding slots (``last_batch="pad"``) and samples skipped with ``on_error="skip"`` are removed
      from the batches by default, so every sample of an epoch is seen exactly once over all ranks;
      with ``keep_padding=True`` the batches keep their full size and carry a bool mask under
      ``mask_name`` instead.
    - Epochs follow one another without manual resets: after ``StopIteration`` the next
      ``next()`` starts the next epoch (with its new shuffle). A new loop (``iter()``) over an
      iterator in the middle of an epoch continues that epoch, as DALI's iterators do; only
      ``reset()`` leaves it early. ``reset()`` costs about the prefetch depth: the workers are
      told to end the epoch a few batches on, and those are read and discarded.
    - ``state_dict()`` is a small JSON-able dict saying where the epoch stands (the same on every
      rank); ``load_state_dict()`` restarts the pipeline there (the same epoch under the same
      layout, the samples not yet delivered planned anew under another). It restarts the worker
      processes: with ``transfer="merge"`` do it before CUDA is initialised, or use
      ``py_start_method="spawn"``, or pass the state to the pipeline itself
      (``train(resume_from=state)``).
    - With ``audit=True`` each finished epoch is checked: ``it.audits`` gets a report of
      duplicates, missing and skipped samples and steps per rank (gathered from every rank under
      ``torch.distributed``; this rank's part otherwise). Epochs left early are not audited.
    - Under ``torch.distributed`` with the pipeline's world size, the first ``next()`` checks (one
      small all-gather) that every rank planned the same epoch, and raises a ``ConfigError`` on
      every rank if not, instead of a hang in the next collective.
    - A worker's error is raised as the ``ShardError`` it was; a worker that dies, or makes no
      progress for ``worker_timeout`` while the iterator waits, raises a ``WorkerError`` saying
      which and where. When any exception (Ctrl-C included) escapes a call into DALI, the
      pipeline's workers are killed first, so that exit never waits on them. A sample a DALI
      operator fails on is named (``on_error="raise"``) or left out, the pipeline rebuilt at that
      step (``"skip"``; ``incidents`` lists each incident; see ``incidents.py``).

    The iterator adds one small output to the pipeline (each slot's index and status) when it
    builds it, to see padding and skipped samples; hand it a pipeline that is not built yet.
    Each ``next()`` returns a list with one dict, like ``DALIGenericIterator``, from each name of
    ``output_map`` (one name per output of the pipeline function, in order) to: for a *ragged*
    output, a list of per-sample tensors (``ragged="list"``) or one zero-padded tensor with the
    samples' shapes under ``<name>_shape`` (``ragged="pad"``); a list of ``str`` for the
    ``__key__`` field; one tensor for every other output. Each output's type is the same in every
    batch: the ragged outputs are those named in ``ragged_outputs``, or where it is None, the bytes
    fields the function returns as they come (a member's, a ``map``'s bytes). Every other output is
    dense (arrays from ``.npy`` members or a ``map`` too: name those that vary, such as boxes); one
    whose samples turn out to differ in shape is a ``RaggedOutputError`` saying how to declare it
    (see ``dali_shards.pytorch.outputs``). ``dynamic_shape`` and ``prepare_first_batch`` are
    ``DALIGenericIterator``'s (the first is ignored by DALI; the second fetches the first batch
    when the iterator is made). ``epoch`` is the epoch the next batch belongs to.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        output_map: Sequence[str],
        *,
        keep_padding: bool = False,
        mask_name: str = "__valid__",
        audit: bool = False,
        ragged: Literal["list", "pad"] = "list",
        ragged_outputs: Optional[Sequence[str]] = None,
        dynamic_shape: bool = False,
        prepare_first_batch: bool = True,
    ) -> None:
        if keep_padding and mask_name in output_map:
            raise ConfigError(f"mask_name {mask_name!r} clashes with an output name; choose another")
        BatchOutputs.check(ragged, output_map, ragged_outputs or ())
        self.ragged = ragged
        self.ragged_outputs = None if ragged_outputs is None else tuple(ragged_outputs)
        self.keep_padding = keep_padding
        self.mask_name = mask_name
        self.audit = audit
        self.audits: List[Dict] = []
        self.incidents: List[Dict[str, Any]] = []
        self._last_good: Optional[int] = None  # a sample DALI took (stands in for skipped ones after a rebuild)
        self._held_plan: Optional[tuple] = None  # (epoch, its plan) from before a rebuild inside it
        self._output_names = list(output_map)
        self._iterator_options: Dict[str, Any] = dict(
            dynamic_shape=dynamic_shape, prepare_first_batch=prepare_first_batch
        )
        self._attach(pipeline)

    def _attach(self, pipeline: Pipeline) -> None:
        self.info = pipeline_info(pipeline)
        check_output_map(self._output_names, len(self.info.outputs))
        if getattr(pipeline, "_dali_shards_iterated", False):
            raise ConfigError(
                "this pipeline already feeds a DALIShardedIterator: a pipeline has one consumer. Make another "
                "pipeline (call the @sharded_pipeline function again) for a second iterator, or reuse the first one"
            )
        pipeline._dali_shards_iterated = True  # type: ignore[attr-defined]  # our marker on DALI's Pipeline
        if self.audit and isinstance(self.info.mode, Streaming):
            raise ConfigError(
                "audit=True checks exactly-once delivery, which the streaming mode (samples_per_epoch=) "
                "does not promise; give the shards' sample counts (a manifest) to audit"
            )
        self.epoch = self.info.start_epoch
        self._step = self.info.plan(self.epoch).start_step
        self._record = EpochRecord()
        self._plan_checked = False
        names = list(self._output_names)
        self._status = not getattr(pipeline, "_built", False) and self.info.slot_status is not None
        if self._status:
            pipeline.set_outputs(*self.info.outputs, self.info.slot_status)
            names.append(STATUS_OUTPUT)
        elif self.info.on_error == "skip" or self.audit:
            raise ConfigError(
                "DALIShardedIterator needs to build the pipeline itself (it adds an output to see skipped "
                "samples and to audit): do not call pipe.build() before creating it"
            )
        keys = [names[i] for i in self.info.key_outputs]
        ragged = self.ragged_outputs
        if ragged is None:  # the outputs that may vary, as the pipeline function passes them on
            ragged = tuple(names[i] for i in self.info.varying_outputs)
        self._outputs = BatchOutputs(names, keys, self.ragged, ragged)
        self._pipeline: Optional[Pipeline] = pipeline
        self._watchdog: Optional[Watchdog] = None
        self._guarded(pipeline.build)  # starts the workers: watch them before the first batch
        self._watch(pipeline)
        try:
            self._guarded(
                lambda: DALIGenericIterator.__init__(
                    self, [pipeline], names, size=-1, auto_reset=False, **self._iterator_options
                )
            )
        except SampleFailure as failure:  # in the first batch
            self._skip(failure)

    def _watch(self, pipeline: Pipeline) -> None:
        """Watch the started workers: for death, and (with a control block) for a stop in progress."""
        self.info.transfer.watch()
        control = getattr(self.info, "control", None)
        if control is not None:
            urls = [s.url for s in self.info.shards]
            self._watchdog = Watchdog(control, self.info.transfer.pids(), urls, self.info.rank)
            weakref.finalize(self, self._watchdog.stop)

    def _get_outputs(self) -> List[List[Any]]:
        """DALI's outputs of the next batch, those PyTorch cannot take as they are (ragged, keys,
        unsigned types) converted here and kept for ``__next__`` (see ``torch_outputs``)."""
        return [self._outputs.prepare(outs) for outs in DALIGenericIterator._get_outputs(self)]

    @property
    def step(self) -> int:
        """Steps of the current epoch taken so far on this rank: the batches returned, and those the
        runs its ``resume_from`` state came from took in that epoch (after a resume under the same
        layout, the state's step; under another layout, the steps of the layouts before it, then
        on). It never goes back within an epoch; ``len(it)`` counts the batches this iterator
        delivers in the epoch from where it started it."""
        return self._step + sum(int(entry["steps"]) for entry in self.info.prior(self.epoch))

    def __len__(self) -> int:
        """Batches this iterator delivers in the current epoch, from where it started it: the steps
        per epoch, or what was left of the epoch it resumed in."""
        plan = self._plan()
        return plan.steps - plan.start_step

    def state_dict(self) -> Dict[str, Any]:
        """Where the epoch stands: a small JSON-able dict, the same on every rank (its fields:
        ``dali_shards.plan.statecheck.State``)."""
        return cast(Dict[str, Any], self.info.state(self.epoch, self._step))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a ``state_dict()``: the pipeline is rebuilt to resume there."""
        self.info.resume_point(dict(state))  # refuse an incompatible state before stopping anything
        self._rebuild(state)

    def _rebuild(self, state: Mapping[str, Any]) -> None:
        rebuild = self.info.rebuild
        assert rebuild is not None  # build_sharded_pipeline gives every pipeline one
        if self._watchdog is not None:
            self._watchdog.stop()
        self._pipes = []
        self._pipeline = None
        self._first_batch = None
        gc.collect()  # the old pipeline's worker processes stop when it is collected
        self._attach(rebuild(resume_from=state))

    def _skip(self, failure: SampleFailure, at_step: Optional[int] = None) -> None:
        """Go on without the samples a DALI operator failed on (``incidents.skip``)."""
        skip(self, failure, at_step)

    def __next__(self) -> List[Dict[str, Any]]:
        if not self._plan_checked:
            self._plan_checked = True
            summary = lambda: plan_summary(self.state_dict(), len(self), self.info.spec, self.info.rank)  # noqa: E731
            assert self._pipeline is not None  # set by _attach
            check_same_plan(self.info.spec.world_size, summary, self._pipeline.device_id)
        while True:
            try:
                batches = self._guarded(lambda: DALIGenericIterator.__next__(self))
                break
            except StopIteration:
                self._end_epoch()
                raise
            except SampleFailure as failure:
                self._skip(failure)
        step = self._step
        self._step += 1
        return [self._apply_mask(self._outputs.finish(batches[0]), step)]

    def __iter__(self) -> "DALIShardedIterator":
        """The iterator itself: a loop continues the current epoch where it stands (after every
        batch of an epoch was taken, the next epoch)."""
        if self._step >= self._plan().steps:
            self.reset()
        return self

    def reset(self) -> None:
        """Leave the current epoch and get ready for the next one; nothing to do at its start.

        The workers are told to end the epoch after the batches they may already have prepared
        (about ``prefetch_queue_depth + worker_prefetch + 1``); those are read and discarded. The
        next epochs, and states saved in them, are whole and exactly once as ever."""
        plan = self._plan()
        if self._step == plan.start_step:
            return
        delivered, steps = self._step - plan.start_step, plan.steps - plan.start_step
        end = self._cut_short(delivered, steps)
        while True:  # read and discard what is left: at most ``end - delivered`` batches
            try:
                self._outputs.finish(self._guarded(lambda: DALIGenericIterator.__next__(self))[0])
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
        control = getattr(self.info, "control", None)
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
            self._finish_audit()
        self._guarded(lambda: DALIGenericIterator.reset(self))  # waits for the next epoch's first batches
        self.epoch += 1
        self._step = self.info.plan(self.epoch).start_step
        self._record = EpochRecord()

    def _finish_audit(self) -> None:
        plan = self._plan()
        ranks = gather(self._record)
        lengths = self.info.resolved.lengths
        if ranks is None:  # this rank alone: compare with its own share of the plan
            ranks, expected = [self._record.as_tuple()], expected_indices(plan, lengths, self.info.rank)
        else:
            expected = expected_indices(plan, lengths)
        # a resumed epoch: its plan against the draws left, found without re-planning
        left = self.info.draws_left(self.epoch) if plan is self.info.resume_plan else None
        checked = None if left is None else check_plan(plan, left, lengths)
        stream_of = self.info.packing.stream_of if self.info.mixture is not None else None
        report = summarize(self.epoch, ranks, expected, lost_shards(self.info.shards), stream_of, checked)
        report["rank"] = self.info.rank if len(ranks) == 1 else None
        self.audits.append(report)
        if not report["exactly_once"]:
            log.warning("dali_shards: audit of epoch %d: %s", self.epoch, report)

    def _plan(self) -> Any:
        """The current epoch's plan from where this iterator started it (a rebuild after a skipped
        sample starts a pipeline in the middle of it)."""
        held = self._held_plan
        return held[1] if held is not None and held[0] == self.epoch else self.info.plan(self.epoch)

    def _guarded(self, call):
        """Run a DALI call, its failures said in our words (``failures.guarded``)."""
        return guarded(self, call)

    def _fetching_step(self) -> int:
        """The step of the batch a DALI call in progress fetches (the first batch is fetched ahead)."""
        return self._step + (1 if getattr(self, "_first_batch", None) is not None else 0)  # fetched ahead by DALI

    def _apply_mask(self, batch: Dict[str, Any], step: int) -> Dict[str, Any]:
        if self._status:
            status = batch.pop(STATUS_OUTPUT).to("cpu").reshape(-1, 2).numpy()
            mask = status[:, 1] == 1
            if mask.any():
                self._last_good = int(status[mask, 0][-1])
            if self.audit:
                self._record.add(status[mask, 0], status[status[:, 1] == -1, 0])
        else:
            mask = self.info.plan(self.epoch).valid_mask(self.info.rank, step)
        if self.keep_padding:
            batch[self.mask_name] = torch.from_numpy(mask).to(device_of(batch))
            return batch
        if mask.all():
            return batch
        return select(batch, np.flatnonzero(mask))
