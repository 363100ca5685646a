"""A stream's passes: the order a mix draws a stream's samples in, epoch after epoch, and the
stretches of its shards that a window of that order holds. Pure, no I/O, no DALI.

A pass is every sample of the stream once, in *rounds*: round ``j`` takes sample ``j`` of every
shard that has one, the shards in a seeded order of their own (new for every round, the same in
every pass: so a window shorter than a pass never holds a sample twice, even across a pass's end).
Passes follow one another; epoch ``e`` of a stream drawn ``count`` times takes draws ``[e count,
(e + 1) count)`` of them. So a window of a pass holds about the same share of every shard (its
samples of a shard one stretch, or two across a pass's end): a stream drawn in part is drawn from
all of its shards, as mixed as a whole one, and over epochs no sample repeats before every sample
of the stream was drawn. Its cost is a few arrays over the stream's shards, never over its samples
or its passes: the whole passes of a window are one block of stretches, repeated (``drawn.Drawn``).
"""

from __future__ import annotations

from typing import Tuple

import numpy as np

from dali_shards.plan.random import TAG_MIX, bitgen
from dali_shards.plan.drawn import Drawn
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


def window(sizes: np.ndarray, a: int, b: int, key: Tuple[int, ...], shuffle: bool) -> Drawn:
    """Draws ``[a, b)`` of the passes over shards of ``sizes`` (indices into ``sizes``), as
    stretches of shards, pass by pass: the part of the first pass the window touches, every whole
    pass (every non-empty shard whole, in order: one block, repeated), then the part of its last."""
    sizes = np.asarray(sizes, dtype=np.int64)
    size = int(sizes.sum())
    if not size or b <= a:
        return Drawn.concat([])
    first, last = a // size, (b - 1) // size  # the passes the window touches
    key = (TAG_MIX, *key)
    if first == last:
        return Drawn.of(_part(sizes, a - first * size, b - first * size, key, shuffle))
    whole = np.flatnonzero(sizes > 0)
    head, tail = _part(sizes, a - first * size, size, key, shuffle), _part(sizes, 0, b - last * size, key, shuffle)
    return Drawn.concat([Drawn.of(head), Drawn.of(Units.of(whole, np.zeros(len(whole)), sizes[whole]), last - first - 1),
                         Drawn.of(tail)])  # fmt: skip


def _part(sizes: np.ndarray, a: int, b: int, key: Tuple[int, ...], shuffle: bool) -> Units:
    """Draws ``[a, b)`` of one pass (``0 <= a < b <= size``), as stretches of shards."""
    lo, hi = cut(sizes, a, key, shuffle), cut(sizes, b, key, shuffle)
    rows = np.flatnonzero(hi > lo)
    return Units.of(rows, lo[rows], hi[rows])
