"""Packing samples into one array per sample, and the errors for samples that lack a field."""

import zlib

import numpy as np
import pytest

from dali_shards.errors import ConfigError, ShardFormatError
from dali_shards.ipc.packing import Packing
from dali_shards.tar.members import RawSample
from dali_shards.worker.codec import SampleCodec
from dali_shards.worker.stage import SampleStage


def jpeg(filler: int) -> bytes:
    """A structurally valid JPEG (the packing checks image members): SOI, APP0, SOS, data, EOI."""
    app0 = b"\xff\xe0" + (16).to_bytes(2, "big") + b"JFIF\0" + b"\1" * 9
    sos = b"\xff\xda" + (8).to_bytes(2, "big") + b"\1\1\0\0\x3f\0"
    return b"\xff\xd8" + app0 + sos + b"J" * filler + b"\xff\xd9"


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")


JPG = jpeg(960)
PNG = b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", b"\0" * 13) + png_chunk(b"IDAT", b"P" * 240) + png_chunk(b"IEND", b"")


def sample(key="k1", **data):
    s = RawSample(key, 0, "shard-0.tar")
    for ext, value in data.items():
        s.data[ext] = value
        s.extensions.append(ext)
    return s


def pack(packing, s, index):
    """``s`` packed as a worker packs it: its members read by the codec, packed into ``packing``."""
    return SampleStage(SampleCodec(packing.requested, stream_starts=packing.stream_starts), packing).pack(s, index)


def unpack_batch(packing, packed):
    """Reference unpacking of a mini-batch (a list of Packed), the numpy twin of
    graph.assemble_fields: what each slot's fields are in the pipeline."""
    if packing.table:
        table = packing.table_array(packed)
        rows = table[: len(packed) * packing.header_bytes].view(np.int64).reshape(len(packed), -1)
        items = [(packing.place_array(p), rows[i], table) for i, p in enumerate(packed)]
    else:
        items = []
        for p in packed:
            blob = packing.place_array(p)
            items.append((None, blob[: packing.header_bytes].view(np.int64), blob))
    out = []
    for payload, header, heap in items:
        fields = []
        for spec in packing.fields:
            if spec.kind == "payload":
                fields.append(bytes(payload))
            elif spec.kind in ("bytes", "key"):
                off, n = header[spec.column], header[spec.column + 1]
                fields.append(bytes(heap[off : off + n]))
            elif spec.kind == "valid":
                fields.append(bool(header[spec.column]))
            else:
                fields.append(int(header[spec.column]))
        out.append(fields)
    return out


def unpack(packing, packed):
    return unpack_batch(packing, [packed])[0]


PACKINGS = [
    dict(),
    dict(table=True, payload="jpg;png"),
    dict(table=True, payload="json"),
    dict(table=True),
]


@pytest.mark.parametrize("kw", PACKINGS)
def test_round_trip_of_every_field_kind(kw):
    packing = Packing(("jpg;png", "cls", "__key__", "__index__", "__valid__", "json"), **kw)
    packed = pack(packing, sample(png=PNG, cls=b" 281\n", json=b"{}"), index=12345)
    assert unpack(packing, packed) == [PNG, 281, b"k1", 12345, True, b"{}"]
    pad = packed.as_padding()
    assert unpack(packing, pad)[4] is False and unpack(packing, packed)[4] is True
    assert unpack(packing, pad)[:4] == unpack(packing, packed)[:4]


@pytest.mark.parametrize("table", [False, True])
def test_keys_with_invalid_utf8_travel_as_their_bytes(table):
    packing = Packing(("cls", "__key__"), table=table)
    key = b"caf\xe9".decode("utf-8", "surrogateescape")
    assert unpack(packing, pack(packing, sample(key=key, cls=b"1"), index=0)) == [1, b"caf\xe9"]


@pytest.mark.parametrize("text", [b"99999999999999999999999", b"-9223372036854775809", b"1" * 5000])
def test_a_label_beyond_64_bits_is_a_shard_format_error(text):
    with pytest.raises(ShardFormatError, match="must hold") as err:
        pack(Packing(("cls",)), sample(key="big", cls=text), index=0)
    assert err.value.key == "big" and err.value.url == "shard-0.tar"


@pytest.mark.parametrize("kw", PACKINGS)
def test_a_table_holds_a_whole_mini_batch(kw):
    packing = Packing(("jpg;png", "cls", "__key__", "__index__", "json"), **kw)
    samples = [sample(key=f"k{i}", jpg=jpeg(i), cls=b"%d" % i, json=b"{%d}" % i) for i in range(5)]
    packed = [pack(packing, s, 100 + i) for i, s in enumerate(samples)]
    packed[3] = packed[3].as_padding()
    got = unpack_batch(packing, packed)
    assert got == [[jpeg(i), i, f"k{i}".encode(), 100 + i, b"{%d}" % i] for i in range(5)]


def test_payload_must_be_a_byte_field():
    with pytest.raises(ConfigError):
        Packing(("jpg", "cls"), table=True, payload="cls")
    with pytest.raises(ConfigError):
        Packing(("jpg",), table=True, payload="png")


def test_first_present_alternative_wins():
    packing = Packing(("jpg;png",))
    assert unpack(packing, pack(packing, sample(jpg=JPG, png=PNG), 0)) == [JPG]


def test_empty_member_is_an_empty_field():
    packing = Packing(("txt", "cls"))
    assert unpack(packing, pack(packing, sample(txt=b"", cls=b"0"), 0)) == [b"", 0]


def test_missing_field_names_shard_and_key():
    packing = Packing(("jpg", "cls"))
    with pytest.raises(ShardFormatError) as err:
        pack(packing, sample(key="000042", jpg=JPG), 0)
    assert err.value.url == "shard-0.tar" and err.value.key == "000042"
    assert "'cls'" in str(err.value) and "What to do" in str(err.value)


def test_non_integer_class_names_shard_and_key():
    packing = Packing(("cls",))
    with pytest.raises(ShardFormatError, match="text integer") as err:
        pack(packing, sample(key="k7", cls=b"dog"), 0)
    assert err.value.key == "k7"


@pytest.mark.parametrize("fields", [(), "jpg", ("jpg", "jpg"), ("",), (";",), (3,)])
def test_bad_field_lists(fields):
    with pytest.raises(ConfigError):
        Packing(fields)


def test_layout_pickles():
    import pickle

    packing = Packing(("jpg", "cls", "__index__"), table=True, payload="jpg")
    again = pickle.loads(pickle.dumps(packing))
    assert [f.name for f in again.fields] == ["jpg", "cls", "__index__"]
    assert again.header_bytes == packing.header_bytes and again.payload == "jpg" and again.table


def test_a_mix_s_streams_survive_pickling():
    """A spawned worker gets its Packing pickled: where each stream begins must come along."""
    import pickle

    packing = Packing(("jpg", "__index__", "__stream__"), stream_starts=[0, 30, 42])
    for again in (pickle.loads(pickle.dumps(packing)), packing.plain()):
        assert again.stream_starts == (0, 30, 42)
        assert again.stream_of(np.array([0, 29, 30, 41, 42, 48])).tolist() == [0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize("kw", [dict(), dict(table=True, payload="jpg;png")])
@pytest.mark.parametrize("order", [("png", "cls", "jpg"), ("jpg", "png", "cls"), ("cls", "jpg")])
@pytest.mark.parametrize("fields", [("jpg;png", "cls"), ("jpg;png", "cls", "__key__", "__index__")])
def test_reading_into_place_gives_the_same_sample(kw, order, fields):
    """What the reader does: ask the packing where each member goes, read there, then pack."""
    packing = Packing(fields, **kw)
    members = {"jpg": JPG, "png": PNG, "cls": b"12"}
    direct, placed = sample(key="k9"), sample(key="k9")
    for ext in order:
        direct.data[ext] = members[ext]
        direct.extensions.append(ext)
        buffer = packing.destination(placed, ext, len(members[ext]))
        if buffer is not None:
            buffer[:] = np.frombuffer(members[ext], dtype=np.uint8)
            placed.data[ext] = buffer
        else:
            placed.data[ext] = members[ext]
        placed.extensions.append(ext)
    want = unpack(packing, pack(packing, direct, 5))
    got = unpack(packing, pack(packing, placed, 5))
    assert got == want
    assert want[0] == (members["jpg"] if "jpg" in order else members["png"])


def test_image_fields_must_hold_images():
    packing = Packing(("jpg",))
    assert unpack(packing, pack(packing, sample(jpg=PNG), 0)) == [PNG], "any image format under any image extension"
    with pytest.raises(ShardFormatError, match="not an image") as err:
        pack(packing, sample(key="bad", jpg=b"<html>oops</html>"), 0)
    assert err.value.key == "bad" and "on_error='skip'" in str(err.value)
    assert pack(Packing(("txt",)), sample(txt=b"<html>"), 0) is not None, "other fields are not checked"


def test_padding_and_skipped_marks():
    packing = Packing(("jpg", "__index__", "__valid__"), table=True, payload="jpg")
    packed = pack(packing, sample(jpg=JPG), 7)
    assert list(packed.header[:2]) == [7, 1]
    assert list(packed.as_padding().header[:2]) == [7, 0]
    skipped = packed.as_skipped(42)
    assert list(skipped.header[:2]) == [42, -1] and skipped.payload is packed.payload
    assert list(packed.header[:2]) == [7, 1], "the original is untouched"


# -- integer fields: the whole member is the value -----------------------------------------
@pytest.mark.parametrize(
    "text, value",
    [(b"281", 281), (b" 281\n", 281), (b"\t+12 \r\n", 12), (b"-3", -3), (b"0007", 7), (b"-0", 0),
     (b"9223372036854775807", (1 << 63) - 1), (b"-9223372036854775808", -(1 << 63)),
     (b" " * 30 + b"5" + b" " * 30, 5)],
)  # fmt: skip
def test_an_integer_field_is_its_whole_text(text, value):
    for kw in PACKINGS[:1] + PACKINGS[-1:]:
        packing = Packing(("cls",), **kw)
        assert unpack(packing, pack(packing, sample(cls=text), 0)) == [value]


@pytest.mark.parametrize(
    "text, what",
    [(b"7" + b" " * 63 + b"8", "text integer"), (b"7 8", "text integer"), (b"0" * 64 + b"5", "65 bytes"),
     (b"1_000", "text integer"), (b"", "text integer"), (b" \n", "text integer"), (b"0x10", "text integer"),
     (b"1e3", "text integer"), (b"- 5", "text integer"), (b"+-5", "text integer"), (b"5\x00", "text integer"),
     (b"\xd9\xa1", "text integer"), (b"3.0", "text integer"), (b"5" * 10_000_000, "10000000 bytes")],
    ids=["7, spaces, 8", "7 8", "65 digits", "underscore", "empty", "blank", "hex", "exponent", "sign apart",
         "two signs", "nul", "arabic digit", "decimal point", "10 MB"],
)  # fmt: skip
def test_an_integer_field_that_is_not_one_whole_integer_is_a_shard_format_error(text, what):
    with pytest.raises(ShardFormatError, match="must hold") as err:
        pack(Packing(("cls",)), sample(key="odd", cls=text), index=0)
    assert err.value.key == "odd" and err.value.url == "shard-0.tar" and "'cls'" in str(err.value)
    assert what in str(err.value) and len(str(err.value)) < 1000
