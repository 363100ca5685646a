"""From options and the world to everything the workers need: a pure step with no DALI import.

``resolve`` lists the shards and their sizes, chooses how samples are packed, builds the plan spec (or
the streaming spec), applies a resume state, and makes one picklable ``WorkerConfig`` per local
worker. ``pipeline/build.py`` then turns the result into DALI external sources and a pipeline.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from dali_shards.catalog.shardinfo import ShardInfo
from dali_shards.io.rangesupport import note_ignores_range, probe_ignores_range, server_of
from dali_shards.io.filesystems import is_remote
from dali_shards.options import ShardedOptions, option_default
from dali_shards.catalog.table import SampleTables
from dali_shards.plan.epoch import MIN_SHARDS, PlanSpec
from dali_shards.plan.mixture import MixSpec
from dali_shards.plan.mode import Mode, Planned, Streaming
from dali_shards.setup.mixing import resolve_shards
from dali_shards.plan.resume import Plan
from dali_shards.plan.streaming import StreamingSpec
from dali_shards.plan.resume import resume_point
from dali_shards.plan.statecheck import DatasetId
from dali_shards.world import resolve_world
from dali_shards.worker.config import WorkerConfig
from dali_shards.errors import ConfigError
from dali_shards.setup.first_sample import check_fields_present, choose_outputs_layout, first_sample_outputs, table_or_packed
from dali_shards.setup.lengths import SampleLengths
from dali_shards.fields import check_decoders
from dali_shards.shm.packing import Packing
from dali_shards.worker.stage import SampleStage
from dali_shards.worker.usercode import Portable
from dali_shards.fields import FieldKind

log = logging.getLogger("dali_shards")
SLOT_META_BYTES = 128  # shared memory a batch slot takes beyond its sample


@dataclass(frozen=True, kw_only=True)
class Resolved:
    """What a sharded pipeline reads and how, before any DALI object exists.

    ``mode`` says how epochs are delivered (``plan.mode``); ``spec`` is the plan spec that steps,
    masks and states follow. A resumed pipeline starts at ``start_epoch`` with ``resume_plan`` (the
    rest of that epoch), and ``resume_prior`` lists the layouts that ran in that epoch before it.
    """

    options: ShardedOptions
    world_size: int
    rank: int
    shards: Tuple[ShardInfo, ...]
    dataset: DatasetId
    packing: Packing
    mode: Mode
    start_epoch: int
    resume_plan: Optional[Plan]
    resume_prior: Tuple[Dict[str, Any], ...]
    workers: Tuple[WorkerConfig, ...]
    bytes_per_sample_hint: Optional[int]
    lengths: Optional[SampleLengths] = None  # bucketing: samples' lengths, read in this process
    excluded: Tuple[int, ...] = ()  # samples DALI's operators failed on (from the resume state)

    @property
    def spec(self) -> PlanSpec:
        """The plan spec steps, valid masks and resume states follow."""
        return self.mode.steps_spec

    @property
    def steps_before(self) -> int:
        """Steps of ``start_epoch`` taken before this pipeline (by a resumed state's layouts)."""
        done = sum(int(entry["steps"]) for entry in self.resume_prior)
        return done + (self.resume_plan.start_step if self.resume_plan is not None else 0)

    def with_control(self, path: Optional[str]) -> "Resolved":
        """The same, with every worker attached to the control block at ``path``."""
        workers = tuple(dataclasses.replace(w, control=path) for w in self.workers)
        return dataclasses.replace(self, workers=workers)


def resolve(options: ShardedOptions, outputs: Sequence[str] = ()) -> Resolved:
    """Everything the pipeline's workers need, from the options and the world (see the module);
    ``outputs``: with a ``map``, the names of its outputs (the pipeline function's parameters)."""
    world_size, rank = resolve_world(options.world_size, options.rank)
    listed, mixture = resolve_shards(options)
    shards = tuple(listed)
    stage, sizes = choose_stage(options, shards, outputs)
    packing = stage.packing
    if mixture is not None:  # __stream__ is found from __index__: where each stream's samples begin
        starts = [sum(s.samples for s in shards[:b]) for b in mixture.bounds[:-1]]
        packing.set_streams(starts)
    spec, streaming = plan_specs(options, shards, world_size, mixture)
    dataset = DatasetId.of([s.url for s in shards], [s.samples for s in shards], [s.bytes for s in shards])
    resume_prior: List[Dict[str, Any]]
    start_epoch, resume_plan, resume_prior = options.start_epoch, None, []
    lengths = SampleLengths(shards, options, stage) if options.bucket_by is not None else None
    if options.resume_from is not None:
        start_epoch, resume_plan, resume_prior = resume_point(spec, dict(options.resume_from), dataset, lengths)
    resumed = options.resume_from or {}
    excluded = excluded_samples(resumed, shards)
    stand_in = resumed.get("stand_in")
    if streaming is None:
        mode: Mode = Planned(spec, resume_plan)
    else:
        first = None if resume_plan is None else resume_plan.steps - resume_plan.start_step
        mode = Streaming(streaming, spec, first)
    first_worker = WorkerConfig(
        worker=0,
        mode=mode,
        rank=rank,
        urls=tuple(s.url for s in shards),
        byte_sizes=tuple(s.bytes for s in shards),
        stage=stage,
        offsets=tuple(s.offsets for s in shards) if streaming is None else (),
        key_crc=tuple(s.key_crc for s in shards) if streaming is None else (),
        tables=SampleTables.of(shards, options.storage) if streaming is None else SampleTables(),
        packing=packing,
        on_error=options.on_error,
        image_check=options.image_check,
        storage=options.storage,
        start_epoch=start_epoch,
        shuffle_buffer=options.shuffle_buffer,
        excluded=frozenset(excluded),
        stand_in=None if stand_in is None else int(stand_in),
    )
    return Resolved(
        options=options,
        world_size=world_size,
        rank=rank,
        shards=shards,
        dataset=dataset,
        packing=packing,
        mode=mode,
        start_epoch=start_epoch,
        resume_plan=resume_plan,
        resume_prior=tuple(resume_prior),
        workers=tuple(dataclasses.replace(first_worker, worker=w) for w in range(options.py_num_workers)),
        bytes_per_sample_hint=bytes_per_sample_hint(shards, packing, options.py_num_workers, sizes),
        lengths=lengths,
        excluded=excluded,
    )


def excluded_samples(resumed: Mapping[str, Any], shards: Sequence[ShardInfo]) -> Tuple[int, ...]:
    """The samples a resume state excludes (those DALI's operators failed on), sorted; a
    ConfigError if that is every sample: nothing would be left to deliver."""
    excluded = tuple(sorted({int(i) for i in resumed.get("excluded", ())}))
    if excluded and len(excluded) >= sum(s.samples for s in shards if s.samples > 0):
        raise ConfigError(
            f"every one of the dataset's {len(excluded)} samples is excluded (\"excluded\" in the resume state: the "
            "samples DALI's operators failed on, under on_error='skip'): nothing is left to deliver. Fix the pipeline "
            "step that fails on every sample, or remove \"excluded\" from the state to try them again"
        )
    return excluded


def plan_specs(
    options: ShardedOptions, shards: Sequence[ShardInfo], world_size: int, mixture: Optional[MixSpec] = None
) -> Tuple[PlanSpec, Optional[StreamingSpec]]:
    """The plan spec, and in the streaming mode the streaming spec it stands for (what the
    pipeline's workers follow, and ``dali-shards plan`` prints: interleaving only where every shard
    has sample offsets and every server answers ranged requests)."""
    layout: Dict[str, Any] = dict(
        world_size=world_size,
        py_num_workers=options.py_num_workers,
        batch_size=options.batch_size,
        seed=options.seed,
        shuffle=options.shuffle,
        last_batch=options.last_batch,
    )
    if not options.streaming:
        interleave = options.shuffle and options.shuffle_block and _indexed(shards)
        block = options.shuffle_block if interleave and _ranges_served(shards, options) else 0
        layout["bucket_window"] = options.bucket_window if options.bucket_by is not None else 0
        if block and options.storage.cache_dir and any(is_remote(s.url) for s in shards):
            log.warning(
                "dali_shards: cache_dir is set, but interleaved shuffling (shuffle_block=%d) reads remote shards in "
                "ranged pieces, which are not cached; shuffle_block=0 streams and caches whole shards (batches then "
                "mix less if the shards are class-sorted)", block,
            )  # fmt: skip
        sizes = tuple(s.samples for s in shards)
        spec = PlanSpec(sizes, shuffle_buffer=options.shuffle_buffer, shuffle_block=block, mixture=mixture, **layout)
        if block and not spec.epoch(options.start_epoch).interleaving:
            _few_shards(spec)
        return spec, None
    assert options.samples_per_epoch is not None  # options.streaming
    streaming = StreamingSpec(len(shards), options.samples_per_epoch, **layout)
    if streaming.shares_shards():
        log.warning(
            "dali_shards: %d shards for %d virtual workers: some workers stream the same shards",
            len(shards),
            streaming.num_virtual_workers,
        )
    return streaming.as_plan_spec(options.shuffle_buffer), streaming


def _few_shards(spec: PlanSpec) -> None:
    """Says that the shards are too few to interleave, what the workers read instead, and what to do."""
    log.warning(
        "dali_shards: %d non-empty shard(s) are too few to interleave (shuffle_block needs %d: at least %d, and "
        "as many as a worker's samples per step): each worker reads a contiguous run, which changes every epoch, "
        "but a batch mixes only samples within shuffle_buffer=%d of each other in it. Write more, smaller shards "
        "(e.g. `dali-shards write --max-count N`) for batches mixed across the whole dataset.",
        int(np.count_nonzero(spec.sizes)), max(MIN_SHARDS, spec.mini_batch), MIN_SHARDS, spec.shuffle_buffer,
    )  # fmt: skip


def _indexed(shards: Sequence[ShardInfo]) -> bool:
    """Whether every non-empty shard's sample offsets are known (interleaving reads by them);
    says once why not, and what to do."""
    missing = [s for s in shards if s.samples and not s.has_spans]
    if missing:
        log.warning(
            "dali_shards: %d of %d shards (e.g. %s) have no sample offsets (compressed, or listed in a version-1 "
            "manifest): workers read contiguous runs, so batches mix less than with interleaving (shuffle_block). "
            "Rewrite the manifest with `dali-shards index`, or store the shards uncompressed.",
            len(missing), len(shards), missing[0].url,
        )  # fmt: skip
    return not missing


def _ranges_served(shards: Sequence[ShardInfo], options: ShardedOptions) -> bool:
    """Whether every HTTP(S) server of the shards answers ranged requests (interleaving reads each
    sample by them): each asked once, with one GET of a byte of one of its shards (see
    ``io.rangesupport``); says which one does not, and that workers then read contiguous runs."""
    first: Dict[str, ShardInfo] = {}
    for s in shards:
        if s.samples and s.url.startswith(("http://", "https://")):
            first.setdefault(server_of(s.url), s)
    ignoring = [s for s in first.values() if probe_ignores_range(s.url, options.storage, s.bytes)]
    for s in ignoring:
        note_ignores_range(
            s.url, f"interleaved shuffling (shuffle_block={options.shuffle_block}) reads each sample by a ranged "
            "request, so workers read contiguous runs of whole shards instead (shuffle_block=0: batches mix less if "
            "the shards are class-sorted)",
        )  # fmt: skip
    return not ignoring


def mean_field_bytes(shards: Sequence[ShardInfo], exts: Sequence[str]) -> Optional[float]:
    """Mean bytes per sample of the members with these extensions, if the scan recorded them."""
    samples = sum(s.samples for s in shards if s.samples > 0)
    if not samples or any(s.ext_bytes is None for s in shards if s.samples > 0):
        return None
    return sum((s.ext_bytes or {}).get(e, 0) for s in shards if s.samples > 0 for e in exts) / samples


def choose_packing(
    fields: Sequence[str],
    shards: Sequence[ShardInfo],
    py_num_workers: int,
    image_check: str = option_default("image_check"),
    arrays: Optional[Dict[str, Tuple[str, int]]] = None,
    transfer: str = option_default("transfer"),
) -> Packing:
    """The ring transfer's packing: a table of rows and a heap, every field in it (no payload). The
    merge transfer's: the table form for two or more workers, with the largest byte field (by the
    scan's per-extension sizes; else the first) as payload; the single-array form for one worker."""
    table, payload = table_or_packed(transfer, py_num_workers, lambda: [
        (mean_field_bytes(shards, spec.extensions) or 0.0, -i, spec.name)
        for i, spec in enumerate(Packing(fields).byte_fields)
    ])  # fmt: skip
    return Packing(fields, table=table, payload=payload, image_check=image_check, arrays=arrays)


def choose_stage(
    options: ShardedOptions, shards: Sequence[ShardInfo], outputs: Sequence[str]
) -> Tuple[SampleStage, Dict[str, int]]:
    """The workers' Python stage (its packing included) and, with a ``map``, the sizes of its
    outputs in the first sample; user callables are made portable (refused here if they cannot
    be pickled), and the types of ``.npy`` fields and ``map`` outputs taken from the first sample."""
    if not options.mixing:  # (a mix's streams are checked one by one: ``setup.mixing``)
        check_fields_present(options, shards)
    mapper = Portable(options.map, "map") if options.map is not None else None
    decoders = {k: (None if v is None else Portable(v, f"decoders[{k!r}]")) for k, v in check_decoders(options.decoders, options.fields).items()}
    bucket_by = Portable(options.bucket_by, "bucket_by") if options.bucket_by is not None else None
    reading = Packing(options.fields, image_check=options.image_check)
    if mapper is None:
        npy = [f.name for f in reading.fields if f.kind == FieldKind.ARRAY]
        specs = first_sample_outputs(options, shards, SampleStage(reading, None, decoders), npy)[0] if npy else []
        arrays = {s.name: (s.dtype, s.ndim) for s in specs}
        packing = choose_packing(options.fields, shards, options.py_num_workers, options.image_check, arrays, options.transfer)
        return SampleStage(packing, None, decoders, bucket_by, options.seed), {}
    if not outputs:
        raise ConfigError("map= needs the names of its outputs: the pipeline function's parameters")
    specs, sizes = first_sample_outputs(options, shards, SampleStage(reading, mapper, decoders), outputs)
    return SampleStage(choose_outputs_layout(options, specs, sizes), mapper, decoders, bucket_by, options.seed), sizes


MAX_SLOT_HINT = 64 << 20


def bytes_per_sample_hint(
    shards: Sequence[ShardInfo], packing: Packing, py_num_workers: int, sizes: Optional[Dict[str, int]] = None
) -> Optional[int]:
    """Shared-memory size per batch slot: a worker's batch is ``batch_size`` slots but holds only
    ``batch_size / py_num_workers`` samples, so the hint is the sample size divided by the workers
    (with a ``map``: the size of its outputs in the first sample), at most ``MAX_SLOT_HINT`` (DALI
    grows a slot that needs more: a manifest's sizes of compressed shards are not bounded by theirs)."""
    if sizes:
        return min(MAX_SLOT_HINT, int((sum(sizes.values()) + packing.header_bytes) * 1.25 / py_num_workers) + SLOT_META_BYTES)
    exts = [e for spec in packing.byte_fields for e in spec.extensions]
    mean = mean_field_bytes(shards, exts) if exts else 0.0
    if mean is None:
        known = [(s.bytes, s.samples) for s in shards if s.bytes and s.samples > 0]
        if not known:
            return None
        mean = sum(b for b, _ in known) / sum(n for _, n in known)
    return min(MAX_SLOT_HINT, int((mean + packing.header_bytes) * 1.25 / py_num_workers) + SLOT_META_BYTES)
