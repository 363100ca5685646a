"""A ring's worker side: mini-batches written into the worker's own shared-memory slots, each
announced to the main process once written (see ``messages.py``).

A worker owns ``depth`` slots, each one segment it grows on demand: a mini-batch larger than its
slot gets a new, larger segment (1.5 times what it needs, at least ``MIN_SLOT``) whose descriptor
goes with the announcement, so no mini-batch is ever cut short, however large one sample is. A
slot is written again only after the main process said it is free. Imports no DALI.
"""

from __future__ import annotations

import json
import traceback
from collections import deque
from typing import Any, Deque, List, Optional

from dali_shards.errors import WorkerError, carried_fields
from dali_shards.transfer.ring import messages
from dali_shards.transfer.ring.segment import Stretch
from dali_shards.ipc.control import NO_STAMPS
from dali_shards.ipc.packing import Packing
from dali_shards.ipc.tables import Grow, as_table

MIN_SLOT = 1 << 20
GROWTH = 1.5


class Stopped(Exception):
    """The main process asked the worker to end (or is gone)."""


class RingProducer:
    """The writing end of one worker's ring (``depth`` slots) over ``conn``."""

    def __init__(self, conn: Any, depth: int, packing: Packing, first_slot_bytes: int = MIN_SLOT):
        self.conn = conn
        self.stamps: Any = NO_STAMPS  # the worker's, once attached (``ipc.control.WorkerStamps``): a slot's wait is no stall
        self.packing = packing
        self.slots: List[Optional[Stretch]] = [None] * depth
        self.generations = [0] * depth  # each slot's segment, counted
        self.sent = [0] * depth  # the generation of each slot's segment the main process has
        self.free: Deque[int] = deque(range(depth))
        self.first_slot_bytes = max(MIN_SLOT, int(first_slot_bytes))

    def put(self, epoch: int, step: int, batch: Any) -> None:
        """Write the mini-batch of ``step`` of ``epoch`` into a free slot and announce it (waits for a
        free slot; ``Stopped`` if the main process ends the worker meanwhile). ``batch``: packed
        samples, or a table writer (``ipc/tables.py``)."""
        waits = not self.free
        if waits:  # for the main process to free a slot: not stuck, however long
            self.stamps.waiting()
        slot = self._free_slot()
        if waits:
            self.stamps.begin(epoch, step)
        table = as_table(self.packing, batch)
        need = table.capacity
        while True:
            segment = self._segment(slot, need)
            try:
                size = table.write(segment.array)
                break
            except Grow as more:
                need = more.size
        messages.send(
            self.conn, messages.BATCH, epoch=epoch, step=step, slot=slot, size=size, capacity=segment.size,
            generation=self.generations[slot], count=len(table),
        )  # fmt: skip
        if self.sent[slot] != self.generations[slot]:
            segment.send(self.conn)
            self.sent[slot] = self.generations[slot]

    def end(self, epoch: int, steps: int) -> None:
        """Announce that ``epoch`` ended after ``steps`` steps."""
        messages.send(self.conn, messages.END, epoch=epoch, step=steps)

    def fail(self, exc: BaseException) -> None:
        """Hand ``exc`` to the main process as data (``errors.carried_fields``, the same carrier the
        merge transfer's errors take: JSON, never pickled code), with its traceback as text. What is
        not an ``Exception`` (``SystemExit`` escaping the library's own code...) goes as a
        ``WorkerError``, so that it does not end the main process quietly."""
        if not isinstance(exc, Exception):
            exc = WorkerError(f"a dali_shards worker ended with {type(exc).__name__}: {exc}")
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        messages.send(self.conn, messages.ERROR)
        self.conn.send_bytes(json.dumps({"error": carried_fields(exc), "traceback": text}).encode())

    def wait_for_stop(self) -> None:
        """Wait until the main process ends this worker (or is gone)."""
        try:
            while messages.receive(self.conn).kind != messages.STOP:
                pass
        except (EOFError, OSError):
            pass

    def _free_slot(self) -> int:
        while not self.free:
            try:
                msg = messages.receive(self.conn)
            except (EOFError, OSError):
                raise Stopped() from None
            if msg.kind == messages.STOP:
                raise Stopped()
            if msg.kind == messages.FREE:
                self.free.append(int(msg.slot))
        return self.free.popleft()

    def _segment(self, slot: int, size: int) -> Stretch:
        """The slot's segment, replaced by a larger one if ``size`` bytes do not fit."""
        segment = self.slots[slot]
        if segment is not None and size <= segment.size:
            return segment
        want = max(self.first_slot_bytes if segment is None else MIN_SLOT, int(size * GROWTH))
        if segment is not None:
            segment.close()
        segment = self.slots[slot] = Stretch.create(want, f"dali-shards-slot-{slot}")
        self.generations[slot] += 1
        return segment

    def close(self) -> None:
        for segment in self.slots:
            if segment is not None:
                segment.close()
