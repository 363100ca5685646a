"""PyTorch iterator for ``@sharded_pipeline`` pipelines."""

from __future__ import annotations

import gc
import logging
import multiprocessing.connection
import threading
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch
from nvidia.dali.pipeline import Pipeline
from nvidia.dali.plugin.pytorch import DALIGenericIterator

from .audit import EpochRecord, expected_indices, gather, summarize
from .errors import ConfigError, WorkerError, from_worker
from .pipeline import pipeline_info
from .resume import resume_point

log = logging.getLogger(__name__)
STATUS_OUTPUT = "__dali_shards_status__"


class DALIShardedIterator(DALIGenericIterator):
    """A ``DALIGenericIterator`` for one sharded pipeline that knows its epoch.

    - ``len(it)`` is the number of steps per epoch, identical on every rank.
    - Padding slots (``last_batch="pad"``) and samples skipped with ``on_error="skip"`` are removed
      from the batches by default, so every sample of an epoch is seen exactly once over all ranks;
      with ``keep_padding=True`` the batches keep their full size and carry a bool mask under
      ``mask_name`` instead.
    - Epochs follow one another without manual resets: after ``StopIteration`` the next
      ``next()`` starts the next epoch (with its new shuffle). ``reset()`` or a new ``iter()``
      in the middle of an epoch finishes that epoch first (the rest is read and discarded), so
      the workers never fall out of step with the plan.
    - ``state_dict()`` is a small JSON-able dict saying where the epoch stands (the same on every
      rank); ``load_state_dict()`` restarts the pipeline there. To resume under the same ranks and
      workers, the epoch continues exactly as it would have; under others, the samples not yet
      delivered are planned over the new layout. Loading a state restarts the pipeline's worker
      processes: do it before CUDA is initialised, or use ``py_start_method="spawn"``, or pass
      the state to the pipeline itself (``train(resume_from=state)``).
    - With ``audit=True`` each finished epoch is checked: ``it.audits`` gets a report of
      duplicates, missing and skipped samples and steps per rank (gathered from every rank under
      ``torch.distributed``; this rank's part otherwise).
    - A worker's error is raised as the ``ShardError`` it was (naming the shard and sample); a
      worker that dies raises a ``WorkerError`` saying so, instead of DALI's bare message.

    The iterator adds one small output to the pipeline (each slot's index and status) when it
    builds it, to see padding and skipped samples; hand it a pipeline that is not built yet.
    Each ``next()`` returns a list with one dict (name -> tensor), like ``DALIGenericIterator``.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        output_map: Sequence[str],
        *,
        keep_padding: bool = False,
        mask_name: str = "__valid__",
        audit: bool = False,
        dynamic_shape: bool = False,
        prepare_first_batch: bool = True,
    ):
        if keep_padding and mask_name in output_map:
            raise ValueError(f"mask_name {mask_name!r} clashes with an output name; choose another")
        self.keep_padding = keep_padding
        self.mask_name = mask_name
        self.audit = audit
        self.audits: List[Dict] = []
        self._output_names = list(output_map)
        self._iterator_options = dict(dynamic_shape=dynamic_shape, prepare_first_batch=prepare_first_batch)
        self._attach(pipeline)

    def _attach(self, pipeline: Pipeline) -> None:
        self.info = pipeline_info(pipeline)
        if self.audit and self.info.streaming is not None:
            raise ValueError(
                "audit=True checks exactly-once delivery, which the streaming mode (samples_per_epoch=) "
                "does not promise; give the shards' sample counts (a manifest) to audit"
            )
        self.epoch = self.info.start_epoch
        self._step = self.info.plan(self.epoch).start_step
        self._record = EpochRecord()
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
        self._pipeline = pipeline
        self._guarded(
            lambda: DALIGenericIterator.__init__(
                self, [pipeline], names, size=-1, auto_reset=False, **self._iterator_options
            )
        )
        _WorkerWatch.start(pipeline)

    @property
    def step(self) -> int:
        """Batches of the current epoch returned so far (after a resume with the same layout, those
        returned before the save included)."""
        return self._step

    def __len__(self) -> int:
        """Batches in the current epoch (after an elastic resume: in what was left of it)."""
        return self.info.plan(self.epoch).steps

    def state_dict(self) -> Dict:
        """Where the epoch stands: a small JSON-able dict, the same on every rank."""
        return self.info.state(self.epoch, self._step)

    def load_state_dict(self, state: Dict) -> None:
        """Continue from a ``state_dict()``: the pipeline is rebuilt to resume there."""
        resume_point(self.info.spec, state)  # refuse an incompatible state before stopping anything
        rebuild = self.info.rebuild
        self._pipes = []
        self._pipeline = None
        self._first_batch = None
        gc.collect()  # the old pipeline's worker processes stop when it is collected
        self._attach(rebuild(resume_from=state))

    def __next__(self) -> List[Dict[str, torch.Tensor]]:
        try:
            batches = self._guarded(lambda: DALIGenericIterator.__next__(self))
        except StopIteration:
            self._end_epoch()
            raise
        step = self._step
        self._step += 1
        return [self._apply_mask(batches[0], step)]

    def __iter__(self) -> "DALIShardedIterator":
        if self._step > self.info.plan(self.epoch).start_step:
            self.reset()
        return self

    def reset(self) -> None:
        """Finish the current epoch (reading and discarding what is left of it) and get ready for
        the next one. Does nothing at the start of an epoch."""
        if self._step == self.info.plan(self.epoch).start_step:
            return
        left = 0
        while True:
            try:
                self._guarded(lambda: DALIGenericIterator.__next__(self))
            except StopIteration:
                break
            left += 1
        if left:
            log.warning("dali_shards: epoch %d abandoned with %d of %d batches unread", self.epoch, left, len(self))
        self._end_epoch()

    def _end_epoch(self) -> None:
        if self.audit:
            self._finish_audit()
        DALIGenericIterator.reset(self)
        self.epoch += 1
        self._step = self.info.plan(self.epoch).start_step
        self._record = EpochRecord()

    def _finish_audit(self) -> None:
        plan = self.info.plan(self.epoch)
        ranks = gather(self._record)
        if ranks is None:  # this rank alone: compare with its own share of the plan
            ranks, expected = [self._record.as_tuple()], _rank_expected(plan, self.info.rank)
        else:
            expected = expected_indices(plan)
        report = summarize(self.epoch, ranks, expected)
        report["rank"] = self.info.rank if len(ranks) == 1 else None
        self.audits.append(report)
        if not report["exactly_once"]:
            log.warning("dali_shards: audit of epoch %d: %s", self.epoch, report)

    def _guarded(self, call):
        """Run a DALI call; turn worker failures into errors that say what happened.

        A worker that died is looked for before the call too: DALI would block forever handing
        the dead worker its next task (its queue's lock dies with it)."""
        dead = _dead_workers(self._pipeline)
        if dead:
            raise self._worker_error(dead)
        try:
            return call()
        except StopIteration:
            raise
        except Exception as exc:  # DALI re-raises worker errors as plain Exception/RuntimeError
            ours = from_worker(exc)
            if ours is not None:
                raise ours from exc
            dead = _dead_workers(self._pipeline)
            if dead or "Worker data receiving interrupted" in str(exc):
                raise self._worker_error(dead) from exc
            raise

    def _worker_error(self, dead) -> WorkerError:
        codes = ", ".join(f"pid {pid}: {_describe_exit(code)}" for pid, code in dead) or "unknown"
        return WorkerError(
            f"a dali_shards worker process of rank {self.info.rank} stopped ({codes}). If it was killed for "
            "memory, lower shuffle_buffer or batch_size; otherwise see the worker's output above. Restart from "
            "the last state_dict() to continue the epoch"
        )

    def _apply_mask(self, batch: Dict[str, torch.Tensor], step: int) -> Dict[str, torch.Tensor]:
        if self._status:
            status = batch.pop(STATUS_OUTPUT).to("cpu").reshape(-1, 2).numpy()
            mask = status[:, 1] == 1
            if self.audit:
                self._record.add(status[mask, 0], status[status[:, 1] == -1, 0])
        else:
            mask = self.info.plan(self.epoch).valid_mask(self.info.rank, step)
        if self.keep_padding:
            first = next(iter(batch.values()), None)
            device = first.device if first is not None else torch.device("cpu")
            batch[self.mask_name] = torch.from_numpy(mask).to(device)
            return batch
        if mask.all():
            return batch
        keep = torch.from_numpy(np.flatnonzero(mask))
        return {name: t[keep.to(t.device)] for name, t in batch.items()}


def _rank_expected(plan, rank: int) -> np.ndarray:
    index, valid = plan.rank_batches(rank)
    rows = slice(plan.start_step, None)
    return index[rows][valid[rows]]


class _WorkerWatch:
    """Keeps DALI from blocking forever when a worker process dies.

    A worker killed while it waits for its next task leaves the condition variable of its task
    queue expecting an acknowledgement from it; DALI's next hand-off to that queue would wait for
    it forever (DALI then terminates the other workers, leaving the same state in their queues).
    When a worker process ends, this thread gives that acknowledgement, so the hand-off returns and
    the iterator can report the dead worker; after a normal shutdown nothing uses the queue again.
    (DALI and multiprocessing internals, looked up defensively: without them only the check before
    each call remains.)"""

    @staticmethod
    def start(pipeline: Pipeline) -> None:
        try:
            pool = pipeline._py_pool.pool  # noqa: SLF001
            pairs = list(zip(pool._processes, pool._workers_contexts))  # noqa: SLF001
        except AttributeError:
            return
        threading.Thread(target=_WorkerWatch._run, args=(pairs,), daemon=True, name="dali-shards-watch").start()

    @staticmethod
    def _run(pairs) -> None:
        pending = {proc.sentinel: (proc, ctx) for proc, ctx in pairs}
        while pending:
            try:
                ready = multiprocessing.connection.wait(list(pending))
            except (OSError, ValueError):
                return
            for sentinel in ready:  # the process has ended (its exit code may already be reaped by DALI)
                _, ctx = pending.pop(sentinel)
                queue = getattr(ctx, "dedicated_task_queue", None)
                woken = getattr(getattr(queue, "cv_not_empty", None), "_woken_count", None)
                if woken is not None:
                    woken.release()


def _dead_workers(pipeline: Optional[Pipeline]):
    """(pid, exit code) of the pipeline's worker processes that have exited (DALI internals,
    looked up defensively: an empty list if they are not where expected)."""
    try:
        processes = pipeline._py_pool.pool._processes  # noqa: SLF001
        return [(p.pid, p.exitcode) for p in processes if p.exitcode is not None]
    except AttributeError:
        return []


def _describe_exit(code: Optional[int]) -> str:
    if code is None:
        return "running"
    if code < 0:
        import signal

        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"
