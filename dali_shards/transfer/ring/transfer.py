"""The ring transfer in the pipeline: one (non-parallel) external source whose callback takes each
worker's mini-batch of the step from its ring and gives DALI the step's batch, field by field (see
``assemble.py``); the worker processes start when the pipeline is built and stop with it.

DALI's operators read the slots in place (``no_copy``: the main process copies no bytes), so a
step's slots are held until DALI is done with them, ``feed_lifetime(prefetch_queue_depth)`` calls
(DALI's rule for ``no_copy``: its prefetch queue's depth, both queues' product where they differ),
and until their output is taken (a pipeline scheduled ahead of its outputs: ``schedule_run()``
called more often than ``outputs()``); a worker can be ``worker_prefetch`` steps ahead of the
pipeline. A field
the pipeline returns as it is, DALI copies when it takes it: its output would be copied anyway, and
a copy of memory DALI does not own costs it more at the output. Memory per rank: ``py_num_workers x
(worker_prefetch + feed_lifetime)`` slots, each the size of the largest mini-batch written into it
(times 1.5), at least 1 MiB.
"""

from __future__ import annotations

import functools
import math
import re
import warnings
import weakref
from collections import deque
from multiprocessing.util import Finalize
from typing import Any, Deque, List, Mapping, NoReturn, Optional, Sequence, Tuple, Union, cast

from nvidia.dali import fn, types
from nvidia.dali.pipeline import Pipeline
from nvidia.dali.tensors import TensorCPU

from dali_shards.errors import WorkerError
from dali_shards.userwarn import warn_user
from dali_shards.transfer.base import outputs_pending, refuse_scheduled_ahead, steps_in_flight
from dali_shards.transfer.ring.assemble import assemble, output_types
from dali_shards.transfer.ring.consumer import EpochEnd, MiniBatch, WorkerGone
from dali_shards.shm.control import ControlBlock
from dali_shards.transfer.ring.workers import RingWorkers
from dali_shards.worker.config import WorkerConfig
from dali_shards.shm.packing import Packing


FEED_NAME = "dali_shards ring feed"


def feed_lifetime(prefetch_queue_depth: Union[int, Mapping[str, int]]) -> int:
    """Calls of the feed a step's data must stay untouched for, DALI reading it in place: the
    pipeline's ``prefetch_queue_depth``, or the product of its CPU and GPU queues where they differ
    (see ``no_copy`` in DALI's ``external_source``)."""
    if isinstance(prefetch_queue_depth, Mapping):
        sizes = [int(v) for v in prefetch_queue_depth.values()] or [1]  # (an empty one: DALI says what is wrong)
        return max(1, math.prod(sizes) if len(set(sizes)) > 1 else sizes[0])
    return max(1, int(prefetch_queue_depth))


def set_no_copy(node: Any, in_place: bool) -> bool:
    """Set ``no_copy`` of the external source output ``node`` once the graph's outputs are known;
    whether DALI reads it in place. Left to DALI's default (a copy) where a DALI release builds its
    operators otherwise."""
    spec = getattr(getattr(node, "source", None), "spec", None)
    try:
        spec.AddArg("no_copy", in_place)  # type: ignore[union-attr]  # (AttributeError: caught)
    except (AttributeError, RuntimeError):
        return False
    return in_place


class RingFeed:
    """The external source's callback (see the module): one step's batch per call, and
    ``StopIteration`` at the end of each epoch (the next call starts the next epoch). Once a call
    has failed (a worker's error, a lost worker), every later call says so at once: the workers'
    streams are no longer in step."""

    def __init__(self, workers: RingWorkers, packing: Packing, start_epoch: int, batch_size: int,
                 control: Optional[ControlBlock] = None, lifetime: int = 1):  # fmt: skip
        self.workers = workers
        self.lifetime = lifetime  # calls a step's slots (and what DALI was handed) are held for
        self.packing = packing
        self.epoch = start_epoch
        self.step = 0
        self.batch_size = batch_size
        self.control = control
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
            out = assemble(self.packing, got, wrap=TensorCPU)
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


class RingTransfer:
    """The ring transfer of one pipeline (see ``transfer.base.Transfer``)."""

    name = "ring"

    def __init__(self, configs: Sequence[WorkerConfig], packing: Packing, *, batch_size: int, worker_prefetch: int,
                 start_method: str, start_epoch: int, first_slot_bytes: int,
                 prefetch_queue_depth: Union[int, Mapping[str, int]], control: Optional[ControlBlock] = None):  # fmt: skip
        lifetime = feed_lifetime(prefetch_queue_depth)
        self.depth = worker_prefetch + lifetime  # a slot is given back once DALI is done with it
        self.workers = RingWorkers(configs, self.depth, start_method, first_slot_bytes)
        self.feed = RingFeed(self.workers, packing, start_epoch, batch_size, control, lifetime)
        self.packing = packing
        self.nodes: List[Any] = []
        self.in_place: List[bool] = []

    def graph_inputs(self) -> Tuple[List[Any], Any]:
        kinds = output_types(self.packing)
        outputs = fn.external_source(
            source=self.feed, num_outputs=len(kinds), batch=True, parallel=False,
            dtype=[types.to_dali_type(k.dtype) for k in kinds], ndim=[k.ndim for k in kinds],
        )  # fmt: skip  # (no_copy is set per output: see returned)
        self.nodes = list(outputs)
        return list(outputs[:-1]), outputs[-1]

    def returned(self, outputs: Sequence[Any]) -> None:
        """Each field read in place by DALI but those the pipeline returns as they are (see the
        module); the slot status, which ``DALIShardedIterator`` returns, copied."""
        direct = {id(node) for node in outputs}
        wanted = [id(node) not in direct for node in self.nodes[:-1]] + [False]  # the fields, the status
        self.in_place = [set_no_copy(node, w) for node, w in zip(self.nodes, wanted)]

    def attach(self, pipeline: Pipeline) -> None:
        # with the pipeline, or at exit before multiprocessing joins its children (priority >= 0)
        Finalize(pipeline, self.workers.stop, exitpriority=10)
        self.feed.pipeline = weakref.ref(pipeline)
        fields = [f.name for f in self.packing.fields]
        pipeline.build = functools.partial(  # type: ignore[method-assign]  # wraps this DALI pipeline's build
            _build_started, weakref.ref(pipeline), self.workers, fields
        )

    def watch(self) -> None:
        """Nothing to add once the pipeline is built: the ring's waits see a dead worker."""

    def pids(self) -> List[int]:
        return self.workers.pids()

    def dead(self) -> List[Tuple[int, Optional[int]]]:
        return self.workers.dead()

    def kill(self) -> None:
        self.workers.kill()

    def in_flight(self, pipeline: Pipeline) -> int:
        # DALI holds the slots of its last calls: a worker fills its other slots, then makes one more;
        # before the feed holds that many, a worker may fill every slot (lifetime > queue: separate queues)
        return max(steps_in_flight(pipeline.prefetch_queue_depth, self.depth - self.feed.lifetime), self.depth + 1)

    def translate(self, exc: BaseException) -> Optional[BaseException]:
        return None  # the workers' own errors arrive as they were raised

    def lost_worker(self, exc: BaseException) -> bool:
        return isinstance(exc, WorkerGone)


def _build_started(ref: Any, workers: RingWorkers, fields: Sequence[str]) -> Any:
    """``Pipeline.build`` the first time, the worker processes started first; DALI's own ``build``
    after that (DALI calls it at every step). DALI's warning that some of the external source's
    outputs are not used is said in our words: the slot status output is used only by
    ``DALIShardedIterator``, and requested fields the function leaves unused are named."""
    pipeline = ref()
    if getattr(pipeline, "_built", False):
        return type(pipeline).build(pipeline)
    workers.start()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = type(pipeline).build(pipeline)
    del pipeline.build  # built: DALI's own method from now on
    for w in caught:
        text = str(w.message)
        if FEED_NAME not in text:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
            continue
        unused = [fields[int(i)] for i in re.findall(r"\d+", text.split("not used")[0].split("index")[-1])
                  if int(i) < len(fields)]  # fmt: skip
        if unused:
            warn_user(
                f"dali_shards: fields {unused} are read and sent to the pipeline but its function does not use "
                "them: leave them out of fields= to save their reading and transfer"
            )
    return result
