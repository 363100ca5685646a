"""Samples read by their byte span: positioned reads of local shard files, and one sample parsed
from the bytes of its span.

A sample's *span* is where its headers begin to where the next sample's begin (the offsets a
header scan or a version-2 manifest records, see ``catalog.manifest``). Reading a sample is one
positioned read of its span, so a worker can read any sample of any shard without reading what
lies before it, and holds no buffer between reads.
"""

from __future__ import annotations

import io
import os
import resource
from collections import OrderedDict
from typing import Any, BinaryIO, Collection, Optional, Sequence, Tuple

import numpy as np

from dali_shards.errors import ShardAccessError, ShardFormatError
from dali_shards.io.storage import open_local
from dali_shards.tar.format import TarReader
from dali_shards.tar.members import Destination, RawSample

MAX_OPEN = 256  # local shard files a worker keeps open (fewer if the process's file limit is low)
_STALE_HINT = "the shard changed after it was counted; rebuild its manifest (dali-shards index) or restart so it is scanned again"
_READ_HINT = "check the file system"
_DAMAGED_HINT = (
    "the shard is damaged there, or changed after it was indexed: check it with `dali-shards inspect`, then "
    "re-create it or rebuild its manifest (dali-shards index)"
)


class _SpanBytes(io.BytesIO):
    """Bytes ``[base, base + len(data))`` of a shard, addressed by shard offsets."""

    def __init__(self, data: bytes, base: int):
        super().__init__(data)
        self._base = base

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            pos -= self._base
        return super().seek(pos, whence) + self._base

    def tell(self) -> int:
        return super().tell() + self._base


def sample_in_span(
    data: bytes,
    url: str,
    span: Tuple[int, int],
    position: int,
    want: Optional[Collection[str]] = None,
    into: Optional[Destination] = None,
) -> RawSample:
    """The sample at ``position`` of shard ``url`` from the bytes of its ``span``, read as
    ``TarReader.samples`` reads it; a ``ShardFormatError`` if the bytes do not hold exactly one
    sample (a shard changed since it was indexed, or damaged there)."""
    lo, hi = span
    if len(data) != hi - lo:
        raise ShardFormatError(
            url, f"sample {position} should lie in bytes {lo}-{hi - 1}, but only {len(data)} of those bytes could be "
            f"read (the shard, or the answer to the request for them, ends at byte {lo + len(data)})", hint=_STALE_HINT,
        )  # fmt: skip
    reader = TarReader(_SpanBytes(bytes(data), lo), url, span=span, first=position, size=hi)
    try:
        found = list(reader.samples(want, start=position, into=into))
    except ShardFormatError as exc:
        raise ShardFormatError(
            url, f"sample {position} (bytes {lo}-{hi - 1}) cannot be read: {exc.detail}", key=exc.key, hint=_DAMAGED_HINT
        ) from None
    if len(found) != 1:
        raise ShardFormatError(
            url, f"bytes {lo}-{hi - 1} should hold sample {position}, but hold {len(found)} samples", hint=_STALE_HINT
        )
    return found[0]


def _open_limit() -> int:
    try:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (OSError, ValueError):  # pragma: no cover - no limit to ask
        return MAX_OPEN
    return MAX_OPEN if soft == resource.RLIM_INFINITY else max(8, min(MAX_OPEN, soft // 4))


class LocalFiles:
    """Positioned reads of local files, the least recently used closed beyond a bound (at most
    ``MAX_OPEN``, and a quarter of the process's file limit). A file is checked against the size
    it had when counted when it is opened."""

    def __init__(self, max_open: Optional[int] = None):
        self.max_open = max_open or _open_limit()
        self._files: "OrderedDict[str, BinaryIO]" = OrderedDict()
        self._sizes: dict = {}

    def read(self, url: str, path: str, span: Tuple[int, int], size: Optional[int] = None) -> np.ndarray:
        """Bytes ``span`` of the file at ``path`` (shard ``url``), read into a new uint8 array (one
        copy, from the page cache or the disk); fewer only where the file ends sooner."""
        self._file(url, path, span, size)  # the span is checked against the file before allocating
        data = np.empty(span[1] - span[0], dtype=np.uint8)
        return data[: self.read_into(url, path, span, size, data)]

    def read_into(self, url: str, path: str, span: Tuple[int, int], size: Optional[int], out: Any) -> int:
        """Read bytes ``span`` of the file at ``path`` into ``out`` (a writable buffer of the span's
        length); the bytes read (fewer only where the file ends sooner)."""
        fd = self._file(url, path, span, size).fileno()
        lo, hi = span
        try:
            return self._read_whole(fd, memoryview(out).cast("B"), lo, hi, 0)
        except OSError as exc:
            raise ShardAccessError(url, f"read error in bytes {lo}-{hi - 1}: {exc}", hint=_READ_HINT) from None

    def read_runs(self, url: str, path: str, size: Optional[int], runs: Sequence[Tuple[int, int, int]],
                  out: Any) -> bool:  # fmt: skip
        """Read each run ``(lo, hi, at)``: bytes ``[lo, hi)`` of the file at ``path`` (shard
        ``url``) into ``out[at : at + hi - lo]``; whether every run was read whole (False where the
        file ends sooner, or ``out`` does). Runs are checked against the file as ``read_into``
        checks a span."""
        if not runs:
            return True
        far = max(runs, key=lambda run: run[1])
        fd = self._file(url, path, (far[0], far[1]), size).fileno()
        view, preadv = memoryview(out).cast("B"), os.preadv
        try:
            for lo, hi, at in runs:
                got = preadv(fd, [view[at : at + hi - lo]], lo)
                if got != hi - lo and self._read_whole(fd, view, lo, hi, at, got) != hi - lo:
                    return False
        except OSError as exc:
            raise ShardAccessError(url, f"read error in bytes {lo}-{hi - 1}: {exc}", hint=_READ_HINT) from None
        return True

    @staticmethod
    def _read_whole(fd: int, view: memoryview, lo: int, hi: int, at: int, got: int = 0) -> int:
        """Bytes ``[lo, hi)`` of ``fd`` into ``view[at:]``, the first ``got`` already there, read on
        until whole or the file ends (a read may return less); how many there are."""
        while got < hi - lo:
            n = os.preadv(fd, [view[at + got : at + hi - lo]], lo + got)
            if not n:
                break
            got += n
        return got

    def _file(self, url: str, path: str, span: Tuple[int, int], size: Optional[int]) -> BinaryIO:
        """The open file at ``path``; a ShardFormatError if ``span`` ends beyond it (a bad or stale
        index: never allocate or read more than the file holds)."""
        f = self._files.get(path)
        if f is None:
            f = open_local(path, url, size)
            self._files[path] = f
            self._sizes[path] = os.fstat(f.fileno()).st_size
            while len(self._files) > self.max_open:
                old, closing = self._files.popitem(last=False)
                closing.close()
                self._sizes.pop(old, None)
        else:
            self._files.move_to_end(path)
        lo, hi = span
        if hi > self._sizes[path]:
            raise ShardFormatError(
                url, f"a sample's span, bytes {lo}-{hi - 1}, lies beyond the end of the file, which has "
                f"{self._sizes[path]} bytes: the shard is not what its index (manifest or scan) says", hint=_STALE_HINT,
            )  # fmt: skip
        return f

    def close(self) -> None:
        while self._files:
            self._files.popitem()[1].close()
        self._sizes.clear()
