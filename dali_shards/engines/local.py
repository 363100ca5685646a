"""The local engine: tasks in this machine's processes (one process: in this one)."""

from __future__ import annotations

import os
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Dict, Iterator, Optional, Sequence, Tuple

from dali_shards.errors import WorkerError


class LocalEngine:
    """Runs tasks in ``processes`` local processes (default: all cores; 1: in this process)."""

    def __init__(self, processes: Optional[int] = None) -> None:
        self.workers = processes or os.cpu_count() or 1

    def run(self, fn: Callable[[Any], Any], tasks: Sequence[Any]) -> Iterator[Tuple[int, Any]]:
        """``(index, fn(task))`` for every task, as each completes."""
        workers = min(self.workers, len(tasks))
        if workers <= 1:
            for i, task in enumerate(tasks):
                yield i, fn(task)
            return
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures: Dict[Future, int] = {pool.submit(fn, task): i for i, task in enumerate(tasks)}
            try:
                while futures:
                    done, _ = wait(futures, return_when=FIRST_COMPLETED)
                    for future in done:
                        i = futures.pop(future)
                        yield i, _result(future)
            finally:
                for future in futures:
                    future.cancel()

    def close(self) -> None:
        """Nothing to release: each ``run`` has its own processes."""


def _result(future: Future) -> Any:
    try:
        return future.result()
    except BrokenProcessPool:
        raise WorkerError(
            "a writer process died (killed, or out of memory) before its task completed; run the same command "
            "again: what was complete is kept"
        ) from None
