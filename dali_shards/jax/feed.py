"""DALI's JAX iterator (``nvidia.dali.plugin.jax.DALIGenericIterator``) as a run session's ``Feed``:
started over each pipeline the session builds, its outputs made static in shape as DALI hands them
over (``outputs.py``), each batch this process's part, as single-device JAX arrays."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from nvidia.dali.pipeline import Pipeline
from nvidia.dali.plugin.jax import DALIGenericIterator

from dali_shards.jax.outputs import StaticOutputs, check_bounds
from dali_shards.session import STATUS_OUTPUT


class _DaliJax(DALIGenericIterator):
    """DALI's JAX iterator over one pipeline, its outputs converted by ``static`` before DALI's own
    conversion to JAX arrays."""

    def __init__(self, pipeline: Pipeline, names: Sequence[str], static: StaticOutputs, prepare_first_batch: bool):
        self.static = static  # (before DALI's __init__, which may fetch the first batch)
        super().__init__([pipeline], list(names), size=-1, auto_reset=False, prepare_first_batch=prepare_first_batch)

    def _get_outputs(self) -> List[List[Any]]:
        return [self.static.prepare(outs) for outs in super()._get_outputs()]


class JaxFeed:
    """The session's ``Feed`` for ``dali_shards.jax``: DALI's JAX iterator, its ragged outputs padded
    to ``pad_to``; ``prepare_first_batch`` is DALI's."""

    def __init__(self, pad_to: Mapping[str, Sequence[int]], prepare_first_batch: bool = True) -> None:
        self.pad_to = dict(pad_to)
        self.prepare_first_batch = prepare_first_batch
        self._dali: Optional[_DaliJax] = None
        self._outputs: Optional[StaticOutputs] = None

    def open(self, pipeline: Pipeline, names: Sequence[str], keys: Sequence[str], varying: Sequence[str]) -> None:
        status = STATUS_OUTPUT if STATUS_OUTPUT in names else None
        check_bounds([n for n in names if n != STATUS_OUTPUT], [*keys, *varying], self.pad_to)
        self._outputs = StaticOutputs(names, self.pad_to, status)
        self._dali = _DaliJax(pipeline, names, self._outputs, self.prepare_first_batch)

    def next(self) -> Tuple[Dict[str, Any], Optional[np.ndarray]]:
        assert self._dali is not None and self._outputs is not None  # made by open()
        return self._outputs.finish(self._dali.__next__())

    def reset(self) -> None:
        assert self._dali is not None  # made by open()
        self._dali.reset()

    def close(self) -> None:
        self._dali = self._outputs = None

    def fetched_ahead(self) -> bool:
        return self._dali is not None and getattr(self._dali, "_first_batch", None) is not None
