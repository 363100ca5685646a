"""A mix's draws kept compact: the same stretches as the pass-by-pass planner, windows of them laid
in a seeded order the same as sorting every stretch, plans the same as over the listed stretches,
and every draw delivered as many times as drawn, at a cost that follows a worker's own draws."""

import tracemalloc
from collections import Counter

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dali_shards.plan import drawn as drawn_module
from dali_shards.plan import passes
from dali_shards.plan.drawn import Drawn, Laid
from dali_shards.plan.epoch import PlanSpec
from dali_shards.plan.mixture import MixSpec, Stream, stream_counts
from dali_shards.plan.random import TAG_MIX, bitgen
from dali_shards.plan.units import Streams, Units


def old_window(sizes, a, b, key, shuffle):
    """The planner before: one loop turn per pass the window touches (the slow reference)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    size = int(sizes.sum())
    out = []
    if not size or b <= a:
        return Units.of([], [], [])
    for p in range(a // size, (b - 1) // size + 1):
        lo = passes.cut(sizes, max(a - p * size, 0), (TAG_MIX, *key), shuffle)
        hi = passes.cut(sizes, min(b - p * size, size), (TAG_MIX, *key), shuffle)
        rows = np.flatnonzero(hi > lo)
        out.append(Units.of(rows, lo[rows], hi[rows]))
    return Units.concat(out)


def rows_of(units):
    return list(zip(units.shard.tolist(), units.lo.tolist(), units.hi.tolist()))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=7).filter(lambda s: sum(s) > 0), st.integers(0, 400),
       st.integers(0, 400), st.integers(0, 2**32), st.booleans())  # fmt: skip
@example([3, 0, 5], 4, 4 + 8 * 30 + 5, 1, True).via("thirty whole passes between two parts")
@example([2, 2], 0, 4 * 7, 5, True).via("whole passes only")
def test_a_window_holds_the_stretches_of_the_pass_by_pass_planner(sizes, a, n, seed, shuffle):
    new = passes.window(np.asarray(sizes), a, a + n, (seed, 2), shuffle)
    assert rows_of(new.units()) == rows_of(old_window(sizes, a, a + n, (seed, 2), shuffle))
    assert new.total == n and len(new) == len(new.units())
    assert len(new.blocks) <= 3, "whole passes are one block, repeated"


def test_a_stream_drawn_many_times_its_size_stays_a_few_rows():
    drawn = passes.window(np.asarray([5, 5]), 3, 3 + 10**9, (1, 0), True)
    assert drawn.total == 10**9 and len(drawn) == 2 + 2 * (10**8 - 1) + 2
    assert sum(len(u) for u in drawn.blocks) == 6


def sorted_reference(drawn, key, a, b):
    """Samples ``[a, b)`` of every stretch listed and sorted (the slow reference)."""
    units = drawn.units()
    order = np.argsort(bitgen(*key).random_raw(len(units)), kind="stable") if key else np.arange(len(units))
    laid = Streams(units, order.astype(np.int64), np.zeros(len(units), np.int64), units.sizes[order])
    return laid.window(a, b)


def same_streams(x, y):
    starts = np.zeros(1000, np.int64)
    return ([x.stretches(j) for j in range(len(x))] == [y.stretches(j) for j in range(len(y))]
            and x.flat_positions(starts).tolist() == y.flat_positions(starts).tolist())  # fmt: skip


blocks = st.lists(st.tuples(st.lists(st.tuples(st.integers(0, 30), st.integers(1, 6)), min_size=1, max_size=6), st.integers(0, 40)),
                  min_size=1, max_size=4)  # fmt: skip


def drawn_of(spec):
    parts = [Drawn.of(Units.of([s for s, _ in rows], [0] * len(rows), [n for _, n in rows]), times) for rows, times in spec]
    return Drawn.concat(parts)


@settings(max_examples=250, deadline=None)
@given(blocks, st.data(), st.booleans(), st.sampled_from([8.0, 0.0]), st.sampled_from([1 << 16, 5]))
def test_a_laid_window_is_the_window_of_every_stretch_sorted(spec, data, keyed, spread, chunk):
    """Windows one by one (a tight margin widened until it holds; chunks across blocks), then many
    (every stretch sorted once): the same streams as sorting every stretch."""
    drawn = drawn_of(spec)
    if not drawn.total:
        return
    key = (7, data.draw(st.integers(0, 2**32))) if keyed else None
    laid = Laid(drawn, key)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(drawn_module, "SPREAD", spread)
        mp.setattr(drawn_module, "CHUNK", chunk)
        for _ in range(4):
            a = data.draw(st.integers(0, drawn.total))
            b = data.draw(st.integers(a, drawn.total))
            assert same_streams(laid.window(a, b), sorted_reference(drawn, key, a, b)), (a, b)


def old_positions(streams, starts):
    """``Streams.positions`` before: one loop turn per stream (the slow reference)."""
    units, out = streams.units, []
    size = units.sizes[streams.unit]
    first = starts[units.shard[streams.unit]] + units.lo[streams.unit]
    for j in range(len(streams)):
        t = (int(streams.start[j]) + np.arange(int(streams.length[j]), dtype=np.int64)) % max(int(size[j]), 1)
        out.append(int(first[j]) + t)
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 9), st.integers(0, 20), st.integers(0, 30)), max_size=12))
def test_stream_positions_are_those_of_the_loop_over_streams(rows):
    units = Units.of([0, 1, 2, 3, 4], [0, 2, 0, 5, 1], [4, 2, 9, 6, 8])  # one of them empty
    streams = Streams(units, np.array([r[0] for r in rows], np.int64),
                      np.array([r[2] % max(int(units.sizes[r[0]]), 1) for r in rows], np.int64),
                      np.array([r[3] if units.sizes[r[0]] else 0 for r in rows], np.int64))  # fmt: skip
    starts = np.array([0, 100, 200, 300, 400], np.int64)
    want = old_positions(streams, starts)
    assert [p.tolist() for p in streams.positions(starts)] == [p.tolist() for p in want]
    assert streams.flat_positions(starts).tolist() == [x for p in want for x in p.tolist()]


mixes = st.lists(st.lists(st.integers(0, 6), min_size=1, max_size=4).filter(lambda s: sum(s) > 0), min_size=1, max_size=3)


@settings(max_examples=80, deadline=None)
@given(mixes, st.data(), st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.sampled_from(["random", "stratified"]),
       st.sampled_from([(True, 256), (True, 0), (False, 256)]), st.sampled_from(["pad", "drop"]), st.integers(0, 3))  # fmt: skip
def test_a_mix_drawn_many_times_its_size_is_planned_as_its_listed_stretches_and_every_draw_comes(
        streams, data, world, workers, per_worker, batching, shuffling, mode, epoch):  # fmt: skip
    """The plan over compact draws (laid window by window) is the plan over every stretch listed
    (the planner before); over the ranks every sample comes as many times as it was drawn."""
    sizes = [n for s in streams for n in s]
    bounds = np.concatenate([[0], np.cumsum([len(s) for s in streams])]).tolist()
    counts = [data.draw(st.integers(1, 60 * sum(s))) for s in streams]
    batch = workers * per_worker
    if mode == "drop" and sum(counts) < world * batch:
        mode = "pad"
    spec = PlanSpec(tuple(sizes), world_size=world, py_num_workers=workers, batch_size=batch, last_batch=mode, seed=3,
                    shuffle=shuffling[0], shuffle_block=shuffling[1], mixture=MixSpec(tuple(bounds), tuple(counts), batching))  # fmt: skip
    plan = spec.epoch(epoch)
    listed = spec.epoch(epoch, subset=plan.units)  # the same stretches, dealt from arrays over all of them
    got = Counter()
    for v in range(spec.num_virtual_workers):
        pos, ok = plan.worker_order(v)
        before = listed.worker_order(v)
        assert pos.tolist() == before[0].tolist() and ok.tolist() == before[1].tolist()
        assert plan.worker_reads(v) == listed.worker_reads(v)
        got.update(pos[ok].tolist())
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    drawn = Counter(x for i in range(len(streams)) for x in _draws(sizes, bounds, counts, i, epoch, starts, spec.shuffle))
    if mode == "pad":
        assert got == drawn, "each sample as many times as it was drawn"
    else:
        assert not got - drawn and sum(got.values()) == plan.planned


def _draws(sizes, bounds, counts, i, epoch, starts, shuffle):
    """Stream ``i``'s draws of ``epoch`` sample by sample, from the pass-by-pass planner."""
    a, b = bounds[i], bounds[i + 1]
    units = old_window(sizes[a:b], epoch * counts[i], (epoch + 1) * counts[i], (3, i), shuffle)
    return Units.of(units.shard + a, units.lo, units.hi).positions(starts).tolist()


@pytest.mark.parametrize("batching", ["random", "stratified"])
def test_a_workers_plan_of_a_stream_drawn_a_million_passes_costs_its_own_draws(batching):
    """choose=10M of a stream of 10 samples at 64 ranks x 8 workers (as the pipeline takes it): a
    worker's emissions (19,500 draws) in a few MiB, not arrays over the 2M stretches drawn (its time:
    benchmarks/scale.py, mix-choose-1e7)."""
    counts = stream_counts([Stream("a", choose=10_000_000), Stream("b", choose=1_000)], [10, 1000], None)
    mix = MixSpec((0, 2, 4), counts, batching)
    spec = PlanSpec((5, 5, 500, 500), world_size=64, py_num_workers=8, batch_size=256, seed=1, shuffle=True, mixture=mix)
    tracemalloc.start()
    pos, ok = spec.epoch(1).worker_order(300)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert int(ok.sum()) in (19_533, 19_534)
    assert peak < 40 * 2**20, peak / 2**20
