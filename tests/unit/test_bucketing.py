"""Length bucketing: windows of similar lengths in a rank-shared order, and the plan knowing what
the workers delivered at every step, so that exactly-once, equal steps and resume still hold."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dali_shards.plan.mode import Planned
from dali_shards.errors import ConfigError
from dali_shards.plan.bucket import window_order, window_steps
from dali_shards.plan.epoch import EpochPlan, PlanSpec
from dali_shards.worker.config import WorkerConfig
from dali_shards.ipc.packing import Packing
from dali_shards.transfer.merge.layout import table_place
from dali_shards.worker.codec import SampleCodec
from dali_shards.transfer.merge.source import MergeSource
from dali_shards.worker.stage import SampleStage
from dali_shards.worker.usercode import Portable


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 40), max_size=80), st.integers(1, 7), st.integers(0, 99), st.integers(0, 5))
def test_a_window_is_cut_into_mini_batches_of_neighbouring_lengths(lengths, m, seed, window):
    order = window_order(lengths, m, seed, 3, 1, window)
    assert sorted(order.tolist()) == list(range(len(lengths))), "a permutation of the window"
    ranks = np.empty(len(lengths), dtype=int)
    ranks[np.argsort(np.asarray(lengths, dtype=np.int64), kind="stable")] = np.arange(len(lengths))
    whole = len(lengths) // m
    chunks = [sorted(ranks[order[i * m : (i + 1) * m]].tolist()) for i in range(whole)]
    assert all(c == list(range(c[0], c[0] + m)) for c in chunks), "each mini-batch: consecutive in length order"
    assert sorted(c[0] for c in chunks) == [i * m for i in range(whole)]
    assert sorted(ranks[order[whole * m :]].tolist()) == list(range(whole * m, len(lengths))), "the rest last"
    assert (window_order(lengths, m, seed, 3, 1, window) == order).all(), "deterministic"


def test_the_workers_of_a_rank_share_the_batch_order():
    lengths = np.arange(64)
    a, b = window_order(lengths, 4, 1, 0, 2, 7), window_order(lengths[::-1].copy(), 4, 1, 0, 2, 7)
    assert (lengths[a] // 4).tolist() == (lengths[::-1][b] // 4).tolist(), "same length rank at the same step"
    orders = {tuple(window_order(lengths, 4, 1, e, 0, 0)) for e in range(4)}
    assert len(orders) > 1, "a new order every epoch"


LENGTH = {}  # index -> length of the test data


@pytest.fixture(scope="module")
def shards(make_shards):
    rng = np.random.default_rng(0)
    sizes = (9, 0, 14, 5, 11, 3, 8, 10, 7, 6, 12, 4)

    def text(index, shard, position):
        LENGTH[index] = int(rng.integers(1, 60))
        return {"__key__": f"{index:05d}", "txt": b"x" * LENGTH[index]}

    return make_shards(sizes, text, name="t-{shard:03d}.tar"), sizes


def lengths_of(plan, positions):
    return np.array([LENGTH[int(i)] for i in plan.canonical_index(positions)])


def emitted(spec, paths, v, resume_plan=None):
    """Per step, the (index, valid) of the samples worker ``v`` emits (epoch 0)."""
    packing = Packing(("txt", "__index__"), table=spec.py_num_workers > 1, payload="txt" if spec.py_num_workers > 1 else None)
    stage = SampleStage(SampleCodec(packing.requested), packing, bucket_by=Portable(lambda s: len(s["txt"]), "bucket_by"))
    rank, worker = divmod(v, spec.py_num_workers)
    config = WorkerConfig(mode=Planned(spec, resume_plan), urls=tuple(paths), byte_sizes=(), packing=packing, stage=stage,
                          rank=rank, worker=worker)  # fmt: skip
    m, steps = spec.mini_batch, []
    for batch in iter(MergeSource(config)):
        if packing.table:
            table = batch[table_place(worker, spec.py_num_workers, m)]
            rows = table[: m * packing.header_bytes].view(np.int64).reshape(m, -1)
        else:
            rows = [batch[worker * m + i][: packing.header_bytes].view(np.int64) for i in range(m)]
        steps.append([(int(r[0]), bool(r[1] == 1)) for r in rows])
    return steps


@settings(max_examples=12, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.sampled_from([1, 4, 8, 30]),
       st.sampled_from([0, 256]), st.sampled_from(["pad", "drop"]))  # fmt: skip
def test_workers_deliver_each_sample_once_and_the_plan_knows_which_at_every_step(
    shards, world, workers, per_worker, window, block, mode
):
    paths, sizes = shards
    spec = PlanSpec(sizes, world_size=world, py_num_workers=workers, batch_size=workers * per_worker, seed=4,
                    shuffle=True, shuffle_block=block, bucket_window=window, last_batch=mode)  # fmt: skip
    plan = spec.epoch(0)
    per_worker_steps = [emitted(spec, paths, v) for v in range(spec.num_virtual_workers)]
    assert all(len(s) == spec.steps_per_epoch for s in per_worker_steps), "equal steps"
    delivered = [i for s in per_worker_steps for step in s for i, ok in step if ok]
    assert len(delivered) == len(set(delivered)) == spec.planned_samples, "each sample once"
    for steps in range(spec.steps_per_epoch + 1):  # a state could be saved after any step
        by_then = {i for s in per_worker_steps for step in s[:steps] for i, ok in step if ok}
        assert set(plan.canonical_index(plan.consumed(steps, lengths_of)).tolist()) == by_then


def test_a_worker_resumed_inside_a_window_goes_on_where_it_stopped(shards):
    paths, sizes = shards
    spec = PlanSpec(sizes, py_num_workers=2, batch_size=4, seed=2, shuffle=True, bucket_window=16)
    assert window_steps(spec.bucket_window, spec.mini_batch) == 8
    whole = emitted(spec, paths, 1)
    for start in (3, 8, 11):
        resumed = emitted(spec, paths, 1, resume_plan=EpochPlan(spec, 0, start_step=start))
        assert resumed == whole[start:]


def test_another_layout_needs_the_lengths_of_the_window_it_stopped_in():
    spec = PlanSpec((30, 30), py_num_workers=2, batch_size=4, seed=2, shuffle=True, bucket_window=16)
    with pytest.raises(ConfigError, match="middle of a bucketing window"):
        spec.epoch(0).consumed(3)
    assert len(spec.epoch(0).consumed(8)) == 32, "at a window's end no lengths are needed"
