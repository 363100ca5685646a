"""`dali-shards plan` prints the plan the pipeline's workers follow, in every planned mode: each
worker's samples as printed are the samples that worker delivers (interleaved, contiguous runs,
compressed shards falling back to contiguous runs, a random and a stratified mix, bucketing), and
in the streaming mode each worker's shards in their order."""

import json
import os
from collections import Counter, defaultdict

import numpy as np
import pytest

from dali_shards import Stream, cli
from dali_shards.pytorch import DALIShardedIterator
from dali_shards.testing.contract import write_dataset
from dali_shards.testing.pipelines import identity_pipeline

SIZES = (7, 0, 12, 5, 9, 3, 11, 6, 8, 4)
LAYOUT = dict(world_size=2, py_num_workers=2, batch_size=4, seed=3, shuffle=True)


def printed(args, capsys):
    """Per virtual worker, the set of ``__index__`` the plan command says it reads."""
    assert cli.main(["plan", *args, "--world-size", "2", "--workers", "2", "--batch-size", "4", "--seed", "3",
                     "--shuffle", "--json"]) == 0  # fmt: skip
    return json.loads(capsys.readouterr().out)


def reads(summary, paths):
    """Per virtual worker, the samples its printed reads hold, as many times as they hold them (shard
    names as the summary gives them)."""
    starts = dict(zip(names(paths), np.cumsum([0] + [count(p) for p in paths])[:-1].tolist()))
    out = {}
    for rank in summary["ranks"]:
        for w in rank["workers"]:
            out[w["virtual_worker"]] = Counter(starts[r["shard"]] + i for r in w["reads"] for i in range(*r["samples"]))
    return out


def names(paths):
    base = [os.path.basename(p) for p in paths]
    return base if len(set(base)) == len(base) else [os.path.join(os.path.basename(os.path.dirname(p)), b) for p, b in zip(paths, base)]


def count(path):
    with open(os.path.join(os.path.dirname(path), "manifest.json")) as f:
        entries = json.load(f)["shards"]
    return next(e["samples"] for e in entries if os.path.basename(e["url"]) == os.path.basename(path))


def delivered(source, **options):
    """Per virtual worker, the samples the pipeline's workers deliver in epoch 0 (a mix's drawn twice, twice)."""
    out = defaultdict(Counter)
    for rank in range(2):
        pipe = identity_pipeline(source, ("__index__",), **{**LAYOUT, **options})(rank=rank)
        for (batch,) in DALIShardedIterator(pipe, ["index"], keep_padding=True):
            index, valid = batch["index"].reshape(-1).tolist(), batch["__valid__"].reshape(-1).tolist()
            for slot, (i, ok) in enumerate(zip(index, valid)):
                if ok:
                    out[rank * 2 + slot // 2][i] += 1
    return dict(out)


@pytest.mark.parametrize("mode", ["interleaved", "contiguous", "compressed", "random mix", "stratified mix", "bucketed"])
def test_the_printed_plan_is_what_the_workers_read(tmp_path, capsys, mode):
    paths = write_dataset(str(tmp_path / "a"), SIZES, 0, gz=mode == "compressed")
    args, source, options = [str(tmp_path / "a" / "manifest.json")], str(tmp_path / "a" / "manifest.json"), {}
    if mode == "contiguous":
        args, options = args + ["--shuffle-block", "0"], {"shuffle_block": 0}
    if mode.endswith("mix"):
        small = write_dataset(str(tmp_path / "b"), (3, 2), sum(SIZES))
        args = ["--stream", f"repeat=2:{args[0]}", "--stream", f"choose=17:{tmp_path / 'b' / 'manifest.json'}"]
        source = [Stream(source, repeat=2), Stream(str(tmp_path / "b" / "manifest.json"), choose=17)]
        paths = paths + small
        if mode.startswith("stratified"):
            args, options = args + ["--batching", "stratified"], {"batching": "stratified"}
    if mode == "bucketed":  # bucketing reorders a worker's samples within windows, not which it reads
        options = dict(map=lambda s: {"index": s["__index__"]}, bucket_by=lambda s: int(s["index"]) % 5,
                       bucket_window=8, outputs="index")  # fmt: skip
    summary = printed(args, capsys)
    assert reads(summary, paths) == delivered(source, **options)


def test_the_printed_streaming_plan_is_what_the_workers_stream(tmp_path, capsys):
    """The streaming mode (shards without counts): each worker delivers its quota, every sample from
    the shards the plan says it streams, in the printed order (no buffer shuffle to hide it)."""
    paths = write_dataset(str(tmp_path / "a"), SIZES, 0)
    tars = sorted(p for p in paths if p.endswith(".tar"))
    summary = printed([*tars, "--samples-per-epoch", "40", "--epoch", "1", "--shuffle-buffer", "1"], capsys)
    shard_of = {os.path.basename(p): i for i, p in enumerate(tars)}
    seen = defaultdict(list)
    for rank in range(2):
        pipe = identity_pipeline(tars, ("__index__",), **LAYOUT, samples_per_epoch=40, start_epoch=1,
                               shuffle_buffer=1)(rank=rank)
        for (batch,) in DALIShardedIterator(pipe, ["index"]):
            for slot, i in enumerate(batch["index"].reshape(-1).tolist()):
                seen[rank * 2 + slot // 2].append(i >> 32)  # a streamed __index__: (shard << 32) | position
    for rank in summary["ranks"]:
        for w in rank["workers"]:
            streams = [shard_of[name] for name in w["shards"]]
            got = seen[w["virtual_worker"]]
            assert len(got) == w["samples"] == summary["quota"]
            runs = [s for k, s in enumerate(got) if k == 0 or got[k - 1] != s]  # the shards, as read one after another
            first_pass = [s for s in streams if SIZES[s]][: len(runs)]
            assert set(got) <= set(streams) and runs[: len(first_pass)] == first_pass
