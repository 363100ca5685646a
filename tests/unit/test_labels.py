"""The label-clustering measure of `dali-shards inspect`: exact expectation, class-sorted vs mixed."""

import itertools
import random
from collections import Counter

import pytest

from dali_shards.tools.labels import clustering, expected_distinct


@pytest.mark.parametrize("counts, size", [((3, 1, 2), 2), ((5, 5), 3), ((1, 1, 1, 1), 4), ((4, 2, 1), 6)])
def test_expected_distinct_is_exact(counts, size):
    population = [c for c, n in enumerate(counts) for _ in range(n)]
    draws = list(itertools.combinations(range(len(population)), size))
    brute = sum(len({population[i] for i in d}) for d in draws) / len(draws)
    assert expected_distinct(counts, size) == pytest.approx(brute)


def test_class_sorted_shards_are_flagged_and_mixed_ones_are_not():
    labels = [c for c in range(50) for _ in range(20)]  # 50 classes x 20 samples
    sorted_shards = [Counter(labels[i : i + 40]) for i in range(0, 1000, 40)]
    mixed = labels[:]
    random.Random(0).shuffle(mixed)
    mixed_shards = [Counter(mixed[i : i + 40]) for i in range(0, 1000, 40)]
    a, b = clustering(sorted_shards), clustering(mixed_shards)
    assert a["class_sorted"] and a["ratio"] < 0.2 and a["classes"] == 50
    assert not b["class_sorted"] and 0.9 < b["ratio"] < 1.1
    assert clustering([Counter(), Counter()]) is None
