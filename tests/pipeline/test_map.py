"""map= in real DALI pipelines: user Python per sample in the workers (lambdas, closures, bound
methods, under fork and spawn), its outputs through the slots, its errors under both on_error
modes, .npy fields, and a detection-style pipeline on the built-in photos."""

import io
import json
import time
from collections import Counter

import numpy as np
import pytest
import torch
from nvidia.dali import fn, types

from dali_shards import ConfigError, ShardMapError, WorkerError, sharded_pipeline
from dali_shards.pytorch import DALIShardedIterator
from dali_shards.sample_data import sample_images
from dali_shards.testing.pipelines import identity_pipeline, run_epochs
from dali_shards.tools.writer import write_shard

SIZES = (5, 0, 7, 3)


@pytest.fixture(scope="module")
def shards(make_shards):
    return make_shards(SIZES)


class Scaler:
    """An object with state whose bound method is the map."""

    def __init__(self, factor):
        self.factor = factor

    def __call__(self, s):
        return self.apply(s)

    def apply(self, s):
        return {"jpg": s["jpg"], "label": s["cls"], "vec": np.arange(3, dtype=np.float32) * s["cls"] * self.factor,
                "grid": np.full((s["cls"] % 3, 2), s["__key__"], dtype="U8").astype(np.int16), "key": s["__key__"].encode()}  # fmt: skip


def closure(factor):
    def apply(s):
        return Scaler(factor).apply(s)

    return apply


MAPS = {
    "lambda": lambda s: Scaler(2.0).apply(s),
    "closure": closure(2.0),
    "bound method": Scaler(2.0).apply,
}


def check(out):
    labels = []
    for jpg, label, vec, grid, key, valid in out:
        for i in range(len(label)):
            assert vec[i].dtype == np.float32 and np.allclose(vec[i], np.arange(3) * int(label[i]) * 2.0)
            assert grid[i].shape == (int(label[i]) % 3, 2) and grid[i].dtype == np.int16
            assert (grid[i] == int(bytes(key[i]))).all() and jpg[i][:2].tobytes() == b"\xff\xd8"
            if valid[i]:
                labels.append(int(bytes(key[i])))
    return labels


@pytest.mark.parametrize("start", ["fork", "spawn"])
@pytest.mark.parametrize("kind", list(MAPS))
def test_user_maps_run_in_the_workers(shards, kind, start):
    for workers in (1, 2) if start == "fork" else (2,):

        @sharded_pipeline(shards, fields=("jpg", "cls"), map=MAPS[kind], batch_size=2 * workers, py_num_workers=workers,
                          shuffle=True, num_threads=1, device_id=None, py_start_method=start)  # fmt: skip
        def pipe(jpg, label, vec, grid, key, __valid__):
            return jpg, label, vec, grid, key, __valid__

        keys = check(run_epochs(pipe(), 1)[0])
        assert sorted(keys) == list(range(sum(SIZES))), "every sample once, its outputs its own"


def torch_features(s):
    g = torch.Generator().manual_seed(int(s["cls"]))
    x = torch.randn(64, 256, generator=g) @ torch.randn(256, 256, generator=g)  # uses torch's thread pool
    return {"label": s["cls"], "feat": x.sum(0).numpy()}


def test_a_map_with_torch_ops_runs_in_forked_workers(shards):
    torch.set_num_threads(2)  # the parent's pool, used by the build-time probe, then inherited through fork
    (torch.randn(64, 256) @ torch.randn(256, 256)).sum()

    @sharded_pipeline(shards, fields=("cls",), map=torch_features, batch_size=4, py_num_workers=2, num_threads=1,
                      device_id=None, py_start_method="fork", worker_timeout=20)  # fmt: skip
    def pipe(label, feat):
        return label, feat

    batches = list(DALIShardedIterator(pipe(), ["label", "feat"]))
    assert sum(len(b["label"]) for (b,) in batches) == sum(SIZES) and batches[0][0]["feat"].shape == (4, 256)


def test_a_map_that_cannot_be_pickled_is_refused_when_the_pipeline_is_built(shards):
    ids = (i for i in range(10))
    with pytest.raises(ConfigError, match="map=.*cannot be pickled"):

        @sharded_pipeline(shards, fields=("cls",), map=lambda s: {"n": next(ids)}, batch_size=2, py_num_workers=1,
                          device_id=None)  # fmt: skip
        def pipe(n):
            return n

        pipe()


def draws(s):
    import random

    return {"i": s["__index__"], "r": np.array([random.random(), np.random.rand(), float(torch.rand(1))])}


def augmentations(shards, workers, start="fork"):
    """Per epoch, each sample's draws from the three global RNGs in the map."""
    @sharded_pipeline(shards, fields=("__index__",), map=draws, batch_size=2 * workers, py_num_workers=workers,
                      shuffle=True, num_threads=1, device_id=None, py_start_method=start)  # fmt: skip
    def pipe(i, r, __valid__):
        return i, r, __valid__

    return [{int(i): r.tolist() for step in epoch for i, r, ok in zip(*step) if ok} for epoch in run_epochs(pipe(), 2)]


def test_random_augmentations_are_the_same_under_any_layout_and_differ_by_epoch(shards):
    import random

    before = (random.getstate(), np.random.get_state()[1].tolist())
    one = augmentations(shards, 1)
    assert one == augmentations(shards, 2) == augmentations(shards, 2, "spawn"), "seeded per sample, not per worker"
    assert all(one[0][i] != one[1][i] for i in one[0]), "a new draw each epoch"
    assert len({tuple(r) for r in one[0].values()}) == sum(SIZES), "and each sample its own"
    assert (random.getstate(), np.random.get_state()[1].tolist()) == before, "the main process's RNGs untouched"


class LoadsOnlyHere:
    """Pickles, but refuses to be loaded in another process."""

    def __init__(self):
        self.state = "some"

    def __setstate__(self, state):
        raise RuntimeError("not loadable elsewhere")

    def __call__(self, s):
        return {"label": s["cls"]}


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_map_that_cannot_be_loaded_in_a_worker_is_one_clear_error(shards, on_error):
    @sharded_pipeline(shards, fields=("cls",), map=LoadsOnlyHere(), batch_size=4, py_num_workers=2, num_threads=1,
                      device_id=None, py_start_method="spawn", on_error=on_error)  # fmt: skip
    def pipe(label):
        return label

    with pytest.raises(ConfigError, match=r"map=LoadsOnlyHere was pickled but cannot be loaded in a worker.*not loadable"):
        for _ in DALIShardedIterator(pipe(), ["label"]):
            pass


def flaky(s):
    if s["__key__"] in ("000006", "000013"):
        raise KeyError("no such box")
    return {"label": s["cls"]}


def make(shards, **kw):
    options = dict(map=flaky, batch_size=4, py_num_workers=2, **kw)
    return identity_pipeline(shards, ("cls", "__index__"), outputs="label", **options)


def test_user_errors_stop_the_epoch_with_the_original_traceback(shards, transfer):
    with pytest.raises(ShardMapError, match=r"sample '0000(06|13)'.*map \(flaky\) raised KeyError") as err:
        for _ in DALIShardedIterator(make(shards, transfer=transfer)(), ["label"]):
            pass
    assert "in flaky" in str(err.value) and "raise KeyError" in str(err.value), "the user's traceback"
    assert "sample-00000" in err.value.url and "stage.py" not in str(err.value)
    assert err.value.key in ("000006", "000013") and "error object" not in str(err.value), "the worker's own object"
    assert err.value.__cause__ is None or transfer == "ring"


def test_user_errors_are_skipped_and_counted_keeping_exactly_once(shards):
    it = DALIShardedIterator(make(shards, on_error="skip")(), ["label"], audit=True)
    for _ in range(2):
        labels = [int(x) for (b,) in it for x in b["label"]]
        assert len(labels) == sum(SIZES) - 2
        audit = it.audits[-1]
        assert sorted(audit["skipped"]) == [6, 13] and not audit["duplicates"] and audit["exactly_once"], audit


def test_an_output_that_changes_type_or_cannot_go_to_dali_is_named(shards):
    def drifting(s):
        return {"x": np.zeros(3, np.float32 if s["__key__"] < "000010" else np.float64)}

    @sharded_pipeline(shards, fields=("cls",), map=drifting, batch_size=4, py_num_workers=2, device_id=None)
    def pipe(x):
        return x

    with pytest.raises(ShardMapError, match="output 'x' is a float64 array.*float32 array .* in the first sample"):
        for _ in DALIShardedIterator(pipe(), ["x"]):
            pass

    @sharded_pipeline(shards, fields=("cls",), map=lambda s: {"x": "text"}, batch_size=4, py_num_workers=2, device_id=None)
    def strings(x):
        return x

    with pytest.raises(ShardMapError, match="output 'x' is a str"):
        strings()  # the first sample is run when the pipeline is built


def test_npy_fields_travel_as_arrays_without_a_map(tmp_path):
    def npy(a):
        buf = io.BytesIO()
        np.save(buf, a)
        return buf.getvalue()

    samples = [{"__key__": f"{i:03d}", "npy": npy(np.full((i % 4, 3), i, np.float32)), "cls": i} for i in range(10)]
    write_shard(str(tmp_path / "a.tar"), samples)
    for workers in (1, 2):

        @sharded_pipeline(str(tmp_path / "a.tar"), fields=("npy", "cls"), batch_size=2 * workers, py_num_workers=workers,
                          device_id=None)  # fmt: skip
        def pipe(arr, cls):
            return arr, cls

        seen = Counter()
        for arr, cls in run_epochs(pipe(), 1)[0]:
            for a, c in zip(arr, cls):
                assert a.dtype == np.float32 and a.shape == (int(c) % 4, 3) and (a == int(c)).all()
                seen[int(c)] += 1
        assert sorted(seen) == list(range(10))


def boxes_to_arrays(s):
    objects = s["json"]["objects"]
    return {"jpg": s["jpg"], "boxes": np.array([o["box"] for o in objects], np.float32).reshape(-1, 4),
            "labels": np.array([o["label"] for o in objects], np.int64)}  # fmt: skip


def test_detection_boxes_and_labels_from_json_crop_and_flip_with_the_image(tmp_path):
    rng = np.random.default_rng(0)
    samples, want = [], {}
    for i, image in enumerate(sample_images()[:12]):
        n = i % 4  # 0 to 3 boxes, ltrb in relative coordinates
        lt = rng.uniform(0, 0.5, (n, 2))
        boxes = np.concatenate([lt, lt + rng.uniform(0.1, 0.5, (n, 2))], axis=1).clip(0, 1).round(3)
        doc = {"objects": [{"box": b.tolist(), "label": int(i * 10 + k)} for k, b in enumerate(boxes)]}
        samples.append({"__key__": f"{i:04d}", "jpg": open(image.path, "rb").read(), "json": json.dumps(doc)})
        want[i] = (boxes, [o["label"] for o in doc["objects"]])
    write_shard(str(tmp_path / "det.tar"), samples)

    @sharded_pipeline(str(tmp_path / "det.tar"), fields=("jpg", "json", "__index__"), map=boxes_to_arrays,
                      batch_size=4, py_num_workers=2, num_threads=1, device_id=None)  # fmt: skip
    def det(jpg, boxes, labels, __index__):
        anchor, shape, crop_boxes, crop_labels = fn.random_bbox_crop(
            boxes, fn.cast(labels, dtype=types.INT32), device="cpu", aspect_ratio=[0.5, 2.0], thresholds=[0.0], scaling=[0.3, 1.0],
            bbox_layout="xyXY", allow_no_crop=True,
        )  # fmt: skip
        images = fn.decoders.image_slice(jpg, anchor, shape, output_type=types.RGB)
        flip = fn.random.coin_flip(probability=0.5)
        return images, fn.bb_flip(crop_boxes, ltrb=True, horizontal=flip), crop_labels, boxes, labels, __index__

    for images, out_boxes, out_labels, boxes, labels, index in run_epochs(det(), 1)[0]:
        for k in range(len(index)):
            i = int(index[k])
            assert boxes[k].shape == (len(want[i][1]), 4) and np.allclose(boxes[k], want[i][0], atol=1e-6)
            assert labels[k].tolist() == want[i][1], "labels travel with their image"
            assert images[k].ndim == 3 and images[k].shape[2] == 3
            assert out_boxes[k].shape[1:] == (4,) and set(out_labels[k].reshape(-1).tolist()) <= set(want[i][1])
            assert ((out_boxes[k] >= -1e-6) & (out_boxes[k] <= 1 + 1e-6)).all()


def test_the_streaming_mode_maps_too(shards):
    @sharded_pipeline(shards, fields=("cls",), map=lambda s: {"v": np.full(2, s["cls"], np.int32)}, batch_size=4,
                      py_num_workers=2, samples_per_epoch=16, num_threads=1, device_id=None)  # fmt: skip
    def pipe(v):
        return v

    steps = run_epochs(pipe(), 1)[0]
    assert len(steps) == 4 and all(a.dtype == np.int32 and a.shape == (2,) and a[0] == a[1] for (v,) in steps for a in v)


BUF = np.zeros(4, dtype=np.int64)


def reusing_map(s):
    """A map that returns its own buffer, and a view of it, reused for every sample."""
    BUF[:] = s["__index__"]
    return {"x": BUF, "y": BUF[1:3], "z": memoryview(BUF.view(np.uint8))}


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_a_map_may_reuse_its_buffers(tmp_path, workers):
    """Each output's value is taken when the map returns: no sample carries another's values."""
    paths = [str(tmp_path / f"r-{i}.tar") for i in range(4)]
    for i, path in enumerate(paths):
        write_shard(path, [{"__key__": f"k{30 * i + j:04d}", "txt": b"x"} for j in range(30)])

    @sharded_pipeline(paths, fields=("__index__", "txt"), map=reusing_map, batch_size=4 * workers,
                      py_num_workers=workers, shuffle=True, num_threads=1, device_id=None)  # fmt: skip
    def pipe(x, y, z, __index__, __valid__):
        return x, y, z, __index__, __valid__

    seen = []
    for x, y, z, index, valid in run_epochs(pipe(), 1)[0]:
        for i in range(len(index)):
            want = int(index[i])
            assert (x[i] == want).all() and (y[i] == want).all(), (x[i], y[i], want)
            assert (np.frombuffer(z[i].tobytes(), dtype=np.int64) == want).all()
            seen += [want] if valid[i] else []
    assert sorted(seen) == list(range(120))


def hang_on_k0025(s):
    if s["__key__"] == "k0025":
        time.sleep(600)
    return {"i": s["__index__"]}


def test_a_map_that_hangs_is_reported_in_the_shard_of_its_sample(tmp_path):
    """Interleaving reads a sample of another shard each time: the watchdog names the shard of the
    sample the map hangs on, not the shard the worker opened last."""
    paths = [str(tmp_path / f"h-{i:04d}.tar") for i in range(12)]
    for i, path in enumerate(paths):
        write_shard(path, [{"__key__": f"k{10 * i + j:04d}", "txt": b"x"} for j in range(10)])

    @sharded_pipeline(paths, fields=("__index__", "txt"), map=hang_on_k0025, batch_size=4, py_num_workers=2,
                      shuffle=True, num_threads=1, device_id=None, worker_timeout=2)  # fmt: skip
    def pipe(i):
        return i

    pipe_ = pipe()
    assert pipe_.dali_shards.plan(0).interleaving
    with pytest.raises(WorkerError) as err:
        for _ in DALIShardedIterator(pipe_, ["i"]):
            pass
    message = str(err.value)
    assert "made no progress" in message and "h-0002.tar" in message, message
    assert not any(f"h-{i:04d}.tar" in message for i in range(12) if i != 2), message
