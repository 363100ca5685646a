"""Stratified batches of a mix, as planned: every batch holds each stream's share (floor or
ceiling), every stream its exact total, every draw once over the ranks and workers; the rest of a
stopped epoch, planned again on another world, completes it."""

from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dali_shards.plan.epoch import PlanSpec
from dali_shards.plan.mixture import MixSpec
from dali_shards.plan.shares import Strata


def share_bounds(slots, totals):
    planned = int(np.sum(totals))
    exact = np.asarray(slots)[:, None] * np.asarray(totals)[None, :]
    return exact // planned, -(-exact // planned)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 400), min_size=1, max_size=8).filter(lambda t: sum(t) > 0), st.integers(1, 9),
       st.integers(1, 6), st.integers(0, 2**32), st.booleans())  # fmt: skip
def test_every_batch_holds_each_streams_share_and_every_total_is_exact(totals, workers, mini_batch, seed, shuffle):
    strata = Strata(totals, workers, mini_batch, seed, 3, shuffle)
    q = strata.quotas
    assert q.sum(axis=0).tolist() == list(totals)
    assert (q[: strata.full].sum(axis=1) == workers * mini_batch).all()
    lo, hi = share_bounds(strata.sizes, totals)
    assert ((q >= lo) & (q <= hi)).all(), "floor or ceiling of the batch's share"
    per_worker = np.stack([strata.worker_counts(v) for v in range(workers)])  # (workers, steps, streams)
    assert (per_worker.sum(axis=0) == q).all(), "the workers' slots are the batch's"
    valid = per_worker.sum(axis=2)
    for v in range(workers):
        a, b = v * sum(totals) // workers, (v + 1) * sum(totals) // workers
        assert valid[v].sum() == b - a and (valid[v][: strata.full] == mini_batch).all()
        assert (strata.counts_before(v) == per_worker[:v].sum(axis=(0, 1))).all()


def test_a_workers_part_of_a_batch_holds_about_its_share():
    """Two streams 3:1 over 8 workers of 8 slots: each worker's 8 slots hold about 6 and 2."""
    strata = Strata([3000, 1000], 8, 8, 5, 0, True)
    counts = np.stack([strata.worker_counts(v) for v in range(8)])
    assert np.abs(counts[:, :strata.full, 0] - 6).max() <= 1, "the full batches"


def plan_for(sizes, bounds, counts, **kw):
    spec = PlanSpec(tuple(sizes), mixture=MixSpec(tuple(bounds), tuple(counts), "stratified"), **kw)
    return spec


mixes = st.lists(st.lists(st.integers(0, 9), min_size=1, max_size=5).filter(lambda s: sum(s) > 0), min_size=1, max_size=4)


@settings(max_examples=120, deadline=None)
@given(mixes, st.data(), st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.sampled_from(["pad", "drop"]), st.integers(0, 5))
def test_a_stratified_epoch_delivers_every_draw_once_in_stratified_batches(streams, data, world, workers, per_worker, mode, epoch):
    sizes = [n for s in streams for n in s]
    bounds = np.concatenate([[0], np.cumsum([len(s) for s in streams])]).tolist()
    counts = [data.draw(st.integers(1, 3 * sum(s))) for s in streams]
    batch = workers * per_worker
    if mode == "drop" and sum(counts) < world * batch:
        mode = "pad"
    spec = plan_for(sizes, bounds, counts, world_size=world, py_num_workers=workers, batch_size=batch, last_batch=mode,
                    shuffle=True, seed=11)  # fmt: skip
    plan = spec.epoch(epoch)
    draws = Counter(plan.units.positions(plan.canonical_starts).tolist())
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    stream_of = lambda x: int(np.searchsorted(starts[np.asarray(bounds)], x, side="right") - 1)  # noqa: E731
    got, steps = Counter(), []
    batches = [plan.rank_batches(r) for r in range(world)]
    for s in range(plan.steps):
        step = [int(i) for index, valid in batches for i, ok in zip(index[s], valid[s]) if ok]
        got.update(step)
        steps.append(Counter(stream_of(i) for i in step))
    if mode == "pad":
        assert got == draws, "every draw once"
    else:
        assert not got - draws and sum(got.values()) == plan.planned
    totals = plan.strata.totals
    lo, hi = share_bounds([sum(c.values()) for c in steps], totals)
    for s, c in enumerate(steps):
        assert all(lo[s, i] <= c[i] <= hi[s, i] for i in range(len(streams))), (s, c, totals)


@settings(max_examples=60, deadline=None)
@given(mixes, st.data(), st.integers(1, 3), st.integers(1, 3), st.integers(1, 3))
def test_the_rest_of_a_stopped_epoch_planned_on_another_world_completes_it(streams, data, world, workers, again):
    sizes = [n for s in streams for n in s]
    bounds = np.concatenate([[0], np.cumsum([len(s) for s in streams])]).tolist()
    counts = [data.draw(st.integers(1, 2 * sum(s))) for s in streams]
    spec = plan_for(sizes, bounds, counts, world_size=world, py_num_workers=workers, batch_size=workers * 2, shuffle=True, seed=4)
    plan = spec.epoch(2)
    stop = data.draw(st.integers(0, plan.steps))
    done = Counter(plan.consumed(stop).tolist())
    rest = plan.remaining(stop)
    other = plan_for(sizes, bounds, counts, world_size=again, py_num_workers=2, batch_size=2, shuffle=True, seed=4)
    resumed = other.epoch(2, subset=rest)
    later = Counter()
    for r in range(again):
        index, valid = resumed.rank_batches(r)
        later.update(index[valid].tolist())
    assert done + later == Counter(plan.units.positions(plan.canonical_starts).tolist())


def test_class_sorted_streams_are_mixed_in_every_batch():
    """Two streams of 40 shards of 50 samples, each shard one class: a global batch of 128 draws
    its samples from nearly as many shards as it holds samples, in both batchings."""
    sizes = (50,) * 80
    for batching in ("random", "stratified"):
        spec = PlanSpec(sizes, world_size=4, py_num_workers=2, batch_size=32, shuffle=True, seed=9,
                        mixture=MixSpec((0, 40, 80), (1500, 500), batching))  # fmt: skip
        plan = spec.epoch(1)
        batches = [plan.rank_batches(r)[0] for r in range(4)]
        for s in range(plan.steps - 1):
            step = np.concatenate([b[s] for b in batches])
            shards = step // 50
            assert len(set(shards.tolist())) >= 0.7 * min(len(step), 80), (batching, s, len(set(shards.tolist())))
            if batching == "stratified":
                assert abs(int((shards < 40).sum()) - 96) <= 1
