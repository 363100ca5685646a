"""End to end through DALI (CPU-only pipelines): real JPEG shards, simulated ranks, real workers."""

import hashlib
import math
import re
import traceback
from collections import Counter

import numpy as np
import pytest
import webdataset as wds
from nvidia.dali import types
from PIL import Image

from dali_shards.testing.pipelines import identity_pipeline, run_epochs
from dali_shards import ConfigError, EmptyDatasetError, decode_image, pipeline_info, sharded_pipeline
from dali_shards.sample_data import sample_images


def index_pipeline(source, **kw):
    return identity_pipeline(source, ("__index__", "__valid__"), **kw)


@pytest.mark.parametrize(
    "world, workers, batch, shuffle, last_batch",
    [
        (2, 2, 4, True, "pad"),
        (3, 2, 6, True, "pad"),  # odd world size; 47 samples do not divide
        (1, 3, 6, False, "drop"),
        (2, 1, 5, True, "drop"),
        (4, 4, 4, True, "pad"),  # 16 virtual workers, shards of 0..17 samples
    ],
)
def test_pipelines_deliver_the_plan_exactly_once(photo_shards, world, workers, batch, shuffle, last_batch, transfer):
    make = index_pipeline(
        photo_shards["pattern"],
        transfer=transfer,
        batch_size=batch,
        py_num_workers=workers,
        shuffle=shuffle,
        seed=17,
        world_size=world,
        last_batch=last_batch,
        shuffle_buffer=5,
    )
    per_epoch = [Counter(), Counter()]
    steps = []
    for rank in range(world):
        pipe = make(rank=rank)
        info = pipeline_info(pipe)
        epochs = run_epochs(pipe, 2)
        steps.append([len(e) for e in epochs])
        for epoch, epoch_steps in enumerate(epochs):
            want_index, want_valid = info.plan(epoch).rank_batches(rank)
            assert len(epoch_steps) == info.steps_per_epoch
            for s, (index, valid) in enumerate(epoch_steps):
                assert [int(i) for i in index] == want_index[s].tolist()
                assert [bool(v) for v in valid] == want_valid[s].tolist()
                per_epoch[epoch].update(int(i) for i, v in zip(index, valid) if v)
    assert len({tuple(s) for s in steps}) == 1, "every rank runs the same number of steps"
    total = photo_shards["total"]
    for seen in per_epoch:
        assert max(seen.values()) == 1, "no sample twice"
        if last_batch == "pad":
            assert sorted(seen) == list(range(total)), "every sample once"
        else:
            assert len(seen) == total // (world * batch) * world * batch


def test_more_virtual_workers_than_samples(tmp_path, workers):
    from dali_shards.sample_data import write_sample_shards

    write_sample_shards(str(tmp_path), shard_sizes=(2, 0, 1))
    world = 4 if workers == 1 else 2  # 4 or 6 virtual workers for 3 samples

    make = identity_pipeline(str(tmp_path / "sample-*.tar"), ("jpg", "__index__", "__valid__"), batch_size=workers,
                             py_num_workers=workers, world_size=world, shuffle=True)  # fmt: skip

    seen = Counter()
    for rank in range(world):
        (steps,) = run_epochs(make(rank=rank), 1)
        assert len(steps) == 1
        for jpg, index, valid in steps:
            assert all(j.size > 1000 for j in jpg), "padding slots hold a real sample"
            assert len(index) == workers
            seen.update(int(i) for i, v in zip(index, valid) if v)
    assert sorted(seen) == [0, 1, 2] and max(seen.values()) == 1


@pytest.fixture(params=["one worker", "two workers"])
def workers(request):
    """Workers per rank: under the merge transfer one worker uses the packed layout, more use the
    table layout (the ring uses its table whatever the number)."""
    return {"one worker": 1, "two workers": 2}[request.param]


def test_labels_keys_and_images_match(photo_shards, workers, transfer):
    photos = sample_images()
    originals = [open(p.path, "rb").read() for p in photos]

    @sharded_pipeline(
        photo_shards["paths"],
        fields=("jpg", "cls", "__key__", "__index__", "__valid__"),
        batch_size=4,
        py_num_workers=workers,
        world_size=2,
        shuffle=True,
        seed=3,
        num_threads=2,
        device_id=None,
        transfer=transfer,
    )
    def pipe(jpg, cls, key, index, valid):
        return jpg, decode_image(jpg), cls, key, index, valid

    checked = 0
    for rank in range(2):
        p = pipe(rank=rank)
        assert pipeline_info(p).packing.table == (workers > 1 or transfer == "ring")
        (steps,) = run_epochs(p, 1)
        for jpg, image, cls, key, index, valid in steps:
            for j, img, c, k, i, v in zip(jpg, image, cls, key, index, valid):
                photo = int(i) % len(photos)
                assert c.dtype == np.int64 and c.shape == () and int(c) == photos[photo].label
                assert i.dtype == np.int64 and v.dtype == np.bool_
                assert bytes(k).decode() == f"{int(i):06d}"
                assert j.dtype == np.uint8 and j.ndim == 1
                assert hashlib.sha1(j.tobytes()).digest() == hashlib.sha1(originals[photo]).digest()
                w, h = Image.open(photos[photo].path).size
                assert img.shape == (h, w, 3)
                checked += bool(v)
    assert checked == 47


def test_same_seed_same_order_and_new_order_each_epoch(photo_shards):
    make = index_pipeline(photo_shards["pattern"], batch_size=4, py_num_workers=2, shuffle=True, seed=123)
    first = run_epochs(make(), 2)
    again = run_epochs(make(), 2)
    other = run_epochs(make(seed=124), 1)

    def order(steps):
        return [int(i) for index, _ in steps for i in index]

    assert order(first[0]) == order(again[0]) and order(first[1]) == order(again[1])
    assert order(first[0]) != order(first[1]), "reshuffled each epoch"
    assert order(first[0]) != order(other[0]), "the seed matters"


def test_start_epoch_continues_the_schedule(photo_shards):
    make = index_pipeline(photo_shards["pattern"], batch_size=4, py_num_workers=2, shuffle=True, seed=5)
    run = run_epochs(make(), 3)
    later = run_epochs(make(start_epoch=2), 1)
    assert [int(i) for s in run[2] for i in s[0]] == [int(i) for s in later[0] for i in s[0]]


def test_third_party_shard_matches_webdataset(workers, mnist_shard):
    want = {s["__key__"]: int(s["cls"]) for s in wds.WebDataset(mnist_shard, shardshuffle=False)}

    @sharded_pipeline(
        mnist_shard,
        fields=("png", "cls", "__key__", "__valid__"),
        batch_size=8,
        py_num_workers=workers,
        num_threads=1,
        device_id=None,
    )
    def pipe(png, cls, key, valid):
        return decode_image(png, output_type=types.GRAY), cls, key, valid

    (steps,) = run_epochs(pipe(), 1)
    got = {}
    for image, cls, key, valid in steps:
        for img, c, k, v in zip(image, cls, key, valid):
            assert img.shape == (28, 28, 1)
            if v:
                got[bytes(k).decode()] = int(c)
    assert got == want and len(got) == 90


def test_missing_field_error_names_shard_and_sample(make_shards):
    """A field only some samples lack: the run stops at the first such sample, naming it."""

    def sample(index, shard, position):
        return {"__key__": f"{index:06d}", "bin": b"x", **({} if index == 5 else {"txt": b"y"})}

    paths = make_shards((4, 4), sample, prefix="some-lack-txt")

    @sharded_pipeline(paths, fields=("bin", "txt"), batch_size=2, py_num_workers=2, num_threads=1, device_id=None)
    def pipe(jpg, txt):
        return jpg, txt

    p = pipe()  # (the first sample has the field: not refused when built)
    p.build()
    with pytest.raises(Exception) as err:
        for _ in range(4):
            p.run()
    text = str(err.value)
    assert re.search(r"shard '[^']*some-lack-txt-000001\.tar', sample '000005': no member for field 'txt'", text), text
    assert "What to do" in text
    assert "NotDirect" not in "".join(traceback.format_exception(err.value)), "the fast path's hand-over is not shown"


def test_a_misspelled_field_is_one_error_when_the_pipeline_is_built(photo_shards):
    """fields=("jpeg", "cls") on .jpg shards: a ConfigError at build naming the field, with the
    extensions the samples hold and the nearest one, not an error chain at the first batch."""

    @sharded_pipeline(photo_shards["pattern"], fields=("jpeg", "cls"), batch_size=2, py_num_workers=1, device_id=None)
    def pipe(jpg, cls):
        return jpg, cls

    with pytest.raises(ConfigError) as err:
        pipe()
    text = str(err.value)
    assert "field 'jpeg' is in no sample read" in text and "(they have: cls, jpg): did you mean 'jpg'?" in text, text
    assert err.value.__cause__ is None and err.value.__context__ is None


def test_a_function_whose_parameters_do_not_match_the_fields_is_a_config_error(photo_shards):
    @sharded_pipeline(photo_shards["pattern"], fields=("jpg", "cls"), batch_size=2, py_num_workers=1, device_id=None)
    def pipe(jpg):
        return jpg

    with pytest.raises(ConfigError, match=r"pipe\(jpg\) cannot take the fields: .*fields=\('jpg', 'cls'\).*give pipe one "
                       r"parameter per field"):
        pipe()

    @sharded_pipeline(photo_shards["pattern"], fields=("jpg",), batch_size=2, py_num_workers=1, device_id=None)
    def scaled(jpg, factor):
        return jpg

    with pytest.raises(ConfigError, match=r"scaled\(jpg, factor\) cannot take the fields"):
        scaled()
    scaled(factor=2)  # given when called: fine


def test_configuration_errors(photo_shards):
    with pytest.raises(ConfigError, match="multiple of py_num_workers"):
        index_pipeline(photo_shards["pattern"], batch_size=5, py_num_workers=2)()
    with pytest.raises(EmptyDatasetError):
        index_pipeline(photo_shards["pattern"], batch_size=48, py_num_workers=1, last_batch="drop")()
    with pytest.raises(ConfigError, match="unknown keyword.*'no_such_option'"):
        index_pipeline(photo_shards["pattern"], batch_size=4, py_num_workers=2)(no_such_option=1)
    with pytest.raises(ConfigError, match="'shufle' \\(did you mean 'shuffle'\\?\\)"):
        index_pipeline(photo_shards["pattern"], batch_size=4, py_num_workers=2)(shufle=True)
    with pytest.raises(ConfigError, match="fields"):
        sharded_pipeline(photo_shards["pattern"], fields="jpg", batch_size=2, py_num_workers=1)


def test_a_misspelled_option_is_refused_when_the_decorator_runs(photo_shards, capfd):
    """Not later, inside DALI's Pipeline (a TypeError and a Pipeline.__del__ traceback)."""
    with pytest.raises(ConfigError, match="'shufle' \\(did you mean 'shuffle'\\?\\)") as err:
        sharded_pipeline(photo_shards["pattern"], fields=("jpg",), batch_size=2, py_num_workers=1, shufle=True)
    assert isinstance(err.value, TypeError)  # also what Python raises for an unexpected keyword
    assert str(err.value).endswith("must be a sharded_pipeline option (help(sharded_pipeline) lists them) or a DALI "
                                   "Pipeline parameter"), str(err.value)
    with pytest.raises(ConfigError) as err:
        index_pipeline(photo_shards["pattern"], batch_size=4, py_num_workers=2)(no_such_option=1)
    assert str(err.value).endswith("(help(sharded_pipeline) lists them), a DALI Pipeline parameter, or a parameter of "
                                   "the function"), str(err.value)
    with pytest.raises(ConfigError, match="'num_thread' \\(did you mean 'num_threads'\\?\\)"):
        sharded_pipeline(photo_shards["pattern"], fields=("jpg",), batch_size=2, py_num_workers=1, num_thread=1)
    sharded_pipeline(photo_shards["pattern"], fields=("jpg",), batch_size=2, py_num_workers=1, enable_conditionals=True)
    assert "Traceback" not in capfd.readouterr().err


def test_function_parameters_and_overrides(photo_shards):
    @sharded_pipeline(
        photo_shards["pattern"], fields=("__index__",), batch_size=2, py_num_workers=1, num_threads=1, device_id=None
    )
    def pipe(index, offset=0):
        return index + offset

    (steps,) = run_epochs(pipe(offset=1000, batch_size=47), 1)
    assert [int(i) for i in steps[0][0]] == list(range(1000, 1047))


def test_sixteen_workers_deliver_the_plan(photo_shards):
    p = index_pipeline(photo_shards["pattern"], batch_size=16, py_num_workers=16, shuffle=True, seed=8)()
    info = pipeline_info(p)
    (steps,) = run_epochs(p, 1)
    want_index, want_valid = info.plan(0).rank_batches(0)
    assert [[int(i) for i in index] for index, _ in steps] == want_index.tolist()
    assert [[bool(v) for v in valid] for _, valid in steps] == want_valid.tolist()


@pytest.mark.parametrize("workers", [2, 5, 8])
def test_merge_is_a_balanced_tree(photo_shards, workers, monkeypatch):
    """The merge transfer's tree of conditional splits and merges: ceil(log2 N) levels, N - 1 inner
    nodes (a linear if/elif chain needs N - 1 levels), counted where our graph builds it."""
    from dali_shards.transfer.merge import graph

    real, depth, seen = graph._merge_range, [0], {"calls": 0, "deepest": 0}

    def counting(owner, slices, lo):
        depth[0] += 1
        seen["calls"] += 1
        seen["deepest"] = max(seen["deepest"], depth[0])
        try:
            return real(owner, slices, lo)
        finally:
            depth[0] -= 1

    monkeypatch.setattr(graph, "_merge_range", counting)
    p = index_pipeline(photo_shards["pattern"], batch_size=workers, py_num_workers=workers, transfer="merge")()
    p.build()
    assert seen["calls"] == 2 * workers - 1, "N leaves and N - 1 inner nodes, once per field group"
    assert seen["deepest"] == math.ceil(math.log2(workers)) + 1


def test_spawned_workers(photo_shards):
    make = index_pipeline(
        photo_shards["pattern"], batch_size=4, py_num_workers=2, shuffle=True, seed=2, py_start_method="spawn"
    )
    spawned = run_epochs(make(), 2)
    forked = run_epochs(make(py_start_method="fork"), 2)
    assert [[int(i) for s in e for i in s[0]] for e in spawned] == [[int(i) for s in e for i in s[0]] for e in forked]


def test_decode_helper_uses_cpu_without_gpu(photo_shards):
    @sharded_pipeline(
        photo_shards["pattern"], fields=("jpg",), batch_size=2, py_num_workers=1, num_threads=1, device_id=None
    )
    def pipe(jpg):
        return decode_image(jpg)

    p = pipe()
    p.build()
    (out,) = p.run()
    assert type(out).__name__ == "TensorListCPU" and out[0].shape()[-1] == 3
