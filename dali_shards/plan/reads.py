"""What a plan's workers read, as stretches of shards (``Stretch``): the same for every plan of
this version, given each worker's parts. Pure, no I/O, no DALI."""

from __future__ import annotations

from typing import TYPE_CHECKING, Collection, List

import numpy as np

from dali_shards.plan.geometry import Stretch
from dali_shards.plan.units import holding

if TYPE_CHECKING:
    from dali_shards.plan.units import Streams


class Reads:
    """Segments from ``worker_parts(v)``, ``interleaving``, ``worker_valid_count(v)``,
    ``pad_position(v)``, ``locate`` and ``canonical_starts`` (which the plan provides)."""

    if TYPE_CHECKING:  # what the plan provides
        @property
        def interleaving(self) -> bool: ...
        @property
        def canonical_starts(self) -> np.ndarray: ...

        def worker_parts(self, v: int) -> List[Streams]: ...
        def worker_valid_count(self, v: int) -> int: ...
        def pad_position(self, v: int) -> int: ...
        def locate(self, positions: np.ndarray) -> tuple: ...

    def worker_pieces(self, v: int) -> List[Stretch]:
        """The stretches of shards worker ``v`` reads, in the order it starts them."""
        return [seg for part in self.worker_parts(v) for seg in part.started(self.interleaving, self.canonical_starts)]

    def worker_reads(self, v: int) -> List[Stretch]:
        """What worker ``v`` reads (from step 0): its pieces, or the one sample it pads with."""
        if self.worker_valid_count(v):
            return self.worker_pieces(v)
        return self.reads_of(v, [self.pad_position(v)])

    def reads_of(self, v: int, positions: Collection[int]) -> List[Stretch]:
        """The stretches of worker ``v``'s reading that hold ``positions``, each cut to the first
        and last of them, in reading order."""
        pieces = self.worker_pieces(v) if self.worker_valid_count(v) else None
        return holding(pieces, np.asarray(list(positions), dtype=np.int64), self.locate, self.canonical_starts)
