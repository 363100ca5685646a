"""The interleaved planner: balanced pieces, and batches as mixed as a global shuffle even from
class-sorted shards (the target the shuffle-quality benchmark measures at ImageNet scale); ranks and
workers draw new samples every epoch."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dali_shards.plan.epoch import PlanSpec
from dali_shards.plan.legacy_interleave import piece_bounds
from dali_shards.tools.labels import expected_distinct


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=30), st.integers(1, 12))
def test_pieces_cover_every_shard_and_balance_the_workers(sizes, workers):
    carry, totals = 0, np.zeros(workers, dtype=int)
    for size in sizes:
        bounds, carry = piece_bounds(size, workers, carry)
        assert bounds[0] == 0 and bounds[-1] == size and (np.diff(bounds) >= 0).all()
        totals += np.diff(bounds)
    assert totals.max() - totals.min() <= 1


def class_mix(spec, labels, steps):
    plan, m, distinct = spec.epoch(0), spec.mini_batch, []
    for rank in range(spec.world_size):
        orders = []
        for w in range(spec.py_num_workers):
            pairs = itertools.islice(plan.iter_worker_order(rank * spec.py_num_workers + w), steps * m)
            orders.append(plan.canonical_index([p for p, _ in pairs]))
        for s in range(steps):
            distinct.append(len(np.unique(labels[np.concatenate([o[s * m : (s + 1) * m] for o in orders])])))
    return np.mean(distinct)


@pytest.mark.parametrize("world, workers, batch", [(1, 1, 32), (2, 2, 32), (4, 2, 16), (2, 4, 64), (3, 2, 32), (8, 8, 64)])
def test_class_sorted_shards_give_batches_as_mixed_as_a_global_shuffle(world, workers, batch):
    classes, per_class, shard = 200, 130, 100  # a class spans more than one shard, as in ImageNet
    total = classes * per_class
    labels = np.arange(total) // per_class
    sizes = tuple(min(shard, total - i) for i in range(0, total, shard))
    ideal = expected_distinct([per_class] * classes, batch)
    spec = PlanSpec(sizes, world_size=world, py_num_workers=workers, batch_size=batch, seed=5, shuffle=True)
    assert class_mix(spec, labels, 10) >= ideal, "the default planner must mix class-sorted shards as a global shuffle"
    if world == workers == 1:  # contiguous runs through a buffer do not: the measure tells them apart
        old = PlanSpec(sizes, batch_size=batch, seed=5, shuffle=True, shuffle_block=0)
        assert class_mix(old, labels, 10) < 0.7 * ideal


def _sample_sets(spec, epoch):
    """The ``__index__`` set of every virtual worker's valid samples in ``epoch``."""
    plan = spec.epoch(epoch)
    sets = []
    for v in range(spec.num_virtual_workers):
        pos, ok = plan.worker_order(v)
        sets.append(set(plan.canonical_index(pos[ok]).tolist()))
    return sets


def _mean_overlap(sets_by_epoch, groups):
    """Mean over epochs and groups (lists of virtual workers) of |set(e) & set(e+1)| / |set(e)|."""
    ratios = []
    for before, after in zip(sets_by_epoch, sets_by_epoch[1:]):
        for group in groups:
            a = set().union(*(before[v] for v in group))
            b = set().union(*(after[v] for v in group))
            if a:
                ratios.append(len(a & b) / len(a))
    return float(np.mean(ratios))


@pytest.mark.parametrize("world", range(1, 9))
@pytest.mark.parametrize("workers", [1, 2, 3, 4])
def test_ranks_and_workers_draw_new_parts_of_every_shard_each_epoch(world, workers):
    """Shuffle before shard at every level: a rank's (a worker's) samples of one epoch overlap
    those of the epoch before about as much as a random split would, 1 / world_size (1 / virtual
    workers), instead of being the same part of every shard each epoch."""
    sizes = tuple(np.random.default_rng(world * 10 + workers).integers(20, 60, size=48))
    spec = PlanSpec(sizes, world_size=world, py_num_workers=workers, batch_size=4 * workers, seed=7, shuffle=True)
    assert spec.epoch(0).interleaving
    sets = [_sample_sets(spec, e) for e in range(5)]
    n = spec.num_virtual_workers
    ranks = [list(range(r * workers, (r + 1) * workers)) for r in range(world)]
    for expected, groups in ((1 / world, ranks), (1 / n, [[v] for v in range(n)])):
        overlap = _mean_overlap(sets, groups)
        assert abs(overlap - expected) <= 0.06 + 0.2 * expected, (overlap, expected)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=8, max_size=24), st.integers(1, 8), st.integers(1, 3), st.integers(0, 99))
def test_the_stretches_workers_read_cover_every_sample_once(sizes, world, workers, epoch):
    """Drawn cuts: the stretches of all workers cover every sample once (each piece is at most two
    stretches of its shard: test_deal.py)."""
    if sum(1 for s in sizes if s) < 8:
        return
    spec = PlanSpec(tuple(sizes), world_size=world, py_num_workers=workers, batch_size=workers, seed=1, shuffle=True)
    plan = spec.epoch(epoch)
    covered = []
    for v in range(spec.num_virtual_workers):
        if not plan.worker_valid_count(v):
            continue
        for seg in plan.worker_pieces(v):
            covered += [(seg.shard, i) for i in range(seg.first, seg.stop)]
    assert sorted(covered) == sorted((s, i) for s, n in enumerate(sizes) for i in range(n))
