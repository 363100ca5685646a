"""What a run session needs from the framework that delivers its batches: a ``Feed`` (the
framework's iterator over DALI's outputs) and ``Ranks`` (the framework's collectives); the output
the session adds to a pipeline to see each slot's sample and status, and the names of the
outputs. Imports no framework and no DALI."""

from __future__ import annotations

from typing import Any, List, Optional, Protocol, Sequence, Tuple

import numpy as np

from dali_shards.errors import ConfigError

STATUS_OUTPUT = "__dali_shards_status__"  # the output the session adds (each place's index and status)


def check_output_map(names: Sequence[str], outputs: int) -> None:
    """A ConfigError unless ``names`` gives one distinct name to each of the pipeline's ``outputs``."""
    if len(names) != outputs:
        raise ConfigError(
            f"output_map has {len(names)} name{'s' * (len(names) != 1)} ({list(names)}) but the pipeline "
            f"function returns {outputs} output{'s' * (outputs != 1)}: give one name per returned output, in order"
        )
    repeated = sorted({n for n in names if list(names).count(n) > 1})
    if repeated:
        raise ConfigError(f"output_map names {repeated} more than once: each output needs its own name")
    if STATUS_OUTPUT in names:
        raise ConfigError(f"output_map may not use {STATUS_OUTPUT!r}: the iterator's own output has that name")


class Feed(Protocol):
    """The framework's iterator over a pipeline's outputs (DALI's PyTorch or JAX iterator), as a
    ``RunSession`` drives it: opened over each pipeline the session builds, a batch at a time, reset
    at each epoch's end, closed before a rebuild. A feed that refers to its adapter does so by a
    weak reference (the adapter holds the session, which holds the feed), so that the pipeline and
    its workers go as soon as the adapter does."""

    def open(self, pipeline: Any, names: Sequence[str], keys: Sequence[str], varying: Sequence[str]) -> None:
        """Start iterating the built ``pipeline`` whose outputs are ``names`` (the last one
        ``STATUS_OUTPUT`` where the session added it); ``keys`` are the ``__key__`` outputs,
        ``varying`` those whose samples may differ in shape. May fetch the first batch."""

    def next(self) -> Tuple[Any, Optional[np.ndarray]]:
        """The next batch in the framework's types, without ``STATUS_OUTPUT``, and that output's
        rows ``(index, status)`` as a NumPy array (None where the pipeline has no such output);
        ``StopIteration`` at the end of the epoch."""

    def reset(self) -> None:
        """Get ready for the next epoch after ``StopIteration``."""

    def close(self) -> None:
        """Let go of the pipeline (a rebuilt one follows)."""

    def fetched_ahead(self) -> bool:
        """Whether a batch was fetched before it was asked for (DALI's ``prepare_first_batch``)."""


class Ranks(Protocol):
    """The collectives of the framework's process group, for the cross-rank plan check and the audit."""

    def size(self) -> Optional[int]:
        """The processes of the initialised group; None without one."""

    def gather_ints(self, values: List[int], device_id: Optional[int]) -> List[List[int]]:
        """Every rank's ``values`` (a collective call: every rank makes it), exchanged on the
        pipeline's GPU ``device_id`` where the group needs one."""

    def gather_objects(self, value: Any) -> List[Any]:
        """Every rank's JSON-able ``value`` (a collective call)."""


class Alone:
    """``Ranks`` without a process group: each rank's session checks and audits its own part."""

    def size(self) -> Optional[int]:
        return None

    def gather_ints(self, values: List[int], device_id: Optional[int]) -> List[List[int]]:
        return [list(values)]

    def gather_objects(self, value: Any) -> List[Any]:
        return [value]
