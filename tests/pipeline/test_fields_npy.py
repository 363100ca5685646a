"""``.npy`` fields and ``map`` outputs of dtypes DALI cannot carry, through real pipelines on both
transfers: a typed error naming the field (the shard and the sample) or the output, never DALI's
``TypeError``/``KeyError``; with ``on_error="skip"``, the sample is a counted skip."""

import numpy as np
import pytest

from dali_shards import ShardFormatError, ShardMapError, sharded_pipeline
from dali_shards.pytorch import DALIShardedIterator
from dali_shards.testing.shards import npy, write_shards

UNCARRIED = {
    "complex64": np.arange(3).astype(np.complex64),
    "unicode": np.array(["ab", "c", "d"]),
    "datetime": np.arange(3).astype("datetime64[s]"),
    "structured": np.zeros(3, [("a", "<i4"), ("b", "<f4")]),
    "object": np.array([{}, 1, "x"], dtype=object),
}
TOTAL = 12


def shards(tmp_path, bad, at):
    """Two shards of 6 samples with float32 .npy members; sample ``at``'s is ``bad``."""

    def sample(i, shard, position):
        return {"__key__": f"{i:06d}", "npy": npy(bad if i == at else np.full(3, i, np.float32)), "cls": b"%d" % i}

    return write_shards(tmp_path, (6, 6), sample, name="v-{shard}.tar")


def epoch(paths, transfer, on_error, workers=2, **kw):
    """{__index__: the sample's array} of one epoch, and its audit."""

    @sharded_pipeline(paths, fields=("npy", "cls", "__index__"), batch_size=2 * workers, py_num_workers=workers,
                      on_error=on_error, num_threads=1, device_id=None, transfer=transfer, **kw)  # fmt: skip
    def pipe(arr, cls, index):
        return arr, cls, index

    it = DALIShardedIterator(pipe(), ["arr", "cls", "index"], audit=True, dynamic_shape=True)
    got = {}
    for (b,) in it:
        for a, index in zip(b["arr"], b["index"].tolist()):
            got[index] = a.numpy()
    return got, it.audits[-1]


@pytest.mark.parametrize("at", [0, 8], ids=["the first sample", "a later sample"])
@pytest.mark.parametrize("array", list(UNCARRIED.values()), ids=list(UNCARRIED))
def test_an_npy_field_dali_cannot_carry_is_named_or_skipped(tmp_path, transfer, array, at):
    paths = shards(tmp_path, array, at)
    with pytest.raises(ShardFormatError, match="field 'npy'") as err:
        epoch(paths, transfer, "raise")
    assert err.value.key == f"{at:06d}" and err.value.url.endswith(f"v-{at // 6}.tar")
    if array.dtype != object:  # (pickled objects: "not a readable .npy array", with its own hint)
        assert "DALI cannot carry" in str(err.value) and "float32" in str(err.value.hint)
    got, audit = epoch(paths, transfer, "skip")
    assert sorted(got) == [i for i in range(TOTAL) if i != at] and audit["skipped"] == [at]
    assert all(a.dtype == np.float32 and (a == i).all() for i, a in got.items())


def mapped(paths, transfer, on_error, dtype, at):
    """{label: x} of one epoch of a map that returns ``x`` of ``dtype`` for sample ``at``, and its audit."""

    def odd(s):
        return {"x": np.zeros(2, dtype) if s["cls"] == at else np.full(2, s["cls"], np.float32), "label": s["cls"]}

    @sharded_pipeline(paths, fields=("cls",), map=odd, batch_size=4, py_num_workers=2, on_error=on_error,
                      num_threads=1, device_id=None, transfer=transfer)  # fmt: skip
    def pipe(x, label):
        return x, label

    it = DALIShardedIterator(pipe(), ["x", "label"], audit=True)
    got = {}
    for (b,) in it:
        got.update((int(c), x.numpy()) for x, c in zip(b["x"], b["label"].tolist()))
    return got, it.audits[-1]


@pytest.mark.parametrize("at", [0, 8], ids=["the first sample", "a later sample"])
@pytest.mark.parametrize("dtype", ["complex64", "U2", "datetime64[s]", "i4,f4"])
def test_a_map_output_dali_cannot_carry_is_named_or_skipped(tmp_path, transfer, dtype, at):
    paths = shards(tmp_path, np.zeros(3, np.float32), -1)
    with pytest.raises(ShardMapError, match="output 'x' is ndarray of dtype .* which DALI cannot take") as err:
        mapped(paths, transfer, "raise", dtype, at)
    assert err.value.key == f"{at:06d}" and "float32" in str(err.value)
    got, audit = mapped(paths, transfer, "skip", dtype, at)
    assert sorted(got) == [i for i in range(TOTAL) if i != at] and audit["skipped"] == [at]
    assert all(x.dtype == np.float32 and (x == i).all() for i, x in got.items())
