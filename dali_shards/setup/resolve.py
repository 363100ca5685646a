"""From options and the world to everything the workers need: a pure step with no DALI import.

``resolve`` lists the shards and their sizes, makes the workers' stage (its codec, and its slot
format as the transfer chooses it), builds the plan spec (or the streaming spec), applies a resume
state, and makes one picklable ``WorkerConfig`` per local worker. ``pipeline/build.py`` then hands
them to the transfer and turns the result into a pipeline.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple


from dali_shards.catalog.assemble import as_catalog
from dali_shards.catalog.columns import Catalog
from dali_shards.options import ShardedOptions
from dali_shards.catalog.table import SampleTables
from dali_shards.plan.epoch import PlanSpec
from dali_shards.plan.mode import Mode, Planned, Streaming
from dali_shards.setup.mixing import resolve_shards
from dali_shards.setup.planspec import plan_specs
from dali_shards.plan.resume import Plan
from dali_shards.plan.resume import resume_point
from dali_shards.plan.sizes import ShardSizes
from dali_shards.plan.statecheck import DatasetId
from dali_shards.world import resolve_world
from dali_shards.worker.config import WorkerConfig
from dali_shards.errors import ConfigError
from dali_shards.setup.first_sample import check_fields_present, first_sample_outputs
from dali_shards.setup.lengths import SampleLengths
from dali_shards.fields import FieldKind, OutputSpec, check_decoders
from dali_shards.plan.mixture import MixSpec
from dali_shards.ipc.packing import Packing
from dali_shards.worker.codec import SampleCodec
from dali_shards.worker.stage import SampleStage
from dali_shards.worker.usercode import Portable
from dali_shards.transfer.base import Handover
from dali_shards.transfer.choice import transfer_for


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
    shards: Catalog  # a sequence of ``ShardInfo`` views, in columns
    dataset: DatasetId
    packing: Packing
    mode: Mode
    start_epoch: int
    resume_plan: Optional[Plan]
    resume_prior: Tuple[Dict[str, Any], ...]
    workers: Tuple[WorkerConfig, ...]
    sample_bytes: Optional[int]  # a sample's estimated bytes in its slot (None: not known)
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


def resolve(options: ShardedOptions, outputs: Sequence[str] = (), transfer: Optional[Handover] = None) -> Resolved:
    """Everything the pipeline's workers need, from the options and the world (see the module);
    ``outputs``: with a ``map``, the names of its outputs (the pipeline function's parameters);
    ``transfer``: the pipeline's (``transfer.choice``; by default one made for the options)."""
    world_size, rank = resolve_world(options.world_size, options.rank)
    shards, mixture = resolve_shards(options)
    transfer = transfer if transfer is not None else transfer_for(options)
    stage, sizes = choose_stage(options, shards, outputs, stream_starts(shards, mixture), transfer)
    packing = stage.packing
    spec, streaming = plan_specs(options, shards, world_size, mixture)
    dataset = DatasetId.of(shards.urls, ShardSizes(shards.samples), shards.byte_sizes)
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
        urls=shards.urls,
        byte_sizes=shards.byte_sizes,
        stage=stage,
        offsets=shards.offsets if streaming is None else (),
        key_crc=shards.key_crc if streaming is None else (),
        tables=SampleTables.of(shards, options.storage) if streaming is None else SampleTables(),
        packing=packing,
        on_error=options.on_error,
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
        sample_bytes=sample_bytes(shards, packing, sizes),
        lengths=lengths,
        excluded=excluded,
    )


def excluded_samples(resumed: Mapping[str, Any], shards: Catalog) -> Tuple[int, ...]:
    """The samples a resume state excludes (those DALI's operators failed on), sorted; a
    ConfigError if that is every sample: nothing would be left to deliver."""
    excluded = tuple(sorted({int(i) for i in resumed.get("excluded", ())}))
    shards = as_catalog(shards)
    if excluded and len(excluded) >= int(shards.samples[shards.samples > 0].sum()):
        raise ConfigError(
            f"every one of the dataset's {len(excluded)} samples is excluded (\"excluded\" in the resume state: the "
            "samples DALI's operators failed on, under on_error='skip'): nothing is left to deliver. Fix the pipeline "
            "step that fails on every sample, or remove \"excluded\" from the state to try them again"
        )
    return excluded


def mean_field_bytes(shards: Catalog, exts: Sequence[str]) -> Optional[float]:
    """Mean bytes per sample of the members with these extensions, if the scan recorded them."""
    shards = as_catalog(shards)
    held = shards.samples > 0
    samples = int(shards.samples[held].sum())
    if not samples or not shards.has_ext[held].all():
        return None
    return shards.ext_total(exts, held) / samples


def stream_starts(shards: Catalog, mixture: Optional[MixSpec]) -> Tuple[int, ...]:
    """The ``__index__`` each stream of a mix begins at (``__stream__`` is found from it); one
    dataset: (0,)."""
    if mixture is None:
        return (0,)
    counts = as_catalog(shards).samples
    return tuple(int(counts[:b].sum()) for b in mixture.bounds[:-1])


def field_sizes(shards: Catalog, codec: SampleCodec) -> List[Tuple[float, int, str]]:
    """(mean bytes by the scan, tie-break, name) of the requested byte fields: what may be a payload."""
    byte_fields = [(name, exts) for name, kind, exts in codec.inputs if kind == FieldKind.BYTES and exts]
    return [(mean_field_bytes(shards, exts) or 0.0, -i, name) for i, (name, exts) in enumerate(byte_fields)]


def output_sizes(specs: Sequence[OutputSpec], sizes: Mapping[str, int]) -> List[Tuple[float, int, str]]:
    """(bytes in the first sample, tie-break, name) of a ``map``'s outputs that may be a payload."""
    return [(float(sizes.get(s.name, 0)), -i, s.name) for i, s in enumerate(specs) if s.kind in (FieldKind.BYTES, FieldKind.ARRAY)]


def choose_stage(options: ShardedOptions, shards: Catalog, outputs: Sequence[str], starts: Tuple[int, ...],
                 transfer: Handover) -> Tuple[SampleStage, Dict[str, int]]:  # fmt: skip
    """The workers' Python stage (its codec, and its slot format as ``transfer`` lays it out) and,
    with a ``map``, the sizes of its outputs in the first sample; user callables are made portable
    (refused here if they cannot be pickled), and the types of ``.npy`` fields and ``map`` outputs
    taken from the first sample."""
    if not options.mixing:  # (a mix's streams are checked one by one: ``setup.mixing``)
        check_fields_present(options, shards)
    mapper = Portable(options.map, "map") if options.map is not None else None
    decoders = {k: (None if v is None else Portable(v, f"decoders[{k!r}]")) for k, v in check_decoders(options.decoders, options.fields).items()}
    bucket_by = Portable(options.bucket_by, "bucket_by") if options.bucket_by is not None else None
    codec = SampleCodec(options.fields, options.image_check, starts)
    reading = SampleStage(codec, None, mapper, decoders)  # the first samples' types, before the slot format
    if mapper is None:
        npy = [name for name, kind, _ in codec.inputs if kind == FieldKind.ARRAY]
        specs = first_sample_outputs(options, shards, reading, npy)[0] if npy else []
        table, payload = transfer.slot_layout(lambda: field_sizes(shards, codec))
        packing = Packing(options.fields, table=table, payload=payload, arrays={s.name: (s.dtype, s.ndim) for s in specs},
                          stream_starts=starts)  # fmt: skip
        return SampleStage(codec, packing, None, decoders, bucket_by, options.seed), {}
    if not outputs:
        raise ConfigError("map= needs the names of its outputs: the pipeline function's parameters")
    specs, sizes = first_sample_outputs(options, shards, reading, outputs)
    table, payload = transfer.slot_layout(lambda: output_sizes(specs, sizes))
    packing = Packing(options.fields, table=table, payload=payload, outputs=specs, stream_starts=starts)
    return SampleStage(codec, packing, mapper, decoders, bucket_by, options.seed), sizes


MAX_SAMPLE_BYTES = 64 << 20  # the estimate's bound (a manifest's sizes of compressed shards do not bound it)


def sample_bytes(shards: Catalog, packing: Packing, sizes: Optional[Dict[str, int]] = None) -> Optional[int]:
    """A sample's estimated bytes in its slot (header included, and a quarter more), at most
    ``MAX_SAMPLE_BYTES``: with a ``map``, from the size of its outputs in the first sample; else
    from the scan's sizes of the requested members, or the shards' mean sample (None where neither
    is known). Each transfer sizes its slots from it."""
    if sizes:
        mean: Optional[float] = float(sum(sizes.values()))
    else:
        exts = [e for spec in packing.byte_fields for e in spec.extensions]
        mean = mean_field_bytes(shards, exts) if exts else 0.0
    if mean is None:
        shards = as_catalog(shards)
        known = (shards.sizes > 0) & (shards.samples > 0)
        if not known.any():
            return None
        mean = float(shards.sizes[known].sum()) / float(shards.samples[known].sum())
    return min(MAX_SAMPLE_BYTES, int((mean + packing.header_bytes) * 1.25))
