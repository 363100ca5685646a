"""What a transfer is (``Handover``: ``RingTransfer``, ``MergeTransfer``, one made per pipeline by
``choice.transfer_for``): the one object that decides, for its pipeline, everything that differs
between the transfers -- the DALI keywords it refuses and those it adds, a sample's slot (table or
single array, the payload), its slots' size, its workers, the graph's inputs, the steps it keeps in
flight, and its failures in our words. Everything else -- epochs, ``len()``, cuts, state, resume,
audit, the watchdog -- is shared. Imports no DALI.

``prefetch_queue_depth`` is read in one place (``Queues``), from the keywords the pipeline is made
with (DALI's defaults where not given), under one rule (``steps_held``).
"""

from __future__ import annotations

import math
import os
import signal
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Protocol, Sequence, Tuple, Union

import numpy as np

from dali_shards.errors import ConfigError
from dali_shards.ipc.control import ControlBlock
from dali_shards.worker.config import WorkerConfig

Sizes = Callable[[], Sequence[Tuple[float, int, str]]]  # (bytes, tie-break, name) of the fields that may be a payload


class Handover(Protocol):
    """One pipeline's transfer (see the module), made from the options; ``check`` and
    ``slot_layout`` are asked before the workers are resolved, ``start`` once they are, the rest
    once the pipeline is defined and built."""

    name: str

    def check(self, settings: Mapping[str, Any]) -> None:
        """A ``ConfigError`` naming a DALI keyword of the pipeline (``settings``: DALI's defaults
        filled in) that this transfer cannot run with."""
        ...

    def slot_layout(self, sizes: Sizes) -> Tuple[bool, Optional[str]]:
        """(table form?, payload) of a sample's slot (``ipc/packing.py``); ``sizes()`` ranks the
        fields that may be the payload."""
        ...

    def pipeline_keywords(self) -> Dict[str, Any]:
        """The DALI keywords the pipeline needs for this transfer."""
        ...

    def start(self, configs: Sequence[WorkerConfig], sample_bytes: Optional[int], control: Optional[ControlBlock],
              settings: Mapping[str, Any]) -> None:  # fmt: skip
        """Its workers for ``configs`` (their processes start when the pipeline is built), its
        slots sized from ``sample_bytes`` (a sample's estimated bytes, if known) and its queues from
        ``settings`` (see ``check``)."""
        ...

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

    def in_flight(self, pipeline: Any = None) -> int:
        """Steps a worker may have produced beyond those the iterator returned: an epoch cut short
        ends that many steps on (``Queues.in_flight``; ``pipeline``, the one it feeds, adds nothing:
        its queues were read from the keywords it was made with)."""
        ...

    def translate(self, exc: BaseException) -> Optional[BaseException]:
        """Our error for a failure of this transport (a worker's error it carried as text, a lost
        worker), or None to let the caller decide."""
        ...

    def lost_worker(self, exc: BaseException) -> bool:
        """True if ``exc`` says a worker was lost (then reported as a ``WorkerError``)."""
        ...


QueueDepth = Union[int, Mapping[str, int]]


def positive_int(value: Any) -> bool:
    """Whether ``value`` is an integer (not a bool) of at least 1: a queue's depth."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and bool(value >= 1)


def steps_held(prefetch_queue_depth: QueueDepth) -> int:
    """The steps DALI may hold a step it was fed for: ``prefetch_queue_depth``, or the product of its
    CPU and GPU queues where they differ (DALI's rule for ``no_copy`` in ``external_source``: a
    step's data stays untouched that many feeds). It also bounds the steps DALI runs ahead of the
    outputs taken (its prefetch: the larger queue), so it serves both what a transfer must keep
    and how far ahead its workers may be. The one rule for the queue depth."""
    if isinstance(prefetch_queue_depth, Mapping):
        sizes = [int(v) for v in prefetch_queue_depth.values()] or [1]  # (an empty one: DALI says what is wrong)
        return max(1, math.prod(sizes) if len(set(sizes)) > 1 else sizes[0])
    return max(1, int(prefetch_queue_depth))


@dataclass(frozen=True)
class Queues:
    """A pipeline's queues: ``held``, the steps DALI holds (``steps_held``), and
    ``worker_prefetch``, the steps each worker prepares ahead."""

    held: int
    worker_prefetch: int

    @classmethod
    def of(cls, settings: Mapping[str, Any], worker_prefetch: int) -> "Queues":
        """The queues of a pipeline made with ``settings`` (its DALI keywords, DALI's defaults filled in)."""
        return cls(steps_held(settings["prefetch_queue_depth"]), worker_prefetch)

    @property
    def slots(self) -> int:
        """The steps a worker's output must be kept for: those DALI holds and those it prepares ahead."""
        return self.worker_prefetch + self.held

    @property
    def in_flight(self) -> int:
        """Steps a worker may have produced beyond those returned: those DALI holds (or runs
        ahead), those each worker prepares ahead, and the one it is making (a larger cut costs
        only batches read in vain)."""
        return self.slots + 1


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
