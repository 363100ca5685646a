"""What one virtual worker emits in the planned mode: per epoch, one *mini-batch* per step --
its ``mini_batch`` packed samples for that step (padding and stand-ins for skipped samples
included), nothing about how they reach DALI.

A :class:`PlannedWorkerSource` lives in the worker process that reads for it (a transfer starts it
there: see ``dali_shards.transfer``); ``source.epoch(e)`` is the iterator of epoch ``e``'s
mini-batches. It stamps its progress in the pipeline's control block and ends an epoch early where
the main process cut it short. While an epoch is read, the next one is prepared at a step of its
own for each worker (``stagger.py``): its plan and order, and on the fast path its first group of
steps, read ahead; nothing of it is handed on before it is asked for. The module imports no DALI.
"""

from __future__ import annotations

import logging
from typing import Any, Generator, Iterator, List, NamedTuple, Optional, Tuple, Union

from dali_shards.errors import WorkerError
from dali_shards.plan.bucket import window_order, window_steps
from dali_shards.plan.mode import Planned
from dali_shards.plan.resume import Plan, epoch_plan
from dali_shards.worker.config import WorkerConfig
from dali_shards.ipc.control import NO_STAMPS
from dali_shards.worker.direct import DirectBatches, direct_fits
from dali_shards.ipc.packed import Packed
from dali_shards.worker.pieces import Interleaved, positioned, read_interleaved, read_segments
from dali_shards.worker.clock import StepClock
from dali_shards.worker.grouped import GroupBuffers
from dali_shards.worker.pending import Pending, draws
from dali_shards.worker.reader import Item, ShardReader, Skipped
from dali_shards.worker.stagger import prepare_step
from dali_shards.worker.standin import StandIn

log = logging.getLogger("dali_shards")


class Ahead(NamedTuple):
    """An epoch's reading started before its first batch is asked for (remote interleaving)."""

    plan: Plan
    emissions: List[Tuple[int, bool]]
    reading: Interleaved


class PlannedWorkerSource:
    """The mini-batches of one local worker (``config``), epoch by epoch (``epoch(e)``), stamped in
    its control-block ``slot``. Nothing is opened before the first epoch's first mini-batch is asked
    for; each epoch prepares the next at this worker's step (``prepare``: ``prepared``). When the
    epoch's remote requests are all answered, the next epoch's reading starts (``ahead``).
    """

    def __init__(self, config: WorkerConfig, mode: Planned, stamps=NO_STAMPS, direct: bool = False):
        if len(config.urls) != len(mode.spec.shard_sizes):
            raise ValueError("one URL per shard size is required")
        self.config, self.mode = config, mode
        self.worker = config.worker
        self.stamps = stamps
        self.direct = direct and direct_fits(config)
        self.ahead: Optional[Ahead] = None
        self.prepared: Optional[Union["EpochBatches", DirectBatches]] = None  # the next epoch's, made ahead
        self.buffers = GroupBuffers()  # the fast path's groups' bytes (grouped.py), kept across epochs

    def epoch(self, epoch: int) -> Iterator[Any]:
        """The iterator of ``epoch``'s mini-batches (with ``direct``, where the epoch allows it, of
        table writers that read a step straight into the ring's slot: ``worker/direct.py``): the
        one prepared while the epoch before was read, if any."""
        prepared, self.prepared = self.prepared, None
        if prepared is not None:
            if prepared.epoch == epoch:
                return prepared
            prepared.close()  # (epochs are asked for in order: not expected)
        return self._batches(epoch)

    def prepare(self, epoch: int, carried: Optional[int] = None) -> None:
        """Make ``epoch``'s iterator now, while the epoch before is read: its plan and order, and
        on the fast path its opening group of steps (``DirectBatches.prepare``: ``carried``, the steps
        the epoch before's last group reaches into). Only a head start: where anything fails, the
        epoch begins as usual when it is asked for, and fails there."""
        if self.prepared is not None:
            return
        batches: Optional[Union[EpochBatches, DirectBatches]] = None
        try:
            batches = self._batches(epoch)
            batches.prepare(carried)
        except Exception as exc:  # noqa: BLE001 - said again, in its place, when the epoch is asked for
            log.debug("dali_shards: epoch %d not prepared ahead: %r", epoch, exc)
            if batches is not None:
                batches.close()
            return
        self.prepared = batches

    def _batches(self, epoch: int) -> Union["EpochBatches", DirectBatches]:
        if self.direct and self.ahead is None:
            plan = self.plan_for(epoch)
            emissions = plan.worker_emissions(self.config.virtual_worker)
            shards = set(plan.locate([pos for pos, _ in emissions])[0].tolist()) if emissions else set()
            if shards and all(positioned(self.config, s) for s in shards):
                return DirectBatches(self, epoch, plan, emissions)
        return EpochBatches(self, epoch)

    def reader(self, plan: Plan) -> ShardReader:
        """A reader of this worker's shards for ``plan``'s epoch, stamping its progress."""
        return ShardReader(self.config, self.stamps.progress, plan.epoch)

    def plan_for(self, epoch: int) -> Plan:
        """The epoch's plan: the resumed one for the epoch a pipeline resumes in."""
        return epoch_plan(self.mode.spec, self.mode.resume_plan, epoch)

    def take_ahead(self, epoch: int) -> Optional[Ahead]:
        """The reading started ahead for ``epoch``, if any (one for another epoch is dropped)."""
        ahead, self.ahead = self.ahead, None
        if ahead is not None and ahead.plan.epoch != epoch:
            ahead.reading.close()
            return None
        return ahead

    def start_next_epoch(self, epoch: int, current: Interleaved) -> None:
        """Start reading ``epoch`` while ``current`` (the epoch before) goes on (see the class)."""
        v = self.config.virtual_worker
        try:
            plan = self.plan_for(epoch)
            if not (plan.interleaving and plan.worker_valid_count(v)):
                return
            emissions = plan.worker_emissions(v, 0)
            reading = self.interleaved(plan, emissions, ahead_of=current)
        except Exception as exc:  # noqa: BLE001 - only a head start: the epoch begins as usual
            log.debug("dali_shards: epoch %d not started ahead: %r", epoch, exc)
            return
        self.ahead = Ahead(plan, emissions, reading)

    def interleaved(
        self, plan: Plan, emissions: List[Tuple[int, bool]], ahead_of: Optional[Interleaved] = None
    ) -> Interleaved:
        """The interleaved reading of the samples in ``emissions`` (this worker's slots of ``plan``)."""
        needed = {pos for pos, _ in emissions}
        order = [pos for pos in plan.worker_read_order(self.config.virtual_worker).tolist() if pos in needed]
        reader = ShardReader(self.config, self.stamps.progress, plan.epoch)
        return Interleaved(plan, order, needed.__contains__, reader, ahead_of=ahead_of)


class EpochBatches:
    """Iterator over one epoch's mini-batches of one worker (lists of ``mini_batch`` packed samples)."""

    def __init__(self, source: PlannedWorkerSource, epoch: int):
        self.source = source
        self.epoch = epoch
        self._clock: Optional[Iterator[int]] = None
        self._order: Optional[Iterator[Tuple[int, bool]]] = None
        self._samples: Optional[Generator[Tuple[int, Item], None, None]] = None
        self._pending = Pending()
        self._last: Tuple[int, Optional[Item]] = (-1, None)
        self._good = StandIn(source.config)  # stands in for skipped samples
        self._reading: Optional[Interleaved] = None
        self._ahead_of: Optional[Interleaved] = None  # a remote reading whose next epoch is not started yet
        self._planned: Optional[Tuple[Plan, List[Tuple[int, bool]]]] = None  # the plan and this worker's emissions
        self._prepare_at = -1  # the step after which the next epoch is prepared

    def __iter__(self) -> "EpochBatches":
        return self

    def __next__(self):
        src = self.source
        if self._clock is None:
            self._clock = iter(StepClock(src.stamps, self.epoch, self._start()))
        try:
            step = next(self._clock)
        except StopIteration:
            self._close()
            raise
        batch = self._batch(step)
        if self._ahead_of is not None and self._ahead_of.fetcher is not None and self._ahead_of.fetcher.fetched_all:
            current, self._ahead_of = self._ahead_of, None
            src.start_next_epoch(self.epoch + 1, current)
        if step == self._prepare_at:
            src.prepare(self.epoch + 1)
        return batch

    def prepare(self, carried: Optional[int] = None) -> None:
        """The epoch's plan and this worker's emissions, made now (nothing is read; ``carried``:
        the fast path's, see ``DirectBatches.prepare``)."""
        if self._planned is None:
            plan = self.source.plan_for(self.epoch)
            self._planned = (plan, plan.worker_emissions(self.source.config.virtual_worker, self._window(plan)[2]))

    @staticmethod
    def _window(plan: Plan) -> Tuple[int, int, int]:
        """(slots per bucketing window or 0, slots of the resumed epoch passed over, the first slot
        emitted: the start of the window where it is bucketed)."""
        m = plan.spec.mini_batch
        span = window_steps(plan.spec.bucket_window, m) * m
        skip = plan.start_step * m
        return span, skip, skip // span * span if span else skip

    def _start(self) -> int:
        """Open the epoch's reading; the steps it takes."""
        src = self.source
        ahead = src.take_ahead(self.epoch)
        if ahead is None:
            self.prepare()
        plan, emissions = (ahead.plan, ahead.emissions) if ahead is not None else self._planned  # type: ignore[misc]
        span, skip, first = self._window(plan)
        v = src.config.virtual_worker
        steps = plan.steps - plan.start_step
        cfg = src.config
        self._prepare_at = prepare_step(cfg.worker, cfg.spec.py_num_workers, steps)
        self._order = self._bucketed(emissions, span, skip - first, first // span) if span else iter(emissions)
        if plan.interleaving and plan.worker_valid_count(v):
            reading = self._reading = ahead.reading if ahead is not None else src.interleaved(plan, emissions)
            self._ahead_of = reading if reading.fetcher is not None else None
            self._samples = read_interleaved(reading)
            return steps
        needed = {pos for pos, _ in emissions}
        reader = ShardReader(src.config, src.stamps.progress, plan.epoch)
        reads = plan.reads_of(v, needed) if needed else []
        if reads and all(positioned(src.config, seg.shard) for seg in reads):  # each sample by one read of its span
            self._reading = Interleaved(plan, draws(emissions), needed.__contains__, reader)
            self._samples = read_interleaved(self._reading)
            return steps
        self._samples = read_segments(plan, reads, needed.__contains__, reader)
        return steps

    def _bucketed(self, emissions: List[Tuple[int, bool]], span: int, skip: int, first: int) -> Iterator[Tuple[int, bool]]:
        """``emissions`` window by window, each window's valid samples (all read first) in the
        order ``plan.bucket`` gives their lengths, the padding after them; the first ``skip``
        slots left out (a resumed epoch goes on inside a window)."""
        cfg = self.source.config
        pad = None  # padding copies the last sample emitted
        for w, start in enumerate(range(0, len(emissions), span)):
            window = emissions[start : start + span]
            valid = [pos for pos, ok in window if ok]
            if valid:
                items = [self._take(pos) for pos in valid]
                self._last = (-1, None)
                lengths = [item.length if isinstance(item, Packed) else -1 for item in items]
                perm = window_order(lengths, cfg.spec.mini_batch, cfg.spec.seed, self.epoch, cfg.rank, first + w)
                for pos, item in zip(valid, items):
                    self._pending.put(pos, item)
                valid = [valid[i] for i in perm]
                pad = valid[-1]
            ordered = [(pos, True) for pos in valid]
            ordered += [(pos if pad is None else pad, False) for pos, ok in window if not ok]
            for entry in ordered:
                if skip:
                    skip -= 1
                    continue
                yield entry

    def _batch(self, step: int) -> List[Packed]:
        src = self.source
        samples = []
        assert self._order is not None  # set by _start()
        try:
            for _ in range(src.mode.spec.mini_batch):
                pos, valid = next(self._order)
                item = self._take(pos, valid)
                if isinstance(item, Skipped):
                    stand_in = self._good.sample(self._more())
                    packed = stand_in.as_skipped(item.index) if valid else stand_in.as_padding()
                elif valid:
                    packed = item
                    self._good.remember(item)
                else:
                    packed = item.as_padding()
                samples.append(packed)
        except StopIteration:  # never let a short read end this worker's epoch alone
            raise WorkerError(
                f"dali_shards internal error: worker {src.config.virtual_worker} ran out of planned samples at step "
                f"{step} of epoch {self.epoch}; please report it"
            ) from None
        return samples

    def _more(self) -> Iterator[Item]:
        """The samples read ahead, then the next ones read (kept for when they are emitted)."""
        yield from self._pending.values()
        assert self._samples is not None  # set by _start()
        for got, item in self._samples:
            self._pending.put(got, item)
            yield item

    def _take(self, pos: int, valid: bool = True) -> Union[Packed, Skipped]:
        """The sample at ``pos``: a valid draw takes a sample of its own (a mix may draw one twice),
        padding the copy of the last one taken."""
        if not valid and self._last[0] == pos:
            last = self._last[1]
            assert last is not None  # (-1, None) is no position's
            return last
        pending = self._pending
        assert self._samples is not None  # set by _start()
        while pos not in pending:
            got, item = next(self._samples)
            pending.put(got, item)
        item = pending.pop(pos)
        self._last = (pos, item)
        return item

    def close(self) -> None:
        """Close what the epoch opened (an epoch prepared but never asked for, too)."""
        self._close()

    def _close(self) -> None:
        if self._samples is not None:
            self._samples.close()
        if self._reading is not None:  # also when its generator never started
            self._reading.close()
        self._pending.clear()
        self._last = (-1, None)

