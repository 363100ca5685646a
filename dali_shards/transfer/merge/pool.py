"""Every touch of DALI's worker pool internals, in one place (the merge transfer's): its processes
(``pipe._py_pool.pool._processes``), the condition variable and lock of each worker's task queue,
its observer thread, and ``Pipeline.start_py_workers``. Looked up defensively: where DALI moved
them, only the checks that need nothing from DALI remain (``tests/pipeline/test_dali_internals.py``
fails loudly on such a DALI version). Imports no DALI.

- ``WorkerWatch`` keeps DALI from blocking forever when a worker process dies.
- ``kill_workers`` ends every worker of a pipeline at once (stopped ones too).
- ``start_collected`` makes a pipeline collect garbage before its workers start (each watching
  this process from its first moment: ``worker/parent.py``), check each step before DALI takes
  it from the pool, and raise a worker's error as the dali_shards error it was wherever DALI
  receives it (``pipe.run()``, DALI's own iterators, ours).
"""

from __future__ import annotations

import functools
import gc
import logging
import multiprocessing.connection
import threading
import time
import weakref
from typing import Any, Callable, List, Optional, Tuple

from dali_shards.errors import from_worker
from dali_shards.transfer.base import dead_of, kill_all, pids_of
from dali_shards.worker.parent import watched_children

log = logging.getLogger("dali_shards")
LOST_WORKER_TEXT = "Worker data receiving interrupted"  # what DALI says when a worker of its pool is gone


def _processes(pipeline: Any) -> list:
    try:
        return list(pipeline._py_pool.pool._processes)  # noqa: SLF001
    except AttributeError:
        return []


def worker_pids(pipeline: Any) -> List[int]:
    """The pids of the pipeline's worker processes (empty before it is built)."""
    return pids_of(_processes(pipeline))


def dead_workers(pipeline: Any) -> List[Tuple[int, Optional[int]]]:
    """(pid, exit code) of the pipeline's worker processes that have exited."""
    return dead_of(_processes(pipeline))


def kill_workers(pipeline: Any) -> None:
    """SIGKILL every live worker process of the pipeline (a stopped one too), then let DALI's pool
    observer see them end. If the observer is stuck on a lock a killed worker held, it is
    detached so that the pool's shutdown does not wait for it."""
    kill_all(_processes(pipeline))
    observer: Any = getattr(getattr(getattr(pipeline, "_py_pool", None), "pool", None), "_observer", None)
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


def start_collected(pipeline: Any, before_receive: Callable[[], None]) -> None:
    """Make ``pipeline`` collect garbage before its workers start (see ``_start_collected``), and
    call ``before_receive`` each time it is about to take a batch from its pool (it may raise)."""
    pipeline.start_py_workers = functools.partial(_start_collected, weakref.ref(pipeline), before_receive)


def _start_collected(ref: Any, before_receive: Callable[[], None], *args: Any, **kwargs: Any) -> Any:
    """``Pipeline.start_py_workers``, after a garbage collection: a pipeline dropped earlier but not
    yet collected would otherwise be collected in a forked worker, right after the fork, where
    DALI's shutdown of it never returns and the new pipeline's start hangs. The workers watch
    this process from their first moment (``watched_children``)."""
    gc.collect()
    pipeline = ref()
    with watched_children():
        started = type(pipeline).start_py_workers(pipeline, *args, **kwargs)
    _receive_checked(getattr(pipeline, "_py_pool", None), before_receive)
    return started


def _receive_checked(pool: Any, before: Callable[[], None]) -> None:
    """Make ``pool`` call ``before`` ahead of each batch it hands over, and raise a worker's error
    as the dali_shards error it was (``errors.carry``), not as DALI's plain ``Exception`` holding
    its text: the one place all of DALI's callers of the pool (``pipe.run()``, its iterators)
    receive a batch."""
    receive = getattr(pool, "receive_batch", None)
    if receive is None:
        return

    def receive_typed(context_i: int) -> Any:
        before()
        try:
            return receive(context_i)
        except StopIteration:
            raise
        except Exception as exc:
            carried = from_worker(exc)
            if carried is None:
                raise
            raise carried from None

    pool.receive_batch = receive_typed
