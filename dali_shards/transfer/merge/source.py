"""The merge transfer's external-source object for one local worker: DALI pickles (or forks) it into
the worker process of its pool and iterates it there once per epoch, epochs counted per process
(``ProcessEpochs``); each batch is ``batch_size`` arrays long, the same size as every other
worker's batch, laid out as ``layout.py`` says. A worker's error reaches the main process in
DALI's text of it, as data (``errors.carry``). Imports no DALI."""

from __future__ import annotations

import os
from typing import Any, Iterator, Optional, Tuple

from dali_shards.errors import DaliShardsError, carry
from dali_shards.ipc.control import NO_STAMPS
from dali_shards.transfer.merge.layout import worker_batch
from dali_shards.worker.config import WorkerConfig
from dali_shards.worker.process import attach_stamps, entered_process
from dali_shards.worker.sources import EpochSource, make_source


class ProcessEpochs:
    """Epoch counting for a worker source: DALI calls ``iter()`` once per epoch in the worker
    process (and once in the main process when the pipeline is defined), so epochs count per
    process from ``start_epoch``. Per-process state (names in ``_process_state``) is dropped
    when pickled and reset in a new process.

    A source records the process that builds it (``owner_pid``), the path of the pipeline's
    control block (``control``, or None) and its local ``worker`` id (see ``init_process``). The
    first ``iter()`` in another process makes it a worker (``worker.process.entered_process``),
    stamping its progress in the control block (``stamps``)."""

    start_epoch: int
    worker: int
    owner_pid: int
    control: Optional[str] = None
    stamps = NO_STAMPS
    _process_state: Tuple[str, ...] = ()

    def init_process(self, control: Optional[str]) -> None:
        """Record the building process and the control block's path (call in ``__init__``)."""
        self.owner_pid = os.getpid()
        self.control = control

    def next_epoch(self) -> int:
        """The epoch the coming ``iter()`` starts."""
        pid = os.getpid()
        if getattr(self, "_pid", None) != pid:
            self._pid, self._epoch = pid, self.start_epoch
            for name in self._process_state:
                setattr(self, name, None)
            self.stamps = NO_STAMPS
            if pid != self.owner_pid:
                entered_process(self.owner_pid)
                self.stamps = attach_stamps(self.control, self.worker)
        else:
            self._epoch += 1
        return self._epoch

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_pid"] = None
        state.pop("stamps", None)
        for name in self._process_state:
            state[name] = None
        return state


class MergeSource(ProcessEpochs):
    """The padded batches of local worker ``config.worker``, one epoch per ``iter()``, from
    ``config.start_epoch`` on.

    ``iter()`` is also called once in the main process when the pipeline is defined; it stays lazy
    (nothing is opened before the first batch) and epochs are counted per process. The worker
    source itself is made once per process (``_process_state``)."""

    _process_state = ("_source",)
    _source: Optional[EpochSource] = None

    def __init__(self, config: WorkerConfig):
        self.config = config
        self.worker = config.worker
        self.start_epoch = config.start_epoch
        self.init_process(config.control)

    def __iter__(self) -> "PaddedBatches":
        epoch = self.next_epoch()
        if self._source is None:
            self._source = make_source(self.config, self.stamps)
        return PaddedBatches(self.config, epoch, self._source.epoch(epoch), self.stamps)


class PaddedBatches:
    """One epoch of a worker's full-size padded batches: its mini-batches (``mini``) padded; once
    each is made, the worker is stamped as waiting (``stamps``) until DALI asks for the next."""

    def __init__(self, config: WorkerConfig, epoch: int, mini: Iterator[list], stamps: Any = NO_STAMPS):
        self.config = config
        self.epoch = epoch
        self.mini = mini
        self.stamps = stamps

    def __iter__(self) -> "PaddedBatches":
        return self

    def __next__(self) -> list:
        cfg, spec = self.config, self.config.spec
        batch = worker_batch(cfg.packing, next(self.mini), cfg.worker, spec.py_num_workers, spec.batch_size)
        self.stamps.waiting()
        return batch


class Carried:
    """A source as DALI's worker pool runs it, its errors carried in their text (``errors.carry``):
    DALI passes only the text of a worker's exception on."""

    def __init__(self, source: MergeSource):
        self.source = source
        self._batches: Optional[Iterator[list]] = None

    def __getstate__(self) -> dict:
        """What a spawned worker gets: the source, not the epoch DALI began iterating in this
        process (a generator, in the streaming mode: it does not pickle, and is not the worker's)."""
        return {"source": self.source, "_batches": None}

    def __iter__(self) -> "Carried":
        try:
            self._batches = iter(self.source)
        except DaliShardsError as exc:
            raise carry(exc) from None
        return self

    def __next__(self) -> list:
        assert self._batches is not None, "iter() first"
        try:
            return next(self._batches)
        except DaliShardsError as exc:
            raise carry(exc) from None
