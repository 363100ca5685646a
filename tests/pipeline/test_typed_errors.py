"""Faults that used to end in a raw error from deep inside (a hostile trial, issue 22): each now a
typed error naming the shard, the sample or the option, or a counted skip."""

import json
import sys

import numpy as np
import pytest

from dali_shards import ConfigError, ShardFormatError, ShardMapError
from dali_shards.catalog.scan import scan_shards
from dali_shards.catalog.manifest import write_manifest
from dali_shards.pytorch import DALIShardedIterator
from dali_shards.testing.pipelines import identity_pipeline

SHARDS, PER_SHARD = 8, 6  # enough shards to interleave


@pytest.fixture
def shards(make_shards, tmp_path):
    def text(index, shard, position):
        return {"__key__": f"k{index:03d}", "txt": b"x" * (position + 1)}

    return make_shards((PER_SHARD,) * SHARDS, text, name="t-{shard}.tar", folder=tmp_path)


def make(source, outputs="i", **kw):
    """A pipeline factory whose function's parameters (the map's outputs) are ``outputs``."""
    options = {"batch_size": 4, "py_num_workers": 2, **kw}
    return identity_pipeline(source, ("__index__", "txt"), outputs=outputs, **options)


def indices(it):
    return [i for (b,) in it for i in b["i"].reshape(-1).tolist()]


def index_map(s):
    return {"i": s["__index__"]}


def huge_length(s):
    return 1 << 70 if s["i"] == 4 else 1


def exits(kind):
    def mapper(s):
        if s["__key__"] == "k010":
            if kind == "exit":
                sys.exit(3)
            raise {"interrupt": KeyboardInterrupt, "generator": GeneratorExit}[kind]()
        return {"i": s["__index__"]}

    return mapper


def test_bucket_by_beyond_int64_names_the_sample_or_is_skipped(shards):
    def pipe(**kw):
        return make(shards, map=index_map, bucket_by=huge_length, bucket_window=8, **kw)()

    with pytest.raises(ShardMapError, match="k004.*bucket_by.*does not fit in int64"):
        indices(DALIShardedIterator(pipe(), ["i"]))
    it = DALIShardedIterator(pipe(on_error="skip"), ["i"], audit=True)
    assert sorted(indices(it)) == [i for i in range(SHARDS * PER_SHARD) if i != 4]
    assert it.audits[0]["skipped"] == [4]


@pytest.mark.parametrize("kind", ["exit", "interrupt", "generator"])
def test_sys_exit_and_interrupts_in_a_map_are_the_samples_errors(shards, kind):
    pipe = make(shards, map=exits(kind))
    with pytest.raises(ShardMapError, match=r"sample 'k010'.*map .*raised (SystemExit|KeyboardInterrupt|GeneratorExit)"):
        indices(DALIShardedIterator(pipe(), ["i"]))


def _manifest_with_blocks(shards, tmp_path, blocks_of_last):
    infos = scan_shards(shards)
    path = str(tmp_path / "manifest.json")
    write_manifest(path, infos, version=2)  # the offsets inline, to edit
    doc = json.load(open(path))
    entry = doc["shards"][1]
    blocks = entry["sample_blocks"].split()
    entry["sample_blocks"] = " ".join(blocks[:-1] + [blocks_of_last])
    entry.pop("bytes")  # nothing to check the claim against until the shard is read
    json.dump(doc, open(path, "w"))
    return path


def test_sample_blocks_that_overflow_int64_are_a_manifest_error(shards, tmp_path):
    path = _manifest_with_blocks(shards, tmp_path, str(2**62))
    with pytest.raises(ConfigError, match="entry 1: \"sample_blocks\" must be"):
        make(path, shuffle=True, map=index_map)()


def test_a_sample_claiming_more_blocks_than_its_shard_holds_is_its_error(shards, tmp_path):
    """A last sample that claims 10**9 blocks (500 GB) is not allocated: the shard's size says no."""
    path = _manifest_with_blocks(shards, tmp_path, str(10**9))
    last = 2 * PER_SHARD - 1  # the last sample of shard 1
    pipe = make(path, map=index_map, shuffle=True)
    assert pipe().dali_shards.plan(0).interleaving  # each sample read at its span
    with pytest.raises(ShardFormatError, match=r"t-1\.tar.*span, bytes \d+-\d+, lies beyond the end of the file"):
        indices(DALIShardedIterator(pipe(), ["i"]))
    it = DALIShardedIterator(pipe(on_error="skip"), ["i"], audit=True)
    assert sorted(indices(it)) == [i for i in range(SHARDS * PER_SHARD) if i != last]
    assert it.audits[0]["skipped"] == [last]


def test_a_second_iterator_on_one_pipeline_is_refused(shards):
    pipe = make(shards, map=index_map)()
    DALIShardedIterator(pipe, ["i"])
    with pytest.raises(ConfigError, match="already feeds a DALIShardedIterator"):
        DALIShardedIterator(pipe, ["i"])


def unsigned(s):
    i = s["__index__"]
    return {"a": np.array([i, 65535], np.uint16), "b": np.full(2, 4_000_000_000 + i, np.uint32),
            "c": np.array([i], np.uint64)}  # fmt: skip


def too_big(s):
    return {"c": np.array([2**64 - 1 - s["__index__"]], np.uint64)}


def test_unsigned_outputs_reach_torch_in_a_type_that_holds_them(shards):
    it = DALIShardedIterator(make(shards, "a b c", map=unsigned)(), ["a", "b", "c"])
    rows = {}
    for (b,) in it:
        assert (b["a"].dtype, b["b"].dtype, b["c"].dtype) == (torch_types())
        for a, bb, c in zip(b["a"].tolist(), b["b"].tolist(), b["c"].tolist()):
            rows[c[0]] = (a, bb)
    assert rows == {i: ([i, 65535], [4_000_000_000 + i] * 2) for i in range(SHARDS * PER_SHARD)}
    with pytest.raises(ConfigError, match="output 'c' is uint64 and holds values beyond int64"):
        indices(DALIShardedIterator(make(shards, "c", map=too_big)(), ["c"]))


def torch_types():
    import torch

    return torch.int32, torch.int64, torch.int64


def _fails_at_k010(s):
    if s["__key__"] == "k010":
        raise ValueError("bad sample")
    return {"i": s["__index__"]}


@pytest.mark.parametrize("consumer", ["pipe.run", "DALIGenericIterator", "DALIShardedIterator"])
def test_a_workers_error_is_typed_whoever_runs_the_pipeline(shards, transfer, consumer):
    """The merge transfer used to raise DALI's plain Exception carrying our text from ``pipe.run()``
    and DALI's own iterator; both transfers now raise the ShardMapError the worker raised."""
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    pipe = make(shards, map=_fails_at_k010, transfer=transfer)()
    with pytest.raises(ShardMapError, match="k010") as raised:
        if consumer == "pipe.run":
            pipe.build()
            for _ in range(100):
                pipe.run()
        else:
            iterator = DALIGenericIterator if consumer == "DALIGenericIterator" else DALIShardedIterator
            for _ in iterator(pipe, ["i"]):
                pass
    assert type(raised.value) is ShardMapError


@pytest.mark.parametrize("depth", [{"cpu_size": 2, "gpu_size": 2}, 0, "2"])
def test_a_queue_depth_dalis_pool_cannot_take_is_refused_on_merge(shards, depth):
    """A dict prefetch_queue_depth used to fail in DALI's pool with a raw TypeError."""
    with pytest.raises(ConfigError, match="prefetch_queue_depth=.*transfer='merge'"):
        make(shards, map=index_map, transfer="merge", prefetch_queue_depth=depth)()


def test_separate_queues_work_on_the_ring(shards):
    pipe = make(shards, map=index_map, prefetch_queue_depth={"cpu_size": 2, "gpu_size": 2})()
    assert sorted(indices(DALIShardedIterator(pipe, ["i"]))) == list(range(SHARDS * PER_SHARD))


@pytest.mark.parametrize("depth", [1, 2])
def test_a_pipeline_scheduled_further_ahead_than_its_transfer_keeps_is_refused(make_shards, tmp_path, transfer, depth):
    """``schedule_run()`` called more often than ``outputs()``: the merge transfer used to hand DALI
    batches its pool had already written over (wrong samples) or fail with a raw error. Each
    transfer keeps so many steps for DALI to read in place (the ring: its workers' slots,
    ``worker_prefetch + prefetch_queue_depth``; the merge: DALI's pool, ``prefetch_queue_depth``),
    delivers every step whole that far ahead, refuses one more with a ConfigError, and goes on as
    if it had not been asked."""
    paths = make_shards((PER_SHARD,) * SHARDS, lambda i, s, p: {"__key__": f"k{i:03d}", "txt": f"sample {i}".encode()}, folder=tmp_path)
    room = {"ring": 3 + depth, "merge": depth}[transfer]
    pipe = identity_pipeline(paths, ("__index__", "__valid__", "txt"), batch_size=4, py_num_workers=2,
                             transfer=transfer, prefetch_queue_depth=depth, worker_prefetch=3)()  # fmt: skip
    pipe.build()
    for _ in range(room - depth + 1):  # the first call runs `depth` steps (DALI's prefetch)
        pipe.schedule_run()
    with pytest.raises(ConfigError, match=f"scheduled {room} steps? ahead of its outputs: transfer='{transfer}'"):
        pipe.schedule_run()
    seen = []
    while True:  # `room` steps ahead all along
        try:
            index, valid, txt = pipe.outputs()
        except StopIteration:
            break
        for i, v, t in zip(index, valid, txt):
            if np.array(v):
                seen.append(int(np.array(i)))
                assert np.array(t).tobytes() == f"sample {seen[-1]}".encode()
        pipe.schedule_run()
    assert sorted(seen) == list(range(SHARDS * PER_SHARD))


@pytest.mark.parametrize("exec_async", [False, True])
def test_without_a_pipelined_executor_the_merge_is_refused_and_the_ring_runs(shards, transfer, exec_async):
    """``exec_pipelined=False``: DALI never gives its parallel external sources a task (the merge
    used to fail at its first step with DALI's raw 'No task has been scheduled'); the ring, which
    needs no pool, delivers every sample exactly once, epoch after epoch."""
    factory = make(shards, map=index_map, transfer=transfer, exec_async=exec_async, exec_pipelined=False)
    if transfer == "merge":
        with pytest.raises(ConfigError, match=f"exec_async={exec_async}, exec_pipelined=False with transfer='merge'"):
            factory()
        return
    it = DALIShardedIterator(factory(), ["i"])
    for _ in range(2):
        assert sorted(indices(it)) == list(range(SHARDS * PER_SHARD))
