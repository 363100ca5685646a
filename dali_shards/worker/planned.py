"""What one local worker feeds to its parallel external source: padded batches, epoch by epoch.

A :class:`WorkerSource` is created in the main process, pickled (or forked) into the DALI worker
process that owns it, and iterated there once per epoch. Each batch is ``batch_size`` arrays
long, the same size as every other worker's batch; only this worker's slice
``[worker * mini_batch, (worker + 1) * mini_batch)`` holds its samples, one padding slot holds
its table (table layout, see ``layout``), the other slots hold an empty dummy. The module
imports no DALI.
"""

from __future__ import annotations

import logging
import lzma
import zlib
from typing import Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple, Union

from dali_shards.errors import ShardAccessError, ShardError, ShardFormatError
from dali_shards.worker.layout import Packed, SampleLayout
from dali_shards.plan.epoch import EpochPlan, PlanSpec, Segment
from dali_shards.options import StorageOptions
from dali_shards.io.remote import DEFAULT_STORAGE
from dali_shards.io.storage import read_ahead, read_attempts
from dali_shards.io.tarformat import TarReader
from dali_shards.worker.process import ProcessEpochs


log = logging.getLogger("dali_shards")
ON_ERROR = ("raise", "skip")


class Skipped(NamedTuple):
    """A sample that could not be used (``on_error="skip"``): its index, shard, key and why."""

    index: int
    url: str
    key: Optional[str]
    reason: str


class WorkerSource(ProcessEpochs):
    """The padded batches of local worker ``worker`` of ``rank`` (virtual worker
    ``rank * num_workers + worker``), one epoch per ``iter()``, starting at ``start_epoch``.

    ``iter()`` is also called once in the main process when the pipeline is defined; it stays
    lazy (nothing is opened before the first batch) and epochs are counted per process.
    """

    def __init__(
        self,
        spec: PlanSpec,
        urls: Sequence[str],
        layout: SampleLayout,
        rank: int,
        worker: int,
        start_epoch: int = 0,
        resume_plan: Optional[EpochPlan] = None,
        on_error: str = "raise",
        storage: StorageOptions = DEFAULT_STORAGE,
        byte_sizes: Sequence[Optional[int]] = (),
        control: Optional[str] = None,
    ):
        if len(urls) != len(spec.shard_sizes):
            raise ValueError("one URL per shard size is required")
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        self.on_error = on_error
        self.storage = storage
        self.byte_sizes = tuple(byte_sizes) or (None,) * len(urls)
        self.spec = spec
        self.urls = tuple(urls)
        self.layout = layout
        self.rank = rank
        self.worker = worker
        self.virtual_worker = rank * spec.num_workers + worker
        self.start_epoch = start_epoch
        self.resume_plan = resume_plan
        self.init_process(control)

    def __iter__(self) -> "EpochBatches":
        return EpochBatches(self, self.next_epoch())

    def plan_for(self, epoch: int) -> EpochPlan:
        """The epoch's plan: the resumed one for the epoch a pipeline resumes in."""
        if self.resume_plan is not None and self.resume_plan.epoch == epoch:
            return self.resume_plan
        return self.spec.epoch(epoch)


class EpochBatches:
    """Iterator over one epoch's padded batches of one worker."""

    def __init__(self, source: WorkerSource, epoch: int):
        self.source = source
        self.epoch = epoch
        self._step = 0
        self._steps = 0
        self._order: Optional[Iterator[Tuple[int, bool]]] = None
        self._samples: Optional[Iterator[Tuple[int, Packed]]] = None
        self._pending: Dict[int, Union[Packed, Skipped]] = {}
        self._last: Tuple[int, Union[Packed, Skipped, None]] = (-1, None)
        self._good: Optional[Packed] = None  # the last good sample: stands in for skipped ones

    def __iter__(self) -> "EpochBatches":
        return self

    def __next__(self):
        src = self.source
        if self._order is None:
            self._start(src.plan_for(self.epoch))
        if self._step >= self._ends_at():
            self._close()
            src.slot.end(self.epoch, self._step, produced=False)
            raise StopIteration
        src.slot.begin(self.epoch, self._step)
        batch = self._batch()
        self._step += 1
        src.slot.end(self.epoch, self._step)
        return batch

    def _start(self, plan: EpochPlan) -> None:
        src = self.source
        emissions = plan.worker_emissions(src.virtual_worker)
        self._steps = plan.steps - plan.start_step
        self._order = iter(emissions)
        needed = {pos for pos, _ in emissions}
        reads = plan.reads_covering(min(needed), max(needed) + 1) if needed else []
        self._samples = _read_segments(
            plan,
            reads,
            src.urls,
            src.layout,
            needed.__contains__,
            src.on_error,
            src.storage,
            src.byte_sizes,
            src.slot.progress,
        )

    def _ends_at(self) -> int:
        """The step this epoch ends at: its last, or where the main process cut it short."""
        cut = self.source.slot.cut_step(self.epoch)
        return self._steps if cut is None else min(cut, self._steps)

    def _batch(self) -> list:
        src = self.source
        spec = src.spec
        samples = []
        try:
            for _ in range(spec.mini_batch):
                pos, valid = next(self._order)
                item = self._take(pos)
                if isinstance(item, Skipped):
                    packed = self._stand_in().as_skipped(item.index) if valid else self._stand_in().as_padding()
                elif valid:
                    packed = self._good = item
                else:
                    packed = item.as_padding()
                samples.append(packed)
        except StopIteration:  # never let a short read end this worker's epoch alone
            raise RuntimeError(
                f"dali_shards internal error: worker {src.virtual_worker} ran out of planned samples at step "
                f"{self._step} of epoch {self.epoch}; please report it"
            ) from None
        return src.layout.worker_batch(samples, src.worker, spec.num_workers, spec.batch_size)

    def _take(self, pos: int) -> Union[Packed, Skipped]:
        if self._last[0] == pos:
            return self._last[1]
        pending = self._pending
        while pos not in pending:
            got, item = next(self._samples)
            pending[got] = item
            if isinstance(item, Skipped):
                log.warning(
                    "dali_shards: skipping sample %r of shard %s (index %d): %s",
                    item.key,
                    item.url,
                    item.index,
                    item.reason,
                )
        item = pending.pop(pos)
        self._last = (pos, item)
        return item

    def _stand_in(self) -> Packed:
        """A real sample to fill a skipped sample's slot: the last good one, else the next."""
        if self._good is None:
            self._good = next((p for p in self._pending.values() if isinstance(p, Packed)), None)
        while self._good is None:
            try:
                got, item = next(self._samples)
            except StopIteration:
                raise ShardFormatError(
                    self.source.urls[0] if len(self.source.urls) == 1 else "(several)",
                    f"worker {self.source.virtual_worker} found no readable sample in its part of epoch "
                    f"{self.epoch} to stand in for the skipped ones",
                    hint="check the shards with `dali-shards inspect`",
                ) from None
            self._pending[got] = item
            if isinstance(item, Packed):
                self._good = item
        return self._good

    def _close(self) -> None:
        if self._samples is not None:
            self._samples.close()
        self._pending.clear()
        self._last = (-1, None)


def shard_error(url: str, exc: BaseException) -> ShardError:
    """A reading failure as an error naming the shard."""
    if isinstance(exc, ShardError):
        return exc
    if isinstance(exc, EOFError):
        return ShardFormatError(
            url, f"compressed data ends early ({exc})", hint="the shard was cut short; re-create it"
        )
    if isinstance(exc, (zlib.error, lzma.LZMAError)) or "gzip" in str(exc).lower() or "compressed" in str(exc).lower():
        return ShardFormatError(url, f"corrupt compressed data ({exc})", hint="re-create or re-download the shard")
    return ShardAccessError(url, f"read error: {exc}", hint="check the storage holding the shard")


def _read_segments(
    plan: EpochPlan,
    segments: List[Segment],
    urls: Sequence[str],
    layout: SampleLayout,
    needed: Callable[[int], bool],
    on_error: str = "raise",
    storage: StorageOptions = DEFAULT_STORAGE,
    byte_sizes: Sequence[Optional[int]] = (),
    progress: Callable[..., None] = lambda shard=None: None,
) -> Iterator[Tuple[int, Union[Packed, Skipped]]]:
    """(epoch position, packed sample) of the ``needed`` samples in ``segments``, in reading order;
    the others are passed over by their headers. The next shards are opened ahead (``storage``).
    With ``on_error="skip"`` a bad sample, or every needed sample left in a shard that cannot be
    read on, comes as a ``Skipped``. ``progress(shard)`` is called as a shard is opened,
    ``progress()`` for every sample read."""
    sizes = [byte_sizes[seg.shard] if byte_sizes else None for seg in segments]
    openers = read_ahead([urls[seg.shard] for seg in segments], storage, sizes)
    try:
        yield from _read_in_order(plan, segments, urls, layout, needed, on_error, openers, progress)
    finally:
        openers.close()


def _read_in_order(plan, segments, urls, layout, needed, on_error, openers, progress):
    for seg, opener in zip(segments, openers):
        url = urls[seg.shard]
        progress(seg.shard)
        offset = int(plan.canonical_starts[seg.shard])
        base = seg.position - seg.first  # sequence position of the shard's sample 0
        done = set()
        try:
            for attempt in read_attempts(opener):  # a cached copy that fails is read again from the server
                with attempt as stream:
                    reader = TarReader(stream, url)
                    samples = reader.samples(
                        layout.extensions,
                        start=seg.first,
                        stop=seg.stop,
                        into=layout.destination,
                        select=lambda local, base=base: needed(base + local) and base + local not in done,
                    )
                    for sample in samples:
                        progress()
                        position = base + sample.position
                        try:
                            item: Union[Packed, Skipped] = layout.pack(sample, offset + sample.position)
                        except ShardError as exc:
                            if on_error == "raise":
                                raise
                            item = Skipped(offset + sample.position, url, sample.key, exc.detail)
                        done.add(position)
                        yield position, item
                    if reader.samples_seen < seg.stop:
                        raise ShardFormatError(
                            url,
                            f"holds fewer samples than the {plan.spec.shard_sizes[seg.shard]} planned "
                            f"(sample {reader.samples_seen} is missing)",
                            hint="the shard changed after it was counted; rebuild its manifest (dali-shards index) "
                            "or restart so it is scanned again",
                        )
        except (ShardError, OSError, EOFError, zlib.error, lzma.LZMAError) as exc:
            error = shard_error(url, exc)
            if on_error == "raise":
                raise error from (None if error is exc else exc)
            for position in range(seg.position, seg.position + seg.stop - seg.first):
                if needed(position) and position not in done:
                    yield position, Skipped(offset + position - base, url, None, error.detail)
