"""The streaming (resampled) mode: shards without sample counts, ``samples_per_epoch=``."""

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dali_shards.testing.pipelines import identity_pipeline, run_epochs
from dali_shards import ConfigError, pipeline_info
from dali_shards.pytorch import DALIShardedIterator
from dali_shards.sample_data import write_sample_shards
from dali_shards.plan.streaming import StreamingSpec, split_stream_index
from dali_shards.testing.servers import HTTPShardServer

SIZES = (11, 0, 17, 3, 16)


@settings(max_examples=200, deadline=None)
@given(
    shards=st.integers(1, 40),
    world=st.integers(1, 5),
    workers=st.integers(1, 4),
    mini=st.integers(1, 4),
    samples=st.integers(1, 500),
    seed=st.integers(0, 2**32),
    drop=st.booleans(),
)
def test_streaming_plan_properties(shards, world, workers, mini, samples, seed, drop):
    batch = workers * mini
    try:
        spec = StreamingSpec(shards, samples, world_size=world, py_num_workers=workers, batch_size=batch, seed=seed, shuffle=True, last_batch="drop" if drop else "pad")
    except ConfigError:
        assert drop and samples < world * batch
        return
    V = spec.num_virtual_workers
    per_epoch = spec.steps_per_epoch * world * batch
    assert (per_epoch >= samples) if not drop else (samples - world * batch < per_epoch <= samples)
    assert spec.quota * V == per_epoch, "every worker delivers an equal share"
    owners = Counter(s for v in range(V) for s in spec.owned_shards(v))
    if shards >= V:
        assert sorted(owners) == list(range(shards)) and set(owners.values()) == {1}, "each shard has one owner"
        counts = [len(spec.owned_shards(v)) for v in range(V)]
        assert max(counts) - min(counts) <= 1
    else:
        assert all(len(spec.owned_shards(v)) == 1 for v in range(V)) and len(owners) == shards
    for v in range(V):
        assert sorted(spec.cycle_order(v, 3)) == spec.owned_shards(v)
        assert spec.cycle_order(v, 3) == spec.cycle_order(v, 3), "deterministic"
    big = StreamingSpec(24, 100, seed=seed, shuffle=True)
    assert len({tuple(big.cycle_order(0, c)) for c in range(4)}) > 1, "cycles reshuffle"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    d = tmp_path_factory.mktemp("stream")
    write_sample_shards(str(d), shard_sizes=SIZES)  # no manifest: counts unknown
    with HTTPShardServer(str(d)) as server:
        yield server


def make(url, **kw):
    return identity_pipeline(url, ("__index__", "__valid__"), **kw)


def test_streaming_over_http_without_counts(served):
    url = f"{served.url}/sample-{{000000..000004}}.tar"
    factory = make(url, batch_size=4, py_num_workers=2, world_size=2, samples_per_epoch=30, shuffle=True, seed=5)
    seen_shards = Counter()
    for rank in range(2):
        pipe = factory(rank=rank)
        info = pipeline_info(pipe)
        spec = info.mode.spec
        epochs = run_epochs(pipe, 3)
        assert [len(e) for e in epochs] == [4, 4, 4], "ceil(30 / (2 ranks x 4)) steps, every epoch, every rank"
        for epoch in epochs:
            for index, valid in epoch:
                assert all(bool(v) for v in valid)
                for w in range(2):  # each worker's slice comes from its own shards only
                    own = set(spec.owned_shards(rank * 2 + w))
                    for i in index[w * 2 : w * 2 + 2]:
                        shard, pos = split_stream_index(int(i))
                        assert shard in own and 0 <= pos < SIZES[shard]
                        seen_shards[shard] += 1
    assert set(seen_shards) == {0, 2, 3, 4}, "every non-empty shard streamed"


def test_streaming_resume_keeps_the_step_count(served):
    url = f"{served.url}/sample-{{000000..000004}}.tar"
    factory = make(url, batch_size=2, py_num_workers=2, samples_per_epoch=20, shuffle=True)
    it = DALIShardedIterator(factory(), ["index", "valid"])
    for n, _ in enumerate(it):
        if n == 3:
            break
    state = it.state_dict()
    assert state["epoch"] == 0
    resumed = DALIShardedIterator(factory(resume_from=state), ["index", "valid"])
    assert sum(1 for _ in resumed) == 10 - 4
    assert sum(1 for _ in resumed) == 10, "the next epoch is whole"
    with pytest.raises(ValueError, match="streaming"):
        DALIShardedIterator(factory(), ["index", "valid"], audit=True)


def test_streaming_state_records_the_dataset_and_the_real_settings(served, tmp_path):
    url = f"{served.url}/sample-{{000000..000004}}.tar"
    factory = make(url, batch_size=2, py_num_workers=2, samples_per_epoch=20, shuffle=True, seed=3, shuffle_buffer=7)
    it = DALIShardedIterator(factory(), ["index", "valid"])
    for n, _ in enumerate(it):
        if n == 2:
            break
    state = it.state_dict()
    assert state["shuffle"] is True and state["seed"] == 3 and state["history"][0]["shuffle_buffer"] == 7
    assert state["dataset"]["shards"] == 5 and state["dataset"]["names"]
    # another world size resumes the same epoch with the rest of its samples
    wider = DALIShardedIterator(factory(resume_from=state, world_size=2, rank=0), ["index", "valid"])
    assert wider.epoch == 0 and len(wider) == -(-(20 - 3 * 2) // 4)
    # a state of another dataset is refused
    other = tmp_path / "other"
    other.mkdir()
    write_sample_shards(str(other), shard_sizes=(3, 3))
    elsewhere = make(str(other / "sample-{000000..000001}.tar"), batch_size=2, py_num_workers=2, samples_per_epoch=20,
                     shuffle=True, seed=3, shuffle_buffer=7)
    with pytest.raises(ConfigError, match="other shards"):
        elsewhere(resume_from=state)


def test_streaming_worker_with_only_empty_shards_fails_clearly(tmp_path):
    write_sample_shards(str(tmp_path), shard_sizes=(0, 4))
    factory = make(str(tmp_path / "sample-*.tar"), batch_size=2, py_num_workers=2, samples_per_epoch=8)
    with pytest.raises(Exception, match="read no usable sample"):
        list(DALIShardedIterator(factory(), ["index", "valid"]))


def test_remote_source_without_counts_needs_a_manifest_or_streaming(served):
    with pytest.raises(ConfigError, match="samples_per_epoch="):
        make(f"{served.url}/sample-{{000000..000004}}.tar", batch_size=2, py_num_workers=1)()


def test_streaming_on_the_merge_transfer_with_spawned_workers(tmp_path):
    """DALI pickles the merge transfer's sources for spawned workers after iterating them once in
    this process: the streaming mode's epoch (a generator) stays here (a raw TypeError before)."""
    paths = write_sample_shards(str(tmp_path), shard_sizes=SIZES)
    pipe = make(paths, batch_size=4, py_num_workers=2, samples_per_epoch=12, transfer="merge",
                py_start_method="spawn")()  # fmt: skip
    steps = [len(batch["index"]) for (batch,) in DALIShardedIterator(pipe, ["index", "valid"])]
    assert steps == [4, 4, 4]
