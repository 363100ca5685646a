"""dali_shards: stream sharded tar datasets into NVIDIA DALI, split over ranks and workers."""

from .decode import decode_image, pipeline_has_gpu
from .errors import ConfigError, DaliShardsError, EmptyDatasetError, ShardAccessError, ShardError, ShardFormatError
from .manifest import ShardInfo, read_manifest, scan_shards, write_manifest
from .pipeline import ShardedPipelineInfo, pipeline_info, sharded_pipeline
from .planner import PLAN_VERSION, EpochPlan, PlanSpec, plan_epoch
from .shardlist import resolve_source
from .writer import ShardWriter, write_shard

__version__ = "0.1.0"

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
    "ShardInfo",
    "read_manifest",
    "write_manifest",
    "scan_shards",
    "ShardWriter",
    "write_shard",
    "DaliShardsError",
    "ConfigError",
    "EmptyDatasetError",
    "ShardError",
    "ShardFormatError",
    "ShardAccessError",
]
