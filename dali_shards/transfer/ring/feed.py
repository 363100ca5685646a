"""The ring's feed: the callback of the pipeline's one external source, which takes each worker's
mini-batch of the step from its ring and gives DALI the step's batch, field by field
(``assemble.py``). DALI reads the slots in place, so a step's slots are given back only ``lifetime``
calls later (``base.steps_held``) and once their output is taken (a pipeline scheduled ahead of
its outputs: ``schedule_run()`` called more often than ``outputs()``). Imports no DALI.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Deque, List, NoReturn, Optional, Sequence, Tuple, Union, cast

import numpy as np

from dali_shards.errors import WorkerError
from dali_shards.ipc.control import ControlBlock
from dali_shards.ipc.packing import Packing
from dali_shards.transfer.base import outputs_pending, refuse_scheduled_ahead
from dali_shards.transfer.ring.assemble import assemble
from dali_shards.transfer.ring.consumer import EpochEnd, MiniBatch
from dali_shards.transfer.ring.workers import RingWorkers

FEED_NAME = "dali_shards ring feed"


class RingFeed:
    """The external source's callback (see the module): one step's batch per call, and
    ``StopIteration`` at the end of each epoch (the next call starts the next epoch). Once a call
    has failed (a worker's error, a lost worker), every later call says so at once: the workers'
    streams are no longer in step. ``wrap`` turns a sample's view into what DALI takes fastest."""

    def __init__(self, workers: RingWorkers, packing: Packing, start_epoch: int, batch_size: int,
                 control: Optional[ControlBlock] = None, lifetime: int = 1,
                 wrap: Callable[[np.ndarray], Any] = lambda a: a):  # fmt: skip
        self.workers = workers
        self.lifetime = lifetime  # calls a step's slots (and what DALI was handed) are held for
        self.packing = packing
        self.epoch = start_epoch
        self.step = 0
        self.batch_size = batch_size
        self.control = control
        self.wrap = wrap
        self.held: Deque[Tuple[List[MiniBatch], Any]] = deque()  # the last calls' mini-batches and outputs
        self.pipeline: Optional[Any] = None  # a weak reference to the pipeline, once attached
        self.failed: Optional[BaseException] = None

    def __repr__(self) -> str:
        return FEED_NAME

    def __call__(self) -> Tuple[Any, ...]:
        if self.failed is not None:
            raise WorkerError(
                f"this pipeline stopped at step {self.step} of epoch {self.epoch} after a worker's error "
                f"({type(self.failed).__name__}: {self.failed}); build it anew (or restart from the last state_dict())"
            ) from self.failed
        self._release()
        self.workers.start()
        try:
            got = self._take()
            out = assemble(self.packing, got, wrap=self.wrap)
        except StopIteration:
            raise
        except BaseException as exc:
            self.failed = exc
            raise
        self.held.append((got, out))
        if self.control is not None:
            self.control.unlink_once_attached()
        return out

    def _release(self) -> None:
        """Give back the slots of the calls DALI is done with: ``lifetime`` calls ago, and their
        outputs taken (a pipeline scheduled ahead of its outputs holds them longer). A ``ConfigError``
        where it is scheduled so far ahead that the workers have no slot left for this call."""
        pipeline = self.pipeline() if self.pipeline is not None else None
        pending = outputs_pending(pipeline)  # calls whose outputs are not taken yet (None: not known)
        while len(self.held) >= self.lifetime and (pending is None or len(self.held) > pending):
            minis, _ = self.held.popleft()
            for consumer, mini in zip(self.workers.consumers, minis):
                consumer.release(mini.slot)
        refuse_scheduled_ahead(
            pipeline, self.workers.depth, "ring",
            f"lets DALI read each step in place until its output is taken, and its workers have {self.workers.depth} "
            "slots each (worker_prefetch + prefetch_queue_depth)",
            "raise worker_prefetch",
        )  # fmt: skip

    def _take(self) -> List[MiniBatch]:
        """Every worker's next mini-batch of this step (its slot held, see ``_release``). A
        failed call's are not given back: the feed stops (see the class)."""
        got: List[Union[MiniBatch, EpochEnd]] = [consumer.next() for consumer in self.workers.consumers]
        ends = [g for g in got if isinstance(g, EpochEnd)]
        if ends:
            self._end_epoch(ends, len(got))
        minis = cast(List[MiniBatch], got)  # no EpochEnd among them: _end_epoch raised
        samples = sum(len(g.rows) for g in minis)
        if any(g.epoch != self.epoch or g.step != self.step for g in minis) or samples != self.batch_size:
            where = sorted({(g.epoch, g.step) for g in minis})
            raise WorkerError(
                f"dali_shards internal error: the workers sent steps {where} ({samples} samples) "
                f"where step {self.step} of epoch {self.epoch} ({self.batch_size} samples) was due; please report it. "
                "Restart from the last state_dict() to go on"
            )
        self.step += 1
        return minis

    def _end_epoch(self, ends: Sequence[EpochEnd], workers: int) -> NoReturn:
        if len(ends) != workers or any(e.epoch != self.epoch or e.steps != self.step for e in ends):
            raise WorkerError(
                f"dali_shards internal error: the workers ended epoch {self.epoch} apart ({len(ends)} of {workers} "
                f"ended, at steps {sorted({e.steps for e in ends})}, after {self.step} steps here); please report it"
            )
        self.epoch += 1
        self.step = 0
        raise StopIteration
