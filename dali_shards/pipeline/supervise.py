"""Watching a pipeline's worker processes from the main process.

- ``WorkerWatch`` keeps DALI from blocking forever when a worker process dies.
- ``Watchdog`` kills a worker that makes no progress for ``worker_timeout`` seconds while the
  main process waits for data, recording why, so that the iterator raises a ``WorkerError`` naming
  the worker and the shard it was reading.
- ``kill_workers`` ends every worker of a pipeline at once (stopped ones too): the iterator does it
  when an exception (Ctrl-C included) escapes a call into DALI, so that exit never waits on them.
- ``supervise`` ties a pipeline's control block to its life and makes SIGTERM act as Ctrl-C.

DALI's worker pool is looked up defensively (``pipe._py_pool``): without it only the checks that
need nothing from DALI remain. Imports no DALI.
"""

from __future__ import annotations

import functools
import gc
import logging
import multiprocessing.connection
import os
import signal
import threading
import time
import weakref
from typing import Any, List, Optional, Sequence, Tuple

from dali_shards.worker.control import ControlBlock, WorkerStatus
from dali_shards.worker.process import HEARTBEAT_S

log = logging.getLogger("dali_shards")


def _processes(pipeline: Any) -> list:
    try:
        return list(pipeline._py_pool.pool._processes)  # noqa: SLF001
    except AttributeError:
        return []


def worker_pids(pipeline: Any) -> List[int]:
    """The pids of the pipeline's worker processes (empty before it is built)."""
    return [p.pid for p in _processes(pipeline) if p.pid]


def dead_workers(pipeline: Any) -> List[Tuple[int, Optional[int]]]:
    """(pid, exit code) of the pipeline's worker processes that have exited."""
    return [(p.pid, p.exitcode) for p in _processes(pipeline) if p.exitcode is not None]


def describe_exit(code: Optional[int]) -> str:
    """An exit code in words."""
    if code is None:
        return "running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def kill_workers(pipeline: Any) -> None:
    """SIGKILL every live worker process of the pipeline (a stopped one too), then let DALI's pool
    observer see them end. If the observer is stuck on a lock a killed worker held, it is
    detached so that the pool's shutdown does not wait for it."""
    for proc in _processes(pipeline):
        if proc.pid and proc.exitcode is None:
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    observer = getattr(getattr(getattr(pipeline, "_py_pool", None), "pool", None), "_observer", None)
    thread = getattr(observer, "thread", None)
    if isinstance(thread, threading.Thread):
        thread.join(timeout=5)
        if thread.is_alive():
            log.warning("dali_shards: DALI's worker observer did not stop after its workers were killed; detached")
            observer.thread = None


class WorkerWatch:
    """Keeps DALI from blocking forever when a worker process dies.

    A worker killed while it waits for its next task leaves the condition variable of its task
    queue expecting an acknowledgement from it; DALI's next hand-off to that queue would wait for
    it forever (DALI then terminates the other workers, leaving the same state in their queues).
    When a worker process ends, this thread gives that acknowledgement, so the hand-off returns and
    the iterator can report the dead worker; after a normal shutdown nothing uses the queue again.
    A worker stopped or killed while it held its queue's lock (taking a task) would block the
    hand-off on the lock itself: that lock is released too (``free_lock_of_the_dead``).
    (DALI and multiprocessing internals, looked up defensively: without them only the check before
    each call remains.)"""

    @staticmethod
    def start(pipeline: Any) -> None:
        try:
            pool = pipeline._py_pool.pool  # noqa: SLF001
            pairs = list(zip(pool._processes, pool._workers_contexts))  # noqa: SLF001
        except AttributeError:
            return
        threading.Thread(target=WorkerWatch._run, args=(pairs,), daemon=True, name="dali-shards-watch").start()

    @staticmethod
    def _run(pairs) -> None:
        pending = {proc.sentinel: (proc, ctx) for proc, ctx in pairs}
        while pending:
            try:
                ready = multiprocessing.connection.wait(list(pending))
            except (OSError, ValueError):
                return
            for sentinel in ready:  # the process has ended (its exit code may already be reaped by DALI)
                _, ctx = pending.pop(sentinel)
                queue = getattr(ctx, "dedicated_task_queue", None)
                woken = getattr(getattr(queue, "cv_not_empty", None), "_woken_count", None)
                if woken is not None:
                    woken.release()
                free_lock_of_the_dead(getattr(queue, "lock", None))


LOOKS = 3  # how many times a lock must be seen taken, by no thread of this process, to be freed
LOOK_S = 0.1


def free_lock_of_the_dead(lock: Any) -> bool:
    """Release ``lock`` (a multiprocessing Lock shared by this process and one worker that has
    ended) if the worker died holding it: it stays taken over ``LOOKS`` looks ``LOOK_S`` apart, and
    no thread of this process holds it. True if released. What DALI then does with the dead
    worker's queue fails as for any dead worker, instead of waiting forever."""
    semlock = getattr(lock, "_semlock", None)
    if semlock is None:
        return False
    try:
        for look in range(LOOKS):
            if look:
                time.sleep(LOOK_S)
            if semlock._get_value() != 0 or semlock._count() != 0:  # noqa: SLF001 - free, or ours
                return False
        lock.release()
        semlock._after_fork()  # noqa: SLF001 - this process's count of it back to 0: it never held it
    except (AttributeError, NotImplementedError, OSError, ValueError, AssertionError):
        return False
    log.warning("dali_shards: a worker process ended holding its task queue's lock; released it")
    return True


def stuck_worker(statuses: Sequence[WorkerStatus], now: float, timeout: float) -> Optional[WorkerStatus]:
    """Of the workers that made no progress for ``timeout`` seconds -- whose heartbeat stopped (a
    stopped or frozen process), or that have been producing a batch without reading a sample --
    the one silent longest; None if every worker is progressing or idle and alive."""
    stuck = [s for s in statuses if now - s.alive > timeout or (s.busy and now - s.progress > timeout)]
    return min(stuck, key=lambda s: max(s.progress, s.alive if now - s.alive > timeout else 0.0), default=None)


class Watchdog:
    """Kills a worker that makes no progress for ``control.worker_timeout`` seconds while the main
    process waits in a call into DALI (``begin()``/``end()`` around it), recording in ``reason``
    which worker, why, and the shard it was reading. A thread of its own, started at the first
    call; ``stop()`` ends it. Holds no reference to the pipeline or the iterator."""

    def __init__(self, control: ControlBlock, pids: Sequence[int], urls: Sequence[str], rank: int):
        self.control = control
        self.timeout = control.worker_timeout
        self.pids = list(pids)
        self.urls = list(urls)
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
        warned = None
        while not self._stop.wait(min(1.0, self.timeout / 4)):
            since = self._since
            now = time.monotonic()
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
            pid = status.pid if status.pid in self.pids else (unclaimed or [None])[0]
            if pid is None:
                continue
            self.reason = self.describe(status, pid, now)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def describe(self, status: WorkerStatus, pid: int, now: float) -> str:
        """Which worker made no progress, for how long, and where."""
        virtual = self.rank * self.control.py_num_workers + status.worker
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
    """Remove the control block when the pipeline goes; handle SIGTERM like Ctrl-C in this process;
    collect garbage before the workers start (see ``_start_collected``)."""
    weakref.finalize(pipeline, control.remove)
    install_sigterm_handler()
    pipeline.start_py_workers = functools.partial(_start_collected, weakref.ref(pipeline))


def _start_collected(ref: Any, *args: Any, **kwargs: Any) -> Any:
    """``Pipeline.start_py_workers``, after a garbage collection: a pipeline dropped earlier but not
    yet collected would otherwise be collected in a forked worker, right after the fork, where
    DALI's shutdown of it never returns and the new pipeline's start hangs."""
    gc.collect()
    pipeline = ref()
    return type(pipeline).start_py_workers(pipeline, *args, **kwargs)
