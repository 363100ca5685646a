"""DALIShardedIterator (and the plain DALI iterator) over sharded pipelines."""

from collections import Counter

import pytest
import torch
from nvidia.dali import fn, pipeline_def
from nvidia.dali.plugin.pytorch import DALIGenericIterator

from dali_shards import decode_image, sharded_pipeline
from dali_shards.pytorch import DALIShardedIterator
from dali_shards.testing.pipelines import identity_pipeline


def resized(jpg, cls, index, valid):
    return fn.resize(decode_image(jpg), size=(32, 32)), cls, index, valid


def make_pipe(pattern, **kw):
    return identity_pipeline(pattern, ("jpg", "cls", "__index__", "__valid__"), body=resized, batch_size=6,
                             py_num_workers=2, shuffle=True, seed=4, num_threads=2, **kw)  # fmt: skip


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


def test_a_peeked_batch_does_not_throw_the_epoch_away(photo_shards):
    """``next(it)`` then ``for ... in it`` continues the epoch (as DALI's iterators do)."""
    pipe = make_pipe(photo_shards["pattern"])()
    it = DALIShardedIterator(pipe, NAMES)
    (first,) = next(it)
    assert it.step == 1 and it.epoch == 0
    rest = [b["index"].tolist() for (b,) in it]  # the rest of epoch 0
    assert len(rest) == len(it) - 1 and it.epoch == 1
    want_index, want_valid = pipe.dali_shards.plan(0).rank_batches(0)
    assert first["index"].tolist() + [i for b in rest for i in b] == want_index[want_valid].tolist()
    # a loop broken off and a new one: still the same epoch
    for n, _ in enumerate(it):
        if n == 1:
            break
    assert it.epoch == 1 and it.step == 2
    assert sum(1 for _ in it) == len(it) - 2 and it.epoch == 2


def test_len_is_what_is_left_after_a_same_layout_resume(photo_shards):
    factory = make_pipe(photo_shards["pattern"])
    it = DALIShardedIterator(factory(), NAMES)
    assert len(it) == 8  # ceil(47 / 6)
    for _ in range(3):
        next(it)
    state = it.state_dict()
    resumed = DALIShardedIterator(factory(resume_from=state), NAMES)
    assert resumed.epoch == 0 and resumed.step == 3
    assert len(resumed) == 5 == sum(1 for _ in resumed)
    assert len(resumed) == 8 == sum(1 for _ in resumed), "the next epoch is whole"
    loaded = DALIShardedIterator(factory(), NAMES)
    loaded.load_state_dict(state)
    assert len(loaded) == 5 == sum(1 for _ in loaded)


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


def long_epoch_pipe(pattern, **kw):
    """Batches of 2 over 2 workers: 24 steps per epoch of the 47 photos."""

    @sharded_pipeline(
        pattern,
        fields=("__index__",),
        batch_size=2,
        py_num_workers=2,
        shuffle=True,
        seed=11,
        shuffle_buffer=4,
        num_threads=1,
        device_id=None,
        **kw,
    )
    def pipe(index):
        return index

    return pipe


def produced(pipe, epoch):
    """Batches each worker produced in ``epoch``, from the pipeline's control block (the workers
    may have begun the next epoch: its batches are not counted)."""
    return [w.produced - (w.step if w.epoch > epoch else 0) for w in pipe.dali_shards.control.snapshot()]


@pytest.mark.parametrize("worker_prefetch", [1, 2])
def test_reset_mid_epoch_costs_about_the_prefetch_depth(photo_shards, worker_prefetch, transfer):
    factory = long_epoch_pipe(photo_shards["pattern"], worker_prefetch=worker_prefetch, transfer=transfer)
    pipe = factory()
    it = DALIShardedIterator(pipe, ["index"], audit=True)
    steps = len(it)
    assert steps == 24
    for _ in range(2):
        next(it)
    it.reset()
    assert it.epoch == 1 and it.step == 0
    bound = 2 + 2 + worker_prefetch + 1  # consumed + pipeline prefetch + worker prefetch + 1
    assert max(produced(pipe, 0)) <= bound < steps, produced(pipe, 0)
    assert len(set(produced(pipe, 0))) == 1, "every worker ended the epoch at the same step"
    assert it.audits == [], "an abandoned epoch is not audited"
    # the epochs after it: whole and exactly once
    for epoch in (1, 2):
        assert sum(1 for _ in it) == steps and it.epoch == epoch + 1
    assert [a["epoch"] for a in it.audits] == [1, 2] and all(a["exactly_once"] for a in it.audits)
    # cut again mid-epoch 3, then a resume mid-epoch 4 from a state saved there: exactly once
    for _ in range(5):
        next(it)
    it.reset()
    assert it.epoch == 4 and it.state_dict()["history"] == []
    seen = [i for _ in range(3) for i in next(it)[0]["index"].tolist()]
    state = it.state_dict()
    del it, pipe
    resumed = DALIShardedIterator(factory(resume_from=state), ["index"])
    seen += [i for (b,) in resumed for i in b["index"].tolist()]
    assert resumed.epoch == 5 and sorted(seen) == list(range(47))


def test_reset_mid_epoch_in_the_streaming_mode(tmp_path):
    from dali_shards.sample_data import write_sample_shards

    paths = write_sample_shards(str(tmp_path), shard_sizes=(5, 7, 3, 9))
    pipe = long_epoch_pipe(paths, samples_per_epoch=400)()
    it = DALIShardedIterator(pipe, ["index"])
    assert len(it) == 200
    next(it)
    it.reset()
    assert max(produced(pipe, 0)) <= 1 + 2 + 2 + 1 and len(set(produced(pipe, 0))) == 1
    assert sum(1 for _ in it) == 200 and it.epoch == 2


def test_the_decorated_function_itself_instead_of_a_pipeline_says_to_call_it(photo_shards):
    from dali_shards import ConfigError, NotAPipelineError

    train = make_pipe(photo_shards["pattern"], world_size=1)
    with pytest.raises(NotAPipelineError, match=r"got the @sharded_pipeline function pipe itself: call it to make the pipeline, "
                       r"e\.g\. DALIShardedIterator\(pipe\(\), \[\.\.\.\]\)"):
        DALIShardedIterator(train, NAMES)
    with pytest.raises(NotAPipelineError, match="expected a pipeline made by a @sharded_pipeline function .*got str") as err:
        DALIShardedIterator("train", NAMES)
    assert isinstance(err.value, TypeError) and isinstance(err.value, ConfigError)
