"""What a transfer provides the main process (``RingTransfer``, ``MergeTransfer``): the graph's
inputs, its worker processes (started, watched, killed), how many steps can be in flight (for an
epoch cut short), and its own failures in our words. Everything else -- epochs, ``len()``, cuts,
state, resume, audit, the watchdog -- is shared. Imports no DALI.
"""

from __future__ import annotations

import os
import signal
from typing import Any, List, Optional, Protocol, Sequence, Tuple

from dali_shards.errors import ConfigError


class Transfer(Protocol):
    """One pipeline's transfer (see the module)."""

    name: str

    def graph_inputs(self) -> Tuple[List[Any], Any]:
        """Inside the graph's definition: the requested fields (DataNodes, in the packing's order)
        and each slot's ``[__index__, status]`` (int64) for the iterator."""
        ...

    def returned(self, outputs: Sequence[Any]) -> None:
        """Inside the graph's definition, once the function has returned ``outputs``: what the
        transfer may tune knowing which of its inputs the pipeline returns as they are."""
        ...

    def attach(self, pipeline: Any) -> None:
        """Bind to the defined pipeline: its workers start when it is built."""
        ...

    def watch(self) -> None:
        """Once the pipeline is built (its workers started): anything the transfer watches."""
        ...

    def pids(self) -> List[int]:
        """The worker processes' pids (empty before they start)."""
        ...

    def dead(self) -> List[Tuple[int, Optional[int]]]:
        """(pid, exit code) of the worker processes that have ended."""
        ...

    def kill(self) -> None:
        """End every worker process now (SIGKILL), so that nothing waits on them."""
        ...

    def in_flight(self, pipeline: Any) -> int:
        """Steps a worker may have produced beyond those the iterator returned: an epoch cut short
        ends that many steps on."""
        ...

    def translate(self, exc: BaseException) -> Optional[BaseException]:
        """Our error for a failure of this transport (a worker's error it carried as text, a lost
        worker), or None to let the caller decide."""
        ...

    def lost_worker(self, exc: BaseException) -> bool:
        """True if ``exc`` says a worker was lost (then reported as a ``WorkerError``)."""
        ...


def steps_in_flight(prefetch_queue_depth: Any, worker_depth: int) -> int:
    """Steps that may be prepared beyond those returned: DALI's prefetch queue (both of its
    queues, where CPU and GPU ones are given: a larger cut costs only batches read in vain), each
    worker's own queue, and the one a worker is making."""
    depth = sum(prefetch_queue_depth.values()) if isinstance(prefetch_queue_depth, dict) else int(prefetch_queue_depth)
    return depth + worker_depth + 1


def outputs_pending(pipeline: Any) -> Optional[int]:
    """How many of the steps ``pipeline`` ran DALI has not returned the outputs of yet (None:
    unknown, e.g. no pipeline)."""
    count = getattr(pipeline, "_batches_to_consume", None)  # DALI's count: a step fed but not yet taken
    return count if isinstance(count, int) else None


def refuse_scheduled_ahead(pipeline: Any, room: int, transfer: str, why: str, remedy: str) -> None:
    """A ``ConfigError`` where ``pipeline`` is about to feed a step while ``room`` or more of its
    steps still wait for their outputs to be taken (``schedule_run()`` called more often than
    ``outputs()``): a transfer whose steps DALI reads in place can hold only ``room`` of them.
    ``why`` says why (after ``transfer='...'``), ``remedy`` what else to do."""
    ahead = outputs_pending(pipeline)
    if ahead is None or ahead < room:
        return
    raise ConfigError(
        f"the pipeline was scheduled {ahead} step{'s' * (ahead != 1)} ahead of its outputs: transfer={transfer!r} "
        f"{why}; take an output before scheduling more, or {remedy}"
    )


def pids_of(processes: Sequence[Any]) -> List[int]:
    """The pids of started processes (``multiprocessing.Process``-like)."""
    return [p.pid for p in processes if p.pid]


def dead_of(processes: Sequence[Any]) -> List[Tuple[int, Optional[int]]]:
    """(pid, exit code) of the processes that have ended."""
    return [(p.pid, p.exitcode) for p in processes if p.pid and p.exitcode is not None]


def kill_all(processes: Sequence[Any]) -> None:
    """SIGKILL every live process of ``processes`` (a stopped one too)."""
    for process in processes:
        if process.pid and process.exitcode is None:
            try:
                os.kill(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
