"""``.npy`` fields of dtypes DALI cannot carry (complex, strings, datetimes, structured, objects):
a ``ShardFormatError`` naming the field, the shard and the sample, with the dtypes that travel --
when the first sample fixes the field's type (the main process, on both transfers) and in the
workers (so that ``on_error="skip"`` skips the sample like any other bad field). No DALI."""

import numpy as np
import pytest

from dali_shards.errors import ConfigError, ShardFormatError
from dali_shards.tar.members import RawSample
from dali_shards.options import ShardedOptions
from dali_shards.setup.resolve import resolve
from dali_shards.testing.shards import npy, write_shards
from dali_shards.ipc.packing import Packing
from dali_shards.worker.codec import SampleCodec
from dali_shards.worker.stage import SampleStage
from dali_shards.worker.outputs import DALI_DTYPES


UNCARRIED = {
    "complex64": np.arange(3).astype(np.complex64),
    "complex128": np.arange(3).astype(np.complex128),
    "unicode": np.array(["ab", "c"]),
    "bytes": np.array([b"ab", b"c"]),
    "datetime": np.arange(2).astype("datetime64[s]"),
    "timedelta": np.arange(2).astype("timedelta64[ms]"),
    "structured": np.zeros(2, [("a", "<i4"), ("b", "<f4")]),
    "void": np.zeros(2, "V8"),
    "longdouble": np.zeros(2, np.longdouble),
}
UNCARRIED = {k: v for k, v in UNCARRIED.items() if v.dtype.name not in DALI_DTYPES}  # (longdouble: float64 on some)


def sample(key="k1", **data):
    s = RawSample(key, 0, "shard-0.tar")
    for ext, value in data.items():
        s.data[ext] = value
        s.extensions.append(ext)
    return s


def check(error, key, url="shard-0.tar"):
    text = str(error)
    assert error.key == key and error.url.endswith(url) and "field 'npy'" in text
    assert "DALI" in text and "float32" in text and "uint8" in text and "What to do" in text


@pytest.mark.parametrize("array", list(UNCARRIED.values()), ids=list(UNCARRIED))
def test_a_worker_names_an_npy_field_dali_cannot_carry(array):
    packing = Packing(("npy", "cls"), table=True, arrays={"npy": ("float32", array.ndim)})
    with pytest.raises(ShardFormatError, match="cannot carry") as err:
        SampleStage(SampleCodec(packing.requested), packing).pack(sample(key="odd", npy=npy(array), cls=b"1"), 0)
    check(err.value, "odd")
    assert str(array.dtype) in str(err.value)


def shards(tmp_path, first):
    """Two shards of 4 samples of float32 .npy members; the first sample's is ``first``."""

    def sample(index, shard, i):
        array = first if index == 0 else np.full(2, i, np.float32)
        return {"__key__": f"{shard}{i:05d}", "npy": npy(array), "cls": b"%d" % i}

    return write_shards(tmp_path, (4, 4), sample, name="a-{shard}.tar")


@pytest.mark.parametrize("transfer", ["ring", "merge"])
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("array", list(UNCARRIED.values()) + [np.array([{}], dtype=object)],
                         ids=list(UNCARRIED) + ["object"])  # fmt: skip
def test_the_first_sample_fixing_an_npy_field_dali_cannot_carry_is_named(tmp_path, array, transfer, workers):
    paths = shards(tmp_path, array)
    kw = dict(source=paths, fields=("npy", "cls"), batch_size=2 * workers, py_num_workers=workers, transfer=transfer)
    with pytest.raises(ShardFormatError) as err:
        resolve(ShardedOptions.from_keywords(**kw))
    assert err.value.key == "000000" and err.value.url.endswith("a-0.tar") and "'npy'" in str(err.value)
    if array.dtype != object:  # (pickled objects: not a readable .npy, as before)
        check(err.value, "000000", "a-0.tar")
    # on_error="skip": the next sample fixes the type; the workers skip the first (see test_a_worker_names...)
    config = resolve(ShardedOptions.from_keywords(on_error="skip", **kw)).workers[0]
    assert config.packing.arrays == {"npy": ("float32", 1)}


def test_a_layout_refuses_an_array_type_dali_cannot_carry():
    with pytest.raises(ConfigError, match="complex64"):
        Packing(("npy",), arrays={"npy": ("complex64", 1)})
