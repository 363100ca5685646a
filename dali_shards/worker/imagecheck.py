"""A cheap structural check of image members in the worker, before they enter a batch.

DALI's decoders stop the whole pipeline on an image they cannot decode, without saying which
sample it was; a check here turns most damaged images into per-sample ``ShardFormatError``s that
name the shard, key and field, which ``on_error="skip"`` then skips and counts. Levels
(``image_check=``):

- ``"structure"`` (default): JPEG -- the marker segments up to the first scan are walked (each
  must fit in the data), the frame header may not claim more than ``MAX_PIXELS`` pixels (a
  decompression bomb, for which DALI would allocate gigabytes and keep them), and an end-of-image
  marker must follow the scan (a JPEG cut short has none: 0xFF 0xD9 cannot occur inside
  entropy-coded data); PNG -- every chunk must fit, with a
  matching CRC, from IHDR to IEND. Other formats: the signature only.
- ``"signature"``: the first bytes must be an image signature DALI's decoders know.
- ``"off"``: nothing is checked.

Not caught: damage inside a JPEG's entropy-coded data that keeps its end marker (bit flips,
garbage in the middle), a frame of 0x0 pixels, and damage inside formats other than JPEG and PNG.
Those fail in DALI's decoder; the iterator then finds the sample and names it or, under
``on_error="skip"``, skips it (``session/incidents.py``). Imports no DALI.
"""

from __future__ import annotations

import struct
import zlib
from typing import Optional

import numpy as np

from dali_shards.options import ImageCheck

IMAGE_EXTENSIONS = frozenset(
    {
        "jpg",
        "jpeg",
        "png",
        "gif",
        "bmp",
        "tif",
        "tiff",
        "webp",
        "jp2",
        "j2k",
        "pnm",
        "ppm",
        "pgm",
        "pbm",
        "avif",
        "heic",
    }
)
_IMAGE_SIGNATURES = (
    b"\xff\xd8\xff",
    b"\x89PNG\r\n\x1a\n",
    b"GIF87a",
    b"GIF89a",
    b"BM",
    b"II*\x00",
    b"MM\x00*",
    b"\x00\x00\x00\x0cjP  ",
    b"\xff\x4f\xff\x51",
    b"P1",
    b"P2",
    b"P3",
    b"P4",
    b"P5",
    b"P6",
)
_PNG = b"\x89PNG\r\n\x1a\n"
_JPEG_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})  # TEM and RSTn: no length field
_JPEG_FRAMES = frozenset({*range(0xC0, 0xC4), *range(0xC5, 0xC8), *range(0xC9, 0xCC), *range(0xCD, 0xD0)})  # SOFn
MAX_PIXELS = 1 << 28  # a frame header claiming more (over 16384 x 16384) is a decompression bomb


def _too_large(height: int, width: int) -> Optional[str]:
    if height * width <= MAX_PIXELS:
        return None
    return (f"is a JPEG whose frame header says {width}x{height} pixels, over the limit of {MAX_PIXELS} "
            f"(a decompression bomb: DALI would allocate {3 * height * width / 2**30:.1f} GiB to decode it)")  # fmt: skip


def looks_like_image(head: bytes) -> bool:
    """True if ``head`` (a file's first bytes) starts like an image DALI's decoders read."""
    return (
        head.startswith(_IMAGE_SIGNATURES)
        or (head[:4] == b"RIFF" and head[8:12] == b"WEBP")
        or head[4:8] == b"ftyp"  # AVIF / HEIC
    )


def image_problem(data, level: ImageCheck = ImageCheck.STRUCTURE) -> Optional[str]:
    """What is wrong with an image member's bytes at this check ``level``, or None."""
    if level is ImageCheck.OFF:
        return None
    head = bytes(data[:12])
    if not looks_like_image(head):
        return f"is not an image (it starts with {head[:8]!r})"
    if level is ImageCheck.SIGNATURE:
        return None
    if head.startswith(b"\xff\xd8"):
        return jpeg_problem(data if isinstance(data, bytes) else memoryview(data).cast("B"))
    if head.startswith(_PNG):
        return png_problem(memoryview(data).cast("B"))
    return None


def jpeg_problem(data) -> Optional[str]:
    """Damage in a JPEG's segment structure, or a missing end-of-image marker (``data``: bytes or
    a byte memoryview, read in place)."""
    n, pos = len(data), 2
    while True:
        if pos >= n:
            return f"is a truncated JPEG: it ends at byte {n}, inside its header segments"
        if data[pos] != 0xFF:
            return f"is a corrupt JPEG: no segment marker at byte {pos}"
        while pos < n and data[pos] == 0xFF:  # fill bytes
            pos += 1
        if pos + 1 > n:
            return f"is a truncated JPEG: it ends at byte {n}, inside a marker"
        marker = data[pos]
        pos += 1
        if marker == 0xD9:
            return "is a corrupt JPEG: it ends (EOI) before any image data"
        if marker in _JPEG_STANDALONE:
            continue
        if pos + 2 > n:
            return f"is a truncated JPEG: it ends at byte {n}, inside segment 0xFF{marker:02X}"
        length = data[pos] << 8 | data[pos + 1]
        if length < 2 or pos + length > n:
            return f"is a truncated JPEG: segment 0xFF{marker:02X} at byte {pos - 2} runs past the end ({n} bytes)"
        if marker in _JPEG_FRAMES and length >= 7:
            bomb = _too_large(data[pos + 3] << 8 | data[pos + 4], data[pos + 5] << 8 | data[pos + 6])
            if bomb:
                return bomb
        pos += length
        if marker == 0xDA:  # start of scan: entropy-coded data follows
            break
    if data[n - 2 : n] != b"\xff\xd9" and bytes(data[pos:]).rfind(b"\xff\xd9") < 0:  # (most end with it)
        return f"is a truncated JPEG: no end-of-image marker after its image data ({n} bytes)"
    return None


MAX_SEGMENTS = 64  # JPEG segments walked in lockstep before the scan; a JPEG with more is checked alone


def images_ok(buf: np.ndarray, starts: np.ndarray, sizes: np.ndarray, level: ImageCheck) -> np.ndarray:
    """Per image (``sizes[i]`` bytes at ``starts[i]`` of ``buf``): True where it passes the check at
    ``level``. JPEGs are walked together, segment by segment, with array operations; any other
    image, and a JPEG out of the ordinary (fill bytes, markers without a length, damage), is checked
    alone by ``image_problem``, whose verdict stands."""
    ok = np.zeros(len(starts), dtype=bool)
    if level is ImageCheck.STRUCTURE and len(starts):
        ok = _jpegs_ok(buf, starts.astype(np.int64), sizes.astype(np.int64))
    view = memoryview(buf)  # type: ignore[arg-type]  # numpy's stubs: a Buffer only on Python 3.12+
    for i in np.flatnonzero(~ok).tolist():
        ok[i] = image_problem(view[starts[i] : starts[i] + sizes[i]], level) is None
    return ok


def _jpegs_ok(buf: np.ndarray, starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """True for the JPEGs whose segments, walked in lockstep, are plain (a marker, a length that
    fits) up to the scan, and that end with the end-of-image marker; False for any other (unsure)."""
    end = starts + sizes
    big = sizes >= 8
    top = len(buf) - 1
    at = lambda p: buf[np.minimum(p, top)].astype(np.int64)  # noqa: E731 (positions are never negative)
    active = big & (at(starts) == 0xFF) & (at(starts + 1) == 0xD8)
    ends_eoi = big & (at(end - 2) == 0xFF) & (at(end - 1) == 0xD9)
    reached = np.zeros(len(starts), dtype=bool)
    pos = starts + 2
    for _ in range(MAX_SEGMENTS):
        idx = np.flatnonzero(active)
        if not len(idx):
            break
        p, e = pos[idx], end[idx]
        marker, length = at(p + 1), at(p + 2) << 8 | at(p + 3)
        plain = (p + 4 <= e) & (at(p) == 0xFF) & ~_UNSURE_MARKERS[marker]
        plain &= (length >= 2) & (p + 2 + length <= e)
        scan = plain & (marker == 0xDA)
        frame = plain & _FRAME_MARKERS[marker] & (length >= 7)
        pixels = (at(p + 5) << 8 | at(p + 6)) * (at(p + 7) << 8 | at(p + 8))
        active[idx[frame & (pixels > MAX_PIXELS)]] = False  # left to image_problem, which says why
        plain &= ~(frame & (pixels > MAX_PIXELS))
        scan &= plain
        reached[idx[scan]] = True
        pos[idx[plain]] = p[plain] + 2 + length[plain]
        active[idx[~plain | scan]] = False
    return reached & ends_eoi


_FRAME_MARKERS = np.zeros(256, dtype=bool)
_FRAME_MARKERS[sorted(_JPEG_FRAMES)] = True
_UNSURE_MARKERS = np.zeros(256, dtype=bool)  # markers the lockstep walk leaves to image_problem
_UNSURE_MARKERS[[0xFF, 0xD9, 0x00, *sorted(_JPEG_STANDALONE)]] = True


def png_problem(data: memoryview) -> Optional[str]:
    """A PNG chunk that does not fit or whose CRC does not match, or no IHDR / IEND."""
    n, pos, first = len(data), 8, True
    while pos + 12 <= n:
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        end = pos + 12 + length
        if end > n:
            return f"is a truncated PNG: chunk {kind!r} at byte {pos} runs past the end ({n} bytes)"
        if first and kind != b"IHDR":
            return f"is a corrupt PNG: its first chunk is {kind!r}, not IHDR"
        (crc,) = struct.unpack(">I", data[end - 4 : end])
        if zlib.crc32(data[pos + 4 : end - 4]) != crc:
            return f"is a corrupt PNG: chunk {kind!r} at byte {pos} has a bad CRC"
        if kind == b"IEND":
            return None
        pos, first = end, False
    return f"is a truncated PNG: it ends at byte {n} without an IEND chunk"
