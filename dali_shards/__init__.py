"""dali_shards: stream sharded tar datasets into NVIDIA DALI, split over ranks and workers.

Planning, tar reading, manifests and shard writing need no DALI; the names that build pipelines
(``sharded_pipeline``, ``decode_image``, ...) import DALI when first used.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from dali_shards.errors import (
    ConfigError,
    DaliShardsError,
    EmptyDatasetError,
    NotAPipelineError,
    RaggedOutputError,
    ShardAccessError,
    ShardMapError,
    ShardError,
    ShardFormatError,
    UnknownOptionError,
    WorkerError,
)
from dali_shards.catalog.shardinfo import ShardInfo
from dali_shards.catalog.scan import scan_shards
from dali_shards.catalog.manifest import read_manifest, write_manifest
from dali_shards.plan.epoch import PLAN_VERSION, EpochPlan, PlanSpec, plan_epoch
from dali_shards.plan.mixture import Stream
from dali_shards.options import ShardedOptions, StorageOptions
from dali_shards.plan.streaming import StreamingSpec
from dali_shards.catalog.sources import resolve_source
from dali_shards.tools.writer import ShardWriter, write_shard

if TYPE_CHECKING:  # imported when first used (they import DALI); type checkers see them at once
    from dali_shards.pipeline.decode import decode_image, pipeline_has_gpu
    from dali_shards.pipeline.decorator import pipeline_info, sharded_pipeline
    from dali_shards.setup.info import ShardedPipelineInfo
    from dali_shards.tools.folderwriter import write_dataset  # noqa: F401

__version__ = "0.1.0"
StorageConfig = StorageOptions  # an earlier name of StorageOptions, kept as an alias

_LAZY = {
    "sharded_pipeline": "pipeline.decorator",
    "pipeline_info": "pipeline.decorator",
    "ShardedPipelineInfo": "setup.info",
    "decode_image": "pipeline.decode",
    "pipeline_has_gpu": "pipeline.decode",
    "write_dataset": "tools.folderwriter",  # (lazy so as not to load the write job's modules on import)
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dali_shards' has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "sharded_pipeline",
    "pipeline_info",
    "ShardedPipelineInfo",
    "decode_image",
    "pipeline_has_gpu",
    "plan_epoch",
    "PlanSpec",
    "EpochPlan",
    "PLAN_VERSION",
    "resolve_source",
    "StorageOptions",
    "ShardedOptions",
    "StreamingSpec",
    "Stream",
    "ShardInfo",
    "read_manifest",
    "write_manifest",
    "scan_shards",
    "ShardWriter",
    "write_shard",
    "DaliShardsError",
    "ConfigError",
    "EmptyDatasetError",
    "RaggedOutputError",
    "ShardError",
    "ShardFormatError",
    "ShardAccessError",
    "ShardMapError",
    "WorkerError",
    "UnknownOptionError",
    "NotAPipelineError",
]
