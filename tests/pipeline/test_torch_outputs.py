"""Outputs whose samples differ in shape, and keys, out of DALIShardedIterator, on both transfers."""

import json
from collections import Counter

import numpy as np
import pytest
import torch

from dali_shards import sharded_pipeline
from dali_shards.errors import ConfigError, RaggedOutputError
from dali_shards.pytorch import DALIShardedIterator
from dali_shards.testing.pipelines import identity_pipeline
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
    return identity_pipeline(pattern, ("__key__", "json"), outputs="__key__ boxes i", map=load, batch_size=4,
                             py_num_workers=2, world_size=world, shuffle=True, seed=5, transfer=transfer)  # fmt: skip


def check_sample(key, boxes, i):
    assert key.endswith(f"_{i}") and key == f"img{'x' * (i % 5)}_{i}"
    assert boxes.shape == (i % 4, 4) and boxes.dtype == torch.float32
    assert torch.equal(boxes, torch.from_numpy(boxes_of(i)))


def test_ragged_outputs_come_as_lists_and_keys_as_strings(ragged_shards, transfer):
    seen = Counter()
    for rank in range(3):
        it = DALIShardedIterator(make_pipe(ragged_shards, transfer)(rank=rank), ["key", "boxes", "i"], ragged_outputs=["boxes"])
        for (batch,) in it:
            assert isinstance(batch["key"], list) and isinstance(batch["boxes"], list)
            assert isinstance(batch["i"], torch.Tensor)  # dense outputs stay tensors
            assert len(batch["key"]) == len(batch["boxes"]) == len(batch["i"])
            for key, boxes, i in zip(batch["key"], batch["boxes"], batch["i"].tolist()):
                check_sample(key, boxes, i)
                seen[i] += 1
    assert sorted(seen) == list(range(N)) and max(seen.values()) == 1


def test_padded_ragged_outputs_carry_their_shapes(ragged_shards, transfer):
    it = DALIShardedIterator(make_pipe(ragged_shards, transfer, world=1)(), ["key", "boxes", "i"], ragged="pad",
                             ragged_outputs=["boxes"])  # fmt: skip
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
    it = DALIShardedIterator(make_pipe(ragged_shards, "ring")(rank=2), ["key", "boxes", "i"], keep_padding=True,
                             ragged_outputs=["boxes"])  # fmt: skip
    sizes = [(len(b["key"]), len(b["boxes"]), int(b["__valid__"].sum())) for (b,) in it]
    assert all(k == n == 4 for k, n, _ in sizes)
    assert sum(valid for _, _, valid in sizes) < 4 * len(sizes), "rank 2 holds padding"


def test_reset_mid_epoch_keeps_ragged_outputs_with_their_batch(ragged_shards, transfer):
    it = DALIShardedIterator(make_pipe(ragged_shards, transfer, world=1)(), ["key", "boxes", "i"], ragged_outputs=["boxes"])
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
    it = DALIShardedIterator(make_pipe(ragged_shards, "ring", world=1)(), ["key", "boxes", "i"], ragged_outputs=["boxes"])
    next(it)
    state = it.state_dict()
    it.load_state_dict(state)
    (batch,) = next(it)
    assert all(isinstance(k, str) for k in batch["key"])


def test_each_output_has_one_type_in_every_batch():
    """Ragged outputs are ragged from the first batch, dense ones dense; an undeclared output whose
    samples differ is one clear error (it used to turn into a list mid-epoch)."""
    from nvidia.dali.tensors import TensorListCPU

    from dali_shards.pytorch.outputs import BatchOutputs

    dense = TensorListCPU(np.zeros((2, 1, 4), np.float32))
    ragged = TensorListCPU([np.zeros((1, 4), np.float32), np.zeros((2, 4), np.float32)])
    named = BatchOutputs(["boxes"], ragged="pad", always=["boxes"])
    for batch_outs in ([dense], [ragged], [dense]):
        got: dict = {}
        named.prepare(batch_outs)
        named.finish(got)
        assert got["boxes"].shape[0] == 2 and got["boxes_shape"].shape == (2, 2), "padded, with shapes, every batch"
    undeclared = BatchOutputs(["boxes"], ragged="pad")
    undeclared.prepare([dense])
    undeclared.finish({})
    with pytest.raises(RaggedOutputError, match=r"output 'boxes' .*\(1, 4\) and \(2, 4\), in batch 2 .* ragged_outputs=\['boxes'\]"):
        undeclared.prepare([ragged])
    with pytest.raises(ConfigError, match="ragged_outputs names"):
        BatchOutputs(["boxes"], always=["box"])


def uniform_then_ragged(sample):
    """Boxes of one shape in the first batches (keys 0..7), then of varying shapes; and the bytes
    of the key (a bytes output: ragged without being named)."""
    i = int(sample["__key__"].rsplit("_", 1)[1])
    return {"boxes": np.zeros((1 if i < 8 else i % 4, 4), np.float32), "i": np.int64(i), "name": sample["__key__"].encode()}


@pytest.mark.parametrize("ragged", ["list", "pad"])
def test_outputs_have_one_type_from_the_first_batch(ragged_shards, ragged):
    """A declared output is ragged from the first batch, even where that batch's samples share one
    shape; bytes outputs are ragged without being declared; an undeclared array output whose samples
    turn out to differ is one clear error, at the batch where they do (it used to become a list there)."""

    @sharded_pipeline(ragged_shards, fields=("__key__", "json"), map=uniform_then_ragged, batch_size=4,
                      py_num_workers=1, shuffle=False, num_threads=1, device_id=None)  # fmt: skip
    def pipe(boxes, i, name):
        return boxes, i, name

    kinds = set()
    for (batch,) in DALIShardedIterator(pipe(), ["boxes", "i", "name"], ragged=ragged, ragged_outputs=["boxes", "name"]):
        assert isinstance(batch["i"], torch.Tensor)
        kinds.add((type(batch["boxes"]).__name__, "boxes_shape" in batch, type(batch["name"]).__name__))
    assert kinds == ({("list", False, "list")} if ragged == "list" else {("Tensor", True, "Tensor")})
    undeclared = DALIShardedIterator(pipe(), ["boxes", "i", "name"], ragged=ragged)
    batches = [next(undeclared), next(undeclared)]  # keys 0..7: one shape
    assert all(isinstance(b["boxes"], torch.Tensor) for (b,) in batches)
    assert all(isinstance(b["name"], list) or "name_shape" in b for (b,) in batches), "bytes: ragged undeclared"
    with pytest.raises(RaggedOutputError, match=r"output 'boxes' .* in batch 3 .* ragged_outputs=\['boxes', 'name'\]"):
        next(undeclared)


def test_an_undeclared_ragged_output_is_one_clear_error(ragged_shards, transfer):
    @sharded_pipeline(ragged_shards, fields=("json",), map=load, batch_size=4, py_num_workers=2,
                      num_threads=1, device_id=None, transfer=transfer)  # fmt: skip
    def pipe(boxes, i):
        return boxes * 2, i

    with pytest.raises(RaggedOutputError, match=r"output 'boxes' has samples of different shapes .* ragged_outputs=\['boxes'\]"):
        for _ in DALIShardedIterator(pipe(), ["boxes", "i"]):
            pass
    declared = DALIShardedIterator(pipe(), ["boxes", "i"], ragged_outputs=["boxes"])
    assert sum(len(b["boxes"]) for (b,) in declared) == N
