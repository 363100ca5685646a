"""Shards for tests: the built-in photos in shards of any sizes, or samples of any fields made by a
function, with a manifest if asked. No DALI (the unit tier uses it). The fixture factory
``make_shards`` in tests/conftest.py writes them into temporary folders."""

from __future__ import annotations

import io
import os
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from dali_shards.sample_data import write_sample_shards
from dali_shards.tools.writer import write_shard

#: ``sample(index, shard, position)``: the sample ``__index__`` ``index``, at ``position`` of shard
#: ``shard``, as the dict ``write_shard`` takes (``"__key__"`` and the fields).
SampleMaker = Callable[[int, int, int], Dict[str, Any]]


def npy(array: np.ndarray) -> bytes:
    """``array`` as the bytes of a ``.npy`` member (objects pickled)."""
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=True)
    return buf.getvalue()


def write_shards(
    folder: Any,
    sizes: Sequence[int],
    sample: Optional[SampleMaker] = None,
    *,
    prefix: str = "sample",
    name: Optional[str] = None,
    manifest: bool = False,
) -> List[str]:
    """Shards of ``sizes`` samples in ``folder``; their paths. Without ``sample``, the built-in
    photos (``write_sample_shards``: key ``f"{index:06d}"``, ``jpg`` and ``cls``) in
    ``{prefix}-{shard:06d}.tar``; with it, the samples it makes, in ``name`` (a template of
    ``shard``; by default the same names). ``manifest``: also ``manifest.json`` in ``folder``."""
    folder = str(folder)
    if sample is None:
        assert name is None, "the photos' shards are named by prefix"
        paths = write_sample_shards(folder, shard_sizes=tuple(sizes), prefix=prefix)
    else:
        template = name if name is not None else prefix + "-{shard:06d}.tar"
        paths, index = [], 0
        for shard, size in enumerate(sizes):
            samples = []
            for position in range(size):
                samples.append(sample(index, shard, position))
                index += 1
            paths.append(os.path.join(folder, template.format(shard=shard)))
            write_shard(paths[-1], samples)
    if manifest:
        from dali_shards.catalog.manifest import write_manifest
        from dali_shards.catalog.scan import scan_shards

        write_manifest(os.path.join(folder, "manifest.json"), scan_shards(paths))
    return paths
