"""Damaged images: caught in the workers (skipped and counted, or an error naming shard, key and
field), or, when the damage passes the workers' check, DALI's decoder failure named by sample."""

import io
from collections import Counter

import pytest
from nvidia.dali import fn
from PIL import Image

from dali_shards import ShardFormatError, decode_image
from dali_shards.pytorch import DALIShardedIterator
from dali_shards.sample_data import sample_images
from dali_shards.testing.pipelines import identity_pipeline
from dali_shards.testing.shards import write_shards
from dali_shards.tools.writer import write_shard

PHOTOS = [open(p.path, "rb").read() for p in sample_images()]


def truncated(data):
    return data[: len(data) // 3]


def header_then_garbage(data):
    sos = data.index(b"\xff\xda")
    return data[: sos + 200] + bytes(range(256)) * 40  # valid segments, then noise without an end marker


def png_with_bad_crc(data):
    out = io.BytesIO()
    Image.open(io.BytesIO(data)).convert("RGB").resize((32, 24)).save(out, format="PNG")
    png = bytearray(out.getvalue())
    png[40] ^= 0x55  # inside the image data chunk
    return bytes(png)


BAD = {5: truncated, 9: header_then_garbage, 14: png_with_bad_crc}  # sample number -> damage


def shards(tmp_path):
    """Two shards of 12 photos, those in ``BAD`` damaged (as they are when called)."""

    def sample(i, shard, position):
        data = PHOTOS[i % len(PHOTOS)]
        damage = BAD.get(i)
        ext = "png" if damage is png_with_bad_crc else "jpg"
        return {"__key__": f"{i:04d}", ext: damage(data) if damage else data, "cls": i}

    return write_shards(tmp_path, (12, 12), sample, name="images-{shard}.tar")


def resized(image, cls, index):
    return fn.resize(decode_image(image), size=(16, 16)), cls, index


def make(source, **kw):
    return identity_pipeline(source, ("jpg;png", "cls", "__index__"), outputs="image cls index", body=resized,
                             **{"batch_size": 4, "py_num_workers": 2, "world_size": 2, **kw})  # fmt: skip


def test_damaged_images_are_skipped_and_counted(tmp_path):
    pipe = make(shards(tmp_path), on_error="skip", shuffle=True, seed=3)
    seen, steps, skipped = Counter(), [], set()
    for rank in range(2):
        it = DALIShardedIterator(pipe(rank=rank), ["image", "cls", "index"], audit=True)
        batches = [b["cls"].tolist() for (b,) in it]
        steps.append(len(batches))
        seen.update(c for b in batches for c in b)
        skipped.update(it.audits[-1]["skipped"])
    assert len(set(steps)) == 1, "equal steps on every rank"
    assert sorted(seen) == [i for i in range(24) if i not in BAD] and max(seen.values()) == 1
    assert sorted(skipped) == sorted(BAD), "each damaged image counted as skipped (its __index__)"


@pytest.mark.parametrize("number, words", [(5, "truncated JPEG"), (9, "truncated JPEG"), (14, "bad CRC")])
def test_a_damaged_image_is_named_by_shard_key_and_field(tmp_path, number, words):
    paths = shards(tmp_path)
    others = {k: v for k, v in BAD.items() if k != number}
    for k in others:  # leave only the one under test damaged
        BAD.pop(k)
    try:
        with pytest.raises(ShardFormatError) as err:
            for rank in range(2):
                for _ in DALIShardedIterator(make(shards(tmp_path))(rank=rank), ["image", "cls", "index"]):
                    pass
    finally:
        BAD.update(others)
    message = str(err.value)
    assert words in message and f"{number:04d}" in message and "jpg;png" in message
    assert err.value.url == paths[number // 12] and err.value.key == f"{number:04d}"


@pytest.mark.parametrize("number", [1, 13, 22])
def test_a_decoder_failure_the_check_misses_is_named(tmp_path, number):
    """With image_check="off" the damage reaches DALI's decoder: the error still names the sample,
    whatever step of the epoch it is in."""
    samples = [{"__key__": f"{i:04d}", "jpg": PHOTOS[i], "cls": i} for i in range(24)]
    samples[number]["jpg"] = truncated(PHOTOS[number])
    write_shard(str(tmp_path / "s.tar"), samples)
    with pytest.raises(ShardFormatError) as err:
        for _ in DALIShardedIterator(make(str(tmp_path / "s.tar"), image_check="off", world_size=1, rank=0)(),
                                     ["image", "cls", "index"]):
            pass
    assert err.value.key == f"{number:04d}" and f"sample {number} of the shard" in str(err.value)
    assert "DALI's operator nvidia.dali.fn.decoders.image failed" in str(err.value)
