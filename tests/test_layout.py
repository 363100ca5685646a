"""Packing samples into one array per sample, and the errors for samples that lack a field."""

import numpy as np
import pytest

from dali_shards.errors import ConfigError, ShardFormatError
from dali_shards.layout import SampleLayout
from dali_shards.tarformat import RawSample


def sample(key="k1", **data):
    s = RawSample(key, 0, "shard-0.tar")
    for ext, value in data.items():
        s.data[ext] = value
        s.extensions.append(ext)
    return s


def unpack(layout, blob):
    """Reference unpacking, the numpy twin of graph.unpack_fields."""
    header = layout.unpack_header(blob)
    out = []
    for spec in layout.fields:
        if spec.kind in ("bytes", "key"):
            off, n = header[spec.slot], header[spec.slot + 1]
            out.append(bytes(blob[off : off + n]))
        elif spec.kind == "valid":
            out.append(bool(header[spec.slot]))
        else:
            out.append(int(header[spec.slot]))
    return out


def test_round_trip_of_every_field_kind():
    layout = SampleLayout(("jpg;png", "cls", "__key__", "__index__", "__valid__", "json"))
    blob = layout.pack(sample(png=b"\x89PNG...", cls=b" 281\n", json=b"{}"), index=12345)
    assert blob.dtype == np.uint8 and blob.ndim == 1
    assert unpack(layout, blob) == [b"\x89PNG...", 281, b"k1", 12345, True, b"{}"]
    pad = SampleLayout.as_padding(blob)
    assert unpack(layout, pad)[4] is False and unpack(layout, blob)[4] is True
    assert unpack(layout, pad)[:4] == unpack(layout, blob)[:4]


def test_first_present_alternative_wins():
    layout = SampleLayout(("jpg;png",))
    assert unpack(layout, layout.pack(sample(jpg=b"J", png=b"P"), 0)) == [b"J"]


def test_empty_member_is_an_empty_field():
    layout = SampleLayout(("txt", "cls"))
    assert unpack(layout, layout.pack(sample(txt=b"", cls=b"0"), 0)) == [b"", 0]


def test_missing_field_names_shard_and_key():
    layout = SampleLayout(("jpg", "cls"))
    with pytest.raises(ShardFormatError) as err:
        layout.pack(sample(key="000042", jpg=b"x"), 0)
    assert err.value.url == "shard-0.tar" and err.value.key == "000042"
    assert "'cls'" in str(err.value) and "What to do" in str(err.value)


def test_non_integer_class_names_shard_and_key():
    layout = SampleLayout(("cls",))
    with pytest.raises(ShardFormatError, match="text integer") as err:
        layout.pack(sample(key="k7", cls=b"dog"), 0)
    assert err.value.key == "k7"


@pytest.mark.parametrize("fields", [(), "jpg", ("jpg", "jpg"), ("",), (";",), (3,)])
def test_bad_field_lists(fields):
    with pytest.raises(ConfigError):
        SampleLayout(fields)


def test_layout_pickles():
    import pickle

    layout = SampleLayout(("jpg", "cls", "__index__"))
    again = pickle.loads(pickle.dumps(layout))
    assert [f.name for f in again.fields] == ["jpg", "cls", "__index__"]
    assert again.header_bytes == layout.header_bytes
