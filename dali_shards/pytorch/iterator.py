"""PyTorch iterator for ``@sharded_pipeline`` pipelines: DALI's ``DALIGenericIterator`` as the feed of
a run session (``dali_shards.session``), which does everything but the outputs' PyTorch types."""

from __future__ import annotations

import weakref
from typing import Any, Dict, List, Literal, Optional, Sequence, Tuple

import numpy as np
import torch
from nvidia.dali.pipeline import Pipeline
from nvidia.dali.plugin.pytorch import DALIGenericIterator

from dali_shards.errors import ConfigError
from dali_shards.pytorch.outputs import BatchOutputs, device_of, select
from dali_shards.pytorch.ranks import TorchRanks
from dali_shards.session import STATUS_OUTPUT, RunSession, check_output_map
from dali_shards.session.adapter import SessionAdapter

__all__ = ["DALIShardedIterator", "STATUS_OUTPUT", "check_output_map"]


class DALIShardedIterator(SessionAdapter, DALIGenericIterator):
    """A ``DALIGenericIterator`` for one sharded pipeline that knows its epoch.

    - ``len(it)`` is the number of batches this iterator delivers in the current epoch from where
      it started it: the steps per epoch, identical on every rank (after a resume in the middle of
      an epoch: what is left of it).
    - Padding slots (``last_batch="pad"``) and samples skipped with ``on_error="skip"`` are removed
      from the batches by default, so every sample of an epoch is seen exactly once over all ranks;
      with ``keep_padding=True`` the batches keep their full size and carry a bool mask under
      ``mask_name`` instead.
    - Epochs follow one another without manual resets: after ``StopIteration`` the next
      ``next()`` starts the next epoch (with its new shuffle). A new loop (``iter()``) over an
      iterator in the middle of an epoch continues that epoch, as DALI's iterators do; only
      ``reset()`` leaves it early. ``reset()`` costs about the prefetch depth: the workers are
      told to end the epoch a few batches on, and those are read and discarded.
    - ``state_dict()`` is a small JSON-able dict saying where the epoch stands (the same on every
      rank); ``load_state_dict()`` restarts the pipeline there (the same epoch under the same
      layout, the samples not yet delivered planned anew under another). It restarts the worker
      processes: with ``transfer="merge"`` do it before CUDA is initialised, or use
      ``py_start_method="spawn"``, or pass the state to the pipeline itself
      (``train(resume_from=state)``).
    - With ``audit=True`` each finished epoch is checked: ``it.audits`` gets a report of
      duplicates, missing and skipped samples and steps per rank (gathered from every rank under
      ``torch.distributed``; this rank's part otherwise). Epochs left early are not audited.
    - Under ``torch.distributed`` with the pipeline's world size, the first ``next()`` checks (one
      small all-gather) that every rank planned the same epoch, and raises a ``ConfigError`` on
      every rank if not, instead of a hang in the next collective.
    - A worker's error is raised as the ``ShardError`` it was; a worker that dies, or makes no
      progress for ``worker_timeout`` while the iterator waits, raises a ``WorkerError`` saying
      which and where. When any exception (Ctrl-C included) escapes a call into DALI, the
      pipeline's workers are killed first, so that exit never waits on them. A sample a DALI
      operator fails on is named (``on_error="raise"``) or left out, the pipeline rebuilt at that
      step (``"skip"``; ``incidents`` lists each incident; see ``dali_shards/session/incidents.py``).

    The iterator adds one small output to the pipeline (each slot's index and status) when it
    builds it, to see padding and skipped samples; hand it a pipeline that is not built yet.
    Each ``next()`` returns a list with one dict, like ``DALIGenericIterator``, from each name of
    ``output_map`` (one name per output of the pipeline function, in order) to: for a *ragged*
    output, a list of per-sample tensors (``ragged="list"``) or one zero-padded tensor with the
    samples' shapes under ``<name>_shape`` (``ragged="pad"``); a list of ``str`` for the
    ``__key__`` field; one tensor for every other output. Each output's type is the same in every
    batch: the ragged outputs are those named in ``ragged_outputs``, or where it is None, the bytes
    fields the function returns as they come (a member's, a ``map``'s bytes). Every other output is
    dense (arrays from ``.npy`` members or a ``map`` too: name those that vary, such as boxes); one
    whose samples turn out to differ in shape is a ``RaggedOutputError`` saying how to declare it
    (see ``dali_shards.pytorch.outputs``). ``dynamic_shape`` and ``prepare_first_batch`` are
    ``DALIGenericIterator``'s (the first is ignored by DALI; the second fetches the first batch
    when the iterator is made). ``epoch`` is the epoch the next batch belongs to.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        output_map: Sequence[str],
        *,
        keep_padding: bool = False,
        mask_name: str = "__valid__",
        audit: bool = False,
        ragged: Literal["list", "pad"] = "list",
        ragged_outputs: Optional[Sequence[str]] = None,
        dynamic_shape: bool = False,
        prepare_first_batch: bool = True,
    ) -> None:
        if keep_padding and mask_name in output_map:
            raise ConfigError(f"mask_name {mask_name!r} clashes with an output name; choose another")
        BatchOutputs.check(ragged, output_map, ragged_outputs or ())
        self.ragged = ragged
        self.ragged_outputs = None if ragged_outputs is None else tuple(ragged_outputs)
        self.keep_padding = keep_padding
        self.mask_name = mask_name
        self._feed = _Feed(self, dict(dynamic_shape=dynamic_shape, prepare_first_batch=prepare_first_batch))
        self._session = RunSession(pipeline, output_map, self._feed, TorchRanks(), audit=audit)

    def _get_outputs(self) -> List[List[Any]]:
        """DALI's outputs of the next batch, those PyTorch cannot take as they are (ragged, keys,
        unsigned types) converted here and kept for ``__next__`` (see ``torch_outputs``)."""
        outputs = self._feed.outputs
        assert outputs is not None  # made by the feed before DALI's iterator starts
        return [outputs.prepare(outs) for outs in DALIGenericIterator._get_outputs(self)]

    # -- the public API: the session's (SessionAdapter), batches in PyTorch's types --------------
    def __next__(self) -> List[Dict[str, Any]]:
        batch, mask = self._session.next()
        if self.keep_padding:
            batch[self.mask_name] = torch.from_numpy(mask).to(device_of(batch))
            return [batch]
        return [batch if mask.all() else select(batch, np.flatnonzero(mask))]


class _Feed:
    """The session's ``Feed``: the ``DALIGenericIterator`` that iterator ``it`` is, started over each
    pipeline the session builds with DALI's ``options``, and the conversions of its outputs
    (``outputs``). It keeps ``it`` by a weak reference (``it`` holds the session, which holds this),
    so that the pipeline and its workers go as soon as the iterator does."""

    def __init__(self, it: DALIShardedIterator, options: Dict[str, Any]) -> None:
        self._it = weakref.ref(it)
        self.options = options
        self.outputs: Optional[BatchOutputs] = None

    def _iterator(self) -> DALIShardedIterator:
        it = self._it()
        assert it is not None, "dali_shards internal error: a feed used after its iterator"
        return it

    def open(self, pipeline: Pipeline, names: Sequence[str], keys: Sequence[str], varying: Sequence[str]) -> None:
        it = self._iterator()
        ragged = it.ragged_outputs if it.ragged_outputs is not None else tuple(varying)
        self.outputs = BatchOutputs(names, keys, it.ragged, ragged)
        DALIGenericIterator.__init__(it, [pipeline], list(names), size=-1, auto_reset=False, **self.options)

    def next(self) -> Tuple[Dict[str, Any], Optional[np.ndarray]]:
        assert self.outputs is not None  # made by open()
        batch = self.outputs.finish(DALIGenericIterator.__next__(self._iterator())[0])
        status = batch.pop(STATUS_OUTPUT, None)
        return batch, None if status is None else status.to("cpu").numpy()

    def reset(self) -> None:
        DALIGenericIterator.reset(self._iterator())

    def close(self) -> None:
        it = self._iterator()
        it._pipes, it._first_batch = [], None

    def fetched_ahead(self) -> bool:
        return getattr(self._iterator(), "_first_batch", None) is not None  # the first batch, fetched by DALI
