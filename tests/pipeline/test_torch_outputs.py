"""Outputs whose samples differ in shape, and keys, out of DALIShardedIterator, on both transfers."""

import json
from collections import Counter

import numpy as np
import pytest
import torch

from dali_shards import sharded_pipeline
from dali_shards.errors import ConfigError
from dali_shards.pytorch import DALIShardedIterator
from dali_shards.tools.writer import write_shard

N = 29  # samples: 3 ranks x batch 4 leave padding in the last step


def boxes_of(i: int) -> np.ndarray:
    """Sample i's boxes: i % 4 of them (0 included), their values naming the sample."""
    return np.arange((i % 4) * 4, dtype=np.float32).reshape(-1, 4) + 100 * i


@pytest.fixture(scope="module")
def ragged_shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("ragged")
    samples = [
        {"__key__": f"img{'x' * (i % 5)}_{i}", "json": json.dumps({"i": i, "boxes": boxes_of(i).tolist()})}
        for i in range(N)
    ]
    write_shard(str(out / "a-0.tar"), samples[:17])
    write_shard(str(out / "a-1.tar"), samples[17:])
    return str(out / "a-{0..1}.tar")


def load(sample):
    meta = sample["json"]  # decoded by extension, as webdataset does
    return {"boxes": np.asarray(meta["boxes"], dtype=np.float32).reshape(-1, 4), "i": np.int64(meta["i"])}


def make_pipe(pattern, transfer, world=3):
    @sharded_pipeline(pattern, fields=("__key__", "json"), map=load, batch_size=4, py_num_workers=2,
                      world_size=world, shuffle=True, seed=5, num_threads=1, device_id=None, transfer=transfer)  # fmt: skip
    def pipe(__key__, boxes, i):
        return __key__, boxes, i

    return pipe


def check_sample(key, boxes, i):
    assert key.endswith(f"_{i}") and key == f"img{'x' * (i % 5)}_{i}"
    assert boxes.shape == (i % 4, 4) and boxes.dtype == torch.float32
    assert torch.equal(boxes, torch.from_numpy(boxes_of(i)))


def test_ragged_outputs_come_as_lists_and_keys_as_strings(ragged_shards, transfer):
    seen = Counter()
    for rank in range(3):
        it = DALIShardedIterator(make_pipe(ragged_shards, transfer)(rank=rank), ["key", "boxes", "i"])
        for (batch,) in it:
            assert isinstance(batch["key"], list) and isinstance(batch["boxes"], list)
            assert isinstance(batch["i"], torch.Tensor)  # dense outputs stay tensors
            assert len(batch["key"]) == len(batch["boxes"]) == len(batch["i"])
            for key, boxes, i in zip(batch["key"], batch["boxes"], batch["i"].tolist()):
                check_sample(key, boxes, i)
                seen[i] += 1
    assert sorted(seen) == list(range(N)) and max(seen.values()) == 1


def test_padded_ragged_outputs_carry_their_shapes(ragged_shards, transfer):
    it = DALIShardedIterator(make_pipe(ragged_shards, transfer, world=1)(), ["key", "boxes", "i"], ragged="pad")
    seen = 0
    for (batch,) in it:
        padded, shapes = batch["boxes"], batch["boxes_shape"]
        assert padded.dtype == torch.float32 and shapes.dtype == torch.int64
        assert padded.shape[0] == shapes.shape[0] == len(batch["i"]) and shapes.shape[1] == 2
        for key, row, shape, i in zip(batch["key"], padded, shapes.tolist(), batch["i"].tolist()):
            n = shape[0]
            check_sample(key, row[:n], i)
            assert not row[n:].any(), "padding is zeros"
        seen += len(batch["i"])
    assert seen == N


def test_kept_padding_keeps_list_lengths_with_the_mask(ragged_shards):
    it = DALIShardedIterator(make_pipe(ragged_shards, "ring")(rank=2), ["key", "boxes", "i"], keep_padding=True)
    sizes = [(len(b["key"]), len(b["boxes"]), int(b["__valid__"].sum())) for (b,) in it]
    assert all(k == n == 4 for k, n, _ in sizes)
    assert sum(valid for _, _, valid in sizes) < 4 * len(sizes), "rank 2 holds padding"


def test_reset_mid_epoch_keeps_ragged_outputs_with_their_batch(ragged_shards, transfer):
    it = DALIShardedIterator(make_pipe(ragged_shards, transfer, world=1)(), ["key", "boxes", "i"])
    next(it)
    it.reset()  # batches prepared ahead are read and discarded with their converted outputs
    for _ in range(2):
        for (batch,) in it:
            for key, boxes, i in zip(batch["key"], batch["boxes"], batch["i"].tolist()):
                check_sample(key, boxes, i)


def test_ragged_option_is_checked(ragged_shards):
    with pytest.raises(ConfigError, match="ragged must be one of"):
        DALIShardedIterator(make_pipe(ragged_shards, "ring")(rank=0), ["key", "boxes", "i"], ragged="split")
    with pytest.raises(ConfigError, match="boxes_shape"):
        DALIShardedIterator(make_pipe(ragged_shards, "ring")(rank=0), ["boxes", "boxes_shape", "i"], ragged="pad")


def test_load_state_dict_keeps_keys_as_strings(ragged_shards):
    it = DALIShardedIterator(make_pipe(ragged_shards, "ring", world=1)(), ["key", "boxes", "i"])
    next(it)
    state = it.state_dict()
    it.load_state_dict(state)
    (batch,) = next(it)
    assert all(isinstance(k, str) for k in batch["key"])


def test_an_output_keeps_its_type_once_ragged_and_named_ones_from_the_start():
    from nvidia.dali.tensors import TensorListCPU

    from dali_shards.torch_outputs import BatchOutputs

    dense = TensorListCPU(np.zeros((2, 1, 4), np.float32))
    ragged = TensorListCPU([np.zeros((1, 4), np.float32), np.zeros((2, 4), np.float32)])
    seen = BatchOutputs(["boxes"], ragged="pad")
    named = BatchOutputs(["boxes"], ragged="pad", always=["boxes"])
    for outs, batch in ((seen, {}), (named, {})):
        outs.prepare([dense])
        outs.finish(batch)
    assert "boxes_shape" not in seen.pending and named.seen_ragged == {"boxes"}
    results = []
    for batch_outs in ([dense], [ragged], [dense]):
        got, named_got = {}, {}
        seen.prepare(batch_outs)
        seen.finish(got)
        results.append(got)
        named.prepare(batch_outs)
        named.finish(named_got)
        assert "boxes_shape" in named_got, "a named output is padded in every batch"
    assert results[0] == {}, "dense until its first ragged batch (DALI's own tensor)"
    for got in results[1:]:  # from the first ragged batch on: padded, with shapes, dense batches too
        assert got["boxes"].shape[0] == 2 and got["boxes_shape"].shape == (2, 2)
    with pytest.raises(ConfigError, match="ragged_outputs names"):
        BatchOutputs(["boxes"], always=["box"])
