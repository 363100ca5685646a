"""The ring transfer of one pipeline: the library's own worker processes (``workers.py``), each
writing its mini-batches into its ring of shared-memory slots, and one (non-parallel) external
source whose callback (``feed.py``) gives DALI each step's batch, field by field; the workers start
when the pipeline is built and stop with it. Its slot is a table of every field (no payload), and
its workers take the fast path where their epochs allow it (``worker/direct.py``). Imports DALI
only once the graph is defined (``graph.py``), so that the pure resolve step can ask it its slot.

DALI's operators read the slots in place (``no_copy``: the main process copies no bytes), so a
step's slots are held until DALI is done with them (``base.steps_held``) and until their output is
taken; a worker can be ``worker_prefetch`` steps ahead of the pipeline. A field the pipeline
returns as it is, DALI copies when it takes it: its output would be copied anyway, and a copy of
memory DALI does not own costs it more at the output. Memory per rank: ``py_num_workers x
(worker_prefetch + steps held)`` slots, each the size of the largest mini-batch written into it
(times 1.5), at least 1 MiB.
"""

from __future__ import annotations

import functools
import re
import warnings
import weakref
from multiprocessing.util import Finalize
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from dali_shards.errors import ConfigError
from dali_shards.options import ShardedOptions
from dali_shards.ipc.control import ControlBlock
from dali_shards.transfer.base import Queues, Sizes, positive_int
from dali_shards.transfer.ring.consumer import WorkerGone
from dali_shards.transfer.ring.feed import FEED_NAME, RingFeed
from dali_shards.transfer.ring.workers import START_METHODS, RingWorkers
from dali_shards.userwarn import warn_user
from dali_shards.worker.config import WorkerConfig


def set_no_copy(node: Any, in_place: bool) -> bool:
    """Set ``no_copy`` of the external source output ``node`` once the graph's outputs are known;
    whether DALI reads it in place. Left to DALI's default (a copy) where a DALI release builds its
    operators otherwise."""
    spec = getattr(getattr(node, "source", None), "spec", None)
    try:
        spec.AddArg("no_copy", in_place)  # type: ignore[union-attr]  # (AttributeError: caught)
    except (AttributeError, RuntimeError):
        return False
    return in_place


class RingTransfer:
    """The ring transfer of one pipeline (see the module and ``transfer.base.Handover``)."""

    name = "ring"
    FAST_PATH = True  # its workers write a step straight into its slot where they can

    def __init__(self, options: ShardedOptions):
        self.options = options
        self.queues: Optional[Queues] = None
        self._workers: Optional[RingWorkers] = None
        self._feed: Optional[RingFeed] = None
        self._configs: Sequence[WorkerConfig] = ()
        self._control: Optional[ControlBlock] = None
        self.nodes: List[Any] = []
        self.in_place: List[bool] = []

    # -- before the pipeline -----------------------------------------------------------------
    def check(self, settings: Mapping[str, Any]) -> None:
        """Its own processes start with ``fork`` or ``spawn``; its slots are counted from a queue
        depth that is a positive integer, or one per queue (CPU and GPU)."""
        start_method = settings["py_start_method"]
        if start_method not in START_METHODS:
            raise ConfigError(
                f"py_start_method={start_method!r}: the ring's worker processes start with one of {START_METHODS} "
                "(they are bound to end with the process that starts them)"
            )
        depth = settings["prefetch_queue_depth"]
        if not all(positive_int(v) for v in (depth.values() if isinstance(depth, Mapping) else [depth])):
            raise ConfigError(
                f"prefetch_queue_depth={depth!r}: DALI takes a positive integer, or one per queue "
                "({'cpu_size': n, 'gpu_size': m})"
            )

    def slot_layout(self, sizes: Sizes) -> Tuple[bool, Optional[str]]:
        """A table of every field, whatever the workers: no payload (its samples' fields are views
        of the slots, read in place)."""
        return True, None

    def pipeline_keywords(self) -> Dict[str, Any]:
        return {}  # (no py_num_workers: DALI starts no pool)

    def start(self, configs: Sequence[WorkerConfig], sample_bytes: Optional[int], control: Optional[ControlBlock],
              settings: Mapping[str, Any]) -> None:  # fmt: skip
        """The workers' first slot holds a mini-batch of ``sample_bytes`` samples."""
        options = self.options
        self.queues = queues = Queues.of(settings, options.worker_prefetch)
        first_slot = (sample_bytes or 0) * (options.batch_size // options.py_num_workers)
        self._workers = RingWorkers(configs, queues.slots, settings["py_start_method"], first_slot, self.FAST_PATH)
        self._configs, self._control = configs, control

    @property
    def workers(self) -> RingWorkers:
        if self._workers is None:
            raise RuntimeError("dali_shards internal error: the ring transfer was not started")
        return self._workers

    # -- the pipeline ------------------------------------------------------------------------
    def graph_inputs(self) -> Tuple[List[Any], Any]:
        from dali_shards.transfer.ring.graph import WRAP, feed_outputs  # DALI: the graph is being defined

        first = self._configs[0]
        assert self.queues is not None  # set by start()
        self._feed = RingFeed(self.workers, first.packing, first.start_epoch, self.options.batch_size, self._control,
                              self.queues.held, wrap=WRAP)  # fmt: skip
        self.nodes = feed_outputs(self._feed)
        return self.nodes[:-1], self.nodes[-1]

    def returned(self, outputs: Sequence[Any]) -> None:
        """Each field read in place by DALI but those the pipeline returns as they are (see the
        module); the slot status, which ``DALIShardedIterator`` returns, copied."""
        direct = {id(node) for node in outputs}
        wanted = [id(node) not in direct for node in self.nodes[:-1]] + [False]  # the fields, the status
        self.in_place = [set_no_copy(node, w) for node, w in zip(self.nodes, wanted)]

    def attach(self, pipeline: Any) -> None:
        # with the pipeline, or at exit before multiprocessing joins its children (priority >= 0)
        Finalize(pipeline, self.workers.stop, exitpriority=10)
        assert self._feed is not None  # the graph was defined
        self._feed.pipeline = weakref.ref(pipeline)
        fields = [f.name for f in self._feed.packing.fields]
        pipeline.build = functools.partial(_build_started, weakref.ref(pipeline), self.workers, fields)

    def watch(self) -> None:
        """Nothing to add once the pipeline is built: the ring's waits see a dead worker."""

    def pids(self) -> List[int]:
        return self._workers.pids() if self._workers is not None else []

    def dead(self) -> List[Tuple[int, Optional[int]]]:
        return self._workers.dead() if self._workers is not None else []

    def kill(self) -> None:
        if self._workers is not None:
            self._workers.kill()

    def in_flight(self, pipeline: Any = None) -> int:
        # DALI holds the slots of its last calls: a worker fills its other slots, then makes one more
        assert self.queues is not None  # set by start()
        return self.queues.in_flight

    def translate(self, exc: BaseException) -> Optional[BaseException]:
        return None  # the workers' own errors arrive as they were raised

    def lost_worker(self, exc: BaseException) -> bool:
        return isinstance(exc, WorkerGone)


def _build_started(ref: Any, workers: RingWorkers, fields: Sequence[str]) -> Any:
    """``Pipeline.build`` the first time, the worker processes started first; DALI's own ``build``
    after that (DALI calls it at every step). DALI's warning that some of the external source's
    outputs are not used is said in our words: the slot status output is used only by
    ``DALIShardedIterator``, and requested fields the function leaves unused are named."""
    pipeline = ref()
    if getattr(pipeline, "_built", False):
        return type(pipeline).build(pipeline)
    workers.start()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = type(pipeline).build(pipeline)
    del pipeline.build  # built: DALI's own method from now on
    for w in caught:
        text = str(w.message)
        if FEED_NAME not in text:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
            continue
        unused = [fields[int(i)] for i in re.findall(r"\d+", text.split("not used")[0].split("index")[-1])
                  if int(i) < len(fields)]  # fmt: skip
        if unused:
            warn_user(
                f"dali_shards: fields {unused} are read and sent to the pipeline but its function does not use "
                "them: leave them out of fields= to save their reading and transfer"
            )
    return result
