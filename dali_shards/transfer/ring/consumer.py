"""A ring's main-process side for one worker: its announcements read in order, its slots mapped,
each mini-batch seen as views of the worker's shared memory until it is released. Imports no DALI.
"""

from __future__ import annotations

import multiprocessing.connection
import json
from typing import Any, List, NamedTuple, Optional, Union

import numpy as np

from dali_shards.ipc.packed import table_rows
from dali_shards.errors import ShardMapError, WorkerError, rebuilt
from dali_shards.pids import describe_exit
from dali_shards.transfer.ring import messages
from dali_shards.transfer.ring.segment import Stretch

GONE_S = 2.0  # how long a worker whose connection ended may take to be gone


class MiniBatch(NamedTuple):
    """A worker's mini-batch of step ``step`` of ``epoch``: ``rows`` (one header row per sample,
    int64) and ``table`` (the whole table, uint8; byte fields at the offsets the rows give), views
    of the worker's slot ``slot``."""

    epoch: int
    step: int
    slot: int
    rows: np.ndarray
    table: np.ndarray


class EpochEnd(NamedTuple):
    """The worker ended ``epoch`` after ``steps`` steps."""

    epoch: int
    steps: int


class WorkerGone(WorkerError):
    """A ring worker's process ended (it died or was killed): which, and how."""


class RingConsumer:
    """The reading end of one worker's ring over ``conn``, to the worker ``process``;
    ``header_columns`` the int64 slots of a sample's row."""

    def __init__(self, conn: Any, process: Any, depth: int, header_columns: int):
        self.conn = conn
        self.process = process
        self.header_columns = header_columns
        self.segments: List[Optional[Stretch]] = [None] * depth
        self.generations = [0] * depth
        self.closed = False

    def next(self) -> Union[MiniBatch, EpochEnd]:
        """The worker's next announcement (waits for it); a worker's error is raised as it was
        raised there; ``WorkerGone`` if it died (a stuck but live worker is the watchdog's to kill,
        see ``supervise.py``; Ctrl-C interrupts the wait)."""
        self._wait()
        try:
            msg = messages.receive(self.conn)
        except (EOFError, OSError) as exc:
            raise self._gone(f"its connection ended ({type(exc).__name__})") from None
        if msg.kind == messages.END:
            return EpochEnd(int(msg.epoch), int(msg.step))
        if msg.kind == messages.ERROR:
            raise self._error()
        if msg.kind != messages.BATCH:
            raise WorkerError(f"dali_shards internal error: unexpected ring message kind {msg.kind}; please report it")
        slot = int(msg.slot)
        if msg.generation != self.generations[slot]:
            try:
                self.segments[slot] = Stretch.received(self.conn, int(msg.capacity))
            except (EOFError, OSError) as exc:
                raise self._gone(f"its connection ended while it passed a slot ({type(exc).__name__})") from None
            self.generations[slot] = int(msg.generation)
        segment = self.segments[slot]
        assert segment is not None  # received with the slot's first generation
        table = segment.array[: int(msg.size)]
        count = int(msg.count)
        rows = table_rows(table, count, self.header_columns)
        return MiniBatch(int(msg.epoch), int(msg.step), slot, rows, table)

    def release(self, slot: int) -> None:
        """The main process is done with ``slot``: the worker may write it again."""
        if not self.closed:
            try:
                messages.send(self.conn, messages.FREE, slot=slot)
            except (OSError, ValueError):
                pass  # the worker is gone: the next read says so

    def stop(self) -> None:
        """Ask the worker to end, and forget its slots."""
        if not self.closed:
            self.closed = True
            try:
                messages.send(self.conn, messages.STOP)
            except (OSError, ValueError):
                pass
            self.conn.close()
        self.segments = [None] * len(self.segments)

    def _wait(self) -> None:
        ready = multiprocessing.connection.wait([self.conn, self.process.sentinel])
        if self.conn not in ready:  # (a dead worker's last messages are read before its death is reported)
            raise self._gone("its process ended")

    def _gone(self, what: str) -> WorkerGone:
        """The error for a worker found gone, once its exit code is known (it is ending)."""
        self.process.join(GONE_S)
        return WorkerGone(f"a dali_shards worker process (pid {self.process.pid}) stopped: {what}, "
                          f"{describe_exit(self.process.exitcode)}")  # fmt: skip

    def _error(self) -> BaseException:
        """The error a worker sent (see ``RingProducer.fail``), rebuilt from its fields (a class of
        the allowlist: ``errors.rebuilt``), its traceback as its cause; any other a ``WorkerError``
        with the traceback."""
        try:
            sent = json.loads(self.conn.recv_bytes())
            text = str(sent["traceback"])
        except Exception as err:  # noqa: BLE001 - the worker died while sending it
            return self._gone(f"it failed, and its error could not be read ({type(err).__name__}: {err})")
        exc = rebuilt(sent.get("error"))
        if exc is None:
            return WorkerError(f"a dali_shards worker process (pid {self.process.pid}) failed:\n{text}")
        if exc.__cause__ is None and not isinstance(exc, ShardMapError):  # a ShardMapError carries the user's
            exc.__cause__ = RemoteTraceback(text)
        return exc


class RemoteTraceback(Exception):
    """A worker's traceback, as text (the cause of the exception it raised)."""

    def __str__(self) -> str:
        return f"\nin the worker process:\n{self.args[0]}"
