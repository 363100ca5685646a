"""MosaicML Streaming's per-rank batches, from its own pure shuffle and partition functions, for
``shuffle_quality.py``: the order its ``StreamingDataset`` gives each rank, without its loader.

Streaming's package imports torch, boto3, transformers and more on import; its shuffle
(``streaming.base.shuffle``) and partition (``streaming.base.partition``) modules need only NumPy,
so they are loaded from the installed package without running its ``__init__``. Install it
without its dependencies::

    pip install --no-deps mosaicml-streaming

Set up as ``StreamingDataset`` sets itself up by default: ``num_canonical_nodes`` = physical nodes
for ``py1e`` (64 x for ``py1s``/``py2s``), ``shuffle_block_size = max(4_000_000 // num_canonical_nodes,
1 << 18)``, partition ``orig``; one rank per node (the case where canonical node slices matter
most); each rank's DataLoader takes its workers' batches round-robin.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from typing import Iterator, Optional, Sequence, Tuple

import numpy as np


def streaming_functions() -> Optional[Tuple[object, object, str]]:
    """(get_shuffle, get_partitions, version) of the installed Streaming, or None."""
    try:
        spec = importlib.util.find_spec("streaming")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    root = list(spec.submodule_search_locations)[0]
    for name, path in (("streaming", root), ("streaming.base", os.path.join(root, "base"))):
        if name not in sys.modules:  # a namespace stand-in: the real __init__ is not run
            module = types.ModuleType(name)
            module.__path__ = [path]
            sys.modules[name] = module
    from streaming.base.partition import get_partitions
    from streaming.base.shuffle import get_shuffle

    version = "?"
    try:
        from importlib.metadata import version as dist_version

        version = dist_version("mosaicml-streaming")
    except Exception:  # noqa: BLE001 - the version is only reported
        pass
    return get_shuffle, get_partitions, version


def streaming_rank_batches(
    funcs, shard_sizes: Sequence[int], algo: str, ranks: int, workers: int, batch: int, seed: int, epoch: int, steps: int
) -> Iterator[Tuple[int, np.ndarray]]:
    """(rank, sample ids) of the first ``steps`` batches of every rank (see the module)."""
    get_shuffle, get_partitions, _ = funcs
    canonical = 64 * ranks if algo in ("py1s", "py2s") else ranks
    block = max(4_000_000 // canonical, 1 << 18)
    total = int(sum(shard_sizes))
    ids = get_partitions("orig", total, canonical, ranks, 1, workers, batch)
    order = get_shuffle(algo, np.asarray(shard_sizes, dtype=np.int64), canonical, seed, epoch, block)
    ids = np.where(ids == -1, -1, order[np.maximum(ids, 0)])
    for rank in range(ranks):
        for b in range(min(steps, ids.shape[3] * workers)):
            got = ids[rank, 0, b % workers, b // workers]
            yield rank, got[got >= 0]
