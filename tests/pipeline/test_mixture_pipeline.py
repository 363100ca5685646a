"""Weighted mixing in pipelines, on both transfers: each stream's exact count per epoch, every
draw delivered once (a sample drawn twice in an epoch comes twice, also from one worker, from
indexed, compressed and bucketed reading), stratified batches, resume (also elastic), and the
combinations refused."""

from collections import Counter

import numpy as np
import pytest

from dali_shards import Stream
from dali_shards.errors import ConfigError
from dali_shards.pytorch import DALIShardedIterator
from dali_shards.testing.pipelines import identity_pipeline
from dali_shards.testing.resume import check_resume
from dali_shards.testing.shards import npy

FIELDS = ("__index__", "__stream__", "__valid__")


def numbered(index, shard, position):
    return {"__key__": f"s{shard:03d}-{position:04d}", "ids": npy(np.array([index], np.int64))}


@pytest.fixture(scope="module")
def streams(make_shards):
    """Three datasets of 30, 12 and 7 samples in shards of uneven sizes (one empty)."""
    return (make_shards((8, 8, 0, 9, 5), numbered, prefix="big"), make_shards((4, 4, 4), numbered, prefix="small"),
            make_shards((3, 4), numbered, prefix="tiny"))  # fmt: skip


def run(pipe, epochs=2):
    """Per epoch: per step, the (index, stream) pairs of the valid slots of the batch (audited)."""
    it = DALIShardedIterator(pipe, ["index", "stream", "valid"], audit=True)
    out = []
    for _ in range(epochs):
        steps = []
        for (batch,) in it:
            ok = batch["valid"].reshape(-1).numpy().astype(bool)
            steps.append(list(zip(batch["index"].reshape(-1).numpy()[ok].tolist(), batch["stream"].reshape(-1).numpy()[ok].tolist())))
        out.append(steps)
    return out, it


def mixed(streams, **kw):
    mix = [Stream(streams[0], proportion=3), Stream(streams[1], repeat=2), Stream(streams[2], proportion=1)]
    options = dict(epoch_size=60, batch_size=4, py_num_workers=2, world_size=2, shuffle=True, seed=3)
    return identity_pipeline(mix, FIELDS, **{**options, **kw})


def by_rank(factory, world, epochs=2):
    """Per epoch, per step, the pairs of every rank's batch together (the global batch)."""
    runs = [run(factory(rank=r), epochs)[0] for r in range(world)]
    return [[sum((r[e][s] for r in runs), []) for s in range(len(runs[0][e]))] for e in range(epochs)]


@pytest.mark.parametrize("batching", ["random", "stratified"])
def test_each_stream_gives_its_count_and_each_draw_comes_once(streams, transfer, batching):
    factory = mixed(streams, transfer=transfer, batching=batching)
    counts = factory().dali_shards.mixture.counts
    assert counts == (27, 24, 9)  # 60 - 24 left, 3:1
    bounds = [0, 30, 42, 49]
    for epoch, steps in enumerate(by_rank(factory, 2)):
        pairs = [p for step in steps for p in step]
        got = Counter(s for _, s in pairs)
        assert [got[i] for i in range(3)] == list(counts), f"epoch {epoch}"
        for index, stream in pairs:
            assert bounds[stream] <= index < bounds[stream + 1], "__stream__ is the stream of __index__"
        drawn = Counter(i for i, _ in pairs)
        small = [drawn[i] for i in range(30, 42)]
        assert small == [2] * 12, "repeat=2: each sample of the stream twice"
        big = [drawn[i] for i in range(30)]
        assert max(big) == 1 and sum(big) == counts[0], "a proportion within the stream's size: no sample twice"
        if batching == "stratified":
            for step in steps[:-1]:
                per = Counter(s for _, s in step)
                for i, c in enumerate(counts):
                    share = len(step) * c / 60
                    assert abs(per[i] - share) <= 1, f"epoch {epoch}: stream {i} {per[i]} of a share {share:.2f}"


def test_spawned_workers_label_each_sample_with_its_stream(streams, transfer):
    """What a spawned worker receives (pickled) knows where each stream begins."""
    factory = mixed(streams, transfer=transfer, world_size=1, py_start_method="spawn")
    (steps,), it = run(factory(), epochs=1)
    bounds = [0, 30, 42, 49]
    pairs = [p for step in steps for p in step]
    assert Counter(s for _, s in pairs) == {0: 27, 1: 24, 2: 9}
    assert all(bounds[s] <= i < bounds[s + 1] for i, s in pairs), "__stream__ is the stream of __index__"
    assert it.audits[0]["per_stream"] == [27, 24, 9]


@pytest.mark.filterwarnings("ignore:.*does not use them")
@pytest.mark.parametrize("reading", ["indexed", "compressed", "bucketed"])
def test_a_sample_drawn_thrice_by_one_worker_comes_thrice(make_shards, tmp_path, reading, transfer):
    paths = make_shards((3, 2), numbered, prefix="thrice")
    if reading == "compressed":
        import gzip
        import shutil

        for p in paths:
            with open(p, "rb") as src, gzip.open(p + ".gz", "wb") as dst:
                shutil.copyfileobj(src, dst)
        paths = [p + ".gz" for p in paths]
    fields, kw = FIELDS, {}
    if reading == "bucketed":
        fields, kw = ("ids", "__index__", "__stream__"), dict(
            map=lambda s: {"index": s["__index__"], "stream": s["__stream__"], "valid": np.int32(1), "n": len(s["ids"])},
            bucket_by=lambda out: out["n"], bucket_window=8)  # fmt: skip
    factory = identity_pipeline([Stream(paths, repeat=3)], fields, batch_size=2, py_num_workers=1, shuffle=True,
                                transfer=transfer, outputs="index stream valid n" if kw else None, returns="index stream valid", **kw)  # fmt: skip
    epochs, it = run(factory())
    for steps in epochs:
        assert Counter(i for step in steps for i, _ in step) == {i: 3 for i in range(5)}
    assert all(a["exactly_once"] and a["per_stream"] == [15] for a in it.audits), it.audits


def test_a_mix_resumes_where_it_stopped(streams, transfer):
    factory = mixed(streams, transfer=transfer, batch_size=4)
    stops = (0, 1, "mid", "end", "next") if transfer == "ring" else ("mid", "next")  # (the plan is the same)
    checked = check_resume(factory, ["index", "stream", "valid"], world=2, stops=stops)
    assert checked["steps_per_epoch"] >= 5


def test_a_stratified_mix_resumes_on_another_world(streams):
    """Saved by 2 ranks mid-epoch, resumed by 3: the rest of the epoch's draws, each once."""
    two = mixed(streams, batching="stratified")
    iters = [DALIShardedIterator(two(rank=r), ["index", "stream", "valid"]) for r in range(2)]
    first = Counter()
    for it in iters:
        for _ in range(3):
            (batch,) = next(it)
            ok = batch["valid"].reshape(-1).numpy().astype(bool)
            first.update(batch["index"].reshape(-1).numpy()[ok].tolist())
    state = iters[0].state_dict()
    three = mixed(streams, batching="stratified", world_size=3, resume_from=state)
    whole = Counter(i for steps in by_rank(mixed(streams, batching="stratified"), 2, epochs=1) for step in steps for i, _ in step)
    rest = Counter(i for step in by_rank(three, 3, epochs=1)[0] for i, _ in step)
    assert first + rest == whole


@pytest.mark.parametrize("block", [0, 256])
def test_an_elastic_resume_of_draws_beyond_a_stream_s_size_delivers_each_draw(streams, transfer, block):
    """Streams drawn two to three times their size, read in contiguous runs (``shuffle_block=0``,
    chunks that hold a sample twice) or interleaved; saved by 2 ranks after a step, resumed by 3:
    the rest of the epoch's draws, each once, and every resumed rank's audit agrees."""
    mix = [Stream(streams[0], choose=20), Stream(streams[1], repeat=2.5), Stream(streams[2], choose=20)]
    options = dict(batch_size=4, py_num_workers=2, shuffle=True, seed=3, shuffle_block=block, shuffle_buffer=6)
    two = identity_pipeline(mix, FIELDS, world_size=2, transfer=transfer, **options)
    whole = Counter(i for steps in by_rank(two, 2, epochs=1) for step in steps for i, _ in step)
    assert sum(whole.values()) == 70 and max(whole.values()) == 3
    first = Counter()
    iters = [DALIShardedIterator(two(rank=r), ["index", "stream", "valid"]) for r in range(2)]
    for it in iters:
        (batch,) = next(it)
        ok = batch["valid"].reshape(-1).numpy().astype(bool)
        first.update(batch["index"].reshape(-1).numpy()[ok].tolist())
    three = identity_pipeline(mix, FIELDS, world_size=3, transfer=transfer, resume_from=iters[0].state_dict(), **options)
    runs = [run(three(rank=r), epochs=1) for r in range(3)]
    rest = Counter(i for steps, _ in runs for step in steps[0] for i, _ in step)
    assert first + rest == whole, "every draw of the epoch once"
    for _, it in runs:
        assert it.audits[0]["exactly_once"] and it.audits[0]["plan_missing"] == 0, it.audits[0]


def test_what_a_mix_cannot_go_with_is_refused(streams, make_shards):
    with pytest.raises(ConfigError, match="samples_per_epoch"):
        mixed(streams, samples_per_epoch=20)()
    with pytest.raises(ConfigError, match="stratified.*bucket|bucket.*stratified"):
        mixed(streams, batching="stratified", map=lambda s: s, bucket_by=len)()
    photos = make_shards((4, 4), prefix="photos")
    with pytest.raises(ConfigError, match=r"stream 1 .*without field\(s\) \['ids'\]"):
        identity_pipeline([Stream(streams[0]), Stream(photos)], ("ids",) + FIELDS, batch_size=2, py_num_workers=1)()
    with pytest.raises(ConfigError, match="stream 0 and stream 1"):
        identity_pipeline([Stream(streams[1]), Stream(streams[1][:1])], FIELDS, batch_size=2, py_num_workers=1)()
    with pytest.raises(ConfigError, match=r"stream 1 \(.*\) holds no samples"):
        identity_pipeline([Stream(streams[0]), Stream(make_shards((0,), prefix="none"))], FIELDS, batch_size=2, py_num_workers=1)()


def test_a_state_of_a_mix_does_not_resume_another(streams):
    it = DALIShardedIterator(mixed(streams, world_size=1)(), ["index", "stream", "valid"])
    next(it)
    state = it.state_dict()
    with pytest.raises(ConfigError, match="mix"):
        mixed(streams, world_size=1, epoch_size=61)(resume_from=state)
    with pytest.raises(ConfigError, match="mix"):
        one = [p for s in streams for p in s]  # the same shards, as one dataset
        identity_pipeline(one, ("__index__", "__valid__"), batch_size=4, py_num_workers=2, shuffle=True, seed=3)(resume_from=state)


@pytest.mark.parametrize("batching", ["random", "stratified"])
def test_drop_leaves_out_the_last_partial_batch_of_draws_as_the_plan_and_the_audit_say(streams, batching):
    """last_batch="drop" with a mix: the draws of the last partial global batch are left out, so a
    stream delivers up to its share of them fewer than its count; `dali-shards plan` and the audit
    give each stream's deliveries alike (docs/mixing.md)."""
    from dali_shards.tools.plan_report import plan_report

    pipe = mixed(streams, batching=batching, last_batch="drop", epoch_size=63, world_size=1)()
    info = pipe.dali_shards
    assert sum(info.mixture.counts) == 63 and info.spec.planned_samples == 60 and info.spec.dropped_per_epoch == 3
    epochs, it = run(pipe)
    for epoch, (steps, audit) in enumerate(zip(epochs, it.audits)):
        got = Counter(s for step in steps for _, s in step)
        delivered = [got[i] for i in range(3)]
        assert audit["exactly_once"] and audit["per_stream"] == audit["expected_per_stream"] == delivered
        planned = [s["delivered"] for s in plan_report(info.spec, info.shards, epoch, streams)["streams"]]
        assert planned == delivered and sum(delivered) == 60, f"epoch {epoch}"
        assert all(c - 3 <= d <= c for c, d in zip(info.mixture.counts, delivered))
