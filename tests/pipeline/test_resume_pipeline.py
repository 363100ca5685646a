"""Resuming real pipelines: states at the first step, mid-epoch, the last step and the epoch's end."""

from collections import Counter

import pytest
from nvidia.dali import fn

from dali_shards import ConfigError, decode_image, sharded_pipeline
from dali_shards.pytorch import DALIShardedIterator
from dali_shards.testing import resume
from dali_shards.testing.pipelines import identity_pipeline
from dali_shards.testing.resume import check_resume

WORLD, WORKERS, BATCH = 2, 2, 6  # 47 photos: 4 steps per epoch, one padded slot


def resized(jpg, index):
    return fn.resize(decode_image(jpg), size=(16, 16)), index


def make(pattern, **kw):
    options = dict(batch_size=BATCH, py_num_workers=WORKERS, world_size=WORLD, shuffle=True, seed=11, shuffle_buffer=5)
    return identity_pipeline(pattern, ("jpg", "__index__"), body=resized, **{**options, **kw})


def batches(it, limit=None):
    """(epoch, step, indices) of each batch, up to ``limit`` batches."""
    out = []
    for _ in range(limit if limit is not None else 10**9):
        try:
            (batch,) = next(it)
        except StopIteration:
            if limit is None:
                break
            continue
        out.append((it.epoch, it.step - 1, batch["index"].tolist()))
    return out


@pytest.fixture(scope="module")
def uninterrupted(photo_shards):
    """Two epochs of each rank's batches, in one go."""
    runs, lengths = resume.uninterrupted(make(photo_shards["pattern"]), ["image", "index"], world=WORLD, epochs=2)
    for rank in range(WORLD):
        assert lengths[rank] == 4
        assert [b[0] for b in runs[rank]] == [0] * 4 + [1] * 4
    return runs


@pytest.mark.parametrize("consumed", [0, 1, 2, 3, 4, "epoch end"])
def test_state_round_trips_at_every_point(photo_shards, uninterrupted, consumed, transfer):
    """The resume contract (``check_resume``: the same state on every rank; resumed by
    ``resume_from`` and by ``load_state_dict``, the batches of the uninterrupted run from there on)
    after each number of batches, and after the epoch's end (its ``StopIteration``).
    (``uninterrupted`` ran on the default transfer: both give the same batches.)"""
    train = make(photo_shards["pattern"], transfer=transfer)
    stop = "ended" if consumed == "epoch end" else consumed
    checked = check_resume(train, ["image", "index"], world=WORLD, stops=(stop,), reference=uninterrupted)
    assert checked["stops"] == [4 if consumed == "epoch end" else consumed]


def test_load_state_dict_on_a_fresh_iterator(photo_shards, uninterrupted):
    train = make(photo_shards["pattern"])
    it = DALIShardedIterator(train(rank=1), ["image", "index"])
    batches(it, 2)
    state = it.state_dict()
    fresh = DALIShardedIterator(train(rank=1), ["image", "index"])
    fresh.load_state_dict(state)
    assert fresh.epoch == 0 and fresh.step == 2 and len(fresh) == 2  # what is left of the epoch
    assert batches(fresh, 7) == uninterrupted[1][2:]


def test_elastic_resume_on_another_layout(photo_shards, transfer):
    train = make(photo_shards["pattern"], transfer=transfer)
    seen = Counter()
    states = []
    for rank in range(WORLD):
        it = DALIShardedIterator(train(rank=rank), ["image", "index"])
        for _, _, idx in batches(it, 2):
            seen.update(idx)
        states.append(it.state_dict())
    state = states[0]
    # resume the rest of the epoch on 3 ranks x 1 worker, batch 3
    steps = []
    new = make(photo_shards["pattern"], world_size=3, py_num_workers=1, batch_size=3, transfer=transfer)
    epoch1 = []
    for rank in range(3):
        it = DALIShardedIterator(new(rank=rank, resume_from=state), ["image", "index"])
        assert it.epoch == 0 and it.step == 2, "step: the epoch's steps so far, those under the old layout included"
        left = len(it)  # the batches this iterator delivers in the epoch
        rest = batches(it)  # the rest of epoch 0
        assert [step for _, step, _ in rest] == list(range(2, 2 + left)) and len(rest) == left
        steps.append(len(rest))
        for _, _, idx in rest:
            seen.update(idx)
        assert len(it) == 6 and it.epoch == 1  # the next epoch follows the new layout: ceil(47 / 9)
        epoch1 += [i for _, _, idx in batches(it) for i in idx]
    assert len(set(steps)) == 1, "equal steps on the new ranks"
    assert sorted(seen) == list(range(47)) and max(seen.values()) == 1, "the epoch, exactly once"
    assert sorted(epoch1) == list(range(47))


def test_a_state_of_another_dataset_is_refused(photo_shards, tmp_path):
    from dali_shards.sample_data import write_sample_shards

    train = make(photo_shards["pattern"])
    it = DALIShardedIterator(train(rank=0), ["image", "index"])
    batches(it, 1)
    state = it.state_dict()
    write_sample_shards(str(tmp_path), shard_sizes=(20, 20))
    other = make(str(tmp_path / "sample-*.tar"))
    with pytest.raises(ConfigError, match="other shards"):
        other(rank=0, resume_from=state)
    with pytest.raises(ConfigError, match="other shards"):
        DALIShardedIterator(other(rank=0), ["image", "index"]).load_state_dict(state)


def test_the_same_shards_listed_in_reverse_are_refused(photo_shards):
    """Equal-size shards listed in another order would duplicate and lose samples: refused."""
    it = DALIShardedIterator(make(photo_shards["paths"], world_size=1, rank=0)(), ["images", "index"])
    next(it)
    state = it.state_dict()
    with pytest.raises(ConfigError, match="the same shards in another order"):
        make(photo_shards["paths"][::-1], world_size=1, rank=0)(resume_from=state)
    reversed_it = DALIShardedIterator(make(photo_shards["paths"][::-1], world_size=1, rank=0)(), ["images", "index"])
    with pytest.raises(ConfigError, match="the same shards in another order"):
        reversed_it.load_state_dict(state)


def test_a_resumed_run_draws_new_augmentations(photo_shards):
    """DALI's random operators are seeded by (seed, rank, epoch, step) of the start: a resumed run
    does not replay the augmentations of step 0."""
    import numpy as np

    @sharded_pipeline(photo_shards["pattern"], fields=("__index__",), batch_size=4, py_num_workers=2, world_size=1,
                      rank=0, seed=5, num_threads=1, device_id=None)
    def noisy(index):
        return index, fn.random.uniform(range=(0.0, 1.0), shape=(4,))

    it = DALIShardedIterator(noisy(), ["index", "noise"])
    first = [b["noise"].numpy() for (b,) in (next(it), next(it))]
    state = it.state_dict()
    resumed = DALIShardedIterator(noisy(resume_from=state), ["index", "noise"])
    (after,) = next(resumed)
    assert not any(np.allclose(after["noise"].numpy(), f) for f in first)
    fresh = DALIShardedIterator(noisy(), ["index", "noise"])
    (again,) = next(fresh)
    assert np.allclose(again["noise"].numpy(), first[0]), "a fresh start is reproducible"


def test_interleaved_epochs_resume_exactly_once_under_another_layout(tmp_path, transfer):
    """Enough shards to interleave: a real epoch, stopped, then resumed on another world size."""
    from dali_shards.sample_data import write_sample_shards

    paths = write_sample_shards(str(tmp_path), shard_sizes=(5,) * 9 + (2,))
    first = make(paths, world_size=2, shuffle_buffer=1024, transfer=transfer)
    its = [DALIShardedIterator(first(rank=r), ["image", "index"]) for r in range(2)]
    assert its[0].info.plan(0).interleaving
    seen = [i for it in its for _, _, b in batches(it, 3) for i in b]
    state = its[0].state_dict()
    rest = DALIShardedIterator(make(paths, world_size=1, transfer=transfer)(rank=0, resume_from=state), ["image", "index"])
    seen += [i for epoch, _, b in batches(rest) if epoch == 0 for i in b]
    assert sorted(seen) == list(range(47))


def test_a_state_that_excludes_every_sample_is_refused_when_built(make_shards):
    """Not a worker's "no readable sample ... check the shards" at the first batch."""
    paths = make_shards((4, 4), prefix="excluded")
    train = identity_pipeline(paths, ("__index__",), batch_size=2, py_num_workers=1, world_size=1, on_error="skip")
    state = DALIShardedIterator(train(), ["index"]).state_dict()
    with pytest.raises(ConfigError, match=r"every one of the dataset's 8 samples is excluded \(\"excluded\" in the resume "
                       r"state: the samples DALI's operators failed on.*remove \"excluded\" from the state"):
        train(resume_from={**state, "excluded": list(range(8))})
    it = DALIShardedIterator(train(resume_from={**state, "excluded": list(range(7))}), ["index"])
    assert [i for (batch,) in it for i in batch["index"].reshape(-1).tolist()] == [7]
