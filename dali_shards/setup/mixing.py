"""The shards of a pipeline, and for a mix of streams what each stream draws per epoch: each
stream's source resolved as one source is, the streams' shards one after the other (the canonical
order), every stream checked to hold what ``fields`` asks for. Pure, no DALI."""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

from dali_shards.catalog.assemble import as_catalog, concat
from dali_shards.catalog.columns import Catalog
from dali_shards.catalog.identity import ShardIdentity, spelled
from dali_shards.catalog.repeats import first_repeat_across, identity_digests
from dali_shards.catalog.sources import resolve_catalog
from dali_shards.errors import ConfigError
from dali_shards.fields import SPECIAL_FIELDS
from dali_shards.io.storage import open_shard
from dali_shards.options import Batching, ShardedOptions
from dali_shards.plan.mixture import MixSpec, stream_counts
from dali_shards.stream import Stream
from dali_shards.tar.format import TarReader


def resolve_shards(options: ShardedOptions) -> Tuple[Catalog, Optional[MixSpec]]:
    """The pipeline's shards, and its mix (None: one dataset, every sample once per epoch)."""
    if not options.mixing:
        return _shards(options, options.source), None
    streams: Sequence[Stream] = options.source if isinstance(options.source, tuple) and isinstance(options.source[0], Stream) \
        else (Stream(options.source, proportion=1),)  # fmt: skip
    shards, mix = resolve_mix(streams, options.epoch_size, options.batching, lambda source: _shards(options, source))
    check_stream_fields(shards, mix.bounds, options, streams)
    return shards, mix


def resolve_mix(streams: Sequence[Stream], epoch_size: Optional[int], batching: Batching,
                shards_of: Callable[[Any], Catalog]) -> Tuple[Catalog, MixSpec]:  # fmt: skip
    """The shards of ``streams`` one stream after the other (each resolved by ``shards_of``) and
    their mix; a ConfigError naming the streams that share a shard (however spelled:
    ``catalog.identity``), or a stream that cannot be drawn as asked (``plan.mixture.stream_counts``)."""
    catalogs: List[Catalog] = []
    digests: List[np.ndarray] = []
    bounds = [0]
    identity = ShardIdentity()
    for i, stream in enumerate(streams):
        mine = as_catalog(shards_of(stream.source))
        digests.append(identity_digests(mine, identity))
        met = len(digests) > 1 and np.isin(digests[-1], np.concatenate(digests[:-1])).any()
        found = first_repeat_across(catalogs + [mine]) if met else None  # (each stream refuses its own repeats)
        if found is not None:
            first, again = found
            k = int(np.searchsorted(bounds, first, side="right")) - 1
            url, other = catalogs[k].url(first - bounds[k]), mine.url(again - bounds[-1])
            raise ConfigError(f"shard {spelled(url, other)} is in stream {k} and stream {i}: a shard "
                              "may be in one stream only (give a stream a larger repeat= or proportion= "
                              "instead)")  # fmt: skip
        catalogs.append(mine)
        bounds.append(bounds[-1] + len(mine))
    shards = concat(catalogs)
    sizes = [int(shards.samples[a:b][shards.samples[a:b] > 0].sum()) if b > a else 0 for a, b in zip(bounds, bounds[1:])]
    return shards, MixSpec(tuple(bounds), stream_counts(streams, sizes, epoch_size), batching)


def _shards(options: ShardedOptions, source) -> Catalog:
    return resolve_catalog(source, on_error=options.on_error, config=options.storage, counts=not options.streaming,
                           stale_manifest=options.stale_manifest)  # fmt: skip


def check_stream_fields(shards: Catalog, bounds: Sequence[int], options: ShardedOptions,
                        streams: Sequence[Stream]) -> None:  # fmt: skip
    """A ConfigError naming the stream whose first sample lacks a requested field (streams of other
    fields than the rest): one sample read per stream."""
    wanted = [f for f in options.fields if f not in SPECIAL_FIELDS and f != "__stream__"]
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        held = np.flatnonzero(shards.samples[a:b] > 0)
        if not len(held) or not wanted:
            continue
        first = shards.info(a + int(held[0]))
        with open_shard(first.url, options.storage, first.bytes) as stream:
            sample = next(TarReader(stream, first.url).samples(set()), None)
        have = set(sample.extensions) if sample is not None else set()
        missing = [f for f in wanted if not any(ext in have for ext in f.split(";"))]
        if missing:
            raise ConfigError(
                f"stream {i} ({streams[i].source!r}) has samples without field(s) {missing} (its first sample, in "
                f"{first.url!r}, has {sorted(have)}): every stream of a mix must hold the fields asked for"
            )
