"""The worker-side Python stage without DALI: built-in decoders, the user's map and decoders, what
outputs may be, and errors that name the shard, the sample and the field or output."""

import io
import json
import pickle

import numpy as np
import pytest

from dali_shards.errors import ConfigError, ShardFormatError, ShardMapError
from dali_shards.tar.members import RawSample
from dali_shards.ipc.packing import Packing
from dali_shards.worker.codec import SampleCodec
from dali_shards.worker.outputs import OutputSpec, OutputTypeError, classify, conform
from dali_shards.worker.stage import SampleStage
from dali_shards.worker.usercode import Portable


def sample(key="k1", **data):
    s = RawSample(key, 0, "shard-0.tar")
    for ext, value in data.items():
        s.data[ext] = value
        s.extensions.append(ext)
    return s


def npy(array):
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


MEMBERS = dict(
    jpg=b"\xff\xd8raw", cls=b" 7\n", index=b"12", label=b"-3", json=b'{"boxes": [[1, 2, 3, 4]]}',
    npy=npy(np.arange(6, dtype=np.float16).reshape(2, 3)), txt="héllo".encode(), bin=b"\x00\x01",
)  # fmt: skip


def stage_with(packing, *args, **kw):
    """The stage that reads the requested fields (images unchecked) and packs them into ``packing``."""
    return SampleStage(SampleCodec(packing.requested, "off", packing.stream_starts), packing, *args, **kw)


def stage_of(fields, mapper=None, decoders=None):
    packing = Packing(fields)
    return stage_with(packing, Portable(mapper, "map") if mapper else None,
                      {k: (None if v is None else Portable(v, "decoder")) for k, v in (decoders or {}).items()})  # fmt: skip


def test_every_builtin_decoder_gives_the_value_a_map_receives():
    got = stage_of(tuple(MEMBERS), mapper=lambda s: s).inputs(sample(**MEMBERS), index=5)
    assert got["__key__"] == "k1"
    assert (got["jpg"], got["cls"], got["index"], got["label"]) == (b"\xff\xd8raw", 7, 12, -3)
    assert got["json"] == {"boxes": [[1, 2, 3, 4]]} and got["txt"] == "héllo" and got["bin"] == b"\x00\x01"
    assert got["npy"].dtype == np.float16 and got["npy"].shape == (2, 3) and got["npy"][1, 2] == 5
    plain = stage_of(("json", "txt", "npy", "label")).inputs(sample(**MEMBERS), index=0)
    assert plain["json"] == MEMBERS["json"] and plain["txt"] == MEMBERS["txt"], "without a map: bytes"
    assert plain["npy"].shape == (2, 3) and plain["label"] == -3, "without a map: .npy arrays and integers"


def test_decoders_can_be_replaced_per_field():
    stage = stage_of(("json", "txt"), mapper=lambda s: s, decoders={"json": None, "txt": lambda b: b[::-1]})
    got = stage.inputs(sample(**MEMBERS), 0)
    assert got["json"] == MEMBERS["json"] and got["txt"] == MEMBERS["txt"][::-1]


@pytest.mark.parametrize("field, data, what", [
    ("json", b"{not json", "cannot be decoded as .json"),
    ("txt", b"\xff\xfe", "cannot be decoded as .txt"),
    ("npy", b"not an npy", "cannot be decoded as .npy"),
    ("npy", npy(np.array(["a"], dtype=object)), "cannot be decoded as .npy"),  # pickled objects are refused
    ("cls", b"dog", "cannot be decoded as .cls"),
    # the whole member, not its first 64 bytes
    pytest.param("cls", b"7" + b" " * 63 + b"8", "cannot be decoded as .cls", id="cls-7-spaces-8"),
    pytest.param("label", b"0" * 64 + b"5", "cannot be decoded as .label", id="label-65-digits"),
    pytest.param("index", b"1_000", "cannot be decoded as .index", id="index-underscore"),
])  # fmt: skip
def test_bad_members_are_format_errors_naming_the_field(field, data, what):
    with pytest.raises(ShardFormatError, match=what) as err:
        stage_of((field,), mapper=lambda s: s).inputs(sample(key="k9", **{field: data}), 0)
    assert err.value.key == "k9" and err.value.url == "shard-0.tar" and repr(field) in str(err.value)


def test_a_failing_user_decoder_names_the_field_with_its_traceback():
    def parse(data):
        raise KeyError("box")

    with pytest.raises(ShardMapError, match=r"decoder of field 'json'.*KeyError: 'box'(.|\n)*in parse") as err:
        stage_of(("json",), mapper=lambda s: s, decoders={"json": parse}).inputs(sample(**MEMBERS), 0)
    assert err.value.key == "k1" and "on_error='skip'" in str(err.value)


@pytest.mark.parametrize("value, kind, dtype, ndim", [
    (3, "int", "int64", 0), (np.int32(4), "int", "int64", 0), (b"ab", "bytes", "uint8", 1),
    (bytearray(b"ab"), "bytes", "uint8", 1), (2.5, "array", "float64", 0), (True, "array", "bool", 0),
    ([1, 2], "array", "int64", 1), (np.zeros((0, 4), np.float32), "array", "float32", 2),
])  # fmt: skip
def test_what_outputs_may_be(value, kind, dtype, ndim):
    spec, _ = classify("out", value)
    assert (spec.kind, spec.dtype, spec.ndim) == (kind, dtype, ndim)


@pytest.mark.parametrize("value, what", [
    ("text", "str"), (np.array(["a"]), "dtype <U1"), ([[1, 2], [3]], "ragged"), ({"a": 1}, "dtype object"),
    (1 << 70, "int64"),
])  # fmt: skip
def test_outputs_dali_cannot_take_are_refused_naming_them(value, what):
    with pytest.raises(OutputTypeError, match=f"output 'boxes'.*{what}|{what}.*output 'boxes'"):
        classify("boxes", value)


def test_an_output_must_keep_the_type_of_the_first_sample():
    spec = OutputSpec("boxes", "array", "float32", 2)
    assert conform(spec, np.ones((3, 4), np.float32)).shape == (3, 4)
    with pytest.raises(OutputTypeError, match="float64 array with 2 dimensions here but a float32 array"):
        conform(spec, np.ones((3, 4)))
    with pytest.raises(OutputTypeError, match="1 dimension here"):
        conform(spec, np.ones(4, np.float32))
    assert conform(OutputSpec("n", "int", "int64", 0), np.int64(5)) == 5
    as_bytes, as_array = OutputSpec("b", "bytes"), OutputSpec("b", "array", "uint8", 1)
    assert conform(as_bytes, np.arange(3, dtype=np.uint8)).tolist() == [0, 1, 2], "a 1-D uint8 array is bytes"
    assert conform(as_array, b"\x00\x01").tolist() == [0, 1], "and bytes a 1-D uint8 array"


def test_big_endian_arrays_arrive_in_the_machines_byte_order():
    swapped = (np.arange(3) + 1).astype(">f4")
    spec, value = classify("x", swapped)
    assert spec == OutputSpec("x", "array", "float32", 1) and value.dtype.isnative and value.tolist() == [1, 2, 3]
    for stage in (stage_of(("npy",)), stage_of(("npy",), mapper=lambda s: s)):
        got = stage.inputs(sample(npy=npy(swapped)), 0)["npy"]
        assert got.dtype.isnative and got.tolist() == [1, 2, 3]


def test_map_failures_name_the_sample_and_what_went_wrong():
    packing = Packing(("cls",), outputs=[OutputSpec("label", "int", "int64", 0)])

    def boom(s):
        return {"label": s["cls"] // 0}

    cases = [(boom, "map \\(test_map_failures_name_the_sample_and_what_went_wrong.<locals>.boom\\) raised "
              "ZeroDivisionError(.|\\n)*in boom"), (lambda s: [1], "returned list, not a dict"),
             (lambda s: {"other": 1}, "returned no 'label' \\(it returned \\['other'\\]\\)"),
             (lambda s: {"label": "x"}, "output 'label' is a str")]  # fmt: skip
    for mapper, what in cases:
        stage = stage_with(packing, Portable(mapper, "map"))
        with pytest.raises(ShardMapError, match=what) as err:
            stage.pack(sample(key="k4", cls=b"1"), 0)
        assert err.value.key == "k4" and err.value.url == "shard-0.tar"


class Tokenizer:
    def __init__(self):
        self.vocab = {"a": 1, "b": 2}

    def encode(self, s):
        return {"ids": np.array([self.vocab[c] for c in s["txt"]], dtype=np.int32)}


def test_lambdas_closures_and_bound_methods_travel_pickled():
    offset = 10
    for func, want in [(lambda x: x + 1, 2), ((lambda x: x + offset), 11)]:
        again = pickle.loads(pickle.dumps(Portable(func, "map")))
        assert again(1) == want
    again = pickle.loads(pickle.dumps(Portable(Tokenizer().encode, "map")))
    assert again({"txt": "ab"})["ids"].tolist() == [1, 2], "the object's state went along"


def test_a_callable_that_cannot_be_pickled_is_refused_when_built():
    ids = (i for i in range(3))  # generators never pickle
    with pytest.raises(ConfigError, match="map=.*cannot be pickled.*generator.*open them lazily"):
        Portable(lambda s: (next(ids), s), "map")
    with pytest.raises(ConfigError, match="must be callable"):
        Portable(3, "bucket_by")


def test_json_boxes_to_arrays_round_trip_through_the_slots():
    specs = [OutputSpec("boxes", "array", "float32", 2), OutputSpec("labels", "array", "int64", 1)]

    def to_arrays(s):
        objs = s["json"]["objects"]
        return {"boxes": np.array([o["box"] for o in objs], np.float32).reshape(-1, 4),
                "labels": np.array([o["label"] for o in objs], np.int64)}  # fmt: skip

    for table in (False, True):
        packing = Packing(("json",), outputs=specs, table=table, payload="boxes" if table else None)
        stage = stage_with(packing, Portable(to_arrays, "map"))
        doc = {"objects": [{"box": [0.1, 0.2, 0.5, 0.6], "label": 3}, {"box": [0, 0, 1, 1], "label": 7}]}
        packed = stage.pack(sample(json=json.dumps(doc).encode()), 9)
        head = packed.header
        if table:
            boxes = packed.payload.view(np.float32).reshape(head[2], head[3])
            heap = packing.table_array([packed])
            off, n = heap[: packing.header_bytes].view(np.int64)[4:6]
            labels = heap[off : off + n].view(np.int64)
        else:
            blob = packed.blob
            off, n, r, c = head[2:6]
            boxes = blob[off : off + n].view(np.float32).reshape(r, c)
            off, n = head[6], head[7]
            labels = blob[off : off + n].view(np.int64)
        assert np.allclose(boxes, [[0.1, 0.2, 0.5, 0.6], [0, 0, 1, 1]]) and boxes.dtype == np.float32
        assert labels.tolist() == [3, 7]


def test_user_code_runs_with_rngs_seeded_per_sample_and_epoch():
    import random

    from dali_shards.worker.usercode import KeptRngs, sample_seed

    stage = stage_with(Packing(("cls",), outputs=[OutputSpec("r", "array", "float64", 1)]),
                        Portable(lambda s: {"r": np.array([random.random(), np.random.rand()])}, "map"), seed=3)  # fmt: skip

    def drawn(index, epoch):
        packed = stage.pack(sample(cls=b"1"), index, epoch)
        return bytes(packed.blob)

    with KeptRngs():
        state = (random.getstate(), np.random.get_state()[1].tolist())
        assert drawn(4, 0) == drawn(4, 0) and drawn(4, 0) != drawn(5, 0) and drawn(4, 0) != drawn(4, 1)
    assert (random.getstate(), np.random.get_state()[1].tolist()) == state, "KeptRngs gave the states back"
    seeds = {sample_seed(s, e, i) for s in range(4) for e in range(4) for i in range(64)}
    assert len(seeds) == 4 * 4 * 64 and all(0 <= x < 1 << 64 for x in seeds)
