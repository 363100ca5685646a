"""What one virtual worker emits in the streaming mode: mini-batches (as ``planned``'s) of samples
drawn from an endless pass over the worker's own shards, ``steps_per_epoch`` of them per epoch.
Imports no DALI."""

from __future__ import annotations

from typing import Iterator, List, Optional

from dali_shards.errors import ShardFormatError
from dali_shards.plan.random import TAG_STREAM_BUFFER, bitgen, random_ints
from dali_shards.plan.mode import Streaming
from dali_shards.plan.streaming import stream_index
from dali_shards.worker.config import WorkerConfig
from dali_shards.ipc.control import NO_STAMPS
from dali_shards.ipc.packed import Packed
from dali_shards.worker.clock import StepClock
from dali_shards.worker.reader import ShardFailed, ShardReader, Skipped


class StreamingWorkerSource:
    """The mini-batches of one local worker (``config``), epoch by epoch (``epoch(e)``, epochs in
    order), stamped in its control-block ``slot``.

    The stream position carries over from one epoch to the next; a source starting at epoch ``e``
    (a fresh start or a resume) begins the stream at cycle ``e``.
    """

    def __init__(self, config: WorkerConfig, mode: Streaming, stamps=NO_STAMPS):
        self.config, self.mode = config, mode
        self.worker = config.worker
        self.start_epoch = config.start_epoch
        self.stamps = stamps
        self._stream: Optional[Iterator[Packed]] = None  # the endless stream
        self._cycle_samples: Optional[int] = None  # samples in one pass over the worker's shards

    def epoch(self, epoch: int) -> Iterator[List[Packed]]:
        """The iterator of ``epoch``'s mini-batches."""
        steps = self.mode.spec.steps_per_epoch
        if epoch == self.start_epoch and self.mode.first_steps is not None:
            steps = self.mode.first_steps
        return self._batches(epoch, steps)

    def _batches(self, epoch: int, steps: int) -> Iterator[List[Packed]]:
        """``steps`` mini-batches, or fewer if the main process cuts the epoch short."""
        for _ in StepClock(self.stamps, epoch, steps):
            if self._stream is None:
                self._stream = self._shuffled(self._samples(self.start_epoch))
            yield [next(self._stream) for _ in range(self.mode.spec.mini_batch)]

    def _shuffled(self, samples: Iterator[Packed]) -> Iterator[Packed]:
        cfg = self.config
        if not cfg.spec.shuffle or cfg.shuffle_buffer <= 1:
            yield from samples
            return
        rand = random_ints(bitgen(TAG_STREAM_BUFFER, cfg.spec.seed, cfg.virtual_worker, self.start_epoch))
        buf: List[Packed] = []
        self._cycle_samples = None
        for packed in samples:
            # a buffer larger than one pass over the worker's shards would only hold repeats
            if len(buf) < min(cfg.shuffle_buffer, self._cycle_samples or cfg.shuffle_buffer):
                buf.append(packed)
                continue
            j = next(rand) % len(buf)
            out, buf[j] = buf[j], packed
            yield out

    def _samples(self, first_cycle: int) -> Iterator[Packed]:
        """The endless stream of this worker's samples, cycle after cycle."""
        cfg = self.config
        reader = ShardReader(cfg, self.stamps.progress)
        cycle = first_cycle
        while True:
            order = self.mode.spec.cycle_order(cfg.virtual_worker, cycle)
            reader.epoch = cycle  # a sample's augmentations differ from pass to pass
            delivered = 0
            openers = reader.open_ahead(order)
            try:
                for shard, opener in zip(order, openers):
                    index = lambda position, shard=shard: stream_index(shard, position)  # noqa: E731
                    for got in reader.samples(shard, opener, index):
                        if isinstance(got, ShardFailed) or isinstance(got[1], Skipped):
                            continue
                        delivered += 1
                        yield got[1]
            finally:
                openers.close()
            if delivered == 0:
                urls = ", ".join(cfg.urls[s] for s in order[:3]) + (" ..." if len(order) > 3 else "")
                raise ShardFormatError(
                    cfg.urls[order[0]],
                    f"streaming worker {cfg.virtual_worker} read no usable sample in a whole pass over its "
                    f"{len(order)} shard(s) ({urls})",
                    hint="check the shards with `dali-shards inspect`, or give more shards than ranks x workers",
                )
            if self._cycle_samples is None:
                self._cycle_samples = delivered
            cycle += 1
