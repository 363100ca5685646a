"""``@sharded_pipeline``: a DALI pipeline whose Python workers each stream their own shards.

The decorated function receives the requested fields as DataNodes and returns the pipeline's
outputs, as with ``nvidia.dali.pipeline_def``. Behind it, each of the rank's ``py_num_workers``
workers runs one parallel external source over its part of the epoch plan, emits a full-size
batch padded with empty dummies outside its own slice, and a balanced tree of conditionals merges
the slices into one batch.
"""

from __future__ import annotations

import functools
import inspect
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from nvidia.dali import fn
from nvidia.dali.pipeline import Pipeline, pipeline_def

from dali_shards.worker.control import ControlBlock
from dali_shards.world import check_start_method, default_device_id, resolve_world
from dali_shards.errors import ConfigError
from dali_shards.pipeline.merge import assemble_fields
from dali_shards.worker.layout import SampleLayout
from dali_shards.catalog.manifest import ShardInfo
from dali_shards.plan.epoch import PLAN_VERSION, EpochPlan, PlanSpec
from dali_shards.options import StorageOptions
from dali_shards.plan.resume import make_state, resume_point
from dali_shards.catalog.sources import Source, resolve_source
from dali_shards.worker.resampled import StreamingWorkerSource
from dali_shards.plan.resampled import StreamingSpec
from dali_shards.pipeline.supervise import supervise
from dali_shards.worker.planned import ON_ERROR, WorkerSource

_OPTIONS = (
    "source",
    "fields",
    "batch_size",
    "py_num_workers",
    "shuffle",
    "seed",
    "world_size",
    "rank",
    "last_batch",
    "shuffle_buffer",
    "start_epoch",
    "worker_prefetch",
    "resume_from",
    "on_error",
    "storage_options",
    "read_ahead",
    "cache_dir",
    "cache_limit",
    "retries",
    "request_timeout",
    "samples_per_epoch",
    "stale_manifest",
    "worker_timeout",
)
log = logging.getLogger("dali_shards")
_PIPELINE_PARAMS = frozenset(inspect.signature(Pipeline.__init__).parameters) - {"self"}


@dataclass(frozen=True)
class ShardedPipelineInfo:
    """What a sharded pipeline reads and how: attached to it as ``pipe.dali_shards``.

    A resumed pipeline starts at ``start_epoch`` with ``resume_plan`` (the rest of that epoch);
    ``resume_prior`` lists the layouts that ran in that epoch before it.
    """

    spec: PlanSpec
    rank: int
    start_epoch: int
    shards: Tuple[ShardInfo, ...]
    layout: SampleLayout
    plan_version: int = PLAN_VERSION
    resume_plan: Optional[EpochPlan] = None
    resume_prior: Tuple[Dict[str, Any], ...] = ()
    rebuild: Optional[Callable[..., Pipeline]] = field(default=None, compare=False, repr=False)
    on_error: str = "raise"
    outputs: Tuple[Any, ...] = field(default=(), compare=False, repr=False)  # the function's outputs
    slot_status: Any = field(default=None, compare=False, repr=False)  # [index, status] per slot
    streaming: Optional[StreamingSpec] = None  # set in the streaming (resampled) mode
    control: Optional[ControlBlock] = field(default=None, compare=False, repr=False)  # shared with the workers

    @property
    def steps_per_epoch(self) -> int:
        return self.spec.steps_per_epoch

    @property
    def fields(self) -> Tuple[str, ...]:
        return tuple(f.name for f in self.layout.fields)

    def plan(self, epoch: int) -> EpochPlan:
        """The plan of an epoch (the resumed plan for the epoch a resumed pipeline starts in)."""
        if self.resume_plan is not None and self.resume_plan.epoch == epoch:
            return self.resume_plan
        return self.spec.epoch(epoch)

    def prior(self, epoch: int) -> List[Dict[str, Any]]:
        """The layouts that ran in ``epoch`` before this pipeline's plan of it."""
        return list(self.resume_prior) if self.resume_plan is not None and self.resume_plan.epoch == epoch else []

    def state(self, epoch: int, steps: int) -> Dict[str, Any]:
        """The resumable state after ``steps`` batches of ``epoch`` (counted from its plan's step 0)."""
        return make_state(self.spec, epoch, self.prior(epoch), self.plan(epoch), steps)


def pipeline_info(pipe: Pipeline) -> ShardedPipelineInfo:
    """The :class:`ShardedPipelineInfo` of a pipeline made by ``@sharded_pipeline``."""
    info = getattr(pipe, "dali_shards", None)
    if not isinstance(info, ShardedPipelineInfo):
        raise TypeError("expected a pipeline created by a @sharded_pipeline function")
    return info


def _pipeline_seed(seed: int, rank: int) -> int:
    """DALI's seed for random operators: fixed by (seed, rank), different on every rank."""
    state = np.random.SeedSequence([seed & ((1 << 64) - 1), rank, 0x4155_4720]).generate_state(1)
    return int(state[0] & 0x7FFF_FFFF)


def _mean_field_bytes(shards: Sequence[ShardInfo], exts: Sequence[str]) -> Optional[float]:
    """Mean bytes per sample of the members with these extensions, if the scan recorded them."""
    samples = sum(s.samples for s in shards)
    if not samples or any(s.ext_bytes is None for s in shards if s.samples):
        return None
    return sum(s.ext_bytes.get(e, 0) for s in shards if s.samples for e in exts) / samples


def choose_layout(fields: Sequence[str], shards: Sequence[ShardInfo], num_workers: int) -> SampleLayout:
    """The table layout for two or more workers, with the largest byte field (by the scan's
    per-extension sizes; else the first) as payload; the packed layout for one worker."""
    if num_workers < 2:
        return SampleLayout(fields)
    plain = SampleLayout(fields)
    sizes = [
        (_mean_field_bytes(shards, spec.extensions) or 0.0, -i, spec.name) for i, spec in enumerate(plain.byte_fields)
    ]
    payload = max(sizes)[2] if sizes else None
    return SampleLayout(fields, table=True, payload=payload)


def _bytes_per_sample_hint(shards: Sequence[ShardInfo], layout: SampleLayout, num_workers: int) -> Optional[int]:
    """Shared-memory size per batch slot: a worker's batch is ``batch_size`` slots but holds only
    ``batch_size / num_workers`` samples, so the hint is the sample size divided by the workers."""
    per_slot_meta = 128
    exts = [e for spec in layout.byte_fields for e in spec.extensions]
    mean = _mean_field_bytes(shards, exts) if exts else 0.0
    if mean is None:
        known = [(s.bytes, s.samples) for s in shards if s.bytes and s.samples]
        if not known:
            return None
        mean = sum(b for b, _ in known) / sum(n for _, n in known)
    return int((mean + layout.header_bytes) * 1.25 / num_workers) + per_slot_meta


def storage_config(options: Dict[str, Any]) -> StorageOptions:
    """The storage settings among the pipeline options."""
    try:
        return StorageOptions(
            storage_options=dict(options.get("storage_options") or {}),
            read_ahead=options.get("read_ahead", 2),
            retries=options.get("retries", 5),
            request_timeout=options.get("request_timeout", 60.0),
            cache_dir=options.get("cache_dir"),
            cache_limit=options.get("cache_limit"),
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def build_sharded_pipeline(
    func: Callable[..., Any],
    options: Dict[str, Any],
    pipeline_kwargs: Dict[str, Any],
    fn_args: Sequence[Any] = (),
    fn_kwargs: Optional[Dict[str, Any]] = None,
) -> Pipeline:
    """Create the pipeline of a ``@sharded_pipeline`` function for the given options."""
    fn_kwargs = dict(fn_kwargs or {})
    world_size, rank = resolve_world(options.get("world_size"), options.get("rank"))
    num_workers = options["py_num_workers"]
    batch_size = options["batch_size"]
    if not isinstance(num_workers, int) or num_workers < 1:
        raise ConfigError(f"py_num_workers must be a positive integer, got {num_workers!r}")
    on_error = options.get("on_error", "raise")
    if on_error not in ON_ERROR:
        raise ConfigError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
    storage = storage_config(options)
    samples_per_epoch = options.get("samples_per_epoch")
    streaming = samples_per_epoch is not None
    shards = tuple(
        resolve_source(
            options["source"],
            on_error=on_error,
            config=storage,
            counts=not streaming,
            stale_manifest=options.get("stale_manifest", "raise"),
        )
    )
    layout = choose_layout(options["fields"], shards, num_workers)
    seed = int(options.get("seed", 0))
    shuffle = bool(options.get("shuffle", False))
    common = dict(
        world_size=world_size,
        num_workers=num_workers,
        batch_size=batch_size,
        seed=seed,
        shuffle=shuffle,
        last_batch=options.get("last_batch", "pad"),
    )
    stream_spec = None
    if streaming:
        stream_spec = StreamingSpec(len(shards), samples_per_epoch, **common)
        if stream_spec.shares_shards():
            log.warning(
                "dali_shards: %d shards for %d virtual workers: some workers stream the same shards",
                len(shards),
                stream_spec.num_virtual_workers,
            )
        spec = stream_spec.as_plan_spec()
    else:
        spec = PlanSpec(
            tuple(s.samples for s in shards), shuffle_buffer=int(options.get("shuffle_buffer", 1024)), **common
        )
    start_epoch = int(options.get("start_epoch", 0))
    resume_plan, resume_prior = None, []
    if options.get("resume_from") is not None:
        start_epoch, resume_plan, resume_prior = resume_point(spec, options["resume_from"])
    urls = [s.url for s in shards]
    byte_sizes = [s.bytes for s in shards]
    prefetch = int(options.get("worker_prefetch", 2))
    control = ControlBlock.create(
        num_workers, worker_prefetch=prefetch, worker_timeout=options.get("worker_timeout", 600.0)
    )
    if stream_spec is not None:
        first_steps = None if resume_plan is None else resume_plan.steps - resume_plan.start_step
        sources = [
            StreamingWorkerSource(
                stream_spec,
                urls,
                layout,
                rank,
                w,
                start_epoch,
                first_steps,
                int(options.get("shuffle_buffer", 1024)),
                on_error,
                storage,
                byte_sizes,
                control.path,
            )
            for w in range(num_workers)
        ]
    else:
        sources = [
            WorkerSource(
                spec, urls, layout, rank, w, start_epoch, resume_plan, on_error, storage, byte_sizes, control.path
            )
            for w in range(num_workers)
        ]
    hint = _bytes_per_sample_hint(shards, layout, num_workers)

    captured: Dict[str, Any] = {}

    def graph():
        outputs = [
            fn.external_source(
                source=s,
                batch=True,
                parallel=True,
                cycle="raise",
                prefetch_queue_depth=prefetch,
                bytes_per_sample_hint=hint,
            )
            for s in sources
        ]
        fields, slot_status = assemble_fields(outputs, layout, batch_size)
        result = func(*fields, *fn_args, **fn_kwargs)
        captured["outputs"] = result if isinstance(result, tuple) else (() if result is None else (result,))
        captured["slot_status"] = slot_status
        return result

    check_start_method(pipeline_kwargs.get("py_start_method", "fork"))
    kwargs = {"batch_size": batch_size, "py_num_workers": num_workers, "seed": _pipeline_seed(seed, rank)}
    if "device_id" not in pipeline_kwargs:
        kwargs["device_id"] = default_device_id()
    kwargs.update(pipeline_kwargs)
    kwargs.pop("enable_conditionals", None)
    pipe = pipeline_def(graph, enable_conditionals=True, **kwargs)()
    supervise(pipe, control)  # the control block goes with the pipeline; SIGTERM acts as Ctrl-C

    def rebuild(**overrides: Any) -> Pipeline:
        """The same pipeline, anew, with some options changed (e.g. ``resume_from``)."""
        return build_sharded_pipeline(func, {**options, **overrides}, pipeline_kwargs, fn_args, fn_kwargs)

    pipe.dali_shards = ShardedPipelineInfo(
        spec,
        rank,
        start_epoch,
        shards,
        layout,
        PLAN_VERSION,
        resume_plan,
        tuple(resume_prior),
        rebuild,
        on_error,
        captured["outputs"],
        captured["slot_status"],
        stream_spec,
        control,
    )
    return pipe


def sharded_pipeline(
    source: Source,
    *,
    fields: Sequence[str],
    batch_size: int,
    py_num_workers: int,
    shuffle: bool = False,
    seed: int = 0,
    world_size: Optional[int] = None,
    rank: Optional[int] = None,
    last_batch: str = "pad",
    shuffle_buffer: int = 1024,
    start_epoch: int = 0,
    worker_prefetch: int = 2,
    resume_from: Optional[Dict[str, Any]] = None,
    on_error: str = "raise",
    storage_options: Optional[Dict[str, Any]] = None,
    read_ahead: int = 2,
    cache_dir: Optional[str] = None,
    cache_limit: Optional[int] = None,
    retries: int = 5,
    request_timeout: float = 60.0,
    samples_per_epoch: Optional[int] = None,
    stale_manifest: str = "raise",
    worker_timeout: Optional[float] = 600.0,
    **pipeline_kwargs: Any,
) -> Callable[[Callable[..., Any]], Callable[..., Pipeline]]:
    """Decorator turning a graph function into a factory of worker-sharded DALI pipelines.

    Args:
        source: shards -- a brace pattern, a glob, a manifest (``.json``), or a list of these;
            local paths or URLs (``s3://``, ``gs://``, ``http(s)://``, ``file://``). Remote shards
            take their sample counts from a manifest (given, or ``manifest.json`` beside them).
        fields: member extensions (``"jpg"``, ``"jpg;png"`` for alternatives, ``"cls"``) or
            ``"__key__"``, ``"__index__"``, ``"__valid__"``; passed to the function in order.
        batch_size: samples per batch on this rank; a multiple of ``py_num_workers``.
        py_num_workers: Python worker processes of this rank, each reading its own shards.
        shuffle: shuffle shard order per epoch and samples within each worker's buffer.
        seed: seeds the plan (the same on every rank) and, mixed with the rank, DALI's
            random operators.
        world_size, rank: default to ``torch.distributed``, then ``WORLD_SIZE``/``RANK``, then 1/0.
        last_batch: ``"pad"`` (every sample once; padding flagged by ``__valid__``) or
            ``"drop"`` (only complete global batches).
        shuffle_buffer: samples each worker holds for its buffer shuffle.
        start_epoch: the epoch the pipeline starts at (its shuffle and plan).
        worker_prefetch: batches each worker prepares ahead.
        resume_from: a ``state_dict()`` of ``DALIShardedIterator`` (or ``pipe.dali_shards.state``):
            the pipeline starts where that state stands, exactly as the run would have gone on
            under the same ranks, workers and batch size, re-planned over the samples left under
            others. ``start_epoch`` is then ignored.
        on_error: ``"raise"`` stops at the first bad sample or shard with a ``ShardError``
            naming it; ``"skip"`` logs it, puts another sample of the same worker in its slot
            with ``__valid__`` false (``DALIShardedIterator`` removes it) and goes on.
        storage_options: fsspec options for remote URLs (credentials, ``endpoint_url``...), or
            per protocol (``{"s3": {...}, "https": {...}}``); the standard environment
            (``AWS_ENDPOINT_URL``, ``AWS_PROFILE``...) applies too.
        read_ahead: remote shards each worker opens ahead of the one it reads (0: none).
        cache_dir, cache_limit: keep remote shards read in full on local disk, evicting the
            least recently used beyond ``cache_limit`` bytes (None: no limit).
        retries, request_timeout: a failed or stalled remote request is retried with exponential
            backoff, resumed at the first missing byte. Over HTTP ``request_timeout`` is the
            longest wait for the next bytes; elsewhere the longest request (a slow one is split).
        samples_per_epoch: the streaming (resampled) mode, for shards without sample counts:
            each worker cycles through its own shards and delivers an equal share of this many
            samples per epoch (rounded to whole global batches), all valid. Samples may repeat
            or be missed within an epoch; ``__index__`` is ``shard << 32 | position``.
        stale_manifest: a local shard whose size differs from its manifest's ``bytes``:
            ``"raise"`` refuses it (a ``ShardFormatError``), ``"rescan"`` counts it again from
            its headers. Remote shards, and shards changed after the start, fail when opened.
        worker_timeout: seconds a worker may go without progress (no sample read, no batch made)
            while the iterator waits for it; it is then killed and the iterator raises a
            ``WorkerError`` naming it and its shard. None turns the check off. Keep it above
            ``(retries + 1) * request_timeout``, so that remote retries run their course.
        **pipeline_kwargs: passed to ``nvidia.dali.pipeline_def`` (``device_id``,
            ``num_threads``, ``prefetch_queue_depth``, ``py_start_method``...). ``device_id``
            defaults to this process's GPU (``LOCAL_RANK``) or None without a GPU.

    Calling the decorated function returns an ``nvidia.dali.Pipeline``; keyword arguments given
    then override any of the above, and the function's own extra parameters are passed through.
    """
    SampleLayout(fields)  # fail early on bad field names
    options = {
        "source": source,
        "fields": tuple(fields),
        "batch_size": batch_size,
        "py_num_workers": py_num_workers,
        "shuffle": shuffle,
        "seed": seed,
        "world_size": world_size,
        "rank": rank,
        "last_batch": last_batch,
        "shuffle_buffer": shuffle_buffer,
        "start_epoch": start_epoch,
        "worker_prefetch": worker_prefetch,
        "resume_from": resume_from,
        "on_error": on_error,
        "storage_options": storage_options,
        "read_ahead": read_ahead,
        "cache_dir": cache_dir,
        "cache_limit": cache_limit,
        "retries": retries,
        "request_timeout": request_timeout,
        "samples_per_epoch": samples_per_epoch,
        "stale_manifest": stale_manifest,
        "worker_timeout": worker_timeout,
    }

    def decorator(func: Callable[..., Any]) -> Callable[..., Pipeline]:
        func_params = inspect.signature(func).parameters

        @functools.wraps(func)
        def factory(*args: Any, **kwargs: Any) -> Pipeline:
            opts = dict(options)
            pipe_kwargs = dict(pipeline_kwargs)
            fn_kwargs = {}
            for name, value in kwargs.items():
                if name in _OPTIONS:
                    opts[name] = value
                elif name in func_params:
                    fn_kwargs[name] = value
                elif name in _PIPELINE_PARAMS:
                    pipe_kwargs[name] = value
                else:
                    raise TypeError(
                        f"{func.__name__}() got an unexpected keyword argument {name!r}: it is neither a "
                        "sharded_pipeline option, a DALI Pipeline parameter, nor a parameter of the function"
                    )
            return build_sharded_pipeline(func, opts, pipe_kwargs, args, fn_kwargs)

        return factory

    return decorator
