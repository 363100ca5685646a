"""The epoch planner (version 5): exactly-once, equal steps, balance, locality, determinism,
reshuffling (the older versions, kept to finish saved epochs: test_resume.py, test_interleave.py)."""

import dataclasses
from collections import Counter
from itertools import product

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dali_shards.errors import ConfigError, EmptyDatasetError
from dali_shards.plan.epoch import PlanSpec, plan_epoch
from dali_shards.plan.random import buffer_shuffle_order, permutation, shard_permutation
from dali_shards.plan.runs import chunk_order

shard_lists = st.lists(st.integers(0, 40), min_size=1, max_size=12).filter(lambda s: sum(s) > 0)


@st.composite
def configs(draw, last_batch=None):
    sizes = draw(shard_lists)
    world = draw(st.integers(1, 5))
    workers = draw(st.integers(1, 4))
    batch = workers * draw(st.integers(1, 4))
    mode = last_batch or draw(st.sampled_from(["pad", "drop"]))
    if mode == "drop" and sum(sizes) < world * batch:
        mode = "pad"
    return PlanSpec(
        tuple(sizes),
        world_size=world,
        py_num_workers=workers,
        batch_size=batch,
        seed=draw(st.integers(-(2**63), 2**63)),
        shuffle=draw(st.booleans()),
        last_batch=mode,
        shuffle_buffer=draw(st.integers(1, 64)),
        shuffle_block=draw(st.sampled_from([0, 1, 2, 3, 256])),
    )


def all_batches(spec, epoch):
    plan = spec.epoch(epoch)
    return [plan.rank_batches(r) for r in range(spec.world_size)]


def check_epoch(spec, epoch):
    """Every invariant of one epoch's plan."""
    plan = spec.epoch(epoch)
    total = spec.num_samples
    batches = all_batches(spec, epoch)
    # equal steps on every rank, full-size batches
    for index, valid in batches:
        assert index.shape == valid.shape == (spec.steps_per_epoch, spec.batch_size)
    index = np.concatenate([i.ravel() for i, _ in batches])
    valid = np.concatenate([v.ravel() for _, v in batches])
    assert ((0 <= index) & (index < total)).all(), "padding must hold real samples"
    seen = Counter(index[valid].tolist())
    assert all(c == 1 for c in seen.values()), "a sample delivered twice"
    if spec.last_batch == "pad":
        assert len(seen) == total, "a sample lost"
        assert spec.steps_per_epoch == -(-total // spec.global_batch)
        assert (~valid).sum() == spec.padding_per_epoch < spec.global_batch
    else:
        assert valid.all()
        assert len(seen) == spec.steps_per_epoch * spec.global_batch
        assert spec.steps_per_epoch == total // spec.global_batch
        assert spec.dropped_per_epoch < spec.global_batch
    # the mask the iterator uses is the plan's
    for r, (_, v) in enumerate(batches):
        for s in range(spec.steps_per_epoch):
            assert (plan.valid_mask(r, s) == v[s]).all()
    # balanced shares; padding only at the tail of a worker's slots
    counts = [plan.worker_valid_count(v) for v in range(spec.num_virtual_workers)]
    assert max(counts) - min(counts) <= 1
    for v in range(spec.num_virtual_workers):
        pos, ok = plan.worker_order(v)
        assert ok.tolist() == [True] * counts[v] + [False] * (len(ok) - counts[v])
    check_reads(spec, plan, counts)
    return batches


def check_reads(spec, plan, counts):
    """Each worker emits exactly the samples of the stretches it reads (each read in order, the
    stretches of two workers disjoint); a contiguous run shares at most the shards at its ends with
    other workers, and an interleaving worker reads at most two stretches of a shard per piece."""
    owner = {}
    starts = plan.canonical_starts
    for v in range(spec.num_virtual_workers):
        pos, ok = plan.worker_order(v)
        pieces = plan.worker_pieces(v) if counts[v] else []
        read = plan.worker_read_order(v).tolist()
        assert sorted(read) == sorted(pos[ok].tolist()), "what is read is what is emitted"
        mine = set()
        for p in pieces:
            assert 0 <= p.first < p.stop <= spec.shard_sizes[p.shard] and p.position == starts[p.shard] + p.first
            span = set(range(p.position, p.position + p.stop - p.first))
            assert not span & set(owner), "stretches of two workers overlap"
            owner.update(dict.fromkeys(span, v))
            mine |= span
            in_piece = [x for x in read if x in span]
            assert in_piece == sorted(in_piece), "a stretch is read in order"
        assert set(pos[ok].tolist()) == mine
        if not plan.interleaving and len(pieces) > 2:
            for p in pieces[1:-1]:
                whole = (p.first, p.stop) == (0, spec.shard_sizes[p.shard])
                assert whole or plan.subset is not None, "interior shard of a run read in part"


@settings(max_examples=300, deadline=None)
@given(configs())
def test_every_epoch_is_exactly_once_with_equal_steps(spec):
    for epoch in (0, 1):
        check_epoch(spec, epoch)


@settings(max_examples=100, deadline=None)
@given(configs(), st.integers(0, 10**6))
def test_plan_is_deterministic(spec, epoch):
    a, b = all_batches(spec, epoch), all_batches(dataclasses.replace(spec), epoch)
    for (ia, va), (ib, vb) in zip(a, b):
        assert (ia == ib).all() and (va == vb).all()


@settings(max_examples=100, deadline=None)
@given(configs(), st.data())
def test_epochs_differ_when_shuffling(spec, data):
    spec = dataclasses.replace(spec, shuffle=True, shuffle_buffer=64)
    # randomness is only possible if some worker holds at least 4 samples
    if max(spec.epoch(0).worker_valid_count(v) for v in range(spec.num_virtual_workers)) < 4:
        return
    orders = {tuple(np.concatenate([i.ravel() for i, _ in all_batches(spec, e)])) for e in range(4)}
    assert len(orders) > 1


@pytest.mark.parametrize("block", [0, 4])
def test_each_rank_reads_another_set_of_shards_every_epoch(block):
    """Shuffle before shard at the rank level: the shards (and parts of shards) a rank reads are
    drawn anew every epoch, with and without interleaving."""
    spec = PlanSpec((5,) * 40, world_size=4, py_num_workers=2, batch_size=2, seed=9, shuffle=True, shuffle_block=block)
    for rank in range(spec.world_size):
        sets = set()
        for e in range(4):
            plan = spec.epoch(e)
            assert plan.interleaving == bool(block)
            reads = [(seg.shard, seg.first, seg.stop) for v in spec.rank_workers(rank) for seg in plan.worker_reads(v)]
            sets.add(tuple(sorted(reads)))
        assert len(sets) == 4


def test_contiguous_runs_read_the_shards_in_the_epochs_order():
    spec = PlanSpec((5,) * 20, world_size=2, py_num_workers=2, batch_size=2, seed=9, shuffle=True, shuffle_block=0)
    orders = []
    for e in range(3):
        plan = spec.epoch(e)
        reads = [seg.shard for v in range(spec.num_virtual_workers) for seg in plan.worker_reads(v)]
        order = list(dict.fromkeys(reads))
        assert sorted(order) == list(range(20)) and len(reads) <= 20 + spec.num_virtual_workers
        orders.append(order)
    assert len({tuple(o) for o in orders}) == 3
    plan = PlanSpec((5,) * 20, shuffle=False).epoch(3)
    assert [seg.shard for seg in plan.worker_reads(0)] == list(range(20))


def test_unshuffled_plan_is_canonical_order():
    spec = PlanSpec((3, 0, 4, 2), world_size=1, py_num_workers=1, batch_size=3)
    index, valid = spec.epoch(5).rank_batches(0)
    assert index.ravel().tolist() == list(range(9)) and valid.all()


def test_exhaustive_small_configurations():
    """Every world x workers x batch combination on a few awkward datasets (MosaicML-style)."""
    datasets = [(1,), (7,), (0, 5, 0), (1, 1, 1), (13, 2, 0, 9), (50,), (3,) * 10]
    for sizes, world, workers, per_worker, mode, shuffle in product(
        datasets, range(1, 5), range(1, 5), (1, 2, 3), ("pad", "drop"), (False, True)
    ):
        if mode == "drop" and sum(sizes) < world * workers * per_worker:
            continue
        spec = PlanSpec(sizes, world_size=world, py_num_workers=workers, batch_size=workers * per_worker, seed=11, shuffle=shuffle, last_batch=mode, shuffle_buffer=4)
        check_epoch(spec, 3)


def test_more_workers_than_samples_pads_with_real_samples():
    spec = PlanSpec((2, 0, 1), world_size=3, py_num_workers=2, batch_size=2)
    assert spec.steps_per_epoch == 1
    batches = check_epoch(spec, 0)
    valid = sum(int(v.sum()) for _, v in batches)
    assert valid == 3 and spec.padding_per_epoch == 3
    plan = spec.epoch(0)
    for v in range(spec.num_virtual_workers):
        assert plan.worker_reads(v), "a worker with no samples still reads one to pad with"


def test_shard_order_changes_with_epoch_and_seed_only():
    a = shard_permutation(50, seed=1, epoch=0)
    assert sorted(a.tolist()) == list(range(50))
    assert (a == shard_permutation(50, seed=1, epoch=0)).all()
    assert (a != shard_permutation(50, seed=1, epoch=1)).any()
    assert (a != shard_permutation(50, seed=2, epoch=0)).any()


def test_plan_is_stable_across_releases():
    """Golden values: a change here breaks reproducibility and resumption of saved runs, and must
    come with a new PLAN_VERSION."""
    assert shard_permutation(8, seed=42, epoch=3).tolist() == GOLDEN_SHARDS
    assert list(buffer_shuffle_order(10, 4, seed=42, epoch=3, worker=1)) == GOLDEN_BUFFER
    assert permutation(8, 1, 2, 3).tolist() == GOLDEN_PERMUTATION
    assert chunk_order(10, 4, 42, 3, 1).tolist() == GOLDEN_CHUNKS
    spec = PlanSpec((7, 3, 9, 0, 5, 6, 4, 8, 2, 6), world_size=2, py_num_workers=2, batch_size=4, seed=42, shuffle=True, shuffle_block=2)
    assert spec.epoch(3).rank_batches(1)[0].ravel().tolist() == GOLDEN_RANK_1


GOLDEN_SHARDS = [5, 2, 6, 3, 4, 7, 1, 0]
GOLDEN_BUFFER = [3, 1, 2, 4, 7, 0, 5, 8, 6, 9]
GOLDEN_PERMUTATION = [1, 3, 7, 5, 2, 0, 4, 6]
GOLDEN_CHUNKS = [3, 0, 1, 2, 4, 6, 7, 5, 8, 9]
GOLDEN_RANK_1 = [0, 31, 10, 27, 24, 1, 12, 11, 3, 2, 13, 28, 25, 32, 14, 15, 4, 5, 29, 16, 26, 33, 17, 18, 6, 6, 18, 18]


@given(st.integers(0, 300), st.integers(1, 64), st.integers(0, 2**32), st.integers(0, 9))
@settings(max_examples=200, deadline=None)
def test_buffer_shuffle_is_a_bounded_permutation(n, size, seed, worker):
    order = list(buffer_shuffle_order(n, size, seed, 0, worker))
    assert sorted(order) == list(range(n))
    for emitted, x in enumerate(order):
        assert x < emitted + size, "emitted before it could have been read"


@pytest.mark.parametrize(
    "kwargs, error",
    [
        (dict(shard_sizes=(5,), batch_size=3, py_num_workers=2), ConfigError),
        (dict(shard_sizes=(0, 0), batch_size=2), EmptyDatasetError),
        (dict(shard_sizes=(3,), batch_size=2, world_size=2, last_batch="drop"), EmptyDatasetError),
        (dict(shard_sizes=(3,), last_batch="fill"), ConfigError),
        (dict(shard_sizes=(3,), world_size=0), ConfigError),
        (dict(shard_sizes=(-1, 4)), ConfigError),
    ],
)
def test_bad_configurations_are_refused(kwargs, error):
    with pytest.raises(error):
        PlanSpec(**kwargs)


def test_batch_multiple_error_says_what_to_do():
    with pytest.raises(ConfigError, match="multiple of py_num_workers"):
        plan_epoch([10], epoch=0, batch_size=10, py_num_workers=4)


def test_contiguous_runs_change_every_epoch_however_few_the_shards():
    """One shard, two ranks, shuffling (contiguous runs: too few shards to interleave): each rank
    gets another part of the shard every epoch (plan v6), each epoch every sample once."""
    spec = PlanSpec((300,), world_size=2, py_num_workers=1, batch_size=5, seed=1, shuffle=True)
    sets = []
    for epoch in range(4):
        plan = spec.epoch(epoch)
        assert not plan.interleaving
        ranks = [plan.rank_batches(r) for r in range(2)]
        got = [index[valid].tolist() for index, valid in ranks]
        assert sorted(got[0] + got[1]) == list(range(300))
        sets.append(frozenset(got[0]))
    assert len(set(sets)) == 4, "rank 0's samples differ every epoch"
    v5 = [frozenset(spec.epoch(e, version=5).rank_batches(0)[0].ravel().tolist()) for e in range(3)]
    assert len(set(v5)) == 1, "plan v5 (states saved under it) keeps its runs"


def test_contiguous_runs_are_stable_across_releases():
    spec = PlanSpec((7, 3, 9), world_size=2, py_num_workers=2, batch_size=4, seed=42, shuffle=True, shuffle_buffer=3)
    assert spec.epoch(3).rank_batches(1)[0].ravel().tolist() == GOLDEN_RUNS_RANK_1


GOLDEN_RUNS_RANK_1 = [9, 0, 3, 4, 8, 2, 5, 6, 1, 1, 10, 10]
