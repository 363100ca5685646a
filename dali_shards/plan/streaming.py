"""The streaming (resampled) mode's plan, for shards without sample counts: pure, no DALI.

Each of the ``world_size * py_num_workers`` virtual workers owns a fixed share of the shards (dealt
round-robin after a seeded permutation; with fewer shards than virtual workers, shards are
shared) and cycles through them, in a new seeded order every cycle when shuffling, delivering
exactly its quota of ``steps_per_epoch * mini_batch`` samples per epoch. An epoch is
``samples_per_epoch`` samples rounded up (``last_batch="pad"``) or down (``"drop"``) to whole
global batches; every delivered sample is valid. There is no exactly-once guarantee: samples
are drawn from an endless stream.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Tuple

from dali_shards.errors import ConfigError
from dali_shards.plan.epoch import PlanSpec
from dali_shards.plan.geometry import BatchLayout, check_positive
from dali_shards.plan.random import TAG_CYCLE, TAG_OWNER, permutation
from dali_shards.options import LastBatch


@dataclass(frozen=True)
class StreamingSpec(BatchLayout):
    """Everything the streaming plan depends on; validated on construction."""

    num_shards: int
    samples_per_epoch: int

    def __post_init__(self) -> None:
        check_positive(self, "num_shards", "samples_per_epoch")
        self._check_layout()
        if self.steps_per_epoch < 1:
            raise ConfigError(
                f"samples_per_epoch={self.samples_per_epoch} with last_batch='drop' is less than one global "
                f"batch ({self.world_size} x {self.batch_size}); raise it or use last_batch='pad'"
            )

    @property
    def steps_per_epoch(self) -> int:
        round_ = math.ceil if self.last_batch is LastBatch.PAD else math.floor
        return int(round_(self.samples_per_epoch / self.global_batch))

    @property
    def quota(self) -> int:
        """Samples each virtual worker delivers per epoch."""
        return self.steps_per_epoch * self.mini_batch

    def owned_shards(self, v: int) -> List[int]:
        """The shards virtual worker ``v`` reads, in canonical order."""
        if not 0 <= v < self.num_virtual_workers:
            raise ValueError(f"virtual worker {v} out of range")
        order = permutation(self.num_shards, TAG_OWNER, self.seed)
        if self.num_shards >= self.num_virtual_workers:
            return sorted(int(s) for s in order[v :: self.num_virtual_workers])
        return [int(order[v % self.num_shards])]

    def shares_shards(self) -> bool:
        return self.num_shards < self.num_virtual_workers

    def cycle_order(self, v: int, cycle: int) -> List[int]:
        """The order in which ``v`` reads its shards in its ``cycle``-th pass over them."""
        owned = self.owned_shards(v)
        if not self.shuffle:
            return owned
        perm = permutation(len(owned), TAG_CYCLE, self.seed, v, cycle)
        return [owned[i] for i in perm]

    def as_plan_spec(self, shuffle_buffer: int) -> PlanSpec:
        """A plan of the same steps in which every slot is valid: one run of ``quota`` samples per
        virtual worker (used for step counts, masks and resume state, which records the real seed,
        shuffle and ``shuffle_buffer``)."""
        layout = {**self.layout_fields(), "last_batch": LastBatch.PAD}
        return PlanSpec((self.quota,) * self.num_virtual_workers, shuffle_buffer=shuffle_buffer, shuffle_block=0, **layout)


def stream_index(shard: int, position: int) -> int:
    """The ``__index__`` of a streamed sample: its shard and its position in it."""
    return (shard << 32) | position


def split_stream_index(index: int) -> Tuple[int, int]:
    return index >> 32, index & 0xFFFF_FFFF
