"""Samples' lengths (``bucket_by``) read in the main process, for resuming bucketed epochs under
another layout (no DALI)."""

from __future__ import annotations

from typing import Any, Dict, Sequence, Set, Tuple

from dali_shards.catalog.shardinfo import ShardInfo
from dali_shards.errors import ShardError
from dali_shards.io.storage import open_shard
from dali_shards.tar.format import TarReader
from dali_shards.options import ShardedOptions
from dali_shards.worker.stage import SampleStage
from dali_shards.worker.usercode import KeptRngs


class SampleLengths:
    """Samples' lengths (``bucket_by``) read in the main process, as the workers compute them: what
    a bucketed epoch resumed under another layout needs to know which samples the window it stopped
    in had delivered (see ``EpochPlan.consumed``). A sample that cannot be read has length -1, as
    a skipped one in a worker."""

    def __init__(self, shards: Sequence[ShardInfo], options: ShardedOptions, stage: SampleStage):
        self.shards, self.options, self.stage = shards, options, stage

    def __call__(self, plan: Any, positions: Any) -> Any:
        import numpy as np

        shard, local = plan.locate(positions)
        found: Dict[Tuple[int, int], int] = {}
        with KeptRngs():
            for s in sorted(set(shard.tolist())):
                self._read(plan, s, set(local[shard == s].tolist()), found)
        return np.array([found.get((s, l), -1) for s, l in zip(shard.tolist(), local.tolist())], dtype=np.int64)

    def _read(self, plan: Any, s: int, wanted: Set[int], found: Dict[Tuple[int, int], int]) -> None:
        info = self.shards[s]
        base = int(plan.canonical_starts[s])
        with open_shard(info.url, self.options.storage, info.bytes) as stream:
            reader = TarReader(stream, info.url).samples(self.stage.codec.extensions, select=wanted.__contains__)
            for sample in reader:
                try:
                    found[(s, sample.position)] = self.stage.pack(sample, base + sample.position, plan.epoch).length
                except ShardError:
                    found[(s, sample.position)] = -1
