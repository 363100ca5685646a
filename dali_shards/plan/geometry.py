"""Batch geometry: ranks x workers x batch, steps per epoch, each worker's share and which slots
of a batch are valid. Pure arithmetic, shared by the planned and the resampled modes."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import NamedTuple, Sequence, Tuple

import numpy as np

from dali_shards.errors import ConfigError
from dali_shards.options import LastBatch, check_batch_split, enum_option, option_default


def check_positive(obj: object, *names: str) -> None:
    """ConfigError unless each named attribute of ``obj`` is a positive integer."""
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")


def steps_for(available: int, global_batch: int, last_batch: LastBatch) -> int:
    """Batches per rank that deliver ``available`` samples: all of them, the last batch padded
    (``"pad"``), or only whole global batches (``"drop"``)."""
    if last_batch is LastBatch.PAD:
        return -(-available // global_batch)
    return available // global_batch


def planned_for(available: int, global_batch: int, last_batch: LastBatch) -> int:
    """Samples delivered as valid out of ``available``."""
    if last_batch is LastBatch.PAD:
        return available
    return steps_for(available, global_batch, last_batch) * global_batch


def span(v: int, planned: int, workers: int) -> Tuple[int, int]:
    """Virtual worker ``v``'s balanced share ``[start, stop)`` of ``planned`` samples: shares
    differ by at most one."""
    return v * planned // workers, (v + 1) * planned // workers


def valid_mask(valid_counts: Sequence[int], step: int, mini_batch: int) -> np.ndarray:
    """Which slots of a rank's batch at ``step`` hold real samples, given how many valid samples
    each of its workers emits (valid samples come first in every worker's order)."""
    emitted = step * mini_batch + np.arange(mini_batch)
    return np.concatenate([emitted < count for count in valid_counts])


def shard_of(starts: np.ndarray, index: Sequence[int] | np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(shard, sample-in-shard) of ``__index__`` values, given each shard's first (``canonical_starts``)."""
    pos = np.asarray(index, dtype=np.int64)
    shard = np.searchsorted(starts, pos, side="right") - 1
    return shard, pos - starts[shard]


def virtual_worker(rank: int, worker: int, py_num_workers: int) -> int:
    """``rank * py_num_workers + worker``: a worker's place among all ranks' workers, the unit the
    plan shards over (the one place this is computed)."""
    return rank * py_num_workers + worker


@dataclass(frozen=True, kw_only=True)
class BatchLayout:
    """Ranks x workers x batch, the shared seed, shuffling and the last batch mode: what
    ``PlanSpec`` and ``StreamingSpec`` share (keyword-only)."""

    world_size: int = 1
    py_num_workers: int = 1
    batch_size: int = 1
    seed: int = option_default("seed")
    shuffle: bool = option_default("shuffle")
    last_batch: LastBatch = LastBatch(option_default("last_batch"))

    def _check_layout(self) -> None:
        check_positive(self, "world_size", "py_num_workers", "batch_size")
        check_batch_split(self.batch_size, self.py_num_workers)
        object.__setattr__(self, "last_batch", enum_option(LastBatch, "last_batch", self.last_batch))

    def layout_fields(self) -> dict:
        """This layout's fields, as keywords for another spec."""
        return {f.name: getattr(self, f.name) for f in fields(BatchLayout)}

    @property
    def num_virtual_workers(self) -> int:
        """V = world_size * py_num_workers."""
        return self.world_size * self.py_num_workers

    def virtual_worker(self, rank: int, worker: int) -> int:
        """Worker ``worker`` of ``rank``'s place among all ranks' workers (see ``virtual_worker``)."""
        return virtual_worker(rank, worker, self.py_num_workers)

    def rank_workers(self, rank: int) -> range:
        """The virtual workers of ``rank``, in order."""
        return range(virtual_worker(rank, 0, self.py_num_workers), virtual_worker(rank + 1, 0, self.py_num_workers))

    def rank_of(self, v: int) -> int:
        """The rank virtual worker ``v`` belongs to."""
        return v // self.py_num_workers

    @property
    def mini_batch(self) -> int:
        """Samples each worker contributes to each batch."""
        return self.batch_size // self.py_num_workers

    @property
    def global_batch(self) -> int:
        return self.world_size * self.batch_size


class Stretch(NamedTuple):
    """Samples ``[first, stop)`` of shard ``shard`` (index into the canonical shard list); the
    first of them is at ``position`` in the epoch's sample sequence."""

    shard: int
    first: int
    stop: int
    position: int
