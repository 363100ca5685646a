"""Every option of a sharded pipeline, typed, defaulted and validated in one place.

``ShardedOptions`` (with its nested ``StorageOptions``) is built once from the keywords of
``@sharded_pipeline`` (or of the decorated factory's call) and then only read: each default is
written here and nowhere else, and every range, type and combination is checked in
``__post_init__``, raising a ``ConfigError`` that names the option, the value given and what is
allowed. ``last_batch``, ``on_error``, ``stale_manifest``, ``image_check``, ``transfer`` and ``batching`` are ``StrEnum``s, so the strings
users pass (``"pad"``, ``"skip"``...) keep working and compare equal to the members.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from dali_shards.choices import (  # noqa: F401  (re-exported: the options' enums are imported from here)
    Batching, ImageCheck, LastBatch, OnError, StaleManifest, Transfer, enum_option,
)
from dali_shards.errors import ConfigError
from dali_shards.fields import check_decoders, check_fields
from dali_shards.stream import Stream

MAX_EPOCH = (1 << 31) - 2  # the last epoch a pipeline can start or resume at (the control block's cut word)


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _int(name: str, value: Any, minimum: int, *, optional: bool = False) -> Optional[int]:
    if value is None and optional:
        return None
    if not _is_int(value) or value < minimum:
        what = {0: "a non-negative integer", 1: "a positive integer"}.get(minimum, f"an integer >= {minimum}")
        raise ConfigError(f"{name} must be {what}{' or None' if optional else ''}, got {value!r}")
    return int(value)


def _seconds(name: str, value: Any, *, optional: bool = False) -> Optional[float]:
    if value is None and optional:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not value > 0  # type: ignore[operator]  # typeshed's numbers.Real has no __gt__
        or value != value
    ):
        none = " or None (no limit)" if optional else ""
        raise ConfigError(f"{name} must be a positive number of seconds{none}, got {value!r}")
    return float(value)


def check_batch_split(batch_size: int, py_num_workers: int) -> None:
    """ConfigError unless the batch splits evenly between the workers."""
    if batch_size % py_num_workers:
        raise ConfigError(
            f"batch_size ({batch_size}) must be a multiple of py_num_workers ({py_num_workers}): each worker "
            f"fills an equal slice of every batch. Use e.g. batch_size={batch_size // py_num_workers * py_num_workers or py_num_workers} "
            f"or py_num_workers that divides {batch_size}"
        )


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool) and type(value).__name__ != "bool_":
        raise ConfigError(f"{name} must be True or False, got {value!r}")
    return bool(value)


@dataclass(frozen=True, kw_only=True)
class StorageOptions:
    """How shards are read: fsspec options, read-ahead, retries, timeouts and the local cache.

    ``storage_options`` go to the fsspec filesystem of every remote URL or, when its keys are
    protocols (``{"s3": {...}, "https": {...}}``), to that protocol's filesystem. ``read_ahead``
    is the number of shards a worker opens ahead of the one it reads; ``chunk_size`` the bytes per
    ranged request and ``chunks_ahead`` how many of them each open shard holds ready. A failed
    request is retried ``retries`` times, waiting ``backoff`` seconds and doubling up to
    ``max_backoff``; ``request_timeout`` is the longest wait for bytes over HTTP and the longest
    request elsewhere. ``read_window`` bounds the bytes of remote shards a worker holds (fetched
    ahead or in flight) when it reads pieces of many shards at once (the interleaved shuffle). ``cache_dir`` keeps completely read remote shards on local disk, evicting
    the least recently used beyond ``cache_limit`` bytes (None: no limit), and in its ``catalogs``
    folder the node's one copy of each large manifest's catalog (without it: a private folder in
    the system's temporary folder). A remote manifest's
    entries must lie on its own server or bucket (same scheme and host or bucket: never local
    files) unless ``manifest_foreign_urls`` is True.
    """

    storage_options: Mapping[str, Any] = field(default_factory=dict)
    read_ahead: int = 2
    chunk_size: int = 8 << 20
    chunks_ahead: int = 2
    read_window: int = 128 << 20
    retries: int = 5
    backoff: float = 0.5
    max_backoff: float = 30.0
    request_timeout: float = 60.0
    cache_dir: Optional[str] = None
    cache_limit: Optional[int] = None
    manifest_foreign_urls: bool = False

    def __post_init__(self) -> None:
        opts = self.storage_options
        if opts is None:
            opts = {}
        if not isinstance(opts, Mapping):
            raise ConfigError(f"storage_options must be a dict of fsspec options, got {opts!r}")
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 (frozen)
        set_("storage_options", dict(opts))
        for name in ("read_ahead", "retries"):
            set_(name, _int(name, getattr(self, name), 0))
        for name in ("chunk_size", "chunks_ahead", "read_window"):
            set_(name, _int(name, getattr(self, name), 1))
        set_("request_timeout", _seconds("request_timeout", self.request_timeout))
        set_("max_backoff", _seconds("max_backoff", self.max_backoff))
        if isinstance(self.backoff, bool) or not isinstance(self.backoff, numbers.Real) or self.backoff < 0:
            raise ConfigError(f"backoff must be a non-negative number of seconds, got {self.backoff!r}")
        set_("backoff", float(self.backoff))
        if self.cache_dir is not None:
            if not isinstance(self.cache_dir, (str, os.PathLike)) or not os.fspath(self.cache_dir):
                raise ConfigError(f"cache_dir must be a directory path or None, got {self.cache_dir!r}")
            set_("cache_dir", os.fspath(self.cache_dir))
        set_("cache_limit", _int("cache_limit", self.cache_limit, 0, optional=True))
        if self.cache_limit is not None and self.cache_dir is None:
            raise ConfigError(f"cache_limit={self.cache_limit!r} needs cache_dir: say where the cache is")
        set_("manifest_foreign_urls", _flag("manifest_foreign_urls", self.manifest_foreign_urls))

    def options_for(self, protocol: str) -> Dict[str, Any]:
        """The fsspec options for one protocol."""
        opts = dict(self.storage_options)
        if opts and set(opts) <= _PROTOCOL_KEYS:
            return dict(opts.get(protocol, {}))
        return opts


_PROTOCOL_KEYS = frozenset({"s3", "s3a", "gs", "gcs", "http", "https", "az", "abfs", "file", "hf", "memory"})


@dataclass(frozen=True, kw_only=True)
class ShardedOptions:
    """The options of ``@sharded_pipeline`` (see its docstring for what each one does)."""

    source: Any
    fields: Tuple[str, ...]
    batch_size: int
    py_num_workers: int
    shuffle: bool = False
    seed: int = 0
    world_size: Optional[int] = None
    rank: Optional[int] = None
    last_batch: LastBatch = LastBatch.PAD
    shuffle_buffer: int = 1024
    shuffle_block: int = 256
    start_epoch: int = 0
    worker_prefetch: int = 2
    resume_from: Optional[Mapping[str, Any]] = None
    on_error: OnError = OnError.RAISE
    samples_per_epoch: Optional[int] = None
    stale_manifest: StaleManifest = StaleManifest.RAISE
    worker_timeout: Optional[float] = 600.0
    image_check: ImageCheck = ImageCheck.STRUCTURE
    map: Optional[Callable[..., Any]] = None
    decoders: Optional[Mapping[str, Any]] = None
    bucket_by: Optional[Callable[..., Any]] = None
    bucket_window: int = 1024
    transfer: Transfer = Transfer.RING
    epoch_size: Optional[int] = None
    batching: Batching = Batching.RANDOM
    storage: StorageOptions = field(default_factory=StorageOptions)

    def __post_init__(self) -> None:
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 (frozen)
        set_("source", _source(self.source))
        set_("fields", check_fields(self.fields))
        for name in ("batch_size", "py_num_workers", "worker_prefetch", "shuffle_buffer"):
            set_(name, _int(name, getattr(self, name), 1))
        set_("shuffle_block", _int("shuffle_block", self.shuffle_block, 0))
        check_batch_split(self.batch_size, self.py_num_workers)
        set_("shuffle", _flag("shuffle", self.shuffle))
        if not _is_int(self.seed):
            raise ConfigError(
                f"seed must be an integer, the same on every rank (it keys the shared shuffle), got {self.seed!r}"
            )
        set_("seed", int(self.seed))
        set_("world_size", _int("world_size", self.world_size, 1, optional=True))
        set_("rank", _int("rank", self.rank, 0, optional=True))
        if self.world_size is not None and self.rank is not None and self.rank >= self.world_size:
            raise ConfigError(f"rank must be in 0..{self.world_size - 1} for world_size={self.world_size}, got {self.rank}")
        set_("start_epoch", _int("start_epoch", self.start_epoch, 0))
        if self.start_epoch > MAX_EPOCH:
            raise ConfigError(f"start_epoch must be at most {MAX_EPOCH}, got {self.start_epoch}")
        set_("samples_per_epoch", _int("samples_per_epoch", self.samples_per_epoch, 1, optional=True))
        set_("worker_timeout", _seconds("worker_timeout", self.worker_timeout, optional=True))
        for name, cls in (("last_batch", LastBatch), ("on_error", OnError), ("stale_manifest", StaleManifest),
                          ("image_check", ImageCheck), ("transfer", Transfer)):
            set_(name, enum_option(cls, name, getattr(self, name)))
        if self.resume_from is not None and not isinstance(self.resume_from, Mapping):
            raise ConfigError(
                f"resume_from must be a state_dict() of DALIShardedIterator (a dict) or None, "
                f"got {type(self.resume_from).__name__}"
            )
        if not isinstance(self.storage, StorageOptions):
            raise ConfigError(f"storage must be a StorageOptions, got {self.storage!r}")
        self._check_stage()
        self._check_mix()

    def _check_mix(self) -> None:
        """``epoch_size``, ``batching``, and what a mix of streams can go with."""
        object.__setattr__(self, "epoch_size", _int("epoch_size", self.epoch_size, 1, optional=True))
        object.__setattr__(self, "batching", enum_option(Batching, "batching", self.batching))
        if self.batching is Batching.STRATIFIED and not self.mixing:
            raise ConfigError("batching='stratified' keeps each stream's share in every batch: it needs a mix of streams "
                              "(a list of Stream objects as the source)")  # fmt: skip
        if self.batching is Batching.STRATIFIED and self.bucket_by is not None:
            raise ConfigError("batching='stratified' keeps each stream's share in every batch, bucket_by= reorders "
                              "samples across the batches of a window: give one or the other")  # fmt: skip
        if self.mixing and self.streaming:
            raise ConfigError(
                "a mix of streams (Stream objects, or epoch_size=) plans exact per-epoch counts from the shards' sample "
                "counts; samples_per_epoch= streams without counts: give one or the other"
            )

    def _check_stage(self) -> None:
        """The worker-side Python stage: ``map``, ``decoders``, ``bucket_by``, ``bucket_window``."""
        for name in ("map", "bucket_by"):
            if getattr(self, name) is not None and not callable(getattr(self, name)):
                raise ConfigError(f"{name} must be a callable or None, got {getattr(self, name)!r}")
        check_decoders(self.decoders, self.fields)
        if self.decoders and self.map is None:
            raise ConfigError(
                "decoders= says how fields are decoded for map=, and there is no map: without one, fields reach the "
                "pipeline as bytes (integers for .cls/.index/.label, arrays for .npy); pass a map, or drop decoders"
            )
        object.__setattr__(self, "bucket_window", _int("bucket_window", self.bucket_window, 1))
        if self.bucket_by is not None and self.streaming:
            raise ConfigError("bucket_by needs planned epochs: it cannot be used with samples_per_epoch")

    @property
    def mixing(self) -> bool:
        """True for a mix of streams: ``Stream`` objects as the source, or ``epoch_size`` given."""
        return _is_mix(self.source) or self.epoch_size is not None

    @property
    def streaming(self) -> bool:
        """True in the streaming (resampled) mode, chosen by ``samples_per_epoch``."""
        return self.samples_per_epoch is not None

    @classmethod
    def from_keywords(cls, **keywords: Any) -> "ShardedOptions":
        """Options from the flat keywords of ``@sharded_pipeline`` (storage ones included)."""
        storage = {k: keywords.pop(k) for k in list(keywords) if k in STORAGE_KEYWORDS}
        unknown = set(keywords) - set(OPTION_KEYWORDS)
        if unknown:
            raise ConfigError(f"unknown sharded_pipeline option(s) {sorted(unknown)}")
        required = [f.name for f in dataclasses.fields(cls) if f.name != "storage" and _required(f)]
        missing = [name for name in required if name not in keywords]
        if missing:
            raise ConfigError(f"sharded_pipeline needs {', '.join(f'{m}=' for m in missing)} (no default)")
        return cls(storage=StorageOptions(**storage), **keywords)

    def replace(self, **keywords: Any) -> "ShardedOptions":
        """A copy with some flat keywords changed (validated anew)."""
        storage = {k: keywords.pop(k) for k in list(keywords) if k in STORAGE_KEYWORDS}
        new_storage = dataclasses.replace(self.storage, **storage) if storage else self.storage
        return dataclasses.replace(self, storage=new_storage, **keywords)

    def keywords(self) -> Dict[str, Any]:
        """The flat keywords that rebuild these options (enum members as their strings)."""
        flat = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "storage"}
        flat.update({name: getattr(self.storage, name) for name in STORAGE_KEYWORDS})
        return {k: (v.value if isinstance(v, Enum) else v) for k, v in flat.items()}


def _is_mix(source: Any) -> bool:
    """A mix: a tuple of ``Stream`` objects."""
    return isinstance(source, tuple) and bool(source) and all(isinstance(s, Stream) for s in source)


def _source(source: Any) -> Any:
    if isinstance(source, (list, tuple)) and source and any(isinstance(s, Stream) for s in source):
        if not all(isinstance(s, Stream) for s in source):
            raise ConfigError(f"a mix is a list of Stream objects only (wrap each source in Stream()), got {source!r}")
        return tuple(source)
    if isinstance(source, Stream):
        raise ConfigError(f"source is one Stream ({source!r}): a mix is a list of them ([Stream(...), ...]); for "
                          "one dataset, give its shards themselves")  # fmt: skip
    if isinstance(source, (str, os.PathLike)):
        if not os.fspath(source):
            raise ConfigError("source is empty: give shards as a pattern, a manifest, a directory or a list")
        return os.fspath(source)
    if isinstance(source, (list, tuple)):
        if not source or not all(isinstance(s, (str, os.PathLike)) and os.fspath(s) for s in source):
            raise ConfigError(f"source must be a non-empty list of shard paths/URLs/patterns, got {source!r}")
        return tuple(os.fspath(s) for s in source)
    raise ConfigError(f"source must be a path, URL, pattern, manifest or a list of them, got {source!r}")


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def option_default(name: str) -> Any:
    """The default of option ``name`` (written once, in ``ShardedOptions``/``StorageOptions``)."""
    for cls in (ShardedOptions, StorageOptions):
        for f in dataclasses.fields(cls):
            if f.name == name:
                if f.default is not dataclasses.MISSING:
                    return f.default.value if isinstance(f.default, Enum) else f.default
                if f.default_factory is not dataclasses.MISSING:
                    return f.default_factory()
    raise KeyError(f"option {name!r} has no default")


STORAGE_KEYWORDS: Tuple[str, ...] = ("storage_options", "read_ahead", "read_window", "retries", "request_timeout",
                                     "cache_dir", "cache_limit", "manifest_foreign_urls")
OPTION_KEYWORDS: Tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(ShardedOptions) if f.name != "storage"
) + STORAGE_KEYWORDS
