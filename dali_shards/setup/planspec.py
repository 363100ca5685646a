"""The plan spec a pipeline follows (and ``dali-shards plan`` prints): interleaving where the shards
and their servers allow it, contiguous runs otherwise (each fall-back said once, with what to do),
or the streaming mode's spec. No DALI."""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from dali_shards.catalog.assemble import as_catalog
from dali_shards.catalog.columns import Catalog
from dali_shards.catalog.shardinfo import ShardInfo
from dali_shards.io.filesystems import is_remote
from dali_shards.io.rangesupport import note_ignores_range, probe_ignores_range, server_of
from dali_shards.options import ShardedOptions
from dali_shards.plan.epoch import MIN_SHARDS, PlanSpec
from dali_shards.plan.mixture import MixSpec
from dali_shards.plan.sizes import ShardSizes
from dali_shards.plan.streaming import StreamingSpec

log = logging.getLogger("dali_shards")


def plan_specs(
    options: ShardedOptions, shards: Catalog, world_size: int, mixture: Optional[MixSpec] = None
) -> Tuple[PlanSpec, Optional[StreamingSpec]]:
    """The plan spec, and in the streaming mode the streaming spec it stands for (what the
    pipeline's workers follow, and ``dali-shards plan`` prints: interleaving only where every shard
    has sample offsets and every server answers ranged requests)."""
    shards = as_catalog(shards)
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
        if block and options.storage.cache_dir and any_remote(shards):
            log.warning(
                "dali_shards: cache_dir is set, but interleaved shuffling (shuffle_block=%d) reads remote shards in "
                "ranged pieces, which are not cached; shuffle_block=0 streams and caches whole shards (batches then "
                "mix less if the shards are class-sorted)", block,
            )  # fmt: skip
        sizes = ShardSizes(shards.samples, shards if shards.path is not None else None)
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


def _indexed(shards: Catalog) -> bool:
    """Whether every non-empty shard's sample offsets are known (interleaving reads by them);
    says once why not, and what to do."""
    missing = np.flatnonzero((shards.samples != 0) & ~shards.has_spans())
    if len(missing):
        log.warning(
            "dali_shards: %d of %d shards (e.g. %s) have no sample offsets (compressed, or listed in a version-1 "
            "manifest): workers read contiguous runs, so batches mix less than with interleaving (shuffle_block). "
            "Rewrite the manifest with `dali-shards index`, or store the shards uncompressed.",
            len(missing), len(shards), shards.url(int(missing[0])),
        )  # fmt: skip
    return not len(missing)


def _ranges_served(shards: Catalog, options: ShardedOptions) -> bool:
    """Whether every HTTP(S) server of the shards answers ranged requests (interleaving reads each
    sample by them): each asked once, with one GET of a byte of one of its shards (see
    ``io.rangesupport``); says which one does not, and that workers then read contiguous runs."""
    first: Dict[str, ShardInfo] = {}
    for i in _http_rows(shards):
        s = shards.info(i)
        first.setdefault(server_of(s.url), s)
    ignoring = [s for s in first.values() if probe_ignores_range(s.url, options.storage, s.bytes)]
    for s in ignoring:
        note_ignores_range(
            s.url, f"interleaved shuffling (shuffle_block={options.shuffle_block}) reads each sample by a ranged "
            "request, so workers read contiguous runs of whole shards instead (shuffle_block=0: batches mix less if "
            "the shards are class-sorted)",
        )  # fmt: skip
    return not ignoring


def any_remote(shards: Catalog) -> bool:
    """Whether one of the shards is remote."""
    return bool(_first_rows(shards, is_remote, False))


def _http_rows(shards: Catalog) -> List[int]:
    """Non-empty shards served over HTTP(S), the first of each server among them (in order)."""
    return _first_rows(shards, lambda url: url.startswith(("http://", "https://")), True)


def _first_rows(shards: Catalog, wanted: Callable[[str], bool], held: bool) -> List[int]:
    """Shards whose URL is ``wanted`` (``held``: non-empty ones only), in order; of those under one
    folder prefix only the first (they share its server)."""
    prefix = shards.columns["prefix"]
    out: List[int] = []
    for k, p in enumerate(shards.prefixes):
        rows = np.flatnonzero((prefix == k) & (shards.samples != 0) if held else prefix == k)
        if p == "":
            out.extend(i for i in rows.tolist() if wanted(shards.url(i)))
        elif len(rows) and wanted(p):
            out.append(int(rows[0]))
    return sorted(out)
