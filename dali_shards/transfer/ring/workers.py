"""The ring transfer's worker processes: started by the library (``fork`` or ``spawn``), each
running one local worker's source and writing its mini-batches into its ring; stopped with their
pipeline, killed when anything goes wrong. Imports no DALI.

A worker process enters like any of the library's workers (``worker/process.py``: garbage
collection frozen, signals left to the main process, bound to end with it), then emits its epochs
one after the other, from the pipeline's first; it stops when asked, when its connection ends, or
with its parent. An error is handed to the main process as the exception it was.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import multiprocessing as mp
import os
import time
from typing import Any, Iterator, List, Optional, Sequence, Tuple

from dali_shards.transfer.base import dead_of, kill_all, pids_of
from dali_shards.transfer.ring.consumer import RingConsumer
from dali_shards.transfer.ring.producer import RingProducer, Stopped
from dali_shards.worker.config import WorkerConfig
from dali_shards.worker.parent import watched_children
from dali_shards.worker.process import attach_stamps, entered_process
from dali_shards.worker.sources import make_source

log = logging.getLogger("dali_shards")
JOIN_S = 5.0  # how long stopped workers may take to end, all together, before they are killed
START_METHODS = ("fork", "spawn")


def run_worker(config: WorkerConfig, conn: Any, depth: int, owner_pid: int, first_slot_bytes: int, direct: bool) -> None:
    """A ring worker process's whole life (see the module); ``direct``: its steps may take the fast
    path (``worker/direct.py``)."""
    entered_process(owner_pid)
    producer = RingProducer(conn, depth, config.packing, first_slot_bytes)
    try:
        producer.stamps = attach_stamps(config.control, config.worker)
        source = make_source(config, producer.stamps, direct=direct)
        epoch = config.start_epoch
        while True:
            steps = 0
            for samples in source.epoch(epoch):
                producer.put(epoch, steps, samples)
                steps += 1
            producer.end(epoch, steps)
            epoch += 1
    except Stopped:
        pass
    except BaseException as exc:  # noqa: BLE001 - every failure goes to the main process
        try:
            producer.fail(exc)
            producer.wait_for_stop()  # alive until the main process has read it: then it ends this process
        except (OSError, ValueError):
            pass  # the main process is gone
    finally:
        producer.close()
        conn.close()


class RingWorkers:
    """The worker processes of one pipeline's ring, one per local worker ``configs[w]``, and the
    main process's consumer of each (``consumers``, in worker order): ``depth`` slots each, the first
    of ``first_slot_bytes``, started with ``start_method`` (one of ``START_METHODS``); ``direct``:
    their steps may take the fast path."""

    def __init__(self, configs: Sequence[WorkerConfig], depth: int, start_method: str, first_slot_bytes: int,
                 direct: bool):  # fmt: skip
        self.configs = list(configs)
        self.depth = depth
        self.start_method = start_method
        self.first_slot_bytes = first_slot_bytes
        self.direct = direct
        self.processes: List[Any] = []
        self.consumers: List[RingConsumer] = []
        self.owner_pid = os.getpid()

    @property
    def started(self) -> bool:
        return bool(self.processes)

    def start(self) -> None:
        """Start the processes (once; all or none), each watching this process from its first
        moment (``worker/parent.py``). Nothing the parent dropped is finalized in a forked child (a
        discarded DALI pipeline's shutdown hangs there): see ``_fork_safe``."""
        if self.started:
            return
        with _fork_safe(), watched_children():
            self.processes, self.consumers = self._start_all()

    def _start_all(self) -> Tuple[List[Any], List[RingConsumer]]:
        ctx = mp.get_context(self.start_method)
        processes: List[Any] = []
        consumers: List[RingConsumer] = []
        try:
            for config in self.configs:
                here, there = ctx.Pipe(duplex=True)
                try:
                    process = ctx.Process(  # type: ignore[attr-defined]  # typeshed's BaseContext has no Process
                        target=run_worker,
                        args=(config, there, self.depth, os.getpid(), self.first_slot_bytes, self.direct),
                        name=f"dali-shards-worker-{config.rank}.{config.worker}",
                    )
                    process.start()
                except BaseException:
                    here.close()
                    raise
                finally:
                    there.close()
                processes.append(process)
                consumers.append(RingConsumer(here, process, self.depth, config.packing.header_columns))
        except BaseException:
            _end(processes, consumers)
            raise
        return processes, consumers

    def pids(self) -> List[int]:
        return pids_of(self.processes)

    def dead(self) -> List[Tuple[int, Optional[int]]]:
        return dead_of(self.processes)

    def kill(self) -> None:
        """SIGKILL every live worker process now."""
        kill_all(self.processes)

    def stop(self) -> None:
        """Ask every worker to end, give them ``JOIN_S`` in all, kill the rest, and reap them all."""
        if os.getpid() != self.owner_pid:  # a forked child's copy: the workers are its parent's
            return
        _end(self.processes, self.consumers)
        self.consumers = []


@contextlib.contextmanager
def _fork_safe() -> Iterator[None]:
    """While children fork: collection off, and what exists frozen out of it (given back after),
    so that no garbage of the parent's is collected in a child before it freezes what it inherited
    (``entered_process``). Where the user froze objects already (``gc.freeze``), they stay frozen:
    garbage is collected first instead."""
    enabled = gc.isenabled()
    thaw = gc.get_freeze_count() == 0
    if thaw:
        gc.freeze()
    else:
        gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if thaw:
            gc.unfreeze()
        if enabled:
            gc.enable()


def _end(processes: Sequence[Any], consumers: Sequence[RingConsumer]) -> None:
    """Stop these workers: asked first, killed after ``JOIN_S`` (one deadline for all), reaped."""
    for consumer in consumers:
        consumer.stop()
    deadline = time.monotonic() + JOIN_S
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    kill_all(processes)
    for process in processes:
        process.join(JOIN_S)
