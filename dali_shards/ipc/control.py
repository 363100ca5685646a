"""The control block: a few hundred bytes of shared memory between a pipeline's main process and
its worker processes.

The main process creates it when it builds a pipeline: anonymous memory (a Linux ``memfd``, which
the workers open as ``/proc/<pid>/fd/<fd>``) that ends with the processes that map it, whichever
way they end; elsewhere a file in ``/dev/shm`` where there is one (else in the temporary
directory). The worker sources carry only its path and map it in the worker process, so it works
with ``fork`` and ``spawn`` alike. Each worker stamps
its own record (pid, a heartbeat, when it last made progress, whether it is producing a batch, its
epoch and step, the batches it produced, the shard it reads); the main process reads the records to
find a stuck worker, and publishes one word, "epoch E ends at step K", to cut an abandoned epoch
short. A file is removed once every worker has mapped it (the iterator looks before each batch),
or with the pipeline; files left by dead processes are removed when the next one is created.
Imports no DALI.
"""

from __future__ import annotations

import ctypes
import glob
import mmap
import os
import struct
import tempfile
import time
import weakref
from typing import List, NamedTuple, Optional, Tuple

from dali_shards.pids import pid_alive
from dali_shards.options import option_default

_MAGIC = b"DSCTL001"
_PREFIX = "dali-shards-"
_SUFFIX = ".ctl"


class Header(ctypes.Structure):
    """The block's first 64 bytes."""

    _fields_ = [
        ("magic", ctypes.c_char * 8),
        ("owner", ctypes.c_int64),  # the main process's pid
        ("workers", ctypes.c_int64),  # records that follow
        ("reserved", ctypes.c_int64),
        ("cut", ctypes.c_int64),  # (epoch + 1) << 32 | step: the epoch ends after that step (0: none)
        ("padding", ctypes.c_int64 * 3),
    ]


class Record(ctypes.Structure):
    """One worker's 64 bytes, after the header (the fields of ``WorkerStatus``, in its order)."""

    _fields_ = [
        ("pid", ctypes.c_int64),
        ("alive", ctypes.c_double),  # time.monotonic() of its last heartbeat
        ("progress", ctypes.c_double),  # ... of the last sample read or batch finished
        ("busy", ctypes.c_int64),  # 1 while a batch is being produced
        ("epoch", ctypes.c_int64),
        ("step", ctypes.c_int64),  # batches of ``epoch`` produced
        ("produced", ctypes.c_int64),  # batches produced in all
        ("shard", ctypes.c_int64),  # the shard it reads (-1: none yet)
    ]


assert ctypes.sizeof(Header) == ctypes.sizeof(Record) == 64


def _record_at(worker: int) -> int:
    return ctypes.sizeof(Header) + ctypes.sizeof(Record) * worker


class WorkerStatus(NamedTuple):
    """What worker ``worker`` last stamped: ``alive`` is its last heartbeat, ``progress`` the last
    sample read or batch finished (``time.monotonic()`` seconds, 0 before the first), ``busy``
    whether it is producing a batch, ``step`` the batches of ``epoch`` it produced, ``produced``
    its batches in all, ``shard`` the index of the shard it reads (-1: none yet)."""

    worker: int
    pid: int
    alive: float
    progress: float
    busy: bool
    epoch: int
    step: int
    produced: int
    shard: int


def _directory() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


def remove_stale(directory: Optional[str] = None) -> List[str]:
    """Remove the control blocks of processes that no longer exist; returns their paths."""
    removed = []
    for path in glob.glob(os.path.join(directory or _directory(), f"{_PREFIX}*{_SUFFIX}")):
        try:
            pid = int(os.path.basename(path)[len(_PREFIX) :].split("-", 1)[0])
        except ValueError:
            continue
        if not pid_alive(pid):
            try:
                os.unlink(path)
                removed.append(path)
            except OSError:
                pass
    return removed


def _new_file(directory: Optional[str]) -> Tuple[int, str, bool]:
    """(descriptor, path the workers open, whether it is a named file to remove)."""
    if directory is None and hasattr(os, "memfd_create") and os.path.isdir(f"/proc/{os.getpid()}/fd"):
        fd = os.memfd_create(f"{_PREFIX}control")  # close-on-exec: spawned workers open it by path
        return fd, f"/proc/{os.getpid()}/fd/{fd}", False
    directory = directory or _directory()
    remove_stale(directory)
    fd, path = tempfile.mkstemp(prefix=f"{_PREFIX}{os.getpid()}-", suffix=_SUFFIX, dir=directory)
    return fd, path, True


def _release(path: Optional[str], mapped: mmap.mmap, fd: Optional[int], owner_pid: int) -> None:
    if os.getpid() != owner_pid:  # a forked child's copy: the block is its parent's
        return
    mapped.close()
    if fd is not None:
        os.close(fd)
    if path is not None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


class ControlBlock:
    """The main process's side of a pipeline's control block, with the settings that go with it
    (``worker_timeout``, which the watchdog reads). Create it with :meth:`create`; it is removed by
    :meth:`remove`, or when it is garbage collected, or at exit."""

    def __init__(self, path: str, py_num_workers: int, worker_timeout: Optional[float]):
        self.path = path
        self.py_num_workers = py_num_workers
        self.worker_timeout = worker_timeout
        self.owner_pid = os.getpid()
        self._map: Optional[mmap.mmap] = None
        self._finalizer: Optional[weakref.finalize] = None
        self._unlinked = False

    @classmethod
    def create(
        cls,
        py_num_workers: int,
        *,
        worker_timeout: Optional[float] = option_default("worker_timeout"),
        directory: Optional[str] = None,
    ) -> "ControlBlock":
        """A new, zeroed control block for ``py_num_workers`` workers: anonymous memory (a
        ``memfd`` the workers open through ``/proc``: nothing to leave behind, however the process
        ends) where Linux has it and no ``directory`` is given, else a file there (stale ones of
        dead processes are removed first)."""
        fd, path, named = _new_file(directory)
        try:
            size = _record_at(py_num_workers)
            os.ftruncate(fd, size)
            block = cls(path, py_num_workers, worker_timeout)
            block._map = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            if named:
                os.unlink(path)
            raise
        if named:
            os.close(fd)
        block._unlinked = not named  # a memfd has no name to remove
        block._finalizer = weakref.finalize(
            block, _release, path if named else None, block._map, None if named else fd, block.owner_pid
        )
        block._map[: ctypes.sizeof(Header)] = bytes(Header(magic=_MAGIC, owner=os.getpid(), workers=py_num_workers))
        return block

    def snapshot(self) -> List[WorkerStatus]:
        """Every worker's last stamps."""
        if self._map is None:
            return []
        records = (Record.from_buffer_copy(self._map, _record_at(w)) for w in range(self.py_num_workers))
        return [WorkerStatus(w, *(getattr(r, field[0]) for field in Record._fields_)) for w, r in enumerate(records)]

    def unlink_once_attached(self) -> bool:
        """Remove the block's file once every worker has mapped it (its record carries a pid): the
        mapping stays, and nothing is left behind however the processes end later. True once done."""
        if self._unlinked or self._map is None:
            return self._unlinked
        if all(status.pid for status in self.snapshot()):
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            self._unlinked = True
        return self._unlinked

    def cut(self, epoch: int, step: int) -> None:
        """Publish that ``epoch`` ends after ``step`` batches of each worker (counted from where
        the workers started that epoch)."""
        if not 0 <= step < 1 << 32 or not 0 <= epoch < (1 << 31) - 1:
            raise ValueError(f"cannot cut epoch {epoch} at step {step}")
        if self._map is not None:
            struct.pack_into("<q", self._map, Header.cut.offset, (epoch + 1) << 32 | step)

    def remove(self) -> None:
        """Unmap and delete the block (only in the process that created it)."""
        if os.getpid() == self.owner_pid and self._finalizer is not None:
            self._map = None
            self._finalizer()


class WorkerStamps:
    """A worker process's view of its record in a control block (the stamps it makes there) (opened by path)."""

    def __init__(self, path: str, worker: int):
        with open(path, "r+b") as f:
            self._map = mmap.mmap(f.fileno(), 0)
        header = Header.from_buffer_copy(self._map, 0)
        if header.magic != _MAGIC or not 0 <= worker < header.workers:
            raise ValueError(f"{path} is not a dali_shards control block with a record for worker {worker}")
        self.path = path
        self._record = Record.from_buffer(self._map, _record_at(worker))  # written in place, field by field
        self._produced = 0
        record = self._record
        record.alive, record.progress, record.shard = time.monotonic(), 0.0, -1
        record.pid = os.getpid()  # last: a record with a pid is attached

    def beat(self) -> None:
        """The process is alive (from its heartbeat thread)."""
        self._record.alive = time.monotonic()

    def progress(self, shard: Optional[int] = None) -> None:
        """A sample was read (or a shard is being opened: ``shard``)."""
        self._record.progress = time.monotonic()
        if shard is not None:
            self._record.shard = shard

    def begin(self, epoch: int, step: int) -> None:
        """Batch ``step`` of ``epoch`` is being produced."""
        record = self._record
        record.progress = time.monotonic()  # first: never busy with an old progress stamp
        record.epoch, record.step, record.busy = epoch, step, 1

    def waiting(self) -> None:
        """The worker waits for its consumer -- to be asked for its next batch, or for a free slot
        to make the current one in -- however long, and is not stuck meanwhile."""
        self._record.busy = 0

    def end(self, epoch: int, step: int, produced: bool = True) -> None:
        """``step`` batches of ``epoch`` are done (``produced``: one more was just made)."""
        self._produced += produced
        record = self._record
        record.epoch, record.step, record.produced, record.busy = epoch, step, self._produced, 0
        record.progress = time.monotonic()

    def cut_step(self, epoch: int) -> Optional[int]:
        """The step at which ``epoch`` was cut short by the main process, if it was."""
        (word,) = struct.unpack_from("<q", self._map, Header.cut.offset)
        return word & 0xFFFF_FFFF if word and (word >> 32) - 1 == epoch else None


class NoStamps:
    """Stands in for the stamps where a source runs without a control block: stamps nothing."""

    path = None

    def beat(self) -> None:
        pass

    def progress(self, shard: Optional[int] = None) -> None:
        pass

    def begin(self, epoch: int, step: int) -> None:
        pass

    def waiting(self) -> None:
        pass

    def end(self, epoch: int, step: int, produced: bool = True) -> None:
        pass

    def cut_step(self, epoch: int) -> Optional[int]:
        return None


NO_STAMPS = NoStamps()
