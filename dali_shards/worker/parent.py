"""A worker process bound to end with the process that started it (its owner), from its first
moment, whichever the transfer and start method.

A worker ends within about a second of its owner's death, however the owner dies (SIGKILL
included): on Linux through a parent-death signal (``PR_SET_PDEATHSIG``, SIGKILL) where the
owner's main thread started it (the signal fires when the starting *thread* ends, so a worker
started by another thread does not get it), and everywhere through a heartbeat thread that
compares ``os.getppid()`` with the owner's pid every ``HEARTBEAT_S`` -- which works while the
worker's main thread is blocked in an import, a read or DALI's wait for its next task.

``watched_children()`` makes that start at once in the workers the owner starts inside it: a
forked worker from the fork itself (an at-fork hook), a spawned one before it imports the main
module or unpickles its task (an entry of multiprocessing's preparation data, which the child
unpickles first: ``_SpawnedWatch``; it imports this module, with the package's own light imports,
a fraction of a second). A worker entered otherwise binds itself with ``watch_parent`` when a
source first runs in it (``worker/process.py``). Imports no DALI.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing.spawn
import os
import signal
import sys
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional

from dali_shards.pids import pid_alive

HEARTBEAT_S = 0.5
_PR_SET_PDEATHSIG = 1

_forked_by_main_thread = False  # set in the owner just before each fork; a forked child inherits it
_starting: Dict[int, int] = {}  # thread ident -> owner pid, while that thread is in watched_children()
_watched: Optional[int] = None  # in a worker: the owner pid its heartbeat watches
_beating: List[Any] = []  # in a worker: the control-block stamps its heartbeat beats (``beat_for``)
_preparation_data: Optional[Callable[..., Dict[str, Any]]] = None  # multiprocessing's, once wrapped


@contextlib.contextmanager
def watched_children() -> Iterator[None]:
    """Inside it, the worker processes this thread starts (fork or spawn) watch this process from
    their first moment (see the module)."""
    _wrap_preparation_data()
    me = threading.get_ident()
    outer = _starting.get(me)
    _starting[me] = os.getpid()
    try:
        yield
    finally:
        if outer is None:
            _starting.pop(me, None)


def watch_parent(owner_pid: int, by_main_thread: Optional[bool] = None) -> None:
    """In a worker process: end it within about a second of ``owner_pid``'s death (see the module);
    at once if it is dead already. ``by_main_thread``: whether the owner's main thread started this
    process (None: whether it forked it; False in a spawned process). Once per process. Not bound
    where ``owner_pid`` is alive but not this process's parent (not ours to bind)."""
    global _watched
    if by_main_thread is None:
        by_main_thread = _forked_by_main_thread
    if _watched is not None or os.getpid() == owner_pid:
        return
    if os.getppid() != owner_pid:
        if pid_alive(owner_pid):
            return
        os._exit(1)  # the owner died before this process got here
    _watched = owner_pid
    if by_main_thread and sys.platform.startswith("linux"):
        _set_parent_death_signal()
        if os.getppid() != owner_pid:  # it died while the signal was being set
            os._exit(1)
    threading.Thread(target=_heartbeat, args=(owner_pid,), daemon=True, name="dali-shards-heartbeat").start()


def beat_for(stamps: Any) -> None:
    """Let this worker's heartbeat beat ``stamps`` (a ``WorkerStamps``), and remove its control
    block's file if the owner dies (a dead owner cannot)."""
    _beating.append(stamps)


def _heartbeat(owner_pid: int) -> None:
    while True:
        if os.getppid() != owner_pid:
            for stamps in list(_beating):
                try:
                    os.unlink(stamps.path)
                except OSError:
                    pass
            os._exit(1)
        for stamps in list(_beating):
            stamps.beat()
        time.sleep(HEARTBEAT_S)


def _set_parent_death_signal() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass  # the heartbeat thread still notices


def _before_fork() -> None:
    global _forked_by_main_thread
    _forked_by_main_thread = threading.current_thread() is threading.main_thread()


def _after_fork_in_child() -> None:
    owner = _starting.get(threading.get_ident())  # the forking thread is this child's only one
    _starting.clear()
    if owner is not None:
        watch_parent(owner, _forked_by_main_thread)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


# What a spawned worker runs first, unpickling its preparation data: nothing of the parent's is
# importable before multiprocessing's ``prepare()`` sets ``sys.path``, so it is set here as
# ``prepare()`` is about to set it (the parent's), and this module imported from where the parent
# has it.
_SPAWNED_FIRST = """\
import sys
sys.path[:] = {path!r}
from dali_shards.worker.parent import watch_parent
watch_parent({owner!r}, {main!r})
"""


class _SpawnedWatch:
    """An entry of a spawned worker's preparation data: unpickled in the child before anything
    else of the parent's (the main module, the worker's task), it calls ``watch_parent`` there."""

    def __init__(self, path: List[str], owner_pid: int, by_main_thread: bool):
        self.source = _SPAWNED_FIRST.format(path=list(path), owner=owner_pid, main=by_main_thread)

    def __reduce__(self) -> Any:
        return (exec, (self.source, {}))


def _wrap_preparation_data() -> None:
    """Wrap ``multiprocessing.spawn.get_preparation_data`` (once): a process spawned by a thread
    inside ``watched_children`` gets a ``_SpawnedWatch`` entry; any other spawn is left as it was
    (``prepare`` ignores keys it does not know)."""
    global _preparation_data
    if _preparation_data is not None:
        return
    _preparation_data = multiprocessing.spawn.get_preparation_data

    def get_preparation_data(name: str) -> Dict[str, Any]:
        assert _preparation_data is not None
        data = _preparation_data(name)
        owner = _starting.get(threading.get_ident())
        if owner is not None:
            main = threading.current_thread() is threading.main_thread()
            data["dali_shards_watch"] = _SpawnedWatch(data.get("sys_path", sys.path), owner, main)
        return data

    multiprocessing.spawn.get_preparation_data = get_preparation_data
