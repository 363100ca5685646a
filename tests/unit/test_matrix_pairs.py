"""The combination harness's choice of configurations (no DALI): every pair of values that a valid
configuration has is in the pairwise set, no refused combination is in it, and it is small."""

import itertools

from dali_shards.testing.matrix import AXES, Config, configurations, pairwise


def test_every_valid_pair_of_values_is_covered_by_the_pairwise_set():
    chosen = pairwise()
    assert all(c.invalid() is None for c in chosen)
    assert len(chosen) <= 25 and len(set(chosen)) == len(chosen)
    valid = configurations()
    for (a, xs), (b, ys) in itertools.combinations(AXES.items(), 2):
        for x, y in itertools.product(xs, ys):
            possible = any(getattr(c, a) == x and getattr(c, b) == y for c in valid)
            covered = any(getattr(c, a) == x and getattr(c, b) == y for c in chosen)
            assert covered == possible, f"{a}={x} with {b}={y}"


def test_refused_combinations_are_left_out_of_the_grid():
    assert Config(transfer="merge", queues="separated").invalid()
    assert Config(plan="streaming", source="random_mix").invalid()
    assert Config(plan="bucketed", source="stratified_mix").invalid()
    assert len(configurations()) == 216
