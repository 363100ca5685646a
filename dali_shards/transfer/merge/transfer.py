"""The merge transfer of one pipeline: one parallel external source per local worker (DALI's pool
runs them, ``source.py``), their padded batches merged by conditional execution (``graph.py``),
DALI's pool watched through its internals (``pool.py``). Its slot: the table form with the largest
field as payload for two or more workers, the single-array form for one (``layout.py``). Imports
DALI only once the graph is defined (``graph.py``), so that the pure resolve step can ask it its
slot.
"""

from __future__ import annotations

import weakref
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from dali_shards.device import check_start_method
from dali_shards.errors import ConfigError, from_worker
from dali_shards.options import ShardedOptions
from dali_shards.ipc.control import ControlBlock
from dali_shards.transfer.base import Queues, Sizes, positive_int, refuse_scheduled_ahead
from dali_shards.transfer.merge.pool import LOST_WORKER_TEXT, WorkerWatch, dead_workers, kill_workers, start_collected
from dali_shards.transfer.merge.pool import worker_pids
from dali_shards.transfer.merge.source import MergeSource
from dali_shards.worker.config import WorkerConfig

SLOT_META_BYTES = 128  # shared memory DALI's pool takes per batch slot beyond its sample
MAX_SLOT_HINT = 64 << 20  # (DALI grows a slot that needs more)


class MergeTransfer:
    """The merge transfer of one pipeline (see the module and ``transfer.base.Handover``)."""

    name = "merge"

    def __init__(self, options: ShardedOptions):
        self.options = options
        self.queues: Optional[Queues] = None
        self.sources: List[MergeSource] = []
        self.hint: Optional[int] = None
        self._pipeline: Any = lambda: None

    # -- before the pipeline -----------------------------------------------------------------
    def check(self, settings: Mapping[str, Any]) -> None:
        """DALI's pool cannot fork once CUDA is initialised (our workers can), takes one queue
        depth, and gets tasks only in a pipelined executor."""
        check_start_method(settings["py_start_method"])
        check_queue(settings["prefetch_queue_depth"])
        check_executor(settings)

    def slot_layout(self, sizes: Sizes) -> Tuple[bool, Optional[str]]:
        """The table form for two or more workers (the table in one worker's padding place), with
        the largest of ``sizes()`` as payload; the single-array form for one worker (no padding
        place to spare)."""
        if self.options.py_num_workers < 2:
            return False, None
        candidates = sizes()
        return True, (max(candidates)[2] if candidates else None)

    def pipeline_keywords(self) -> Dict[str, Any]:
        return {"py_num_workers": self.options.py_num_workers}

    def start(self, configs: Sequence[WorkerConfig], sample_bytes: Optional[int], control: Optional[ControlBlock],
              settings: Mapping[str, Any]) -> None:  # fmt: skip
        """DALI's pool sizes each slot of a worker's batch from a hint: its batch of
        ``batch_size`` slots holds a mini-batch, so the hint is a sample's bytes divided by the
        workers (``MAX_SLOT_HINT`` at most)."""
        self.queues = Queues.of(settings, self.options.worker_prefetch)
        self.sources = [MergeSource(config) for config in configs]  # plain objects, made outside the graph
        if sample_bytes is not None:
            self.hint = min(MAX_SLOT_HINT, sample_bytes // self.options.py_num_workers + SLOT_META_BYTES)

    # -- the pipeline ------------------------------------------------------------------------
    def graph_inputs(self) -> Tuple[List[Any], Any]:
        from dali_shards.transfer.merge.graph import merged_inputs  # DALI: the graph is being defined

        options = self.options
        return merged_inputs(self.sources, options.batch_size, options.worker_prefetch, self.hint)

    def returned(self, outputs: Sequence[Any]) -> None:
        """Nothing to tune: DALI's pool hands its batches over in place."""

    def attach(self, pipeline: Any) -> None:
        self._pipeline = weakref.ref(pipeline)
        start_collected(pipeline, self._refuse_ahead)

    def _refuse_ahead(self) -> None:
        """Before DALI takes a step's batch from its pool: a ``ConfigError`` where the pipeline is
        scheduled further ahead of its outputs than the pool keeps batches untouched for (its
        workers would write the next batches over those DALI still reads)."""
        pipeline = self._pipeline()
        if pipeline is None or self.queues is None:
            return
        held = self.queues.held
        refuse_scheduled_ahead(
            pipeline, held, "merge",
            f"lets DALI read each step in place in its pool's shared memory, where only the last "
            f"prefetch_queue_depth ({held}) steps are kept from being overwritten by the workers' next batches",
            "raise prefetch_queue_depth instead (DALI's own prefetch then runs that many steps ahead), or use "
            "transfer='ring', whose workers keep worker_prefetch + prefetch_queue_depth steps",
        )  # fmt: skip

    def watch(self) -> None:
        """Once the pipeline is built: keep DALI from waiting forever on a dead worker."""
        if self._pipeline() is not None:
            WorkerWatch.start(self._pipeline())

    def pids(self) -> List[int]:
        return worker_pids(self._pipeline())

    def dead(self) -> List[Tuple[int, Optional[int]]]:
        return dead_workers(self._pipeline())

    def kill(self) -> None:
        kill_workers(self._pipeline())

    def in_flight(self, pipeline: Any = None) -> int:
        assert self.queues is not None  # set by start()
        return self.queues.in_flight

    def translate(self, exc: BaseException) -> Optional[BaseException]:
        return from_worker(exc)  # DALI passes a worker's error on as text

    def lost_worker(self, exc: BaseException) -> bool:
        return LOST_WORKER_TEXT in str(exc)


def check_queue(depth: Any) -> None:
    """A ConfigError unless DALI's worker pool can take ``prefetch_queue_depth`` (one int)."""
    if positive_int(depth):
        return
    raise ConfigError(
        f"prefetch_queue_depth={depth!r} with transfer='merge': DALI's worker pool takes one positive "
        "integer (separate CPU and GPU queues are not supported with parallel external sources); give an "
        "integer, or use transfer='ring', which takes both"
    )


def check_executor(settings: Mapping[str, Any]) -> None:
    """A ConfigError where DALI's parallel external sources would never be given a task: they are
    first scheduled when a pipelined pipeline prefetches (``exec_pipelined=False``: never)."""
    if settings["exec_pipelined"]:
        return
    given = ", ".join(f"{k}={settings[k]!r}" for k in ("exec_async", "exec_pipelined") if k in settings)
    raise ConfigError(
        f"{given} with transfer='merge': DALI schedules its parallel external sources (the merge's workers) "
        "only in a pipelined executor, so the first step would fail in DALI ('No task has been scheduled'); "
        "leave exec_pipelined at True, or use transfer='ring', which runs under either executor"
    )
