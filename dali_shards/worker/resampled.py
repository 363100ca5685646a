"""What one local worker feeds to its parallel external source in the streaming mode: padded
batches (same layout as ``worker_source``) of samples drawn from an endless pass over the
worker's own shards, exactly ``quota`` per epoch. Imports no DALI."""

from __future__ import annotations

import logging
import lzma
import zlib
from typing import Iterator, List, Optional, Sequence


from dali_shards.errors import ShardError, ShardFormatError
from dali_shards.worker.layout import Packed, SampleLayout
from dali_shards.plan.random import TAG_STREAM_BUFFER, bitgen, random_ints
from dali_shards.options import StorageOptions
from dali_shards.io.remote import DEFAULT_STORAGE
from dali_shards.io.storage import read_ahead, read_attempts
from dali_shards.plan.resampled import StreamingSpec, stream_index
from dali_shards.io.tarformat import TarReader
from dali_shards.worker.process import ProcessEpochs
from dali_shards.worker.planned import shard_error

log = logging.getLogger("dali_shards")


class StreamingWorkerSource(ProcessEpochs):
    """The padded batches of local worker ``worker`` of ``rank``; one epoch per ``iter()``.

    The stream position carries over from one epoch to the next within a worker process; a
    pipeline starting at epoch ``e`` (a fresh start or a resume) begins the stream at cycle ``e``.
    """

    _process_state = ("_stream",)

    def __init__(
        self,
        spec: StreamingSpec,
        urls: Sequence[str],
        layout: SampleLayout,
        rank: int,
        worker: int,
        start_epoch: int = 0,
        first_steps: Optional[int] = None,
        shuffle_buffer: int = 1024,
        on_error: str = "raise",
        storage: StorageOptions = DEFAULT_STORAGE,
        byte_sizes: Sequence[Optional[int]] = (),
        control: Optional[str] = None,
    ):
        self.spec = spec
        self.urls = tuple(urls)
        self.layout = layout
        self.rank = rank
        self.worker = worker
        self.virtual_worker = rank * spec.num_workers + worker
        self.start_epoch = start_epoch
        self.first_steps = first_steps
        self.shuffle_buffer = shuffle_buffer
        self.on_error = on_error
        self.storage = storage
        self.byte_sizes = tuple(byte_sizes) or (None,) * len(urls)
        self._stream: Optional[Iterator[Packed]] = None  # the endless stream, per process
        self._cycle_samples: Optional[int] = None  # samples in one pass over the worker's shards
        self.init_process(control)

    def __iter__(self) -> Iterator[list]:
        epoch = self.next_epoch()
        steps = self.spec.steps_per_epoch
        if epoch == self.start_epoch and self.first_steps is not None:
            steps = self.first_steps
        return self._batches(epoch, steps)

    def _batches(self, epoch: int, steps: int) -> Iterator[list]:
        """``steps`` batches, or fewer if the main process cuts the epoch short."""
        spec, slot = self.spec, self.slot
        step = 0
        while step < steps:
            cut = slot.cut_step(epoch)
            if cut is not None and step >= cut:
                break
            slot.begin(epoch, step)
            if self._stream is None:
                self._stream = self._shuffled(self._samples(self.start_epoch))
            samples = [next(self._stream) for _ in range(spec.mini_batch)]
            step += 1
            slot.end(epoch, step)
            yield self.layout.worker_batch(samples, self.worker, spec.num_workers, spec.batch_size)
        slot.end(epoch, step, produced=False)

    def _shuffled(self, samples: Iterator[Packed]) -> Iterator[Packed]:
        if not self.spec.shuffle or self.shuffle_buffer <= 1:
            yield from samples
            return
        rand = random_ints(bitgen(TAG_STREAM_BUFFER, self.spec.seed, self.virtual_worker, self.start_epoch))
        buf: List[Packed] = []
        self._cycle_samples = None
        for packed in samples:
            # a buffer larger than one pass over the worker's shards would only hold repeats
            if len(buf) < min(self.shuffle_buffer, self._cycle_samples or self.shuffle_buffer):
                buf.append(packed)
                continue
            j = next(rand) % len(buf)
            out, buf[j] = buf[j], packed
            yield out

    def _samples(self, first_cycle: int) -> Iterator[Packed]:
        """The endless stream of this worker's samples, cycle after cycle."""
        cycle = first_cycle
        v = self.virtual_worker
        while True:
            order = self.spec.cycle_order(v, cycle)
            delivered = 0
            openers = read_ahead([self.urls[s] for s in order], self.storage, [self.byte_sizes[s] for s in order])
            try:
                for shard, opener in zip(order, openers):
                    for packed in self._read_shard(shard, opener):
                        delivered += 1
                        yield packed
            finally:
                openers.close()
            if delivered == 0:
                urls = ", ".join(self.urls[s] for s in order[:3]) + (" ..." if len(order) > 3 else "")
                raise ShardFormatError(
                    self.urls[order[0]],
                    f"streaming worker {v} read no usable sample in a whole pass over its {len(order)} shard(s) "
                    f"({urls})",
                    hint="check the shards with `dali-shards inspect`, or give more shards than ranks x workers",
                )
            if self._cycle_samples is None:
                self._cycle_samples = delivered
            cycle += 1

    def _read_shard(self, shard: int, opener) -> Iterator[Packed]:
        url = self.urls[shard]
        self.slot.progress(shard)
        given = 0  # samples passed on (a second attempt, from the server, starts after them)
        try:
            for attempt in read_attempts(opener):  # a cached copy that fails is read again from the server
                with attempt as stream:
                    reader = TarReader(stream, url)
                    samples = reader.samples(self.layout.extensions, start=given, into=self.layout.destination)
                    for sample in samples:
                        self.slot.progress()
                        given = sample.position + 1
                        try:
                            yield self.layout.pack(sample, stream_index(shard, sample.position))
                        except ShardError as exc:
                            if self.on_error == "raise":
                                raise
                            log.warning("dali_shards: skipping sample %r of shard %s: %s", sample.key, url, exc.detail)
        except (ShardError, OSError, EOFError, zlib.error, lzma.LZMAError) as exc:
            error = shard_error(url, exc)
            if self.on_error == "raise":
                raise error from (None if error is exc else exc)
            log.warning("dali_shards: skipping the rest of shard %s: %s", url, error.detail)
