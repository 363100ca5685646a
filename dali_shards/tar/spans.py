"""One sample from the bytes of its span, fast: the common case of ``positioned.sample_in_span``.

A sample's span (from where its headers begin to where the next sample's begin, as an index
records it) holds a few plain tar members. Their headers are parsed here in one ``struct`` call
each, checksums checked in C (``zlib.adler32``), and each member's data is a *view* of the span's
buffer: no copy, no file object. Anything out of the ordinary -- a long name or pax header, a
ustar prefix, a base-256 size, a metadata member, a member that does not fit, a bad checksum, a
second sample -- makes ``fast_sample`` return None, and the caller reads the span with the general
reader (``TarReader``), which accepts or names it exactly as a sequential read would. Imports no
DALI.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any, Collection, Optional

from dali_shards.tar.members import RawSample, split_key
from dali_shards.tar.header import BLOCK, decode_name

# name, (mode, uid, gid skipped), size, (mtime skipped), checksum, typeflag; then magic and prefix
_HEADER = struct.Struct("100s24x12s12x8sc")
_PLAIN = frozenset((b"0", b"\0", b"7"))  # regular and contiguous files
_SPACES = 8 * 0x20  # the checksum field counted as spaces


def fast_sample(buf: Any, url: str, position: int, want: Optional[Collection[str]] = None) -> Optional[RawSample]:
    """The sample whose span ``buf`` (a contiguous uint8 buffer: NumPy array or memoryview) holds,
    its wanted members' data as views of ``buf``; None where the general reader must decide."""
    view = memoryview(buf).cast("B") if not isinstance(buf, memoryview) else buf
    n, pos = len(view), 0
    sample: Optional[RawSample] = None
    while pos < n:
        if pos + BLOCK > n:
            return None
        raw_name, raw_size, raw_sum, flag = _HEADER.unpack_from(view, pos)
        if flag not in _PLAIN or raw_size[0] & 0x80 or _has_prefix(view, pos) or not _checksum_ok(view, pos, raw_sum):
            return None
        try:
            size = int(raw_size.split(b"\0", 1)[0].strip() or b"0", 8)
        except ValueError:
            return None
        data_at = pos + BLOCK
        if data_at + size > n:
            return None
        name = decode_name(raw_name.split(b"\0", 1)[0])
        key, ext = split_key(name)
        if key is None or ext is None or "__" in name:  # no extension, or (maybe) a metadata member
            return None
        if sample is None:
            sample = RawSample(key, position, url)
        elif key != sample.key or ext in sample.extensions:
            return None
        sample.extensions.append(ext)
        if want is None or ext in want:
            sample.data[ext] = view[data_at : data_at + size]
        pos = data_at + ((size + BLOCK - 1) & ~(BLOCK - 1))
    return sample


def _checksum_ok(view: memoryview, pos: int, raw_sum: bytes) -> bool:
    """Whether the header at ``pos`` matches its unsigned checksum (the byte sum with the checksum
    field read as spaces: Adler-32's low half is that sum mod 65521; a header sums to less)."""
    try:
        stored = int(raw_sum.split(b"\0", 1)[0].strip() or b"0", 8)
    except ValueError:
        return False
    total = (zlib.adler32(view[pos : pos + BLOCK]) & 0xFFFF) - 1 - sum(raw_sum) + _SPACES
    return total % 65521 == stored % 65521 and stored <= 255 * BLOCK


def _has_prefix(view: memoryview, pos: int) -> bool:
    """True for a ustar header whose prefix field extends its name."""
    return view[pos + 257 : pos + 263] == b"ustar\0" and view[pos + 345] != 0
