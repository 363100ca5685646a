"""Streaming reader for WebDataset-style tar shards: members, keys and samples.

A *sample* is a run of consecutive regular members that share a key, where a member
``dir/name.ext1.ext2`` has key ``dir/name`` and extension ``ext1.ext2`` (lower-cased), exactly as
the ``webdataset`` library groups them. Members whose name has no extension and WebDataset
metadata members (``__xxx__``) are skipped, as are non-regular members (directories, links).

Only the standard library is used; the reader never loads a whole shard, and skips the data of
members nobody asked for (seeking when the stream allows it).
"""

from __future__ import annotations

from typing import Any, BinaryIO, Callable, Collection, Iterator, Optional, Tuple

from dali_shards.errors import ShardFormatError
from dali_shards.tar.members import KEY_EXT, Destination, Member, RawSample, is_metadata, split_key
from dali_shards.tar.header import (
    BLOCK,
    SPARSE_HINT,
    check_header,
    check_not_sparse,
    decode_name,
    header_name,
    header_start,
    parse_number,
    parse_pax,
    pax_size,
    printable,
)

READ_CHUNK = 16 << 20  # a member is read at most this much at a time: memory follows the bytes present
_REGULAR_FLAGS = frozenset(b"0\x007")  # regular file ("0", NUL) and contiguous file ("7")
_NO_DATA_FLAGS = frozenset(b"123456")  # links, devices, directories, FIFOs: no data (as tarfile)


_TRUNCATED_HINT = "the shard was cut short (interrupted copy or download); re-create it"
_NOT_TAR_HINT = "check that the file is a tar shard (one cut short by an interrupted copy or download: re-create it)"


class TarReader:
    """Reads tar members from a binary stream in order, without materialising the archive.

    A reader over a *span* of the shard (``span=(start, end)`` byte offsets, the stream positioned
    at ``start``) begins at the sample at position ``first`` (``start`` is where its headers
    begin) and ends at ``end`` (where the headers of the sample after the last one wanted begin)
    as if the archive ended there."""

    def __init__(
        self,
        stream: BinaryIO,
        url: str,
        *,
        span: Optional[Tuple[int, int]] = None,
        first: int = 0,
        size: Optional[int] = None,
    ):
        self._f = stream
        self._read = stream.read
        self.url = url
        self._pos = 0 if span is None else span[0]
        self._limit = None if span is None else span[1]
        self._first = first
        self._seekable = bool(getattr(stream, "seekable", lambda: False)())
        self._size = size  # known for seekable streams: a skip past it means the shard was cut short
        if self._seekable and size is None:
            here = stream.tell()
            self._size = stream.seek(0, 2)
            stream.seek(here)
        self.samples_seen = first  # sample positions ``samples()`` has passed (selected or not)
        self.end_offset: Optional[int] = None  # where the end-of-archive marker begins, once reached

    # -- low level -----------------------------------------------------------------------
    def _read_exact(self, n: int, what: str) -> bytes:
        self._check_present(n, what)
        data = self._read(n) if n <= READ_CHUNK else self._read_chunks(n)
        if len(data) != n:
            raise ShardFormatError(
                self.url,
                f"truncated tar archive: expected {n} bytes of {what} at byte {self._pos}, got {len(data)}",
                hint=_TRUNCATED_HINT,
            )
        self._pos += n
        return data

    def _read_chunks(self, n: int) -> bytes:
        """Up to ``n`` bytes, read a chunk at a time (a size field larger than the data allocates
        no more than the data)."""
        parts, got = [], 0
        while got < n:
            chunk = self._read(min(n - got, READ_CHUNK))
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
        return b"".join(parts)

    def _check_present(self, n: int, what: str) -> None:
        """ShardFormatError if a seekable shard is too short for ``n`` more bytes."""
        if self._size is not None and self._pos + n > self._size:
            raise ShardFormatError(
                self.url,
                f"truncated tar archive: {what} needs {n} bytes at byte {self._pos}, but the shard ends at "
                f"byte {self._size}",
                hint=_TRUNCATED_HINT,
            )

    def _skip(self, n: int, what: str) -> None:
        if n <= 0:
            return
        if self._seekable:
            assert self._size is not None  # known for seekable streams
            self._pos += n
            if self._pos > self._size:
                raise ShardFormatError(
                    self.url,
                    f"truncated tar archive: {what} ends at byte {self._pos}, past the end ({self._size} bytes)",
                    hint=_TRUNCATED_HINT,
                )
            self._f.seek(self._pos)
            return
        while n > 0:
            chunk = self._read(min(n, 1 << 20))
            if not chunk:
                raise ShardFormatError(
                    self.url, f"truncated tar archive: {what} ends early at byte {self._pos}", hint=_TRUNCATED_HINT
                )
            self._pos += len(chunk)
            n -= len(chunk)

    def _pax(self, size: int, offset: int) -> dict:
        raw = self._read_exact(size, "pax header")
        self._skip(-size % BLOCK, "pax header padding")
        return parse_pax(self.url, raw, offset)

    # -- members -------------------------------------------------------------------------
    def next_member(self) -> Optional[Member]:
        """The next regular member (positioned at its data), or None at the end-of-archive marker.
        A shard that ends without one (empty, or cut at a member boundary) is truncated."""
        long_name: Optional[str] = None
        pax: Optional[dict] = None
        start = self._pos
        if self._limit is not None and start >= self._limit:
            return None  # the end of the span
        while True:
            offset = self._pos
            hdr = self._header(offset)
            if hdr is None:
                return None  # end-of-archive marker
            typeflag = hdr[156]
            size = parse_number(self.url, hdr[124:136], "size", offset)
            if typeflag in _REGULAR_FLAGS:
                return self._regular(hdr, offset, size, long_name, pax, start)
            if typeflag == 76:  # "L": GNU long name of the next member
                long_name = decode_name(self._read_exact(size, "long name").split(b"\0", 1)[0])
                self._skip(-size % BLOCK, "long name padding")
            elif typeflag == 120:  # "x": POSIX pax extended header of the next member
                pax = self._pax(size, offset)
            elif typeflag == 83:  # "S"
                raise ShardFormatError(
                    self.url,
                    f"member {printable(header_name(hdr))!r} at byte {offset} is a GNU sparse file, which is not "
                    "supported",
                    hint=SPARSE_HINT,
                )
            else:  # directories, links, devices, global pax headers: no sample data
                long_name, pax = None, None
                self._skip(size + (-size % BLOCK) if typeflag not in _NO_DATA_FLAGS else 0, "skipped member")
                if self._limit is not None and self._pos >= self._limit:
                    return None

    def _header(self, offset: int) -> Optional[bytes]:
        """The header block at ``offset`` (checked), or None for the end-of-archive marker."""
        hdr = self._read(BLOCK)
        if len(hdr) != BLOCK:
            raise self._short(offset, hdr)
        self._pos = offset + BLOCK
        if hdr[0] == 0 and hdr.count(0) == BLOCK:
            self.end_offset = offset
            return None
        try:
            check_header(self.url, hdr, offset)
        except ShardFormatError as exc:
            if offset:
                raise
            detail = f"not a tar archive, or its first header is damaged: {exc.detail}"
            raise ShardFormatError(self.url, detail, hint=exc.hint) from None
        return hdr

    def _short(self, offset: int, hdr: bytes) -> ShardFormatError:
        """The error of a header block cut short: a truncated archive, or (at byte 0, unless the
        bytes there begin like a tar header) a file that is no tar archive."""
        if offset == 0 and hdr and not header_start(hdr):
            detail = f"not a tar archive: no valid tar header at byte 0 (it holds only {len(hdr)} bytes, less than one)"
            return ShardFormatError(self.url, detail, hint=_NOT_TAR_HINT)
        where = "inside its first header" if offset == 0 else "without the end-of-archive marker"
        what = "the shard is empty" if offset == 0 and not hdr else f"it ends at byte {offset + len(hdr)} {where}"
        return ShardFormatError(self.url, f"truncated tar archive: {what}", hint=_TRUNCATED_HINT)

    def _regular(
        self, hdr: bytes, offset: int, size: int, long_name: Optional[str], pax: Optional[dict], start: int
    ) -> Member:
        """A regular member, named by the long name or pax header before it if any."""
        name = long_name if long_name is not None else (pax or {}).get("path") or header_name(hdr)
        if pax is not None:
            check_not_sparse(self.url, pax, name, offset)
            if "size" in pax:
                size = pax_size(self.url, pax, name, offset)
        if size < 0:
            raise ShardFormatError(self.url, f"member {printable(name)!r}: negative size", hint=_TRUNCATED_HINT)
        return Member(name, offset, size, start)

    def read_data(self, member: Member) -> bytes:
        size = member.size
        data = self._read_exact(size, f"member {member.name!r}")
        self._skip(-size % BLOCK, "member padding")
        return data

    def read_into(self, member: Member, buffer: Any) -> Any:
        """Read a member's data into ``buffer`` (exactly its size); returns the buffer."""
        view = memoryview(buffer).cast("B")
        got, size = 0, member.size
        readinto = self._f.readinto  # type: ignore[attr-defined]  # the streams have it (typeshed's BinaryIO not)
        while got < size:
            n = readinto(view[got:])
            if not n:
                raise ShardFormatError(
                    self.url,
                    f"truncated tar archive: member {member.name!r} ends at byte {self._pos + got} of its {size}",
                    hint=_TRUNCATED_HINT,
                )
            got += n
        self._pos += size
        self._skip(-size % BLOCK, "member padding")
        return buffer

    def skip_data(self, member: Member) -> None:
        size = member.size
        self._skip(size + (-size % BLOCK), f"member {member.name!r}")

    # -- samples -------------------------------------------------------------------------
    def scan(self) -> Iterator[Tuple[int, str, str, Member]]:
        """``(sample position, key, extension, member)`` of every sample member, from the headers
        alone (the data is skipped after each is yielded, so a member whose data is cut short is
        yielded before the error), grouped by the same rules as ``samples``."""
        position, key = self._first - 1, None
        while True:
            member = self.next_member()
            if member is None:
                return
            k, ext = split_key(member.name)
            if k is not None and not is_metadata(member.name):
                assert ext is not None  # split_key gives both or neither
                if k != key:
                    position, key = position + 1, k
                yield position, k, ext, member
            self.skip_data(member)

    def samples(
        self,
        want: Optional[Collection[str]] = None,
        *,
        start: int = 0,
        stop: Optional[int] = None,
        read: bool = True,
        into: Optional[Destination] = None,
        select: Optional[Callable[[int], bool]] = None,
    ) -> Iterator[RawSample]:
        """Samples at positions ``[start, stop)`` in tar order (only those ``select`` accepts, if
        given), with the data of the members whose extension is in ``want`` (all if None), read
        where ``into`` says (default: new bytes objects). Other samples are passed over by their
        headers alone, as is every sample with ``read=False``. A sample with two members of one
        extension comes with ``error`` set (reading goes on)."""
        current: Optional[RawSample] = None
        position = self._first - 1
        taking = False
        key_ext = KEY_EXT.match
        next_member, skip_data, read_data, read_into = self.next_member, self.skip_data, self.read_data, self.read_into
        while True:
            member = next_member()
            if member is None:
                break
            name = member.name
            m = key_ext(name)
            if m is None or ("__" in name and is_metadata(name)):
                skip_data(member)
                continue
            key, ext = m.group(1), m.group(2).lower()
            if current is None or key != current.key:
                if current is not None and taking:
                    yield current
                position += 1
                if stop is not None and position >= stop:
                    self.samples_seen = position
                    return
                self.samples_seen = position + 1
                current = RawSample(key, position, self.url)
                taking = position >= start and (select is None or select(position))
            if ext in current.extensions:
                if not current.error:
                    current.error = f"duplicate member {name!r} in sample {key!r}"
                    current.hint = "each sample may hold one file per extension; fix the shard writer"
                skip_data(member)
                continue
            current.extensions.append(ext)
            if read and taking and (want is None or ext in want):
                self._check_present(member.size, f"member {printable(name)!r}")  # before any allocation
                big = not self._seekable and member.size > READ_CHUNK  # size unchecked: read, then copy
                buffer = into(current, ext, member.size) if into is not None and not big else None
                current.data[ext] = read_data(member) if buffer is None else read_into(member, buffer)
            else:
                skip_data(member)
        if current is not None and taking:
            yield current
