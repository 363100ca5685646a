"""The pure resolve step: options + world -> shards, layout, spec, resume point, one WorkerConfig
per worker; no DALI needed (the unit tier checks that nothing imports it)."""

import pickle

import pytest

from dali_shards.plan.mode import Planned, Streaming
from dali_shards.errors import ConfigError
from dali_shards.options import ShardedOptions
from dali_shards.setup.resolve import resolve


@pytest.fixture(scope="module")
def shards(make_shards):
    return make_shards((9, 0, 14, 1, 6))


def options(paths, **kw):
    base = dict(source=paths, fields=("jpg", "cls"), batch_size=6, py_num_workers=3, world_size=2, rank=1, seed=4)
    return ShardedOptions.from_keywords(**{**base, **kw})


def test_one_picklable_worker_config_per_local_worker(shards):
    resolved = resolve(options(shards, shuffle=True, shuffle_buffer=5, on_error="skip"))
    assert [w.worker for w in resolved.workers] == [0, 1, 2]
    assert [w.virtual_worker for w in resolved.workers] == [3, 4, 5]
    for config in resolved.workers:
        again = pickle.loads(pickle.dumps(config))
        assert again.urls == tuple(shards) and again.spec == resolved.spec and again.on_error == "skip"
        assert again.packing.table and again.shuffle_buffer == 5
    assert resolved.spec.shard_sizes == (9, 0, 14, 1, 6) and resolved.spec.py_num_workers == 3
    assert resolved.sample_bytes > 0 and isinstance(resolved.mode, Planned)


def test_a_resume_state_becomes_the_workers_first_plan(shards):
    first = resolve(options(shards, shuffle=True))
    plan = first.spec.epoch(2)
    state = make_info_state(first, plan, 1)
    resumed = resolve(options(shards, shuffle=True, resume_from=state))
    assert resumed.start_epoch == 2 and resumed.resume_plan.start_step == 1 and resumed.steps_before == 1
    assert all(w.mode.resume_plan == resumed.resume_plan and w.start_epoch == 2 for w in resumed.workers)
    with pytest.raises(ConfigError, match="another order"):
        resolve(options(list(reversed(shards)), shuffle=True, resume_from=state))


def make_info_state(resolved, plan, steps):
    from dali_shards.plan.resume import make_state

    return make_state(resolved.spec, plan.epoch, [], plan, steps, resolved.dataset)


def test_the_streaming_mode_gives_streaming_specs_to_the_workers(shards):
    resolved = resolve(options(shards, samples_per_epoch=40, shuffle=True, shuffle_buffer=8))
    assert isinstance(resolved.mode, Streaming) and all(w.mode is resolved.mode for w in resolved.workers)
    assert resolved.spec.steps_per_epoch == resolved.mode.spec.steps_per_epoch
    assert resolved.spec.shuffle and resolved.spec.shuffle_buffer == 8


def test_a_field_no_sample_read_holds_is_refused_naming_the_nearest_extension(shards):
    with pytest.raises(ConfigError, match=r"field 'jpeg' is in no sample read: none of the first 9 samples of shard "
                       r"'[^']*sample-000000\.tar' has a member for it \(they have: cls, jpg\): did you mean 'jpg'\?"):
        resolve(options(shards, fields=("jpeg", "cls")))
    with pytest.raises(ConfigError, match=r"field 'seg;mask' is in no sample read.*\(they have: cls, jpg\)\. Request"):
        resolve(options(shards, fields=("jpg", "seg;mask")))
    resolve(options(shards, fields=("jpeg;jpg", "cls")))  # an alternative the samples hold


def test_a_field_only_some_samples_lack_is_left_to_the_workers(make_shards, tmp_path):
    """The first sample lacks it, a later one of its shard has it, or the shards' member statistics
    show it elsewhere: not refused (the workers raise or skip, as on_error says)."""
    def sample(index, shard, position):
        return {"__key__": f"k{index:03d}", "bin": b"x", **({"txt": b"t"} if index in (3, 12) else {})}

    paths = make_shards((6, 8), sample, folder=tmp_path)
    resolve(options(paths, fields=("bin", "txt"), batch_size=3, py_num_workers=1, on_error="skip"))
    lone = make_shards((6, 8), lambda i, s, p: {**sample(i, s, p), "txt": b"t"} if i == 12 else
                       {"__key__": f"k{i:03d}", "bin": b"x"}, folder=tmp_path / "later", prefix="later")  # fmt: skip
    resolve(options(lone, fields=("bin", "txt"), batch_size=3, py_num_workers=1))  # shard 1 holds it (its scan says)
