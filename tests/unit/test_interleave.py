"""The interleaved planner: balanced pieces, and batches as mixed as a global shuffle even from
class-sorted shards (the target the shuffle-quality benchmark measures at ImageNet scale)."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dali_shards.plan.epoch import PlanSpec
from dali_shards.plan.interleave import piece_bounds
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
