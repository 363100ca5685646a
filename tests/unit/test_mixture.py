"""Weighted mixing: exact per-epoch counts per stream, the draws of consecutive epochs walking each
stream pass after pass, and the refusals that name the stream."""

from collections import Counter

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dali_shards.errors import ConfigError
from dali_shards.plan.epoch import PlanSpec
from dali_shards.plan.mixture import MAX_STRETCHES, MixSpec, Stream, largest_remainder, stream_counts


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
                                           (dict(proportion=-1), "proportion must be a finite number > 0, got -1"),
                                           (dict(repeat=-1), ">= 0"), (dict(choose=2.5), "integer"), (dict(proportion=float("nan")), "> 0")])  # fmt: skip
def test_a_bad_stream_is_refused(kwargs, words):
    with pytest.raises(ConfigError, match=words):
        Stream("x", **kwargs)


@pytest.mark.parametrize("source", [Stream("a"), [Stream("a", repeat=2)], ["b.tar", Stream("a")]])
def test_a_stream_inside_a_stream_is_refused(source):
    with pytest.raises(ConfigError, match="a stream's source is shards .*not a Stream"):
        Stream(source, proportion=1)


@pytest.mark.parametrize(
    "streams, sizes, epoch_size, words",
    [
        ([Stream("a", proportion=1e308), Stream("b")], [10, 10], None, (10, 10)),  # a huge weight is only a weight
        ([Stream("a", proportion=1e308), Stream("b", proportion=1e308)], [10, 10], 20, (10, 10)),
        ([Stream("a", proportion=1e308), Stream("b", proportion=1e-300)], [10, 10], 20, (20, 0)),
        ([Stream("a", repeat=1e308), Stream("b")], [10, 10], None, r"stream 0 \('a'\): repeat=1e\+308 .* more than the 1099511627776"),
        ([Stream("a"), Stream("b", choose=1 << 41)], [10, 10], None, r"stream 1 \('b'\): choose=2199023255552 draws per epoch"),
        ([Stream("a", proportion=1)], [10], 1 << 41, "epoch_size=2199023255552 is more than the 1099511627776 draws"),
        ([Stream("a", repeat=1e12)], [10], None, r"stream 0 \('a'\): repeat=1e\+12 of its 10 samples makes 1e\+13 draws"),
        ([Stream("a"), Stream("b", repeat=1e10)], [10, 10], None, (10, 10**11)),  # many passes: see the stretches
        ([Stream("a", proportion=1), Stream("b", choose=5)], [3, 10], 10**6, (999995, 5)),
    ],
)
def test_draws_per_epoch_are_bounded_naming_the_stream(streams, sizes, epoch_size, words):
    """Counts too large to plan are refused with the stream and the limit, before any epoch is
    planned (a repeat of 1e12 used to plan its passes one by one, a hang); huge weights are fine."""
    if isinstance(words, tuple):
        assert stream_counts(streams, sizes, epoch_size) == words
        return
    with pytest.raises(ConfigError, match=words):
        stream_counts(streams, sizes, epoch_size)


def test_an_epoch_of_too_many_stretches_of_shards_is_refused_before_planning():
    sizes = (7,) * 1000
    fits = MixSpec((0, 1000), (7000 * (MAX_STRETCHES // 1000),))  # whole passes: 1000 stretches each
    assert PlanSpec(sizes, batch_size=8, py_num_workers=2, mixture=fits).num_samples == 7000 * (MAX_STRETCHES // 1000)
    over = MixSpec((0, 1, 1000), (5, 7000 * (MAX_STRETCHES // 1000) + 1))
    with pytest.raises(ConfigError, match=r"more than the 4194304 an epoch may hold; stream 1 takes 4195800 \(29358001 draws over its 999 shards\)"):
        PlanSpec(sizes, batch_size=8, py_num_workers=2, mixture=over)
    passes = MixSpec((0, 1, 2), (10, 10**11))  # a stream of one shard drawn 10^10 passes over: that many stretches
    with pytest.raises(ConfigError, match=r"stream 1 takes 10000000000 \(100000000000 draws over its 1 shards\)"):
        PlanSpec((10, 10), batch_size=8, py_num_workers=2, mixture=passes)


def test_largest_remainder_splits_as_the_previous_release_did():
    """The counts are part of a state's mix and of a stratified plan: the same as before weights
    could be huge (ties at .5 included)."""
    assert largest_remainder(14, [1.0, 3.0]) == [4, 10]
    assert largest_remainder(12, [21.0, 35.0]) == [5, 7]
    assert largest_remainder(20, [1e308, 1e-300]) == [20, 0]


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
