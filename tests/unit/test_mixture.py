"""Weighted mixing: exact per-epoch counts per stream, the draws of consecutive epochs walking each
stream pass after pass, and the refusals that name the stream."""

from collections import Counter

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dali_shards.errors import ConfigError
from dali_shards.plan.mixture import MixSpec, Stream, largest_remainder, stream_counts


def test_each_kind_of_count_is_exact():
    streams = [Stream("a", choose=7), Stream("b", repeat=2.5), Stream("c", proportion=1), Stream("d", proportion=3), Stream("e")]
    sizes = [100, 10, 50, 50, 9]
    counts = stream_counts(streams, sizes, epoch_size=100)
    assert counts[0] == 7 and counts[1] == 25 and counts[4] == 9
    assert counts[2] + counts[3] == 100 - 7 - 25 - 9 and (counts[2], counts[3]) == (15, 44)
    assert stream_counts([Stream("a"), Stream("b", repeat=0.5)], [10, 9], None) == (10, 5)  # round(4.5) = 5


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10**6), st.lists(st.floats(0.001, 100), min_size=1, max_size=12))
def test_largest_remainder_is_exact_and_within_one_of_the_share(total, weights):
    counts = largest_remainder(total, weights)
    assert sum(counts) == total and all(c >= 0 for c in counts)
    for c, w in zip(counts, weights):
        assert abs(c - total * w / sum(weights)) < 1


@pytest.mark.parametrize(
    "streams, sizes, epoch_size, words",
    [
        ([Stream("a"), Stream("empty")], [10, 0], None, r"stream 1 \('empty'\) holds no samples"),
        ([Stream("a", choose=50), Stream("b", proportion=1)], [10, 10], 20, r"stream 0 \('a'\): choose=50 is more than epoch_size=20"),
        ([Stream("a", repeat=3), Stream("b", proportion=1)], [10, 10], 20, "cannot hold exactly"),
        ([Stream("a"), Stream("b", proportion=1)], [10, 10], 10, r"stream 1 \('b'\) has a proportion, but nothing"),
        ([Stream("a"), Stream("b")], [10, 10], 25, "cannot hold exactly"),
    ],
)
def test_impossible_mixes_are_config_errors_naming_the_stream(streams, sizes, epoch_size, words):
    with pytest.raises(ConfigError, match=words):
        stream_counts(streams, sizes, epoch_size)


@pytest.mark.parametrize("kwargs, words", [(dict(proportion=1, repeat=2), "at most one"), (dict(proportion=0), "> 0"),
                                           (dict(repeat=-1), ">= 0"), (dict(choose=2.5), "integer"), (dict(proportion=float("nan")), ">= 0")])  # fmt: skip
def test_a_bad_stream_is_refused(kwargs, words):
    with pytest.raises(ConfigError, match=words):
        Stream("x", **kwargs)


def draws(mix, sizes, epoch, shuffle=True):
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    return mix.units(np.asarray(sizes), epoch, seed=3, shuffle=shuffle).positions(starts).tolist()


@settings(max_examples=400, deadline=None)
@given(st.lists(st.integers(0, 12), min_size=1, max_size=6).filter(lambda s: sum(s) > 0), st.integers(1, 40), st.integers(0, 6))
@example([4, 5, 5, 9], 22, 4).via("a window across a pass's end, inside a round")
@example([1, 1, 4], 29, 3).via("whole passes between two parts of passes")
def test_a_stream_walks_its_samples_pass_after_pass(sizes, count, epoch):
    """No sample twice in an epoch while the count fits; no sample again before all were drawn."""
    total = sum(sizes)
    mix = MixSpec((0, len(sizes)), (count,))
    history = [draws(mix, sizes, e) for e in range(epoch + 2)]
    assert all(len(h) == count for h in history)
    flat = [x for h in history for x in h]
    for p in range(len(flat) // total):
        assert sorted(flat[p * total : (p + 1) * total]) == list(range(total)), "each pass draws every sample once"
    for h in history:
        if count <= total:
            assert len(set(h)) == count
        else:
            assert max(Counter(h).values()) - min(Counter(h).values()) <= 1


def test_streams_keep_their_shards_and_counts():
    sizes = [5, 5, 8, 2, 10]
    mix = MixSpec((0, 2, 5), (3, 30))  # stream 0: shards 0-1 (10 samples); stream 1: shards 2-4 (20)
    got = draws(mix, sizes, 1)
    assert len(got) == 33
    assert sum(1 for x in got if x < 10) == 3 and sum(1 for x in got if x >= 10) == 30
    assert mix.stream_of(np.array([0, 1, 2, 4])).tolist() == [0, 0, 1, 1]
