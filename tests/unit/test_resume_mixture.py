"""Resuming a mix whose streams are drawn more than once an epoch: every draw is delivered exactly
once across the stop, whatever the layouts, planners (interleaved, contiguous runs), and bucketing
windows; and the audit counts draws. Without DALI."""

from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dali_shards.plan import multiset
from dali_shards.plan.audit import expected_indices, summarize
from dali_shards.plan.epoch import PlanSpec
from dali_shards.plan.mixture import MixSpec
from dali_shards.plan.resume import make_state, resume_point


def lengths(plan, positions):
    """Made-up sample lengths (what ``bucket_by`` would give), fixed per sample."""
    return (np.asarray(positions, dtype=np.int64) * 7919) % 13


def spec_of(sizes, bounds, counts, layout, block, window, batching="random"):
    world, workers, per = layout
    return PlanSpec(sizes, world_size=world, py_num_workers=workers, batch_size=workers * per, seed=4, shuffle=True,
                    shuffle_buffer=5, shuffle_block=block, bucket_window=window,
                    mixture=MixSpec(bounds, counts, batching))  # fmt: skip


layouts = st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3))
mixes = st.lists(st.lists(st.integers(0, 9), min_size=1, max_size=5).filter(sum), min_size=1, max_size=4)


@settings(max_examples=200, deadline=None)
@given(mixes, layouts, layouts, st.sampled_from([0, 256]), st.sampled_from([0, 4]), st.data())
def test_every_draw_of_a_mix_comes_once_across_a_resume(streams, before, after, block, window, data):
    sizes = tuple(n for stream in streams for n in stream)
    bounds = tuple(np.cumsum([0] + [len(s) for s in streams]).tolist())
    # up to three times each stream's size: samples drawn two and three times an epoch
    counts = tuple(data.draw(st.integers(1, 3 * sum(s))) for s in streams)
    batching = data.draw(st.sampled_from(["random", "stratified"])) if not window else "random"
    old = spec_of(sizes, bounds, counts, before, block, window, batching)
    plan = old.epoch(1)
    draws = plan.units.positions(plan.canonical_starts)
    assert len(draws) == sum(counts)
    if plan.steps < 2:
        return
    step = data.draw(st.integers(1, plan.steps - 1))
    seen = plan.consumed(step, lengths)
    new = spec_of(sizes, bounds, counts, after, block, window, batching)
    epoch, resumed, _ = resume_point(new, make_state(old, 1, [], plan, step), lengths=lengths)
    assert epoch == 1 and resumed is not None
    rest = resumed.consumed(resumed.steps, lengths)
    if resumed.start_step:  # the same layout: the rest of the same plan
        rest = multiset.difference(rest, resumed.consumed(resumed.start_step, lengths))
    assert Counter(seen.tolist() + rest.tolist()) == Counter(draws.tolist()), "every draw once"
    expected = expected_indices(resumed, lengths)
    assert Counter(expected.tolist()) == Counter(rest.tolist()), "the audit expects each draw left"
    ranks = Counter(i for r in range(new.world_size) for i in expected_indices(resumed, lengths, r).tolist())
    assert ranks == Counter(rest.tolist()), "each rank's audit expects its own draws left"
    if not window:  # without bucketing, a rank's batches as the pipeline delivers them: what its audit expects
        for r in range(new.world_size):
            index, valid = resumed.rank_batches(r)
            start = resumed.start_step
            got = index[start:][valid[start:]]
            report = summarize(1, [(got, np.empty(0, np.int64), resumed.steps - start)], expected_indices(resumed, rank=r))
            assert report["exactly_once"], report


def test_the_issues_case_resumed_on_three_ranks_loses_no_draw():
    """4 streams, epoch_size 85 (two drawn more than their size), 2 ranks x 2 workers x batch 4,
    contiguous runs (each worker's chunk holds a sample twice), stopped after 1 step and resumed on
    3 ranks (51a19c1 delivered 83 of the 85)."""
    sizes, bounds, counts = (3, 2, 4, 5), (0, 1, 2, 3, 4), (30, 25, 20, 10)
    old = spec_of(sizes, bounds, counts, (2, 2, 2), 0, 0)
    plan = old.epoch(0)
    seen = plan.consumed(1)
    _, resumed, _ = resume_point(spec_of(sizes, bounds, counts, (3, 2, 2), 0, 0), make_state(old, 0, [], plan, 1))
    rest = resumed.consumed(resumed.steps)
    got = Counter(seen.tolist() + rest.tolist())
    assert sum(got.values()) == 85 and got == Counter(plan.units.positions(plan.canonical_starts).tolist())


def test_the_audit_counts_draws_and_catches_a_lost_or_doubled_draw():
    sizes, bounds, counts = (3, 4), (0, 1, 2), (9, 4)  # stream 0 drawn three times over
    plan = spec_of(sizes, bounds, counts, (1, 2, 2), 256, 0).epoch(0)
    expected = expected_indices(plan)
    assert sorted(Counter(expected.tolist()).values())[-1] == 3
    none = np.empty(0, np.int64)
    whole = summarize(0, [(expected, none, plan.steps)], expected)
    assert whole["exactly_once"] and whole["expected"] == 13
    lost = summarize(0, [(expected[1:], none, plan.steps)], expected)
    assert not lost["exactly_once"] and lost["missing"] == 1, "one draw of a thrice-drawn sample lost"
    doubled = summarize(0, [(np.append(expected, expected[0]), none, plan.steps)], expected)
    assert not doubled["exactly_once"] and doubled["duplicates"] == 1


def test_the_audit_catches_a_re_planning_that_loses_draws(monkeypatch):
    """The resumed plan is checked against the draws the state had left, found without re-planning:
    a re-planning that loses a stretch fails the check, though each rank gets all its plan holds."""
    from dali_shards.plan.audit import check_plan
    from dali_shards.plan.epoch import EpochPlan
    from dali_shards.plan.resume import draws_left
    from dali_shards.plan.units import Units

    sizes, bounds, counts = (3, 2, 4, 5), (0, 1, 2, 3, 4), (30, 25, 20, 10)
    old = spec_of(sizes, bounds, counts, (2, 2, 2), 0, 0)
    new = spec_of(sizes, bounds, counts, (3, 2, 2), 0, 0)
    state = make_state(old, 0, [], old.epoch(0), 1)
    _, good, _ = resume_point(new, state)
    assert check_plan(good, draws_left(new, state)) == {"plan_missing": 0, "plan_duplicates": 0, "plan_examples": []}
    real = EpochPlan.remaining

    def losing(self, steps, lengths=None):
        left = real(self, steps, lengths)
        return Units.of(left.shard[1:], left.lo[1:], left.hi[1:])

    monkeypatch.setattr(EpochPlan, "remaining", losing)
    _, bad, _ = resume_point(new, state)
    check = check_plan(bad, draws_left(new, state))
    assert check["plan_missing"] > 0 and check["plan_duplicates"] == 0
    for rank in range(3):  # each rank alone gets what its share of the plan holds...
        share = expected_indices(bad, rank=rank)
        alone = summarize(0, [(share, np.empty(0, np.int64), bad.steps)], share)
        assert alone["exactly_once"]
        # ...and the check says the plan itself lost draws
        assert not summarize(0, [(share, np.empty(0, np.int64), bad.steps)], share, plan_check=check)["exactly_once"]
