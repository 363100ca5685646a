"""Watching a pipeline's worker processes from the main process, whichever the transfer.

- ``Watchdog`` kills a worker that makes no progress for ``worker_timeout`` seconds while the
  main process waits for data, recording why, so that the iterator raises a ``WorkerError`` naming
  the worker and the shard it was reading; if the main process still waits ``RELEASE_S`` later,
  it kills the pipeline's other workers too.
- ``supervise`` ties a pipeline's control block to its life and makes SIGTERM act as Ctrl-C.

Imports no DALI.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import weakref
from typing import Any, Optional, Sequence, Tuple

from dali_shards.plan.geometry import virtual_worker
from dali_shards.ipc.control import ControlBlock, WorkerStatus
from dali_shards.worker.parent import HEARTBEAT_S

log = logging.getLogger("dali_shards")
RELEASE_S = 5.0  # how long the main process may still wait once a stuck worker is killed: then the others are


def stuck_worker(statuses: Sequence[WorkerStatus], now: float, timeout: float) -> Optional[WorkerStatus]:
    """Of the workers that made no progress for ``timeout`` seconds -- whose heartbeat stopped (a
    stopped or frozen process), or that have been producing a batch without reading a sample --
    the one to blame: a frozen one first (it certainly holds the others up), else the one silent
    longest; None if every worker is progressing or waiting and alive."""
    stuck = [s for s in statuses if now - s.alive > timeout or (s.busy and now - s.progress > timeout)]
    frozen = [s for s in stuck if now - s.alive > timeout]
    return min(frozen or stuck, key=lambda s: max(s.progress, s.alive if s in frozen else 0.0), default=None)


class Watchdog:
    """Kills a worker that makes no progress for ``control.worker_timeout`` seconds while the main
    process waits in a call into DALI (``begin()``/``end()`` around it), recording in ``reason``
    which worker, why, and the shard it was reading; the others too if the call still waits
    ``RELEASE_S`` after that. A thread of its own, started at the first call; ``stop()`` ends it.
    Holds no reference to the pipeline or the iterator."""

    def __init__(self, control: ControlBlock, pids: Sequence[int], urls: Sequence[str], rank: int):
        self.control = control
        self.timeout = control.worker_timeout
        self.pids = list(pids)
        self.urls = urls
        self.rank = rank
        self.reason: Optional[str] = None
        self._since: Optional[float] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def begin(self) -> None:
        if self.timeout is None:
            return
        self._since = time.monotonic()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True, name="dali-shards-watchdog")
            self._thread.start()

    def end(self) -> None:
        self._since = None

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        assert self.timeout is not None  # begin() starts the thread only with a timeout
        warned = None
        killed: Optional[Tuple[float, float, int]] = None  # the stuck worker's: (the wait, when, pid)
        while not self._stop.wait(min(1.0, self.timeout / 4)):
            since = self._since
            now = time.monotonic()
            if killed is not None and since == killed[0] and now - killed[1] > RELEASE_S:
                self._kill_the_others(now - killed[1], killed[2])
                killed = None
            if since is None or self.reason is not None or now - since < self.timeout:
                continue
            statuses = self.control.snapshot()
            status = stuck_worker(statuses, now, self.timeout)
            if status is None:
                if warned != since:
                    warned = since
                    log.warning("dali_shards: waited %.0f s for a batch; every worker is alive and idle", now - since)
                continue
            # DALI's process order need not be the sources' order: a worker's own stamp says its pid
            unclaimed = [pid for pid in self.pids if pid not in {s.pid for s in statuses}]
            pid = status.pid if status.pid in self.pids else (unclaimed[0] if unclaimed else None)
            if pid is None:
                continue
            self.reason = self.describe(status, pid, now)
            killed = (since, now, pid)
            _kill(pid)

    def _kill_the_others(self, waited: float, stuck: int) -> None:
        """The main process still waits after the stuck worker was killed (another worker holds it
        up: stopped too, or holding what DALI waits for): the pipeline is failing anyway, so every
        other worker is killed, and what waits on them is released."""
        log.warning(
            "dali_shards: still waiting %.0f s after a stuck worker was killed; killing the pipeline's other workers",
            waited,
        )
        for pid in self.pids:
            if pid != stuck:  # (killed already: its pid may be another process's by now)
                _kill(pid)

    def describe(self, status: WorkerStatus, pid: int, now: float) -> str:
        """Which worker made no progress, for how long, and where."""
        assert self.timeout is not None  # only the watchdog's thread (with a timeout) asks
        virtual = virtual_worker(self.rank, status.worker, self.control.py_num_workers)
        url = self.urls[status.shard] if 0 <= status.shard < len(self.urls) else None
        last = max(status.progress, status.alive) if now - status.alive > self.timeout else status.progress
        silent = f"for {now - last:.1f} s" if last else "since it started"
        if status.busy and url is not None:
            where = f" while reading shard {url!r} (epoch {status.epoch}, batch {status.step})"
        else:
            where = f" (its last shard: {url!r})" if url is not None else ""
        frozen = now - status.alive > max(self.timeout, 4 * HEARTBEAT_S)
        return (
            f"dali_shards worker {status.worker} (virtual worker {virtual}, pid {pid}) of rank {self.rank} made no "
            f"progress {silent}{where}, longer than worker_timeout={self.timeout:g} s, and was killed"
            + (" (its process did not respond at all: stopped or frozen)" if frozen else "")
            + ". If the storage is only slow, raise worker_timeout (None turns the check off)"
        )


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _sigterm_as_interrupt(signum, frame):
    raise KeyboardInterrupt("SIGTERM (handled as Ctrl-C by dali_shards, so that its worker processes are stopped)")


def install_sigterm_handler() -> bool:
    """Make SIGTERM raise ``KeyboardInterrupt`` in this process, as Ctrl-C does, so that cleanup
    runs -- only from the main thread and only where SIGTERM still has its default action.
    True if installed now."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return False
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    return True


def supervise(pipeline: Any, control: ControlBlock) -> None:
    """Remove the control block when the pipeline goes; handle SIGTERM like Ctrl-C in this process."""
    weakref.finalize(pipeline, control.remove)
    install_sigterm_handler()
