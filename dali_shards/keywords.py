"""The keywords ``@sharded_pipeline`` takes, typed, for type checkers and editors.

``ShardedKeywords`` names every option of ``ShardedOptions`` (its storage options flattened) and
every parameter of DALI's ``Pipeline``; their defaults and checks are ``ShardedOptions``'s. A test
keeps the names in step with both. Options given as enums also take their values as strings.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping, Optional, Protocol, Sequence, TypedDict, Union

from dali_shards.options import ImageCheck, LastBatch, OnError, StaleManifest, Transfer

if TYPE_CHECKING:
    from typing_extensions import Unpack

Fields = Union[str, Sequence[str]]
Source = Union[str, "os.PathLike[str]", Sequence[Union[str, "os.PathLike[str]"]], Sequence[Any]]  # (the last: Stream objects)


class ShardedKeywords(TypedDict, total=False):
    """Keyword arguments of ``sharded_pipeline`` (see its docstring for each)."""

    # dali_shards' options
    fields: Fields
    batch_size: int
    py_num_workers: int
    shuffle: bool
    seed: int
    world_size: Optional[int]
    rank: Optional[int]
    last_batch: Union[LastBatch, Literal["pad", "drop"]]
    shuffle_buffer: int
    shuffle_block: int
    start_epoch: int
    worker_prefetch: int
    resume_from: Optional[Mapping[str, Any]]
    on_error: Union[OnError, Literal["raise", "skip"]]
    samples_per_epoch: Optional[int]
    stale_manifest: Union[StaleManifest, Literal["raise", "rescan"]]
    worker_timeout: Optional[float]
    image_check: Union[ImageCheck, Literal["structure", "signature", "off"]]
    map: Optional[Callable[[Mapping[str, Any]], Mapping[str, Any]]]
    decoders: Optional[Mapping[str, Any]]
    bucket_by: Optional[Callable[[Mapping[str, Any]], int]]
    bucket_window: int
    transfer: Union[Transfer, Literal["ring", "merge"]]
    epoch_size: Optional[int]
    batching: Literal["random", "stratified"]
    # remote storage
    storage_options: Optional[Mapping[str, Any]]
    read_ahead: int
    read_window: int
    retries: int
    request_timeout: float
    cache_dir: Optional[str]
    cache_limit: Optional[int]
    manifest_foreign_urls: bool
    # DALI's Pipeline parameters
    num_threads: Optional[int]
    device_id: Optional[int]
    exec_pipelined: bool
    prefetch_queue_depth: Union[int, Mapping[str, int]]
    exec_async: bool
    bytes_per_sample: int
    set_affinity: bool
    max_streams: Optional[int]
    default_cuda_stream_priority: Optional[int]
    enable_memory_stats: bool
    enable_checkpointing: bool
    checkpoint: Any
    py_start_method: Literal["fork", "spawn"]
    py_callback_pickler: Any
    output_dtype: Any
    output_ndim: Any
    output_layout: Any
    exec_dynamic: Optional[bool]
    experimental_exec_dynamic: Optional[bool]
    stream_policy: Any
    concurrency: Any
    enable_conditionals: bool


class PipelineFactory(Protocol):
    """What ``@sharded_pipeline`` makes of a graph function: each call makes a pipeline. Keywords
    override the decorator's options and DALI parameters (type checkers check their names and
    types); positional arguments go to the function's own parameters after the fields (keywords
    naming them work too, unchecked: type checkers see only the options)."""

    def __call__(self, *args: Any, **overrides: Unpack[ShardedKeywords]) -> Any: ...
