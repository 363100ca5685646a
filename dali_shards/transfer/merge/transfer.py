"""The merge transfer in the pipeline: one parallel external source per local worker (DALI's pool
runs them), their padded batches merged by conditional execution (``graph.py``), DALI's pool
watched through its internals (``pool.py``)."""

from __future__ import annotations

import weakref
from typing import Any, List, Optional, Sequence, Tuple

from nvidia.dali import fn
from nvidia.dali.pipeline import Pipeline

from dali_shards.errors import from_worker
from dali_shards.transfer.base import refuse_scheduled_ahead, steps_in_flight
from dali_shards.transfer.merge.graph import assemble_fields
from dali_shards.transfer.merge.pool import LOST_WORKER_TEXT, WorkerWatch, dead_workers, kill_workers, start_collected
from dali_shards.transfer.merge.pool import worker_pids
from dali_shards.transfer.merge.source import Carried, MergeSource
from dali_shards.worker.config import WorkerConfig
from dali_shards.shm.packing import Packing


class MergeTransfer:
    """The merge transfer of one pipeline (see ``transfer.base.Transfer``)."""

    name = "merge"

    def __init__(self, configs: Sequence[WorkerConfig], packing: Packing, *, batch_size: int,
                 worker_prefetch: int, bytes_per_sample_hint: Optional[int]):  # fmt: skip
        self.sources = [MergeSource(config) for config in configs]  # plain objects, made outside the graph
        self.packing = packing
        self.batch_size = batch_size
        self.worker_prefetch = worker_prefetch
        self.hint = bytes_per_sample_hint
        self._pipeline: Any = lambda: None

    def graph_inputs(self) -> Tuple[List[Any], Any]:
        outputs = [
            fn.external_source(source=Carried(source), batch=True, parallel=True, cycle="raise",
                               prefetch_queue_depth=self.worker_prefetch, bytes_per_sample_hint=self.hint)
            for source in self.sources
        ]  # fmt: skip
        return assemble_fields(outputs, self.packing, self.batch_size)

    def returned(self, outputs: Sequence[Any]) -> None:
        """Nothing to tune: DALI's pool hands its batches over in place."""

    def attach(self, pipeline: Pipeline) -> None:
        self._pipeline = weakref.ref(pipeline)
        start_collected(pipeline, self._refuse_ahead)

    def _refuse_ahead(self) -> None:
        """Before DALI takes a step's batch from its pool: a ``ConfigError`` where the pipeline is
        scheduled further ahead of its outputs than the pool keeps batches untouched for (its
        workers would write the next batches over those DALI still reads)."""
        pipeline = self._pipeline()
        if pipeline is None:
            return
        depth = pipeline.prefetch_queue_depth
        refuse_scheduled_ahead(
            pipeline, depth, "merge",
            f"lets DALI read each step in place in its pool's shared memory, where only the last "
            f"prefetch_queue_depth ({depth}) steps are kept from being overwritten by the workers' next batches",
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

    def in_flight(self, pipeline: Pipeline) -> int:
        return steps_in_flight(pipeline.prefetch_queue_depth, self.worker_prefetch)

    def translate(self, exc: BaseException) -> Optional[BaseException]:
        return from_worker(exc)  # DALI passes a worker's error on as text

    def lost_worker(self, exc: BaseException) -> bool:
        return LOST_WORKER_TEXT in str(exc)
