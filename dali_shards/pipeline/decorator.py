"""``@sharded_pipeline``: a DALI pipeline whose Python workers each stream their own shards.

The decorated function receives the requested fields as DataNodes and returns the pipeline's
outputs, as with ``nvidia.dali.pipeline_def``. Behind it, each of the rank's ``py_num_workers``
workers reads its part of the epoch plan, and a transfer (``dali_shards.transfer``: a shared-memory
ring into one external source, or DALI's parallel sources merged by conditionals) brings every
step's samples to the pipeline. Keywords are sorted here into options (``ShardedOptions``), DALI
pipeline parameters and the function's own -- any other keyword is refused here, with the closest
known name; ``resolve`` and ``build`` do the rest.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
from typing import TYPE_CHECKING, Any, Callable, Collection, Dict, Tuple

from nvidia.dali.pipeline import Pipeline

from dali_shards.errors import NotAPipelineError, UnknownOptionError
from dali_shards.keywords import PipelineFactory, ShardedKeywords, Source
from dali_shards.options import OPTION_KEYWORDS, STORAGE_KEYWORDS, ShardedOptions, StorageOptions
from dali_shards.pipeline.build import build_sharded_pipeline
from dali_shards.setup.info import ShardedPipelineInfo

if TYPE_CHECKING:
    from typing_extensions import Unpack

# what DALI's pipeline_def takes besides our options: Pipeline's parameters and its own keyword
_PIPELINE_PARAMS = frozenset(inspect.signature(Pipeline.__init__).parameters) - {"self"} | {"enable_conditionals"}


def check_keywords(names: Collection[str], where: str, own: Collection[str] = ()) -> None:
    """An ``UnknownOptionError`` (a ``ConfigError``) naming every keyword that is neither an option,
    a DALI pipeline parameter, nor one of ``own`` (the function's parameters), with the closest
    known names."""
    known = sorted(set(OPTION_KEYWORDS) | _PIPELINE_PARAMS | set(own))
    unknown = [n for n in names if n not in known]
    if not unknown:
        return
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    raise UnknownOptionError(
        f"{where} got unknown keyword(s) {', '.join(hints)}: each keyword must be a sharded_pipeline option "
        "(help(sharded_pipeline) lists them)" + (", a DALI Pipeline parameter, or a parameter of the function" if own
                                                 else " or a DALI Pipeline parameter")
    )


def pipeline_info(pipe: Pipeline) -> ShardedPipelineInfo:
    """The :class:`ShardedPipelineInfo` of a pipeline made by ``@sharded_pipeline``."""
    info = getattr(pipe, "dali_shards", None)
    if isinstance(info, ShardedPipelineInfo):
        return info
    if callable(pipe) and not isinstance(pipe, Pipeline):
        name = getattr(pipe, "__name__", "the function")
        raise NotAPipelineError(f"expected a pipeline, got the @sharded_pipeline function {name} itself: call it to "
                                f"make the pipeline, e.g. DALIShardedIterator({name}(), [...])")  # fmt: skip
    raise NotAPipelineError(f"expected a pipeline made by a @sharded_pipeline function (calling it returns one), got "
                            f"{type(pipe).__name__}")  # fmt: skip


def sharded_pipeline(
    source: Source, **keywords: Unpack[ShardedKeywords]
) -> Callable[[Callable[..., Any]], PipelineFactory]:
    """Decorator turning a graph function into a factory of worker-sharded DALI pipelines.

    Only ``fields``, ``batch_size`` and ``py_num_workers`` are required; the other options'
    defaults are ``ShardedOptions``'s (shown by ``help()``). Every value is checked when the
    decorator runs, a bad one a ``ConfigError`` naming it.

    Args:
        source: shards -- a brace pattern, a glob, a manifest (``.json``), or a list of these;
            local paths or URLs (``s3://``, ``gs://``, ``http(s)://``, ``file://``). Remote shards
            take their sample counts from a manifest (given, or ``manifest.json`` beside them).
            A list of ``Stream`` objects is a mix of datasets, each drawn an exact number of
            times per epoch (see ``dali_shards.Stream`` and docs/mixing.md).
        fields: member extensions (``"jpg"``, ``"jpg;png"`` for alternatives, ``"cls"``) or
            ``"__key__"``, ``"__index__"``, ``"__valid__"``, ``"__stream__"`` (a mix's stream);
            passed to the function in order.
        batch_size: samples per batch on this rank; a multiple of ``py_num_workers``.
        py_num_workers: Python worker processes of this rank, each reading its own shards.

        shuffle: shuffle which shards each rank and worker reads every epoch, and the samples:
            interleaved across shards (see ``shuffle_block``) or chunk by chunk of each worker's run.
        seed: seeds the plan (the same on every rank) and, mixed with the rank, DALI's
            random operators.
        world_size, rank: default to ``torch.distributed``, then ``WORLD_SIZE``/``RANK``, then 1/0.
        last_batch: ``"pad"`` (every sample once; padding flagged by ``__valid__``) or
            ``"drop"`` (only complete global batches).
        shuffle_buffer: with contiguous runs, the chunk of its run a worker emits in a seeded order
            (the samples it holds at once).
        shuffle_block: pieces of shards whose samples a rank interleaves at once (at least the
            batch size is used); the shards are cut into about ``max(shards, batch_size *
            world_size)`` pieces dealt to the ranks anew every epoch, each worker reading a part of
            its rank's pieces sample by sample at the offsets the shards' index records. 0 turns
            interleaving off: each shard read once, in contiguous runs (for pre-shuffled shards), as
            do datasets with fewer shards than 8 or a worker's share of a batch, and shards without
            sample offsets (compressed, or listed in a version-1 manifest: rewrite it with
            ``dali-shards index``).
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
        read_window: bytes of remote shards each worker holds ahead when it reads pieces of many
            shards at once (interleaving): requests of ``read_window / (2 k)`` bytes, ``k`` the
            shards it reads at once (about ``shuffle_block / py_num_workers``), at least 256 KiB
            and at most 8 MiB -- a whole piece of a shard where the pieces fit in the window --
            fetched in the order they are needed by 8 threads. Once an epoch's requests are all
            answered, the next epoch's are fetched too, the two within ``read_window / 2``.
        cache_dir, cache_limit: keep remote shards read in full on local disk, evicting the
            least recently used beyond ``cache_limit`` bytes (None: no limit). Only whole-shard
            reads (contiguous runs, streaming) use it; interleaved reads fetch ranges.
        manifest_foreign_urls: a remote manifest may list shards only on its own server or
            bucket (same scheme and host or bucket; never local paths or ``file://`` URLs), else
            a ``ConfigError`` names it and the entry; True lets it list any URL or local path.
            A local folder's ``manifest.json`` that lists shards outside the folder (``../``,
            absolute paths) is read as written, with a warning naming it and an entry.
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
        map: a callable run in the worker processes on every sample: it receives a dict from each
            requested field to its decoded value (see ``decoders``), with ``"__key__"``, and returns
            a dict whose keys are the decorated function's parameters (those without defaults):
            ints, bytes or NumPy arrays (their dtype and number of dimensions fixed by the first
            sample, which is run when the pipeline is built). Lambdas, closures and bound methods
            work under ``fork`` and ``spawn`` (pickled with dill); one that cannot be pickled is a
            ``ConfigError`` here. An exception in it is a ``ShardMapError`` naming the shard and
            the sample, with its traceback (``on_error`` applies).
        decoders: ``{field: callable(bytes) -> value or "bytes"}``: replaces the built-in decoder
            of a field (``.cls``/``.index``/``.label`` -> int, ``.json`` -> parsed, ``.npy`` ->
            array, ``.txt`` -> str with a ``map``; bytes otherwise; see ``worker/decoders.py``).
        bucket_by: a callable giving a sample's length (from the ``map``'s outputs, or from the
            decoded fields without one): each worker groups the samples of every
            ``bucket_window`` (per worker, whole steps) into batches of similar length, in a batch
            order its rank's workers share; every sample still once, equal steps, resumable.
        bucket_window: samples per worker bucketed at once (rounded down to whole steps).
        epoch_size: a mix's samples per epoch (default: its streams' counts summed); the
            ``proportion`` streams share what the others leave of it.
        batching: a mix's batches: ``"random"`` (all streams shuffled together) or
            ``"stratified"`` (every global batch holds each stream's share, within one).
        transfer: how the workers' samples reach DALI. ``"ring"`` (default): the library's own
            worker processes (``py_start_method`` fork or spawn; fork works after CUDA is
            initialised too) write each step's samples into shared memory, and one external
            source gives them to DALI: the cost per step does not grow with ``py_num_workers``.
            ``"merge"``: DALI's own worker pool, one parallel external source per worker, merged
            with conditional execution (the workaround of DALI issue 4892); its cost grows with
            ``py_num_workers x batch_size``; it needs ``exec_pipelined=True`` and one integer
            ``prefetch_queue_depth``, and takes no ``schedule_run()`` ahead of DALI's prefetch.
        image_check: how much of each image member the workers check before it enters a batch:
            ``"structure"`` (JPEG segments and end marker, PNG chunks and CRCs), ``"signature"``
            (first bytes) or ``"off"``. A failed check is a per-sample ``ShardFormatError``
            (skipped with ``on_error="skip"``); see ``worker/imagecheck.py`` for what it misses.
        **pipeline_kwargs: passed to ``nvidia.dali.pipeline_def`` (``device_id``,
            ``num_threads``, ``prefetch_queue_depth``, ``py_start_method``...). ``device_id``
            defaults to this process's GPU (``LOCAL_RANK``) or None without a GPU.

    Calling the decorated function returns an ``nvidia.dali.Pipeline``; keyword arguments given
    then override any of the above, and the function's own extra parameters are passed through.
    """
    check_keywords(keywords, "sharded_pipeline")
    options_kw, pipeline_kwargs = _split(dict(keywords))
    options = ShardedOptions.from_keywords(source=source, **options_kw)

    def decorator(func: Callable[..., Any]) -> PipelineFactory:
        func_params = inspect.signature(func).parameters

        @functools.wraps(func)
        def factory(*args: Any, **kwargs: Any) -> Pipeline:
            check_keywords(kwargs, f"{func.__name__}()", func_params)
            overrides = {k: v for k, v in kwargs.items() if k in OPTION_KEYWORDS}
            fn_kwargs = {k: v for k, v in kwargs.items() if k not in overrides and k in func_params}
            pipe_kwargs = dict(pipeline_kwargs)
            pipe_kwargs.update({k: v for k, v in kwargs.items() if k not in overrides and k not in fn_kwargs})
            opts = options.replace(**overrides) if overrides else options
            return build_sharded_pipeline(func, opts, pipe_kwargs, args, fn_kwargs)

        return factory

    return decorator


def _split(keywords: Dict[str, Any]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """The keywords that are options, and those passed on to DALI's ``pipeline_def``."""
    options = {k: v for k, v in keywords.items() if k in OPTION_KEYWORDS}
    return options, {k: v for k, v in keywords.items() if k not in options}


def _signature() -> inspect.Signature:
    """``sharded_pipeline``'s signature for ``help()``, with the options' own defaults."""
    params = [inspect.Parameter("source", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation="Source")]
    types = ShardedKeywords.__annotations__
    for cls in (ShardedOptions, StorageOptions):
        for f in dataclasses.fields(cls):
            if f.name in ("source", "storage") or (cls is StorageOptions and f.name not in STORAGE_KEYWORDS):
                continue
            if f.default is not dataclasses.MISSING:
                default = f.default.value if hasattr(f.default, "value") else f.default
            elif f.default_factory is not dataclasses.MISSING:
                default = None
            else:
                default = inspect.Parameter.empty
            params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=getattr(types[f.name], "__forward_arg__", types[f.name])))
    params.append(inspect.Parameter("pipeline_kwargs", inspect.Parameter.VAR_KEYWORD, annotation="Any"))
    return inspect.Signature(params, return_annotation="Callable[[Callable[..., Any]], PipelineFactory]")


sharded_pipeline.__signature__ = _signature()  # type: ignore[attr-defined]
