"""DALIShardedIterator (and the plain DALI iterator) over sharded pipelines."""

from collections import Counter

import pytest
import torch
from nvidia.dali import fn, pipeline_def
from nvidia.dali.plugin.pytorch import DALIGenericIterator

from dali_shards import decode_image, sharded_pipeline
from dali_shards.pytorch import DALIShardedIterator


def make_pipe(pattern, **kw):
    @sharded_pipeline(
        pattern,
        fields=("jpg", "cls", "__index__", "__valid__"),
        batch_size=6,
        py_num_workers=2,
        shuffle=True,
        seed=4,
        num_threads=2,
        device_id=None,
        **kw,
    )
    def pipe(jpg, cls, index, valid):
        image = fn.resize(decode_image(jpg), size=(32, 32))
        return image, cls, index, valid

    return pipe


NAMES = ["image", "label", "index", "valid"]


def test_trimmed_batches_cover_every_sample_once_per_epoch(photo_shards):
    world = 3
    seen = [Counter(), Counter(), Counter()]
    for rank in range(world):
        it = DALIShardedIterator(make_pipe(photo_shards["pattern"], world_size=world)(rank=rank), NAMES)
        assert len(it) == 3  # ceil(47 / (3 ranks x 6))
        for epoch in range(3):  # no manual reset between epochs
            sizes = []
            for (batch,) in it:
                assert batch["valid"].all(), "padding is trimmed"
                assert batch["image"].shape[1:] == (32, 32, 3) and batch["image"].dtype == torch.uint8
                assert batch["label"].dtype == torch.int64
                seen[epoch].update(batch["index"].tolist())
                sizes.append(len(batch["index"]))
            assert len(sizes) == len(it) and it.epoch == epoch + 1
    for counter in seen:
        assert sorted(counter) == list(range(47)) and max(counter.values()) == 1


def test_kept_padding_mask_matches_the_data(photo_shards):
    padded = 0
    for rank in range(4):
        pipe = make_pipe(photo_shards["pattern"], world_size=4)(rank=rank)
        it = DALIShardedIterator(pipe, NAMES, keep_padding=True, mask_name="mask")
        for (batch,) in it:
            assert len(batch["index"]) == 6
            assert torch.equal(batch["mask"], batch["valid"])
            padded += int((~batch["mask"]).sum())
    assert padded == pipe.dali_shards.spec.padding_per_epoch == 2 * 4 * 6 - 47


def test_abandoned_epoch_is_finished_before_the_next(photo_shards):
    pipe = make_pipe(photo_shards["pattern"])()
    it = DALIShardedIterator(pipe, NAMES)
    next(it)
    assert it.step == 1 and it.epoch == 0
    indices = [i for (b,) in it for i in b["index"].tolist()]  # a new loop: a whole new epoch
    assert it.epoch == 2
    want_index, want_valid = pipe.dali_shards.plan(1).rank_batches(0)
    assert indices == want_index[want_valid].tolist()


def test_reset_after_exactly_len_batches(photo_shards):
    it = DALIShardedIterator(make_pipe(photo_shards["pattern"])(), NAMES)
    for epoch in range(2):
        for _ in range(len(it)):
            next(it)
        it.reset()
        assert it.epoch == epoch + 1 and it.step == 0


def test_plain_dali_iterator(photo_shards):
    it = DALIGenericIterator(make_pipe(photo_shards["pattern"])(), NAMES)
    total = 0
    steps = 0
    for (batch,) in it:
        steps += 1
        assert len(batch["index"]) == 6
        total += int(batch["valid"].sum())
    assert total == 47 and steps == 8


def test_refuses_foreign_pipelines_and_clashing_mask(photo_shards):
    @pipeline_def(batch_size=1, num_threads=1, device_id=None)
    def plain():
        return fn.constant(idata=1)

    with pytest.raises(TypeError, match="sharded_pipeline"):
        DALIShardedIterator(plain(), ["x"])
    with pytest.raises(ValueError, match="clashes"):
        DALIShardedIterator(make_pipe(photo_shards["pattern"])(), NAMES, keep_padding=True, mask_name="valid")
