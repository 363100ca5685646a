"""PyTorch iterator for ``@sharded_pipeline`` pipelines."""

from __future__ import annotations

import gc
import logging
from typing import Dict, List, Sequence

import numpy as np
import torch
from nvidia.dali.pipeline import Pipeline
from nvidia.dali.plugin.pytorch import DALIGenericIterator

from .pipeline import pipeline_info
from .resume import resume_point

log = logging.getLogger(__name__)


class DALIShardedIterator(DALIGenericIterator):
    """A ``DALIGenericIterator`` for one sharded pipeline that knows its epoch.

    - ``len(it)`` is the number of steps per epoch, identical on every rank.
    - Padding slots (``last_batch="pad"``) are removed from the batches by default, so every
      sample of an epoch is seen exactly once over all ranks; with ``keep_padding=True`` the
      batches keep their full size and carry a bool mask under ``mask_name`` instead.
    - Epochs follow one another without manual resets: after ``StopIteration`` the next
      ``next()`` starts the next epoch (with its new shuffle). ``reset()`` or a new ``iter()``
      in the middle of an epoch finishes that epoch first (the rest is read and discarded), so
      the workers never fall out of step with the plan.
    - ``state_dict()`` is a small JSON-able dict saying where the epoch stands (the same on every
      rank); ``load_state_dict()`` restarts the pipeline there. To resume under the same ranks and
      workers, the epoch continues exactly as it would have; under others, the samples not yet
      delivered are planned over the new layout. Loading a state restarts the pipeline's worker
      processes: do it before CUDA is initialised, or use ``py_start_method="spawn"``, or pass
      the state to the pipeline itself (``train(resume_from=state)``).

    Each ``next()`` returns a list with one dict (name -> tensor), like ``DALIGenericIterator``.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        output_map: Sequence[str],
        *,
        keep_padding: bool = False,
        mask_name: str = "__valid__",
        dynamic_shape: bool = False,
        prepare_first_batch: bool = True,
    ):
        if keep_padding and mask_name in output_map:
            raise ValueError(f"mask_name {mask_name!r} clashes with an output name; choose another")
        self.keep_padding = keep_padding
        self.mask_name = mask_name
        self._output_names = list(output_map)
        self._iterator_options = dict(dynamic_shape=dynamic_shape, prepare_first_batch=prepare_first_batch)
        self._attach(pipeline)

    def _attach(self, pipeline: Pipeline) -> None:
        self.info = pipeline_info(pipeline)
        self.epoch = self.info.start_epoch
        self._step = self.info.plan(self.epoch).start_step
        DALIGenericIterator.__init__(
            self, [pipeline], self._output_names, size=-1, auto_reset=False, **self._iterator_options
        )

    @property
    def step(self) -> int:
        """Batches of the current epoch returned so far (after a resume with the same layout, those
        returned before the save included)."""
        return self._step

    def __len__(self) -> int:
        """Batches in the current epoch (after an elastic resume: in what was left of it)."""
        return self.info.plan(self.epoch).steps

    def state_dict(self) -> Dict:
        """Where the epoch stands: a small JSON-able dict, the same on every rank."""
        return self.info.state(self.epoch, self._step)

    def load_state_dict(self, state: Dict) -> None:
        """Continue from a ``state_dict()``: the pipeline is rebuilt to resume there."""
        resume_point(self.info.spec, state)  # refuse an incompatible state before stopping anything
        rebuild = self.info.rebuild
        self._pipes = []
        self._first_batch = None
        gc.collect()  # the old pipeline's worker processes stop when it is collected
        self._attach(rebuild(resume_from=state))

    def __next__(self) -> List[Dict[str, torch.Tensor]]:
        try:
            batches = super().__next__()
        except StopIteration:
            self._end_epoch()
            raise
        step = self._step
        self._step += 1
        return [self._apply_mask(batches[0], step)]

    def __iter__(self) -> "DALIShardedIterator":
        if self._step > self.info.plan(self.epoch).start_step:
            self.reset()
        return self

    def reset(self) -> None:
        """Finish the current epoch (reading and discarding what is left of it) and get ready for
        the next one. Does nothing at the start of an epoch."""
        if self._step == self.info.plan(self.epoch).start_step:
            return
        left = 0
        while True:
            try:
                super().__next__()
            except StopIteration:
                break
            left += 1
        if left:
            log.warning("dali_shards: epoch %d abandoned with %d of %d batches unread", self.epoch, left, len(self))
        self._end_epoch()

    def _end_epoch(self) -> None:
        DALIGenericIterator.reset(self)
        self.epoch += 1
        self._step = self.info.plan(self.epoch).start_step

    def _apply_mask(self, batch: Dict[str, torch.Tensor], step: int) -> Dict[str, torch.Tensor]:
        mask = self.info.plan(self.epoch).valid_mask(self.info.rank, step)
        if self.keep_padding:
            first = next(iter(batch.values()), None)
            device = first.device if first is not None else torch.device("cpu")
            batch[self.mask_name] = torch.from_numpy(mask).to(device)
            return batch
        if mask.all():
            return batch
        keep = torch.from_numpy(np.flatnonzero(mask))
        return {name: t[keep.to(t.device)] for name, t in batch.items()}
