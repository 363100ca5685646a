"""Resume states: the dataset identity (names, order, counts, sizes) and the shape of every field."""

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dali_shards.errors import ConfigError
from dali_shards.plan.epoch import PlanSpec
from dali_shards.plan.resume import make_state, resume_point
from dali_shards.plan.statecheck import DatasetId, relative_names

URLS = [f"/data/train/shard-{i:03d}.tar" for i in range(10)]
COUNTS = [200] * 10  # equal sizes, as `dali-shards write` makes them


def state_after(dataset, steps=100, **kw):
    spec = PlanSpec(tuple(dataset.counts), world_size=2, py_num_workers=2, batch_size=4, seed=1, shuffle=True, **kw)
    return spec, make_state(spec, 0, [], spec.epoch(0), steps, dataset)


def test_the_same_shards_in_reverse_order_are_refused():
    ds = DatasetId.of(URLS, COUNTS)
    spec, state = state_after(ds)
    with pytest.raises(ConfigError, match="the same shards in another order"):
        resume_point(spec, state, DatasetId.of(URLS[::-1], COUNTS[::-1]))


def test_other_shards_of_the_same_sizes_are_refused():
    spec, state = state_after(DatasetId.of(URLS, COUNTS))
    other = [u.replace("train", "val") for u in URLS[:5]] + [u.replace("shard", "part") for u in URLS[5:]]
    with pytest.raises(ConfigError, match="other shards"):
        resume_point(spec, state, DatasetId.of(other, COUNTS))


def test_changed_byte_sizes_are_refused_where_both_are_known():
    spec, state = state_after(DatasetId.of(URLS, COUNTS, [1000] * 10))
    with pytest.raises(ConfigError, match="other byte sizes"):
        resume_point(spec, state, DatasetId.of(URLS, COUNTS, [1000] * 9 + [1001]))
    resume_point(spec, state, DatasetId.of(URLS, COUNTS))  # sizes unknown now: names and counts decide


def test_a_dataset_copied_elsewhere_resumes_and_so_does_another_layout():
    spec, state = state_after(DatasetId.of(URLS, COUNTS))
    moved = [u.replace("/data/train/", "s3://bucket/copies/imagenet/") for u in URLS]
    epoch, plan, _ = resume_point(spec, json.loads(json.dumps(state)), DatasetId.of(moved, COUNTS))
    assert epoch == 0 and plan.start_step == 100
    other_layout = PlanSpec(tuple(COUNTS), world_size=3, py_num_workers=1, batch_size=5, seed=1, shuffle=True)
    epoch, plan, prior = resume_point(other_layout, state, DatasetId.of(moved, COUNTS))
    assert epoch == 0 and plan.available == sum(COUNTS) - 100 * 2 * 4 and prior


def test_relative_names_drop_the_shared_directory_only():
    assert relative_names(["/a/b/x.tar", "/a/b/y.tar"]) == ("x.tar", "y.tar")
    assert relative_names(["/a/b/x.tar", "/a/c/y.tar"]) == ("b/x.tar", "c/y.tar")
    assert relative_names(["/a/b/shard-1.tar", "/a/b/shard-2.tar"]) == ("shard-1.tar", "shard-2.tar")
    assert relative_names(["s3://k/x.tar"]) == ("x.tar",)


def test_states_without_names_are_accepted_with_a_warning(caplog):
    ds = DatasetId.of(URLS, COUNTS)
    spec, state = state_after(ds)
    old = {**state, "dataset": {k: state["dataset"][k] for k in ("shards", "samples", "fingerprint")}}
    resume_point(spec, old, ds)
    assert "order not checked" in caplog.text


@pytest.mark.parametrize(
    "path, value, words",
    [
        (("history", 0, "steps"), -50, "steps must be an integer >= 0"),
        (("epoch",), 2.7, "epoch must be an integer in 0..2147483646"),
        (("epoch",), -3, "epoch must be an integer in 0..2147483646"),
        (("epoch",), 2**63, "epoch must be an integer in 0..2147483646"),
        (("seed",), None, "seed must be an integer"),
        (("shuffle",), "yes", "shuffle must be true or false"),
        (("history", 0, "last_batch"), "all", "last_batch must be 'pad' or 'drop'"),
        (("history", 0, "num_workers"), 0, "num_workers must be an integer in 1..4096"),
        (("dataset",), [], "dataset must be an object"),
        (("history",), {}, "history must be a list"),
    ],
)
def test_bad_fields_are_config_errors_naming_them(path, value, words):
    spec, state = state_after(DatasetId.of(URLS, COUNTS))
    target = state
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(ConfigError, match=words.replace("(", r"\(")):
        resume_point(spec, state, DatasetId.of(URLS, COUNTS))


def _mutations(state):
    """Every (path, container) of a state, to delete or retype."""
    stack = [((), state)]
    while stack:
        path, obj = stack.pop()
        items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
        for key, value in items:
            yield path + (key,), obj
            stack.append((path + (key,), value))


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 10**6))
def test_fuzzed_states_give_config_errors_only(seed):
    rng = random.Random(seed)
    ds = DatasetId.of(URLS, COUNTS)
    spec, state = state_after(ds)
    state = json.loads(json.dumps(state))
    for _ in range(rng.randint(1, 3)):
        places = list(_mutations(state))
        path, container = rng.choice(places)
        key = path[-1]
        if rng.random() < 0.4 and isinstance(container, dict):
            del container[key]
        else:
            container[key] = rng.choice([None, "x", -1, 2.5, [], {}, True, 10**30])
    try:
        resume_point(spec, state, ds)
    except ConfigError:
        pass


@pytest.mark.parametrize(
    "change, words",
    [
        ({"steps": 300}, "history.0. says 300 steps .* has 250"),  # 100 steps of an 8-step epoch in the issue
        ({"steps": 250}, "history.0. says 250 steps"),  # the layout's whole epoch: a run saves the next epoch instead
        ({"world_size": 1000}, ".* world_size=1000, .* has 1:"),  # the plan of that world has 1 step, not 100
        ({"world_size": 10**9}, r"history.0..world_size must be an integer in 1..1048576"),
        ({"num_workers": 10**6, "batch_size": 10**6}, r"history.0..num_workers must be an integer in 1..4096"),
        ({"last_batch": "drop", "batch_size": 400}, "history.0. says 100 steps .* has 2"),
    ],
)
def test_impossible_layouts_are_refused_not_skipped_to_the_next_epoch(change, words):
    """A state no run could have saved used to resume at the next epoch, silently dropping the rest of the saved one."""
    ds = DatasetId.of(URLS, COUNTS)
    spec, state = state_after(ds)
    state["history"][0].update(change)
    with pytest.raises(ConfigError, match="malformed state: " + words):
        resume_point(spec, state, ds)


@pytest.mark.parametrize("key, value", [("samples", 5), ("shards", 3)])
def test_dataset_totals_must_agree_with_what_the_state_fingerprints(key, value):
    ds = DatasetId.of(URLS, COUNTS)
    spec, state = state_after(ds)
    state["dataset"][key] = value
    with pytest.raises(ConfigError, match=f"malformed state: dataset.{key} is {value}"):
        resume_point(spec, state, ds)


def test_changed_counts_name_the_shards_that_changed():
    """Samples moved between shards: the totals agree, so the message names the shards instead."""
    spec, state = state_after(DatasetId.of(URLS, COUNTS))
    moved = COUNTS[:3] + [150, 250] + COUNTS[5:]
    with pytest.raises(ConfigError) as refused:
        resume_point(spec, state, DatasetId.of(URLS, moved))
    text = str(refused.value)
    assert "the same 2000 samples in 10 shards" in text
    assert "changed: shard-003.tar (now 150 samples), shard-004.tar (now 250 samples)" in text
    assert "shard-002" not in text and "shard-005" not in text


def test_changed_counts_in_a_large_dataset_name_a_run_of_shards_and_the_state_stays_small():
    urls = [f"s3://b/part-{i:06d}.tar" for i in range(100_000)]
    counts = [1000] * 100_000
    spec, state = state_after(DatasetId.of(urls, counts))
    assert len(json.dumps(state)) < 1500
    counts[77_777] += 1
    with pytest.raises(ConfigError, match=r"changed: one of part-075000.tar .. part-078124.tar"):
        resume_point(spec, state, DatasetId.of(urls, counts))
