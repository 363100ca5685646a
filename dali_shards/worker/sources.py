"""What every worker source offers a transfer, whatever the mode: ``epoch(e)``, the iterator of
epoch ``e``'s mini-batches (lists of ``mini_batch`` packed samples, one per step). Imports no DALI."""

from __future__ import annotations

from typing import Iterator, List, Protocol, Union

from dali_shards.plan.mode import Streaming
from dali_shards.worker.config import WorkerConfig
from dali_shards.ipc.control import NO_STAMPS
from dali_shards.ipc.packed import Packed
from dali_shards.worker.planned import PlannedWorkerSource
from dali_shards.worker.streaming import StreamingWorkerSource


class EpochSource(Protocol):
    """A worker's mini-batches, epoch by epoch (epochs asked for in increasing order)."""

    def epoch(self, epoch: int) -> Iterator[List[Packed]]: ...


def make_source(config: WorkerConfig, stamps=NO_STAMPS, direct: bool = False) -> Union[PlannedWorkerSource, StreamingWorkerSource]:
    """The source of local worker ``config.worker``: planned or streaming, as its mode says;
    ``direct``: its steps may be table writers that read straight into the ring's slots."""
    if isinstance(config.mode, Streaming):
        return StreamingWorkerSource(config, config.mode, stamps)
    return PlannedWorkerSource(config, config.mode, stamps, direct=direct)
