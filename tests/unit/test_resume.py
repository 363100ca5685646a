"""Resumable state, without DALI: exact continuation, elastic re-planning, refusals."""

import dataclasses
import hashlib
import json
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dali_shards.errors import ConfigError
from dali_shards.plan.epoch import PLAN_VERSION, PlanSpec
from dali_shards.plan.resume import make_state, resume_point

SIZES = (13, 0, 40, 7, 1, 22)  # few shards: contiguous runs
MANY = (13, 0, 40, 7, 1, 22, 9, 5, 11, 3, 8, 6)  # enough shards to interleave
size_sets = st.sampled_from([SIZES, MANY])


def spec_of(world=2, workers=2, batch=4, mode="pad", sizes=SIZES, seed=5, shuffle=True, buffer=8):
    return PlanSpec(sizes, world_size=world, py_num_workers=workers, batch_size=batch, seed=seed, shuffle=shuffle, last_batch=mode, shuffle_buffer=buffer)


def delivered(plan, steps=None, start=None):
    """Valid indices each rank gets, per step, from ``start`` (default the plan's start) to ``steps``."""
    start = plan.start_step if start is None else start
    out = []
    for rank in range(plan.spec.world_size):
        index, valid = plan.rank_batches(rank)
        rows = range(start, plan.steps if steps is None else steps)
        out.append([index[s][valid[s]].tolist() for s in rows])
    return out


def flat(per_rank):
    return [i for rank in per_rank for step in rank for i in step]


layouts = st.tuples(st.integers(1, 4), st.integers(1, 3), st.integers(1, 3)).map(
    lambda t: dict(world=t[0], workers=t[1], batch=t[1] * t[2])
)


@settings(max_examples=150, deadline=None)
@given(layouts, st.sampled_from(["pad", "drop"]), st.integers(0, 3), size_sets, st.data())
def test_resume_with_the_same_layout_continues_exactly(layout, mode, epoch, sizes, data):
    spec = spec_of(mode=mode, sizes=sizes, **layout)
    plan = spec.epoch(epoch)
    step = data.draw(st.integers(0, plan.steps))
    state = json.loads(json.dumps(make_state(spec, epoch, [], plan, step)))
    start_epoch, resumed, prior = resume_point(spec, state)
    if step == plan.steps:
        assert (start_epoch, resumed) == (epoch + 1, None)
        return
    if step == 0:
        assert (start_epoch, resumed) == (epoch, None)
        return
    assert start_epoch == epoch and resumed.start_step == step and prior == []
    assert delivered(resumed) == delivered(plan, start=step), "the same order as an uninterrupted run"


@settings(max_examples=150, deadline=None)
@given(layouts, layouts, st.sampled_from(["pad", "drop"]), size_sets, st.data())
def test_elastic_resume_delivers_the_rest_exactly_once(before, after, mode, sizes, data):
    old = spec_of(mode=mode, sizes=sizes, **before)
    if mode == "drop" and old.steps_per_epoch == 0:
        return
    plan = old.epoch(1)
    step = data.draw(st.integers(1, max(1, plan.steps - 1)))
    if step >= plan.steps:
        return
    state = make_state(old, 1, [], plan, step)
    new = spec_of(mode=mode, sizes=sizes, **after)
    start_epoch, resumed, prior = resume_point(new, state)
    seen = flat(delivered(plan, steps=step))
    if resumed is None:  # drop: too few left for a whole global batch of the new layout
        assert mode == "drop" and start_epoch == 2
        rest = []
    else:
        assert start_epoch == 1 and len(prior) == (0 if before == after else 1)
        rest = flat(delivered(resumed))
        # every new rank takes the same number of steps
        assert len({len(r) for r in delivered(resumed)}) == 1
    counts = Counter(seen + rest)
    assert max(counts.values()) == 1, "nothing twice"
    if mode == "pad":
        assert sorted(counts) == list(range(sum(sizes))), "everything once"


def test_chained_elastic_resumes_in_one_epoch():
    a, b, c = spec_of(2, 2, 4), spec_of(3, 1, 3), spec_of(1, 3, 6)
    plan_a = a.epoch(0)
    seen = flat(delivered(plan_a, steps=3))
    state = make_state(a, 0, [], plan_a, 3)
    _, plan_b, prior = resume_point(b, state)
    seen += flat(delivered(plan_b, steps=2))
    state = make_state(b, 0, prior, plan_b, 2)
    assert len(state["history"]) == 2
    _, plan_c, prior = resume_point(c, state)
    seen += flat(delivered(plan_c))
    assert sorted(seen) == list(range(sum(SIZES)))
    # and the state at the end of the epoch is the start of the next one
    assert make_state(c, 0, prior, plan_c, plan_c.steps)["epoch"] == 1


def test_resuming_the_same_layout_after_an_elastic_resume_continues_it():
    a, b = spec_of(2, 2, 4), spec_of(3, 1, 3)
    state = make_state(a, 0, [], a.epoch(0), 2)
    _, plan_b, prior = resume_point(b, state)
    state2 = make_state(b, 0, prior, plan_b, 1)
    _, again, prior2 = resume_point(b, state2)
    assert again.start_step == 1 and prior2 == prior
    assert delivered(again) == delivered(plan_b, start=1)


def test_states_saved_before_bucketing_existed_resume_the_same():
    a, b = spec_of(2, 2, 4), spec_of(3, 1, 3)
    state = make_state(a, 0, [], a.epoch(0), 2)
    old = {**state, "history": [{k: v for k, v in e.items() if k != "bucket_window"} for e in state["history"]]}
    for spec in (a, b):
        (_, plan, _), (_, from_old, _) = resume_point(spec, state), resume_point(spec, old)
        assert delivered(from_old) == delivered(plan)


def test_states_are_small_and_json():
    spec = PlanSpec((1000,) * 1281, world_size=64, py_num_workers=8, batch_size=256, shuffle=True, seed=3)
    state = make_state(spec, 7, [], spec.epoch(7), 50)
    text = json.dumps(state)
    assert len(text) < 600
    assert state["history"][0]["steps"] == 50 and state["epoch"] == 7


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(sizes=(13, 0, 40, 7, 1, 23)), "sample counts differ"),
        (dict(seed=6), "seed"),
        (dict(shuffle=False), "shuffle"),
    ],
)
def test_incompatible_states_are_refused(change, message):
    spec = spec_of()
    state = make_state(spec, 0, [], spec.epoch(0), 2)
    with pytest.raises(ConfigError, match=message):
        resume_point(spec_of(**change), state)


def test_malformed_states_are_refused():
    spec = spec_of()
    with pytest.raises(ConfigError, match="not a dali_shards state"):
        resume_point(spec, {"epoch": 1})
    state = make_state(spec, 0, [], spec.epoch(0), 2)
    with pytest.raises(ConfigError, match="plan version"):
        resume_point(spec, {**state, "plan_version": 99})
    with pytest.raises(ConfigError, match="malformed"):
        resume_point(spec, {**state, "history": [{"steps": 1}]})


def test_resumed_plans_read_only_what_they_need():
    spec = spec_of(1, 1, 2, sizes=(10,), shuffle=False)
    plan = spec.epoch(0)
    _, resumed, _ = resume_point(spec, make_state(spec, 0, [], plan, 3))
    emissions = resumed.worker_emissions(0)
    assert [p for p, _ in emissions] == list(range(6, 10))
    assert np.array_equal(resumed.rank_batches(0)[0][3:], plan.rank_batches(0)[0][3:])


def test_the_size_sets_cover_both_planners():
    assert not spec_of(sizes=SIZES).epoch(0).interleaving and spec_of(sizes=MANY).epoch(0).interleaving


# a mid-epoch state saved by dali_shards 53e03ae (plan version 3: rank pieces cut at the same places
# every epoch), and the sha256 prefix of what that release planned for the whole epoch
V3_STATE = {
    "format": "dali-shards-state", "plan_version": 3,
    "dataset": {"shards": 12, "samples": 125, "fingerprint": "929851476c1473d5", "names": "c1be9ff192aedb21",
                "name_set": "6f71a6a38cfed5da", "bytes": None},
    "seed": 5, "shuffle": True, "epoch": 2,
    "history": [{"world_size": 2, "num_workers": 2, "batch_size": 4, "last_batch": "pad", "shuffle_buffer": 8,
                 "shuffle_block": 256, "bucket_window": 0, "steps": 5}],
}  # fmt: skip
V3_EPOCH_DIGEST = "d9b9857e871e6329"


def _digest(plan):
    h = hashlib.sha256()
    for r in range(plan.spec.world_size):
        index, valid = plan.rank_batches(r)
        h.update(index.tobytes())
        h.update(valid.tobytes())
    return h.hexdigest()[:16]


def test_a_state_saved_under_plan_version_3_resumes_exactly():
    """The epoch in progress goes on as version 3 planned it; the epochs after it follow this
    release's plan; a state saved again in that epoch keeps its version."""
    spec = spec_of(sizes=MANY)
    start_epoch, resumed, prior = resume_point(spec, V3_STATE)
    assert (start_epoch, resumed.start_step, resumed.version, prior) == (2, 5, 3, [])
    assert _digest(dataclasses.replace(resumed, start_step=0)) == V3_EPOCH_DIGEST
    assert resumed.interleaving and delivered(resumed) != delivered(spec.epoch(2), start=5)
    again = make_state(spec, 2, prior, resumed, 7)
    assert again["plan_version"] == 3 and resume_point(spec, again)[1].version == 3
    done = make_state(spec, 2, prior, resumed, resumed.steps)
    assert (done["epoch"], done["plan_version"], done["history"]) == (3, PLAN_VERSION, [])


def test_a_version_3_state_resumes_elastically_exactly_once():
    spec3 = spec_of(sizes=MANY)
    plan3 = dataclasses.replace(resume_point(spec3, V3_STATE)[1], start_step=0)
    seen = flat(delivered(plan3, steps=5))
    new = spec_of(world=3, workers=1, batch=3, sizes=MANY)
    _, resumed, prior = resume_point(new, V3_STATE)
    assert resumed.version == 3 and len(prior) == 1
    assert sorted(seen + flat(delivered(resumed))) == list(range(sum(MANY)))


def test_a_state_saved_under_plan_version_5_resumes_its_contiguous_runs_exactly():
    """Plan v6 turns contiguous runs every epoch; an epoch saved under v5 goes on as v5 planned it."""
    spec = spec_of(2, 2, 4)
    old = spec.epoch(2, version=5)
    assert not old.interleaving
    state = json.loads(json.dumps(make_state(spec, 2, [], old, 3)))
    assert state["plan_version"] == 5
    _, resumed, _ = resume_point(spec, state)
    assert resumed.version == 5 and delivered(resumed) == delivered(old, start=3)
    _, elastic, _ = resume_point(spec_of(3, 1, 3), state)
    assert sorted(flat(delivered(old, steps=3)) + flat(delivered(elastic))) == list(range(sum(SIZES)))
