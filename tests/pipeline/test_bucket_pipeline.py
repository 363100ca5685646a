"""Length bucketing in real pipelines: less padding, every sample once, and an epoch stopped inside
a bucketing window resumed under the same layout and under another one."""

from collections import Counter

import numpy as np
import pytest
from nvidia.dali import fn

from dali_shards import sharded_pipeline
from dali_shards.pytorch import DALIShardedIterator
from dali_shards.tools.writer import ShardWriter

TOTAL = 600


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    rng = np.random.default_rng(0)
    with ShardWriter(str(tmp_path_factory.mktemp("txt") / "t-%03d.tar"), max_count=50) as w:
        for i in range(TOTAL):
            w.write({"__key__": f"{i:05d}", "txt": ("x" * int(rng.integers(1, 200))).encode()})
    return w.paths


def tokens(s):
    return {"tokens": np.frombuffer(s["txt"].encode(), np.uint8).astype(np.int32), "idx": s["__index__"]}


def random_crop(s):
    """An augmentation from the global RNGs: a random prefix of the text, a random shift of its bytes."""
    import random

    t = np.frombuffer(s["txt"].encode(), np.uint8).astype(np.int32)
    return {"tokens": t[: np.random.randint(1, len(t) + 1)] + random.randint(0, 9), "idx": s["__index__"]}


def run(paths, bucket, stop=None, load=None, mapper=tokens, audits=None, **kw):
    """Valid indices delivered (in order), the padding fraction, and the state after ``stop`` steps
    (``load``: a state given to ``load_state_dict`` first)."""
    opts = {"batch_size": 8, "py_num_workers": 2, **kw}
    if bucket:
        opts.update(bucket_by=lambda out: len(out["tokens"]), bucket_window=64)

    @sharded_pipeline(paths, fields=("txt", "__index__"), map=mapper, shuffle=True, seed=3, num_threads=1,
                      device_id=None, **opts)  # fmt: skip
    def pipe(tokens, idx):
        return fn.pad(tokens, fill_value=0), tokens.shape(), idx

    it = DALIShardedIterator(pipe(), ["tokens", "lengths", "idx"], audit=audits is not None)
    if load is not None:
        it.load_state_dict(load)
    seen, padded, total = [], 0, 0
    for step, (b,) in enumerate(it, 1):
        padded += b["tokens"].numel() - int(b["lengths"].sum())
        total += b["tokens"].numel()
        seen += b["idx"].reshape(-1).tolist()
        if step == stop:
            return seen, padded / total, it.state_dict()
    if audits is not None:
        audits.extend(it.audits)
    return seen, padded / total, None


def test_bucketing_cuts_padding_and_keeps_every_sample_once(texts):
    plain, plain_padding, _ = run(texts, bucket=False)
    bucketed, bucketed_padding, _ = run(texts, bucket=True)
    for seen in (plain, bucketed):
        assert sorted(seen) == list(range(TOTAL)) and max(Counter(seen).values()) == 1
    assert bucketed_padding * 3 < plain_padding, (plain_padding, bucketed_padding)


@pytest.mark.parametrize("how", ["resume_from", "load_state_dict"])
@pytest.mark.parametrize("layout", [{}, {"py_num_workers": 4}, {"batch_size": 4, "py_num_workers": 1}])
def test_an_epoch_stopped_inside_a_window_resumes_exactly_once(texts, layout, how):
    first, _, state = run(texts, bucket=True, stop=13)  # windows of 64 // 4 = 16 steps: inside the first
    assert state["history"][-1]["bucket_window"] == 64 and state["history"][-1]["steps"] == 13
    given = {"resume_from": state} if how == "resume_from" else {"load": state}
    audits = []
    rest, _, _ = run(texts, bucket=True, audits=audits, **given, **layout)
    assert not set(first) & set(rest) and sorted(first + rest) == list(range(TOTAL))
    assert audits[0]["exactly_once"] and not audits[0]["missing"], "the audit knows what the window delivered"
    if not layout:  # the same layout goes on exactly as the uninterrupted epoch
        whole, _, _ = run(texts, bucket=True)
        assert first + rest == whole


@pytest.mark.parametrize("layout", [{}, {"py_num_workers": 4}])
def test_random_augmentations_are_seeded_per_sample_so_a_resumed_window_is_exactly_once(texts, layout):
    first, _, state = run(texts, bucket=True, stop=13, mapper=random_crop)
    rest, _, _ = run(texts, bucket=True, resume_from=state, mapper=random_crop, **layout)
    assert not set(first) & set(rest) and sorted(first + rest) == list(range(TOTAL))
