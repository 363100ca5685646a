"""A pipeline's worker process, seen from inside: epochs counted per process, and what a worker
does when a source first runs in it.

A worker process ends within about a second of its parent's death: on Linux through a
parent-death signal (``PR_SET_PDEATHSIG``, SIGKILL) where the parent forked it from its main
thread (the signal fires when the forking *thread* ends, so a worker forked by another thread, or
spawned, does not get it), and everywhere through a heartbeat thread that compares
``os.getppid()`` with the pid that built the pipeline every half second -- which works while the
worker's main thread is blocked in a read. Ctrl-C and SIGTERM are the main process's to handle:
workers ignore SIGINT and keep SIGTERM's default action. Imports no DALI.
"""

from __future__ import annotations

import ctypes
import gc
import os
import signal
import sys
import threading
import time
from typing import List, Optional, Tuple

from dali_shards.errors import WorkerError
from dali_shards.pids import pid_alive
from dali_shards.shm.control import NO_STAMPS, WorkerStamps

HEARTBEAT_S = 0.5
_PR_SET_PDEATHSIG = 1

_forked_by_main_thread = False  # set in the parent just before each fork; a forked child inherits it
_entered: Optional[int] = None
_attached: List[WorkerStamps] = []


def _note_forking_thread() -> None:
    global _forked_by_main_thread
    _forked_by_main_thread = threading.current_thread() is threading.main_thread()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_note_forking_thread)


class ProcessEpochs:
    """Epoch counting for a worker source: DALI calls ``iter()`` once per epoch in the worker
    process (and once in the main process when the pipeline is defined), so epochs count per
    process from ``start_epoch``. Per-process state (names in ``_process_state``) is dropped
    when pickled and reset in a new process.

    A source records the process that builds it (``owner_pid``), the path of the pipeline's
    control block (``control``, or None) and its local ``worker`` id (see ``init_process``). The
    first ``iter()`` in another process makes it a worker: see ``entered_process``; ``slot`` is
    then its slot in the control block."""

    start_epoch: int
    worker: int
    owner_pid: Optional[int] = None
    control: Optional[str] = None
    stamps = NO_STAMPS
    _process_state: Tuple[str, ...] = ()

    def init_process(self, control: Optional[str]) -> None:
        """Record the building process and the control block's path (call in ``__init__``)."""
        self.owner_pid = os.getpid()
        self.control = control

    def next_epoch(self) -> int:
        """The epoch the coming ``iter()`` starts."""
        pid = os.getpid()
        if getattr(self, "_pid", None) != pid:
            self._pid, self._epoch = pid, self.start_epoch
            for name in self._process_state:
                setattr(self, name, None)
            self.stamps = NO_STAMPS
            if pid != (self.owner_pid or _MAIN_PID):
                entered_process(self.owner_pid)
                self.stamps = attach_stamps(self.control, self.worker)
        else:
            self._epoch += 1
        return self._epoch

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_pid"] = None
        state.pop("stamps", None)
        for name in self._process_state:
            state[name] = None
        return state


def attach_stamps(path: Optional[str], worker: int):
    """This worker's stamps in the control block at ``path`` (a stand-in without one)."""
    if path is None:
        return NO_STAMPS
    try:
        stamps = WorkerStamps(path, worker)
    except (OSError, ValueError) as exc:
        raise WorkerError(
            f"dali_shards worker {worker} cannot open its pipeline's control block {path} ({exc}); the pipeline "
            "was probably deleted while its workers started"
        ) from exc
    _attached.append(stamps)
    return stamps


def entered_pid() -> Optional[int]:
    """The pid of this process if a source entered it as a worker (see ``entered_process``)."""
    return _entered


def entered_process(owner_pid: Optional[int] = None) -> None:
    """Called when a source first runs in a worker process (not ``owner_pid``, the process that
    built it). The objects inherited from the parent are frozen out of garbage collection, so that
    a collection here never runs their finalizers (a parent's discarded DALI pipeline would try to
    shut down the parent's worker pool from inside this worker, and hang); torch, if imported, runs
    on one thread; SIGINT is ignored and
    SIGTERM takes its default action; and the process is bound to end with its parent."""
    global _entered
    pid = os.getpid()
    if _entered == pid or pid == (owner_pid or _MAIN_PID):
        return
    _entered = pid
    gc.freeze()  # what the parent left, garbage included, is never collected here
    gc.enable()  # (the ring's parent forks with collection off)
    _one_torch_thread()
    _leave_signals_to_the_parent()
    if owner_pid is not None:
        _bind_to_parent(owner_pid)


def _one_torch_thread() -> None:
    """Torch ops in a worker (a ``map``) run on one thread, as in DataLoader's workers: workers are
    the parallelism, and a thread pool the parent used before the fork hangs in the child."""
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "set_num_threads"):
        torch.set_num_threads(1)


def _leave_signals_to_the_parent() -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the main process handles it
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:  # e.g. inherited through fork
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _bind_to_parent(owner_pid: int) -> None:
    if os.getppid() != owner_pid:
        if pid_alive(owner_pid):
            return  # run by something else than the pipeline's pool: not ours to bind
        os._exit(1)  # the parent died before this process got here
    if _forked_by_main_thread and sys.platform.startswith("linux"):
        _set_parent_death_signal()
        if os.getppid() != owner_pid:  # it died while the signal was being set
            os._exit(1)
    threading.Thread(target=_heartbeat, args=(owner_pid,), daemon=True, name="dali-shards-heartbeat").start()


def _set_parent_death_signal() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass  # the heartbeat thread still notices


def _heartbeat(owner_pid: int) -> None:
    while True:
        if os.getppid() != owner_pid:
            for stamps in _attached:
                try:
                    os.unlink(stamps.path)  # the dead parent cannot remove its control block (a file)
                except OSError:
                    pass
            os._exit(1)
        for stamps in _attached:
            stamps.beat()
        time.sleep(HEARTBEAT_S)


_MAIN_PID = os.getpid()
