"""A stream's passes: the order a mix draws a stream's samples in, epoch after epoch, and the
stretches of its shards that a window of that order holds. Pure, no I/O, no DALI.

A pass is every sample of the stream once, in *rounds*: round ``j`` takes sample ``j`` of every
shard that has one, the shards in a seeded order of their own (new for every round, the same in
every pass: so a window shorter than a pass never holds a sample twice, even across a pass's end).
Passes follow one another; epoch ``e`` of a stream drawn ``count`` times takes draws ``[e count,
(e + 1) count)`` of them. So a window of a pass holds about the same share of every shard (its
samples of a shard one stretch, or two across a pass's end): a stream drawn in part is drawn from
all of its shards, as mixed as a whole one, and over epochs no sample repeats before every sample
of the stream was drawn. Its cost is a few arrays over the stream's shards, never over its samples.
"""

from __future__ import annotations

from typing import List, Tuple

import numpy as np

from dali_shards.plan.random import TAG_MIX, bitgen
from dali_shards.plan.units import Units


def rounds_before(sizes: np.ndarray, j: int) -> int:
    """Samples of a pass in its rounds before round ``j``."""
    return int(np.minimum(sizes, j).sum())


def cut(sizes: np.ndarray, at: int, key: Tuple[int, ...], shuffle: bool) -> np.ndarray:
    """Per shard, its samples among the first ``at`` of a pass (``key``: the stream's)."""
    lo, hi = 0, int(sizes.max(initial=0))
    while lo < hi:  # the round ``at`` falls in: the last ``j`` with ``rounds_before(j) <= at``
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if rounds_before(sizes, mid) <= at else (lo, mid - 1)
    j, inside = lo, at - rounds_before(sizes, lo)
    taken = np.minimum(sizes, j)
    if inside:
        members = np.flatnonzero(sizes > j)
        order = np.argsort(bitgen(*key, j).random_raw(len(members)), kind="stable") if shuffle else np.arange(len(members))
        taken[members[order[:inside]]] += 1
    return taken


def window(sizes: np.ndarray, a: int, b: int, key: Tuple[int, ...], shuffle: bool) -> List[Units]:
    """Draws ``[a, b)`` of the passes over shards of ``sizes`` (indices into ``sizes``), as
    stretches of shards, pass by pass."""
    sizes = np.asarray(sizes, dtype=np.int64)
    size = int(sizes.sum())
    out: List[Units] = []
    if not size or b <= a:
        return out
    for p in range(a // size, (b - 1) // size + 1):  # the passes the window touches
        lo = cut(sizes, max(a - p * size, 0), (TAG_MIX, *key), shuffle)
        hi = cut(sizes, min(b - p * size, size), (TAG_MIX, *key), shuffle)
        rows = np.flatnonzero(hi > lo)
        out.append(Units.of(rows, lo[rows], hi[rows]))
    return out
