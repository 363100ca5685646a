"""Samples a DALI operator fails on (images that pass the workers' structure check but not DALI's
decoder, a failing user operator): skipped under on_error="skip" and training goes on, every
other sample exactly once and equal steps on every rank; one typed error under "raise"."""

import io
import json
import logging
from collections import Counter

import numpy as np
import pytest
from nvidia.dali import fn, types
from PIL import Image

from dali_shards import ShardFormatError, sharded_pipeline
from dali_shards.pytorch import DALIShardedIterator
from dali_shards.sample_data import sample_images
from dali_shards.testing.tars import with_jpeg_frame

PHOTO = sample_images()[0].path


def jpeg(size=(48, 32)) -> bytes:
    buf = io.BytesIO()
    Image.open(PHOTO).convert("RGB").resize(size).save(buf, "JPEG", quality=80)
    return buf.getvalue()


GOOD = jpeg()
BAD = {"zero": with_jpeg_frame(GOOD, 0, 0), "bomb": with_jpeg_frame(GOOD, 65000, 65000)}


def shards(make_shards, sizes, bad):
    """Shards of small JPEGs; ``bad`` maps a global index to the kind of bad image it holds."""

    def sample(index, shard, position):
        return {"__key__": f"s{index:04d}", "jpg": BAD[bad[index]] if index in bad else GOOD, "cls": str(index)}

    return make_shards(sizes, sample)


def decoding(source, **options):
    @sharded_pipeline(source, fields=("jpg", "cls"), num_threads=2, device_id=None, **options)
    def pipe(jpg, cls):
        return fn.resize(fn.decoders.image(jpg, device="cpu", output_type=types.RGB), size=(16, 16)), cls

    return pipe


def epochs(make, world, n, transfer, audit=False):
    """Per epoch: the labels delivered over all ranks, the steps of each rank; and the iterators."""
    its = [DALIShardedIterator(make(world_size=world, rank=r, transfer=transfer)(), ["image", "cls"], audit=audit)
           for r in range(world)]  # fmt: skip
    out = []
    for _ in range(n):
        labels, steps = [], []
        for it in its:
            got = [b[0] for b in it]
            steps.append(len(got))
            labels += [int(c) for b in got for c in b["cls"].view(-1).tolist()]
        out.append((labels, steps))
    return out, its


@pytest.mark.parametrize("kind", ["zero", "bomb"])
def test_images_dali_rejects_are_skipped_over_two_epochs_and_two_ranks(make_shards, transfer, kind, caplog):
    """0x0 passes the workers' check and fails in DALI; 65000x65000 (a decompression bomb, for which
    DALI would allocate and keep 12 GB) is refused by the workers' check: both skipped alike."""
    bad = {5: kind, 23: kind}
    paths = shards(make_shards, (10, 0, 17, 9), bad)
    make = lambda **kw: decoding(paths, batch_size=4, py_num_workers=2, shuffle=True, on_error="skip", **kw)  # noqa: E731
    with caplog.at_level(logging.WARNING, logger="dali_shards"):
        result, its = epochs(make, 2, 2, transfer, audit=True)
    for labels, steps in result:
        assert sorted(labels) == [i for i in range(36) if i not in bad]
        assert len(set(steps)) == 1
    skipped = [s for it in its for inc in it.incidents for s in inc["samples"]]
    if kind == "zero":  # found in DALI once each, then skipped for the run
        assert sorted(s["index"] for s in skipped) == sorted(bad)
        assert all(s["key"] == f"s{s['index']:04d}" for s in skipped)
    else:
        assert not skipped
    if kind == "zero":  # (the workers log theirs in their own processes)
        assert len([r for r in caplog.records if "skipping sample" in r.getMessage()]) == len(bad)
    for epoch in range(2):  # each rank's audit counts the samples it skipped, in the epochs it met them
        skipped = sorted(i for it in its for i in it.audits[epoch]["skipped"])
        assert skipped == sorted(bad) and all(it.audits[epoch]["exactly_once"] for it in its)


def test_three_bad_samples_in_one_batch_and_a_resume_after(make_shards, transfer):
    bad = {0: "zero", 1: "zero", 2: "zero"}
    paths = shards(make_shards, (8, 8), bad)
    make = lambda **kw: decoding(paths, batch_size=4, py_num_workers=1, shuffle=False, on_error="skip", **kw)  # noqa: E731
    it = DALIShardedIterator(make(transfer=transfer)(), ["image", "cls"])  # the first batch fails at once
    first = next(it)[0]
    assert [int(c) for c in first["cls"].view(-1).tolist()] == [3]
    state = it.state_dict()
    assert state["excluded"] == [0, 1, 2] and len(json.dumps(state)) < 2000
    rest = [int(c) for b in it for c in b[0]["cls"].view(-1).tolist()]
    assert rest == list(range(4, 16))
    resumed = DALIShardedIterator(make(transfer=transfer, resume_from=state)(), ["image", "cls"])
    assert [int(c) for b in resumed for c in b[0]["cls"].view(-1).tolist()] == list(range(4, 16))
    again = [int(c) for b in resumed for c in b[0]["cls"].view(-1).tolist()]  # the next epoch: still skipped
    assert again == list(range(3, 16)) and not resumed.incidents


def test_a_bad_sample_in_the_last_padded_step(make_shards):
    bad = {12: "zero"}
    paths = shards(make_shards, (13,), bad)
    make = lambda **kw: decoding(paths, batch_size=4, py_num_workers=2, shuffle=False, on_error="skip", **kw)  # noqa: E731
    (result,), its = epochs(make, 1, 1, "ring")
    labels, steps = result
    assert sorted(labels) == list(range(12)) and steps == [4]


def test_a_user_operator_failing_on_one_sample_is_found_and_skipped(make_shards, transfer):
    paths = shards(make_shards, (9,), {})

    def check(cls):
        if int(cls) == 6:
            raise ValueError("no label 6 here")
        return cls

    @sharded_pipeline(paths, fields=("cls",), batch_size=3, py_num_workers=1, shuffle=False, on_error="skip",
                      transfer=transfer, num_threads=1, device_id=None)  # fmt: skip
    def pipe(cls):
        return fn.python_function(cls, function=check, num_outputs=1)

    it = DALIShardedIterator(pipe(), ["cls"])
    labels = [int(c) for b in it for c in b[0]["cls"].view(-1).tolist()]
    assert labels == [0, 1, 2, 3, 4, 5, 7, 8]
    (incident,) = it.incidents
    assert incident["samples"][0]["index"] == 6 and "python_function" in incident["operator"]
    assert incident["find_s"] < 30 and incident["rebuild_s"] < 30


def test_under_raise_one_typed_error_names_the_shard_the_key_and_the_operator(make_shards, transfer):
    paths = shards(make_shards, (6,), {4: "zero"})
    pipe = decoding(paths, batch_size=3, py_num_workers=1, shuffle=False, transfer=transfer)()
    it = DALIShardedIterator(pipe, ["image", "cls"])
    with pytest.raises(ShardFormatError) as err:
        for _ in it:
            pass
    text = str(err.value)
    assert paths[0] in text and "s0004" in text and "decoders.image" in text and "sample 4" in text


def test_nothing_is_probed_when_nothing_fails(make_shards):
    paths = shards(make_shards, (7, 5), {})
    (result,), its = epochs(
        lambda **kw: decoding(paths, batch_size=4, py_num_workers=2, on_error="skip", **kw), 1, 1, "ring"
    )
    assert sorted(result[0]) == list(range(12)) and not its[0].incidents
    assert Counter(result[0]).most_common(1)[0][1] == 1
    assert np.isfinite(0)


def test_a_bad_sample_read_ahead_never_stands_in_after_a_rebuild(make_shards, transfer):
    """After a rebuild the workers put a sample DALI took in the skipped places, not the next one
    they read (which may be bad too); len() and the audit still count the whole epoch."""
    bad = {2: "zero", 17: "zero"}
    paths = shards(make_shards, (20, 16), bad)
    make = lambda **kw: decoding(paths, batch_size=4, py_num_workers=2, shuffle=True, on_error="skip", **kw)  # noqa: E731
    it = DALIShardedIterator(make(transfer=transfer)(), ["image", "cls"], audit=True)
    lengths, labels = [], []
    for _ in range(2):
        for (batch,) in it:
            lengths.append(len(it))
            labels += [int(c) for c in batch["cls"].view(-1).tolist()]
    assert sorted(labels) == sorted(2 * [i for i in range(36) if i not in bad])
    assert set(lengths) == {9} and all(a["exactly_once"] and a["skipped"] == [2, 17] for a in it.audits)


def test_a_failure_in_the_batches_reset_discards_names_the_right_sample(make_shards):
    paths = shards(make_shards, (12, 12), {})

    def check(cls):
        if int(cls) == 9:
            raise ValueError("no label 9 here")
        return cls

    @sharded_pipeline(paths, fields=("cls",), batch_size=4, py_num_workers=2, shuffle=False, on_error="skip",
                      num_threads=1, device_id=None)  # fmt: skip
    def pipe(cls):
        return fn.python_function(cls, function=check, num_outputs=1)

    it = DALIShardedIterator(pipe(), ["cls"])
    for _ in range(3):
        next(it)
    it.reset()  # the batches left are read and discarded: sample 9 fails among them
    labels = [int(c) for b in it for c in b[0]["cls"].view(-1).tolist()]
    assert sorted(labels) == [i for i in range(24) if i != 9]
    assert [s["index"] for inc in it.incidents for s in inc["samples"]] == [9]


def test_the_ranks_plan_check_ignores_each_ranks_skip_list(make_shards):
    from dali_shards.pytorch.plancheck import plan_summary

    paths = shards(make_shards, (8, 8), {0: "zero"})
    make = lambda r: decoding(paths, batch_size=4, py_num_workers=1, on_error="skip", world_size=2, rank=r)()  # noqa: E731
    its = [DALIShardedIterator(make(r), ["image", "cls"]) for r in range(2)]  # a skip in a first batch
    states = [it.state_dict() for it in its]
    assert any("excluded" in s for s in states)
    sums = [plan_summary(s, len(it), it.info.spec, 0) for s, it in zip(states, its)]
    assert sums[0] == sums[1]


def test_a_state_whose_skip_list_repeats_a_sample_still_skips_new_failures(make_shards):
    paths = shards(make_shards, (8,), {5: "zero"})
    make = lambda **kw: decoding(paths, batch_size=4, py_num_workers=1, shuffle=False, on_error="skip", **kw)  # noqa: E731
    state = DALIShardedIterator(make()(), ["image", "cls"]).state_dict()
    state["excluded"] = [2, 2]
    it = DALIShardedIterator(make(resume_from=state)(), ["image", "cls"])
    assert [int(c) for b in it for c in b[0]["cls"].view(-1).tolist()] == [0, 1, 3, 4, 6, 7]


@pytest.mark.parametrize("on_error", ["skip", "raise"])
def test_separate_queues_name_and_skip_the_sample_dali_failed_on(make_shards, on_error):
    """With separate CPU and GPU queues DALI's CPU stage runs steps ahead of the batch fetched:
    the sample it failed on is looked for in every step in flight and checked before it is
    blamed (named wrongly, or a good sample skipped for the run, before)."""
    queues = {"cpu_size": 3, "gpu_size": 2}
    for bad_at in range(1, 36, 5):  # at different steps of the epoch
        paths = shards(make_shards, (10, 0, 17, 9), {bad_at: "zero"})
        pipe = decoding(paths, batch_size=4, py_num_workers=2, shuffle=True, on_error=on_error,
                        prefetch_queue_depth=queues, exec_dynamic=False)()  # fmt: skip
        if on_error == "raise":
            with pytest.raises(ShardFormatError, match=f"s{bad_at:04d}"):
                for _ in DALIShardedIterator(pipe, ["image", "cls"]):  # the first batch is fetched at once
                    pass
            continue
        it = DALIShardedIterator(pipe, ["image", "cls"], audit=True)
        labels = sorted(int(c) for (b,) in it for c in b["cls"].view(-1).tolist())
        assert labels == [i for i in range(36) if i != bad_at]
        assert [s["index"] for inc in it.incidents for s in inc["samples"]] == [bad_at]
        assert it.state_dict()["excluded"] == [bad_at], "only the bad sample is excluded for the run"


def test_a_step_of_only_bad_samples_is_skipped_and_the_rest_delivered(make_shards, transfer):
    """The first steps hold only samples DALI rejects, so no sample DALI took is known yet: one it
    takes is looked for further on to stand in, and the rest is delivered (a raw error before)."""
    bad = {i: "zero" for i in range(36) if i % 18 < 14}
    paths = shards(make_shards, (10, 0, 17, 9), bad)
    pipe = decoding(paths, batch_size=4, py_num_workers=2, shuffle=False, on_error="skip", transfer=transfer)()
    it = DALIShardedIterator(pipe, ["image", "cls"], audit=True)
    labels = sorted(int(c) for (b,) in it for c in b["cls"].view(-1).tolist())
    assert labels == [i for i in range(36) if i not in bad]
    assert it.audits[0]["exactly_once"] and sorted(it.audits[0]["skipped"]) == sorted(bad)


def test_a_dataset_dali_rejects_whole_is_one_clear_error(make_shards):
    paths = shards(make_shards, (10, 0, 17, 9), {i: "zero" for i in range(36)})
    pipe = decoding(paths, batch_size=4, py_num_workers=2, on_error="skip")()
    with pytest.raises(ShardFormatError, match="failed on every sample tried"):
        for _ in DALIShardedIterator(pipe, ["image", "cls"]):  # the first batch is fetched at once
            pass


def test_one_bad_sample_in_an_epoch_of_one_step_is_skipped(make_shards, transfer):
    """DALI names the bad sample's place before any batch was delivered, and the epoch ends within
    the steps in flight: a sample DALI takes is found among the step's others to stand in (a false
    'failed on every sample' before)."""
    paths = shards(make_shards, (4,), {1: "zero"})
    it = DALIShardedIterator(decoding(paths, batch_size=4, py_num_workers=2, on_error="skip", transfer=transfer)(),
                             ["image", "cls"], audit=True)  # fmt: skip
    labels = sorted(int(c) for (b,) in it for c in b["cls"].view(-1).tolist())
    assert labels == [0, 2, 3] and it.audits[0]["exactly_once"] and it.audits[0]["skipped"] == [1]


def test_a_state_loaded_after_a_skip_in_its_epoch_counts_that_epoch_from_the_state(make_shards):
    """The epoch's plan held over a skip's rebuild is let go when a state is loaded: len(), the
    batches and the audit count the epoch from the state (len() said the whole epoch before)."""
    paths = shards(make_shards, (16,), {9: "zero"})
    pipe = decoding(paths, batch_size=4, py_num_workers=1, shuffle=False, on_error="skip")
    it = DALIShardedIterator(pipe(), ["image", "cls"], audit=True)
    next(it)
    state = it.state_dict()  # after step 0 of epoch 0
    next(it), next(it)  # step 2 holds sample 9: skipped, the pipeline rebuilt inside the epoch
    assert [s["index"] for inc in it.incidents for s in inc["samples"]] == [9]
    it.load_state_dict(state)
    assert (it.epoch, it.step, len(it)) == (0, 1, 3)
    labels = [int(c) for b in it for c in b[0]["cls"].view(-1).tolist()]
    assert labels == [i for i in range(4, 16) if i != 9]
    assert [a["exactly_once"] for a in it.audits] == [True]
