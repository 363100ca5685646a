"""A pipeline's worker process, seen from inside: what a worker does when a source first runs in
it, and its stamps in the control block. It ends within about a second of its parent's death
(``worker/parent.py``: watched from its first moment where the library started it, else from
here). Ctrl-C and SIGTERM are the main process's to handle: workers ignore SIGINT and keep
SIGTERM's default action. Imports no DALI.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading
from typing import Optional

from dali_shards.errors import WorkerError
from dali_shards.ipc.control import NO_STAMPS, WorkerStamps
from dali_shards.worker.parent import beat_for, watch_parent

_entered: Optional[int] = None


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
    beat_for(stamps)
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
        watch_parent(owner_pid)  # (at once where the library started the process: see worker/parent.py)


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


_MAIN_PID = os.getpid()
