"""Everything one local worker needs, in one picklable object: made by the pure resolve step in
the main process, carried into the worker process by DALI (pickled, or inherited by fork)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import FrozenSet, Optional, Sequence, Tuple, Union

import numpy as np

from dali_shards.catalog.table import SampleTables
from dali_shards.options import OnError, StorageOptions, option_default
from dali_shards.plan.epoch import PlanSpec
from dali_shards.plan.mode import Mode, Planned
from dali_shards.plan.streaming import StreamingSpec
from dali_shards.ipc.packing import Packing
from dali_shards.worker.codec import SampleCodec
from dali_shards.worker.stage import SampleStage


@dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    """Local worker ``worker`` of ``rank``: its plan, its shards, how it reads and packs them.

    ``mode`` says how epochs are delivered (``plan.mode``: ``Planned`` or ``Streaming``, with a
    resumed pipeline's first epoch). ``control`` is the path of the pipeline's control block (None: no supervision).
    ``urls``, ``byte_sizes``, ``offsets`` and ``key_crc`` are per-shard sequences: tuples, or views
    of the pipeline's catalog (``catalog.columns``: a mapped one travels to the worker as its file's
    path, so what a worker receives does not grow with the shards). ``offsets`` holds, per shard, where each sample begins and the last one ends (see
    ``catalog.shardinfo.ShardInfo``), or None where not in memory; ``key_crc``, per shard, each
    sample's key fingerprint where known (checked as samples are read); ``tables``, the sample tables
    of shards listed by a version-3 manifest, read for the shards this worker reads
    (``sample_offsets``, ``sample_keys``).
    ``packing`` is the slot format its samples are packed into; ``stage`` reads, decodes, maps,
    measures and packs them into that format (default: the requested fields as they are, images
    checked as ``image_check``'s default says).
    ``excluded``: the ``__index__`` of samples DALI's operators failed on (``on_error="skip"``):
    read as skipped, whatever their bytes.
    """

    mode: Mode
    rank: int
    worker: int
    urls: Sequence[str]
    byte_sizes: Sequence[Optional[int]]
    packing: Packing
    offsets: Sequence[Optional[np.ndarray]] = field(default=(), compare=False, repr=False)
    key_crc: Sequence[Optional[np.ndarray]] = field(default=(), compare=False, repr=False)
    tables: SampleTables = field(default_factory=SampleTables, compare=False, repr=False)
    stage: Optional[SampleStage] = field(default=None, repr=False)
    on_error: OnError = OnError(option_default("on_error"))
    storage: StorageOptions = field(default_factory=StorageOptions)
    start_epoch: int = option_default("start_epoch")
    shuffle_buffer: int = option_default("shuffle_buffer")
    control: Optional[str] = None
    excluded: FrozenSet[int] = field(default=frozenset(), compare=False, repr=False)
    stand_in: Optional[int] = None  # the __index__ of a sample DALI took: stands in for excluded ones first

    def __post_init__(self) -> None:
        if not self.byte_sizes:
            object.__setattr__(self, "byte_sizes", (None,) * len(self.urls))
        if len(self.byte_sizes) != len(self.urls):
            raise ValueError("one byte size (or None) per shard URL is required")
        if not self.offsets:
            object.__setattr__(self, "offsets", (None,) * len(self.urls))
        if len(self.offsets) != len(self.urls):
            raise ValueError("one offsets array (or None) per shard URL is required")
        if not self.key_crc:
            object.__setattr__(self, "key_crc", (None,) * len(self.urls))
        if len(self.key_crc) != len(self.urls):
            raise ValueError("one key fingerprint array (or None) per shard URL is required")
        stage = self.stage
        if stage is None:
            stage = SampleStage(SampleCodec(self.packing.requested, stream_starts=self.packing.stream_starts), self.packing)
            object.__setattr__(self, "stage", stage)
        if stage.packing != self.packing:
            raise ValueError("the stage must pack into the config's packing")
        object.__setattr__(self, "on_error", OnError(self.on_error))

    @property
    def codec(self) -> SampleCodec:
        """How the worker reads its samples' members (the stage's)."""
        assert self.stage is not None  # set by __post_init__
        return self.stage.codec

    def spans_known(self, shard: int) -> bool:
        """Whether where each of the shard's samples begins is known without scanning it."""
        return self.offsets[shard] is not None or (self.tables.has(shard) and bool(self.tables.spans[shard]))

    def sample_offsets(self, shard: int) -> Optional[np.ndarray]:
        """Where each of the shard's samples begins (and the last ends), where known."""
        if self.offsets[shard] is not None or not self.spans_known(shard):
            return self.offsets[shard]
        return self._record(shard)[0]

    def sample_keys(self, shard: int) -> Optional[np.ndarray]:
        """Each of the shard's samples' key fingerprint, where known."""
        if self.key_crc[shard] is not None or not (self.tables.has(shard) and self.tables.keys[shard]):
            return self.key_crc[shard]
        return self._record(shard)[1]

    def _record(self, shard: int) -> Tuple[Optional[np.ndarray], np.ndarray]:
        return self.tables.load(shard, self.urls[shard], self.counts[shard], self.byte_sizes[shard])

    @property
    def spec(self) -> Union[PlanSpec, StreamingSpec]:
        """The mode's spec (what both share: ranks, workers, batch, seed, shuffle)."""
        return self.mode.spec

    @property
    def counts(self) -> Sequence[int]:
        """Each shard's sample count (the planned mode; none in the streaming mode)."""
        return self.mode.spec.shard_sizes if isinstance(self.mode, Planned) else ()

    @property
    def virtual_worker(self) -> int:
        """``rank * py_num_workers + worker``: this worker's place among all ranks' workers."""
        return self.spec.virtual_worker(self.rank, self.worker)

    @property
    def skips(self) -> bool:
        return self.on_error is OnError.SKIP
