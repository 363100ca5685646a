"""The image check: a batch of images checked together (JPEGs walked in lockstep) agrees with
the check of each image alone, on good, damaged and unusual images."""

import numpy as np
import pytest

from dali_shards.options import ImageCheck
from dali_shards.sample_data import sample_images
from dali_shards.testing.tars import with_jpeg_frame
from dali_shards.worker.imagecheck import image_problem, images_ok

JPEGS = [open(p.path, "rb").read() for p in sample_images()]


def variants():
    good = JPEGS[0]
    sos = good.find(b"\xff\xda")
    return {
        "good": good,
        "another good": JPEGS[1],
        "cut in the data": good[: len(good) // 2],
        "cut in the headers": good[: sos - 10],
        "no SOI": b"\x00" + good[1:],
        "fill bytes": good[:2] + b"\xff\xff" + good[2:],
        "EOI early": good[:2] + b"\xff\xd9" + good[2:],
        "bad length": good[:4] + b"\xff\xff" + good[6:],
        "trailing bytes": good + b"\x00\x00garbage",
        "tiny": b"\xff\xd8",
        "png signature": b"\x89PNG\r\n\x1a\n" + b"\x00" * 20,
        "text": b"<html>404</html>",
        "empty": b"",
    }


@pytest.mark.parametrize("level", list(ImageCheck))
def test_a_batch_is_checked_as_each_image_alone(level):
    images = list(variants().values()) * 3
    buf = np.frombuffer(b"".join(images) + b"\x00" * 8, dtype=np.uint8)
    starts = np.cumsum([0] + [len(i) for i in images[:-1]])
    sizes = np.array([len(i) for i in images])
    expected = [image_problem(i, level) is None for i in images]
    assert images_ok(buf, starts, sizes, level).tolist() == expected
    if level is ImageCheck.STRUCTURE:  # (fill bytes and bytes after the end marker are allowed)
        verdicts = dict(zip(variants(), expected))
        assert [k for k, ok in verdicts.items() if ok] == ["good", "another good", "fill bytes", "trailing bytes"]


@pytest.mark.parametrize(
    "height, width, refused", [(65000, 65000, True), (16385, 16384, True), (16384, 16384, False), (0, 0, False)]
)
def test_a_decompression_bomb_is_refused_in_both_walks(height, width, refused):
    """A frame header claiming more than 2**28 pixels is refused (DALI would allocate gigabytes for
    it and keep them); 0x0 is left to DALI's decoder (the iterator skips what DALI fails on)."""
    good = open(sample_images()[0].path, "rb").read()
    data = with_jpeg_frame(good, height, width)
    problem = image_problem(data)
    assert (problem is not None and "decompression bomb" in problem and f"{width}x{height}" in problem) == refused
    buf = np.frombuffer(good + data + good, dtype=np.uint8)
    starts, sizes = np.array([0, len(good), len(good) + len(data)]), np.array([len(good), len(data), len(good)])
    assert images_ok(buf, starts, sizes, ImageCheck.STRUCTURE).tolist() == [True, not refused, True]
