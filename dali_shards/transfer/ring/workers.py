"""The ring transfer's worker processes: started by the library (``fork`` or ``spawn``), each
running one local worker's source and writing its mini-batches into its ring; stopped with their
pipeline, killed when anything goes wrong. Imports no DALI.

A worker process enters like any of the library's workers (``worker/process.py``: garbage
collection frozen, signals left to the main process, bound to end with it), then emits its epochs
one after the other, from the pipeline's first; it stops when asked, when its connection ends, or
with its parent. An error is handed to the main process as the exception it was.
"""

from __future__ import annotations

import gc
import logging
import multiprocessing as mp
import os
import signal
from typing import Any, List, Optional, Sequence, Tuple

from dali_shards.transfer.base import pids_of
from dali_shards.transfer.ring.consumer import RingConsumer
from dali_shards.transfer.ring.producer import RingProducer, Stopped
from dali_shards.worker.config import WorkerConfig
from dali_shards.worker.process import attach_slot, entered_process
from dali_shards.worker.sources import make_source

log = logging.getLogger("dali_shards")
JOIN_S = 5.0  # how long a stopped worker may take to end before it is killed


def run_worker(config: WorkerConfig, conn: Any, depth: int, owner_pid: int, first_slot_bytes: int) -> None:
    """A ring worker process's whole life (see the module)."""
    entered_process(owner_pid)
    producer = RingProducer(conn, depth, config.layout, first_slot_bytes)
    try:
        source = make_source(config, attach_slot(config.control, config.worker))
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
    main process's consumer of each (``consumers``, in worker order)."""

    def __init__(self, configs: Sequence[WorkerConfig], depth: int, start_method: str, first_slot_bytes: int):
        self.configs = list(configs)
        self.depth = depth
        self.start_method = start_method
        self.first_slot_bytes = first_slot_bytes
        self.processes: List[Any] = []
        self.consumers: List[RingConsumer] = []
        self.owner_pid = os.getpid()

    @property
    def started(self) -> bool:
        return bool(self.processes)

    def start(self) -> None:
        """Start the processes (once). Nothing the parent dropped is finalized in a forked child:
        everything is frozen out of garbage collection while the children fork (a collection in a
        child would run the finalizers of a discarded DALI pipeline there, which hang), and given
        back to the collector here right after."""
        if self.started:
            return
        gc.freeze()
        try:
            self._start_all()
        finally:
            gc.unfreeze()

    def _start_all(self) -> None:
        ctx = mp.get_context(self.start_method)
        for config in self.configs:
            here, there = ctx.Pipe(duplex=True)
            process = ctx.Process(
                target=run_worker,
                args=(config, there, self.depth, os.getpid(), self.first_slot_bytes),
                name=f"dali-shards-worker-{config.rank}.{config.worker}",
            )
            process.start()
            there.close()
            self.processes.append(process)
            self.consumers.append(RingConsumer(here, process, self.depth, config.layout.header_slots))

    def pids(self) -> List[int]:
        return pids_of(self.processes)

    def dead(self) -> List[Tuple[int, Optional[int]]]:
        return [(p.pid, p.exitcode) for p in self.processes if p.exitcode is not None]

    def kill(self) -> None:
        """SIGKILL every live worker process now."""
        for process in self.processes:
            if process.pid and process.exitcode is None:
                try:
                    os.kill(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def stop(self) -> None:
        """Ask every worker to end, wait ``JOIN_S`` for them, kill the rest, and reap them all."""
        if os.getpid() != self.owner_pid:  # a forked child's copy: the workers are its parent's
            return
        for consumer in self.consumers:
            consumer.stop()
        for process in self.processes:
            process.join(JOIN_S)
        self.kill()
        for process in self.processes:
            process.join(JOIN_S)
        self.consumers = []
