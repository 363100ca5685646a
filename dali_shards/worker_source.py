"""What one local worker feeds to its parallel external source: padded batches, epoch by epoch.

A :class:`WorkerSource` is created in the main process, pickled (or forked) into the DALI worker
process that owns it, and iterated there once per epoch. Each batch is ``batch_size`` arrays
long, the same size as every other worker's batch; only this worker's slice
``[worker * mini_batch, (worker + 1) * mini_batch)`` holds its samples, one padding slot holds
its table (table layout, see ``layout``), the other slots hold an empty dummy. The module
imports no DALI.
"""

from __future__ import annotations

import os
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from .errors import ShardFormatError
from .layout import EMPTY, Packed, SampleLayout, table_slot
from .planner import EpochPlan, PlanSpec, Segment
from .storage import open_shard
from .tarformat import TarReader


class WorkerSource:
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
    ):
        if len(urls) != len(spec.shard_sizes):
            raise ValueError("one URL per shard size is required")
        self.spec = spec
        self.urls = tuple(urls)
        self.layout = layout
        self.rank = rank
        self.worker = worker
        self.virtual_worker = rank * spec.num_workers + worker
        self.start_epoch = start_epoch
        self.resume_plan = resume_plan
        self._pid: Optional[int] = None
        self._epoch = start_epoch

    def __iter__(self) -> "EpochBatches":
        pid = os.getpid()
        if self._pid != pid:
            self._pid, self._epoch = pid, self.start_epoch
        else:
            self._epoch += 1
        return EpochBatches(self, self._epoch)

    def plan_for(self, epoch: int) -> EpochPlan:
        """The epoch's plan: the resumed one for the epoch a pipeline resumes in."""
        if self.resume_plan is not None and self.resume_plan.epoch == epoch:
            return self.resume_plan
        return self.spec.epoch(epoch)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_pid"] = None
        return state


class EpochBatches:
    """Iterator over one epoch's padded batches of one worker."""

    def __init__(self, source: WorkerSource, epoch: int):
        self.source = source
        self.epoch = epoch
        self._step = 0
        self._steps = 0
        self._order: Optional[Iterator[Tuple[int, bool]]] = None
        self._samples: Optional[Iterator[Tuple[int, Packed]]] = None
        self._pending: Dict[int, Packed] = {}
        self._last: Tuple[int, Optional[Packed]] = (-1, None)

    def __iter__(self) -> "EpochBatches":
        return self

    def __next__(self):
        src = self.source
        spec = src.spec
        if self._order is None:
            plan = src.plan_for(self.epoch)
            emissions = plan.worker_emissions(src.virtual_worker)
            self._steps = plan.steps - plan.start_step
            self._order = iter(emissions)
            needed = {pos for pos, _ in emissions}
            reads = plan.reads_covering(min(needed), max(needed) + 1) if needed else []
            self._samples = _read_segments(plan, reads, src.urls, src.layout, needed.__contains__)
        if self._step >= self._steps:
            self._close()
            raise StopIteration
        m = spec.mini_batch
        layout = src.layout
        batch = [EMPTY] * spec.batch_size
        base = src.worker * m
        samples = []
        try:
            for i in range(m):
                pos, valid = next(self._order)
                packed = self._take(pos)
                if not valid:
                    packed = packed.as_padding()
                batch[base + i] = layout.slot_array(packed)
                samples.append(packed)
        except StopIteration:  # never let a short read end this worker's epoch alone
            raise RuntimeError(
                f"dali_shards internal error: worker {src.virtual_worker} ran out of planned samples at step "
                f"{self._step} of epoch {self.epoch}; please report it"
            ) from None
        if layout.table:
            batch[table_slot(src.worker, spec.num_workers, m)] = layout.table_array(samples)
        self._step += 1
        return batch

    def _take(self, pos: int) -> Packed:
        if self._last[0] == pos:
            return self._last[1]
        pending = self._pending
        while pos not in pending:
            got, packed = next(self._samples)
            pending[got] = packed
        packed = pending.pop(pos)
        self._last = (pos, packed)
        return packed

    def _close(self) -> None:
        if self._samples is not None:
            self._samples.close()
        self._pending.clear()
        self._last = (-1, None)


def _read_segments(
    plan: EpochPlan,
    segments: List[Segment],
    urls: Sequence[str],
    layout: SampleLayout,
    needed: Callable[[int], bool],
) -> Iterator[Tuple[int, Packed]]:
    """(epoch position, packed sample) of the ``needed`` samples in ``segments``, in reading order;
    the others are passed over by their headers."""
    for seg in segments:
        url = urls[seg.shard]
        offset = int(plan.canonical_starts[seg.shard])
        base = seg.position - seg.first  # sequence position of the shard's sample 0
        with open_shard(url) as stream:
            reader = TarReader(stream, url)
            samples = reader.samples(
                layout.extensions,
                start=seg.first,
                stop=seg.stop,
                into=layout.destination,
                select=lambda local, base=base: needed(base + local),
            )
            for sample in samples:
                yield base + sample.position, layout.pack(sample, offset + sample.position)
        read = reader.samples_seen
        if read < seg.stop:
            raise ShardFormatError(
                url,
                f"holds fewer samples than the {plan.spec.shard_sizes[seg.shard]} planned (sample {read} is missing)",
                hint="the shard changed after it was counted; rebuild its manifest (dali-shards index) "
                "or restart so it is scanned again",
            )
