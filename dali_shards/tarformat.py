"""Streaming reader for WebDataset-style tar shards: members, keys and samples.

A *sample* is a run of consecutive regular members that share a key, where a member
``dir/name.ext1.ext2`` has key ``dir/name`` and extension ``ext1.ext2`` (lower-cased), exactly as
the ``webdataset`` library groups them. Members whose name has no extension and WebDataset
metadata members (``__xxx__``) are skipped, as are non-regular members (directories, links).

Only the standard library is used; the reader never loads a whole shard, and skips the data of
members nobody asked for (seeking when the stream allows it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import BinaryIO, Callable, Dict, Iterator, Optional

from .errors import ShardFormatError

BLOCK = 512
_KEY_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_META = re.compile(r"__[^/]*__($|/)")
_REGULAR = (b"0", b"\0", b"7")
_SKIPPED_TYPES = (b"1", b"2", b"3", b"4", b"5", b"6", b"g", b"V", b"M", b"N", b"K", b"D")


def split_key(name: str) -> tuple[Optional[str], Optional[str]]:
    """(key, extension) of a member name, or (None, None) if it has no extension."""
    m = _KEY_EXT.match(name)
    if m is None:
        return None, None
    return m.group(1), m.group(2).lower()


def is_metadata(name: str) -> bool:
    """True for WebDataset metadata members, which are not part of any sample."""
    return bool(_META.match(name)) or ("/" not in name and name.startswith("__") and name.endswith("__"))


def _parse_number(field: bytes, url: str, what: str, offset: int) -> int:
    if field and field[0] & 0x80:  # GNU base-256 encoding for large values
        value = int.from_bytes(field[1:], "big")
        if field[0] & 0x40:
            value -= 1 << (8 * len(field) - 1)
        return value
    text = field.split(b"\0", 1)[0].strip()
    if not text:
        return 0
    try:
        return int(text, 8)
    except ValueError:
        raise ShardFormatError(
            url,
            f"corrupt tar header at byte {offset}: the {what} field {field!r} is not a number",
            hint="the shard is damaged or is not a tar archive; re-create or re-download it",
        ) from None


@dataclass
class Member:
    """One regular tar member: its name, the offset of its header, and its data size."""

    name: str
    header_offset: int
    size: int


@dataclass
class RawSample:
    """One sample of a shard: its key, position in the shard, and the data of selected members."""

    key: str
    position: int
    url: str
    data: Dict[str, bytes] = field(default_factory=dict)
    extensions: list = field(default_factory=list)


class TarReader:
    """Reads tar members from a binary stream in order, without materialising the archive.

    ``want(ext)`` decides whose data is read; the data of other members is skipped.
    """

    def __init__(self, stream: BinaryIO, url: str):
        self._f = stream
        self.url = url
        self._pos = 0
        self._seekable = bool(getattr(stream, "seekable", lambda: False)())
        self._pending_name: Optional[str] = None
        self._pending_size: Optional[int] = None

    # -- low level -----------------------------------------------------------------------
    def _read_exact(self, n: int, what: str) -> bytes:
        data = self._f.read(n)
        if len(data) != n:
            raise ShardFormatError(
                self.url,
                f"truncated tar archive: expected {n} bytes of {what} at byte {self._pos}, "
                f"got {len(data)}",
                hint="the shard was cut short (interrupted copy or download); re-create it",
            )
        self._pos += n
        return data

    def _skip(self, n: int, what: str) -> None:
        if n <= 0:
            return
        if self._seekable:
            target = self._pos + n
            self._f.seek(target)
            self._pos = target
            return
        while n > 0:
            chunk = self._f.read(min(n, 1 << 20))
            if not chunk:
                raise ShardFormatError(
                    self.url,
                    f"truncated tar archive: {what} ends early at byte {self._pos}",
                    hint="the shard was cut short (interrupted copy or download); re-create it",
                )
            self._pos += len(chunk)
            n -= len(chunk)

    @staticmethod
    def _padded(size: int) -> int:
        return (size + BLOCK - 1) // BLOCK * BLOCK

    def _header(self) -> Optional[tuple[bytes, int]]:
        offset = self._pos
        hdr = self._f.read(BLOCK)
        if not hdr:
            return None  # end of stream without end-of-archive blocks: accepted, as tarfile does
        if len(hdr) != BLOCK:
            raise ShardFormatError(
                self.url,
                f"truncated tar archive: partial header of {len(hdr)} bytes at byte {offset}",
                hint="the shard was cut short (interrupted copy or download); re-create it",
            )
        self._pos += BLOCK
        if hdr.count(0) == BLOCK:
            return None  # end-of-archive marker
        stored = _parse_number(hdr[148:156], self.url, "checksum", offset)
        actual = sum(hdr) - sum(hdr[148:156]) + 8 * 32
        if stored != actual:
            raise ShardFormatError(
                self.url,
                f"corrupt tar header at byte {offset}: checksum mismatch "
                f"(stored {stored}, computed {actual})",
                hint="the shard is damaged or is not a tar archive; re-create or re-download it",
            )
        return hdr, offset

    def _pax(self, size: int) -> dict:
        raw = self._read_exact(size, "pax header")
        self._skip(self._padded(size) - size, "pax header padding")
        out = {}
        pos = 0
        while pos < len(raw):
            sp = raw.find(b" ", pos)
            if sp < 0:
                break
            try:
                length = int(raw[pos:sp])
            except ValueError:
                break
            record = raw[sp + 1 : pos + length - 1]
            k, _, v = record.partition(b"=")
            out[k.decode("utf-8", "replace")] = v.decode("utf-8", "replace")
            pos += length
        return out

    # -- members -------------------------------------------------------------------------
    def next_member(self) -> Optional[Member]:
        """The next regular member (positioned at its data), or None at the end of the archive."""
        long_name: Optional[str] = None
        pax: dict = {}
        while True:
            got = self._header()
            if got is None:
                return None
            hdr, offset = got
            typeflag = hdr[156:157]
            size = _parse_number(hdr[124:136], self.url, "size", offset)
            if typeflag == b"L":  # GNU long name
                long_name = self._read_exact(size, "long name").split(b"\0", 1)[0].decode("utf-8", "replace")
                self._skip(self._padded(size) - size, "long name padding")
                continue
            if typeflag == b"x":  # POSIX pax extended header for the next member
                pax = self._pax(size)
                continue
            if "size" in pax:
                size = int(pax["size"])
            if typeflag in _REGULAR:
                if long_name is not None:
                    name = long_name
                elif "path" in pax:
                    name = pax["path"]
                else:
                    name = hdr[0:100].split(b"\0", 1)[0].decode("utf-8", "replace")
                    if hdr[257:263] == b"ustar\0":
                        prefix = hdr[345:500].split(b"\0", 1)[0]
                        if prefix:
                            name = prefix.decode("utf-8", "replace") + "/" + name
                return Member(name, offset, size)
            if typeflag == b"S":
                raise ShardFormatError(
                    self.url,
                    f"unsupported GNU sparse member at byte {offset}",
                    hint="write shards without --sparse (e.g. with `dali-shards write` or tarfile)",
                )
            # directories, links, devices, global pax headers: no sample data
            long_name, pax = None, {}
            self._skip(self._padded(size), "skipped member")

    def read_data(self, member: Member) -> bytes:
        data = self._read_exact(member.size, f"member {member.name!r}")
        self._skip(self._padded(member.size) - member.size, "member padding")
        return data

    def skip_data(self, member: Member) -> None:
        self._skip(self._padded(member.size), f"member {member.name!r}")

    # -- samples -------------------------------------------------------------------------
    def samples(
        self,
        want: Callable[[str], bool] = lambda ext: True,
        *,
        start: int = 0,
        stop: Optional[int] = None,
        read: bool = True,
    ) -> Iterator[RawSample]:
        """Samples at positions ``[start, stop)`` in tar order, with the data of the members
        ``want`` selects. Earlier samples are passed over by their headers alone, as is every
        sample with ``read=False`` (a header scan)."""
        current: Optional[RawSample] = None
        position = -1
        while True:
            member = self.next_member()
            if member is None:
                break
            name = member.name
            key, ext = split_key(name)
            if key is None or is_metadata(name):
                self.skip_data(member)
                continue
            if current is None or key != current.key:
                if current is not None and position >= start:
                    yield current
                position += 1
                if stop is not None and position >= stop:
                    return
                current = RawSample(key, position, self.url)
            if ext in current.extensions:
                raise ShardFormatError(
                    self.url,
                    f"duplicate member {name!r} in sample {key!r}",
                    key=key,
                    hint="each sample may hold one file per extension; fix the shard writer",
                )
            current.extensions.append(ext)
            if read and position >= start and want(ext):
                current.data[ext] = self.read_data(member)
            else:
                self.skip_data(member)
        if current is not None and position >= start:
            yield current


def count_samples(stream: BinaryIO, url: str) -> int:
    """Number of samples in a shard, from its headers alone."""
    return sum(1 for _ in TarReader(stream, url).samples(read=False))
