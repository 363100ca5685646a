"""The sample that stands in for a skipped one: the same rule for every source. Imports no DALI.

A skipped sample's place keeps its index (so the iterator knows which was skipped) and carries a
real sample, so that DALI's operators stay fed: the last good sample the worker emitted in this
epoch, else the sample the iterator names as one DALI took (``config.stand_in``, after a rebuild
for a sample DALI failed on), else the next good one it reads, else one of the first samples of
the dataset. A worker that finds none of these raises a
``ShardFormatError`` saying so.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

import numpy as np

from dali_shards.errors import ShardError, ShardFormatError
from dali_shards.ipc.packed import Packed


class StandIn:
    """The stand-in of one worker epoch. ``remember`` the good samples as they are emitted (or only
    their place, read again with ``reread`` if a stand-in is needed)."""

    def __init__(self, config: Any, reread: Optional[Callable[[Any], Any]] = None):
        self.config, self.reread = config, reread
        self.packed: Optional[Packed] = None
        self.place: Any = None

    def remember(self, packed: Optional[Packed] = None, place: Any = None) -> None:
        self.packed, self.place = packed, place

    def sample(self, more: Iterable[Any] = ()) -> Packed:
        """The stand-in: the last good sample, else the first good one of ``more``."""
        if self.packed is None and self.place is not None and self.reread is not None:
            item = self.reread(self.place)
            self.packed = item if isinstance(item, Packed) else None
        if self.packed is None and self.config.stand_in is not None:
            self.packed = sample_at(self.config, self.config.stand_in)
        if self.packed is None:
            self.packed = next((item for item in more if isinstance(item, Packed)), None)
        if self.packed is None:
            self.packed = first_good(self.config)
        if self.packed is None:
            cfg = self.config
            out = f" ({len(cfg.excluded)} are excluded by the resume state: samples DALI's operators failed on)"
            raise ShardFormatError(
                cfg.urls[0] if len(cfg.urls) == 1 else "(several)",
                f"worker {cfg.virtual_worker} found no readable sample in its part of the epoch to stand in for the "
                f"skipped ones{out if cfg.excluded else ''}", hint="check the shards with `dali-shards inspect`"
                + (", and the pipeline step that fails on them" if cfg.excluded else ""),
            )  # fmt: skip
        return self.packed


def sample_at(config: Any, index: int) -> Optional[Packed]:
    """The sample at canonical ``index``, if it reads well."""
    from dali_shards.worker.reader import ShardReader

    ends = np.cumsum(config.counts)
    shard = int(np.searchsorted(ends, index, side="right"))
    if shard >= len(ends):
        return None
    try:
        item = ShardReader(config).read_one(shard, index - int(ends[shard] - config.counts[shard]), index)
    except ShardError:
        return None
    return item if isinstance(item, Packed) else None


def first_good(config: Any, tries: int = 64) -> Optional[Packed]:
    """One of the dataset's first ``tries`` samples that reads well (None if none does)."""
    from dali_shards.worker.reader import ShardReader  # (the reader's module imports this one's users)

    reader = ShardReader(config)
    start = 0
    for shard, count in enumerate(config.counts):
        start += count
        for position in range(min(count, tries)):
            tries -= 1
            try:
                item = reader.read_one(shard, position, start - count + position)
            except ShardError:
                item = None
            if isinstance(item, Packed):
                return item
        if tries <= 0:
            break
    return None
