"""One streamed HTTP GET of a byte range (:class:`HTTPBody`): the answer checked, its body read
into the caller's buffer as it arrives, ``TimeoutError`` when no byte comes for ``timeout`` s.

What an answer means (:func:`check_answer`): 206 gives the bytes asked (and the object's size);
200 gives the whole object from its first byte -- a server that ignores ``Range`` (remembered, see
``io.rangesupport``): the bytes before the range are dropped; 404 and 416 are answered for the
caller. A 200 whose body holds only the range's bytes breaks the Range protocol: a permanent
:class:`~dali_shards.errors.ShardAccessError` (not a stale manifest).
"""

from __future__ import annotations

import asyncio
import re
from typing import TYPE_CHECKING, Any, Callable, Optional

from dali_shards.errors import ShardAccessError, ShardFormatError
from dali_shards.io.fsrequest import Cancelled
from dali_shards.io.rangesupport import note_ignores_range

if TYPE_CHECKING:
    from dali_shards.io.ranged import RangeReader

_HTTP_READ = 1 << 20  # bytes asked of a streamed body at a time (it returns what has arrived)
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")
_UNSATISFIED_RANGE = re.compile(r"bytes\s+\*/(\d+)")


class HTTPBody:
    """The answer to ``GET`` bytes ``[start, end)`` of ``reader``'s object (``end`` None: to its
    end), opened with :meth:`open`; :meth:`read_into` reads on from ``pos``, the object offset of
    the body's next byte. A body may be read in several calls (a stream reading a whole object from
    a server that ignores ``Range``), then closed (:meth:`close`)."""

    def __init__(self, reader: "RangeReader", start: int, end: Optional[int]):
        self.reader, self.start, self.end = reader, start, end
        self.pos = start
        self.ends_at: Optional[int] = None  # the object offset where the body ends, when known
        self._r: Any = None
        self._skip = 0

    async def open(self) -> None:
        """Send the request; raise for an error answer (see :func:`check_answer`)."""
        reader = self.reader
        fs, timeout = reader.fs, reader.config.request_timeout
        session = await fs.set_session()
        kw = dict(fs.kwargs)
        headers = dict(kw.pop("headers", None) or {})
        last = "" if self.end is None else str(self.end - 1)
        headers.update({"Range": f"bytes={self.start}-{last}", "Accept-Encoding": "identity"})
        try:
            self._r = await asyncio.wait_for(session.get(fs.encode_url(reader.path), headers=headers, **kw), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"no answer within {timeout:g} s") from None
        try:
            await self._answered()
        except BaseException:
            self.close(reusable=False)
            raise

    async def _answered(self) -> None:
        r, reader = self._r, self.reader
        length = _body_length(r)
        if r.status == 200 and self.start == 0 and self.end == length and reader.known_size() is None:
            size = await _head_size(reader)  # the range's length: the whole object, or only the range?
            if size is not None and length is not None and size > length:
                raise protocol_error(reader.url, self.start, self.end, length)
        self._skip = check_answer(reader, r, self.start, self.end)
        if r.status == 206:
            m = _CONTENT_RANGE.match(r.headers.get("Content-Range", ""))
            self.ends_at = int(m.group(2)) + 1 if m else (None if length is None else self.start + length)
        elif r.status == 200:
            self.ends_at = length
        else:
            self.ends_at = self.start  # 416: nothing from here on

    async def read_into(self, view: memoryview, cancelled: Callable[[], bool]) -> int:
        """Fill ``view`` with the body's next bytes; fewer only where the body ends. Returns how
        many; ``pos`` moves on with every byte written (also when a failure interrupts it)."""
        r, timeout, got = self._r, self.reader.config.request_timeout, 0
        while got < len(view):
            if cancelled():
                raise Cancelled()
            n = min(_HTTP_READ, self._skip or len(view) - got)
            try:
                data = await asyncio.wait_for(r.content.read(n), timeout)
            except asyncio.TimeoutError:
                raise TimeoutError(f"no bytes for {timeout:g} s ({got} of {len(view)} received)") from None
            if not data:
                break
            if self._skip:
                self._skip -= len(data)
                continue
            view[got : got + len(data)] = data
            got += len(data)
            self.pos += len(data)
        return got

    def more(self) -> bool:
        """Whether the body goes on past ``pos`` (as far as its headers tell)."""
        if self.ends_at is not None:
            return self.pos < self.ends_at
        return not self._r.content.at_eof()

    def close(self, reusable: bool = True) -> None:
        """Done with the body: the connection serves the next request if the body was read to its
        end (and ``reusable``), else it is dropped."""
        r, self._r = self._r, None
        if r is None:
            return
        if reusable and r.content.at_eof():
            r.release()
        else:
            r.close()


def _body_length(r: Any) -> Optional[int]:
    length = r.headers.get("Content-Length")
    if length is None or not length.isdigit() or r.headers.get("Content-Encoding", "identity") not in ("identity", ""):
        return None
    return int(length)


async def _head_size(reader: "RangeReader") -> Optional[int]:
    try:
        info = await asyncio.wait_for(reader.fs._info(reader.path), reader.config.request_timeout)
        return int(info["size"]) if info.get("size") is not None else None
    except Exception:  # noqa: BLE001 - unknown: the answer is taken as the whole object
        return None


def protocol_error(url: str, start: int, end: Optional[int], length: int) -> ShardAccessError:
    """A server answered a range with 200 and only the range's bytes."""
    asked = f"bytes {start}-{'' if end is None else end - 1}"
    return ShardAccessError(
        url,
        f"asked for {asked}, the server answered 200 (meaning the whole object) with only {length} bytes: it breaks "
        "HTTP's Range protocol (a range is answered 206 with Content-Range, or 200 with the whole object)",
        hint="fix the server, or serve the shards from one that supports Range requests (nginx, S3, GCS...)",
    )


def check_answer(reader: "RangeReader", r: Any, start: int, end: Optional[int]) -> int:
    """Raise for an error answer to bytes ``[start, end)``; learn the object's size from a good one.
    Returns the bytes to drop from the body (a server ignoring ``Range`` sends the whole object)."""
    if r.status == 404:
        raise FileNotFoundError(reader.url)
    if r.status == 416:
        m = _UNSATISFIED_RANGE.match(r.headers.get("Content-Range", ""))
        if m:
            reader.learn_size(int(m.group(1)))
        elif reader.expected is not None and start < reader.expected:
            raise ShardFormatError(
                reader.url,
                f"the server has no bytes from {start} on (416), but its manifest says {reader.expected}",
                hint="run `dali-shards index` on the shards again (it rewrites the manifest)",
            )
        return 0
    r.raise_for_status()
    if r.status == 206:
        m = _CONTENT_RANGE.match(r.headers.get("Content-Range", ""))
        if m and int(m.group(1)) != start:
            raise OSError(f"asked for bytes from {start}, the server sent them from {m.group(1)}")
        if m and m.group(3) != "*":
            reader.learn_size(int(m.group(3)))
        return 0
    length, known = _body_length(r), reader.known_size()
    whole = known if known is not None else length  # the object's size, as far as it is known
    if start > 0 or (end is not None and whole is not None and end < whole):  # a part asked, 200 answered
        stop = end if known is None else known if end is None else min(end, known)
        if length is not None and stop is not None and length == stop - start and length != known:
            raise protocol_error(reader.url, start, end, length)
        note_ignores_range(reader.url)
    if length is not None:
        reader.learn_size(length)
    return start
