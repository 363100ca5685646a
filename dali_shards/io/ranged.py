"""Retried ranged reads of one remote object (:class:`RangeReader`), and what ``timeout`` means.

- ``http(s)://``: *inactivity*. Each ranged GET is streamed, and fails when no byte arrives for
  ``timeout`` seconds (waiting for the answer, or within its body). Bytes received before a
  failure are kept (after a stall all of them; after a connection cut those read before aiohttp
  noticed the cut): the retry asks for the first missing byte on. A slow but live server is never
  timed out; a stalled one costs ``timeout`` per attempt.
- other stores (``s3://``, ``gs://``...: fsspec offers no streaming range read for them): each
  ranged request must complete within ``timeout``. One that does not is asked again as half the
  range, down to 64 KiB (completed ranges are kept), so a slow store still progresses; the piece
  size is remembered per filesystem and doubles again after pieces that complete within a quarter
  of ``timeout``. Every timeout counts as a failed attempt.
- metadata requests (sizes) and whole small objects (manifests): each within ``timeout``.

The object's size comes from the server (an answer's ``Content-Range`` over HTTP; elsewhere a
metadata request, made alongside the first read and once per process for each object) and is
compared with the size the caller expects (a manifest's ``bytes``): a difference is a
:class:`~dali_shards.errors.ShardFormatError` naming both sizes.

A failed request is retried ``retries`` times with exponential backoff, unless retrying cannot
help: not found, access denied, or a range past the end of the object (416: the object is shorter
than expected, reported at once). Then a :class:`~dali_shards.errors.ShardAccessError` names the
URL, and, when the server could not be reached at all, its host and port.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Tuple, Union

from dali_shards.errors import ShardAccessError, ShardError, ShardFormatError
from dali_shards.io.fsrequest import access_error, answer_status, permanent, stale_error, timed

if TYPE_CHECKING:
    from dali_shards.options import StorageOptions

log = logging.getLogger("dali_shards")

MIN_PIECE = 64 << 10
_HTTP_READ = 1 << 20  # bytes asked of a streamed body at a time (it returns what has arrived)
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-\d+/(\d+|\*)")
_UNSATISFIED_RANGE = re.compile(r"bytes\s+\*/(\d+)")
_pieces: Dict[int, int] = {}  # per filesystem: the request size that completes within the timeout
_confirmed: Dict[Tuple[str, int], bool] = {}  # (URL, size) the server confirmed in this process


class Cancelled(Exception):
    """The stream no longer needs the bytes being fetched."""


async def _http_get(reader: "RangeReader", start: int, end: int, sink: bytearray, cancelled: Callable[[], bool]):
    """Stream bytes ``[start, end)`` into ``sink`` as they arrive; tell ``reader`` the object's size
    as soon as the answer says it. ``TimeoutError`` when no byte comes for ``timeout`` s."""
    fs, timeout = reader.fs, reader.config.request_timeout
    session = await fs.set_session()
    kw = dict(fs.kwargs)
    headers = dict(kw.pop("headers", None) or {})
    headers.update({"Range": f"bytes={start}-{end - 1}", "Accept-Encoding": "identity"})
    try:
        r = await asyncio.wait_for(session.get(fs.encode_url(reader.path), headers=headers, **kw), timeout)
    except asyncio.TimeoutError:
        raise TimeoutError(f"no answer within {timeout:g} s") from None
    finished = False
    try:
        skip = _check_answer(reader, r, start)
        total = reader.known_size()
        want = end - start if total is None else min(end, total) - start
        got = 0
        while got < want:
            if cancelled():
                raise Cancelled()
            try:
                data = await asyncio.wait_for(r.content.read(_HTTP_READ), timeout)
            except asyncio.TimeoutError:
                raise TimeoutError(f"no bytes for {timeout:g} s ({got} of {want} received)") from None
            if not data:
                break
            if skip:
                cut, skip = min(skip, len(data)), skip - min(skip, len(data))
                data = data[cut:]
            data = data[: want - got]
            sink += data
            got += len(data)
        finished = r.content.at_eof()
    finally:
        if finished:
            r.release()  # the connection can serve the next request
        else:
            r.close()


def _check_answer(reader: "RangeReader", r: Any, start: int) -> int:
    """Raise for an error answer; learn the object's size from a good one. Returns the bytes to
    drop from the body (a server ignoring ``Range`` sends the whole object)."""
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
        if m and m.group(2) != "*":
            reader.learn_size(int(m.group(2)))
        return 0
    length = r.headers.get("Content-Length")
    if length is not None and r.headers.get("Content-Encoding", "identity") in ("identity", ""):
        reader.learn_size(int(length))
    return start


class RangeReader:
    """Retried ranged reads of one remote object (see the module's docstring). ``size`` is the
    size the caller expects (a manifest's ``bytes``), checked against the server's."""

    def __init__(self, url: str, config: Optional["StorageOptions"] = None, size: Optional[int] = None):
        from dali_shards.io.remote import DEFAULT_STORAGE, filesystem

        self.url = url
        self.config = config or DEFAULT_STORAGE
        self.fs, self.path = filesystem(url, self.config)
        self.http = url.startswith(("http://", "https://"))
        self.expected = size
        self.size: Optional[int] = None  # as the server reported it (or confirmed earlier in this process)
        if size is not None and (url, size) in _confirmed:
            self.size = size
        self.retried = 0  # transient failures overcome, for tests and logs
        self._lock = threading.Lock()

    def known_size(self) -> Optional[int]:
        """The server's size if it told it, else the size expected (None if neither)."""
        return self.size if self.size is not None else self.expected

    def learn_size(self, size: int) -> None:
        """The size the server reported; a ShardFormatError if it is not the size expected."""
        if self.expected is not None and size != self.expected:
            raise stale_error(self.url, size, self.expected)
        self.size = size
        if not self.http:  # over HTTP every answer tells the size anyway
            _confirmed[(self.url, size)] = True

    def object_size(self) -> Optional[int]:
        """The object's size: over HTTP what is known so far (no request: the first answer tells
        it); elsewhere asked once with a metadata request and checked against the size expected."""
        if self.http:
            return self.known_size()
        with self._lock:
            if self.size is None:
                self.learn_size(int(self.retrying("size request", lambda: self._timed("size", self.path))))
        return self.size

    def metadata_size(self) -> Optional[int]:
        """One metadata request for the size (None if the server does not say)."""
        size = self.retrying("size request", lambda: self._timed("size", self.path))
        return None if size is None else int(size)

    def whole(self, what: str) -> bytes:
        """The whole object in one request (small objects: manifests)."""
        return self.retrying(what, lambda: self._timed("cat_file", self.path))

    def _timed(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return timed(self.fs, method, self.config.request_timeout, *args, **kwargs)

    def retrying(self, what: str, func: Callable[[], Any], cancelled: Callable[[], bool] = lambda: False) -> Any:
        """``func()``, retried on transient errors; a ``ShardAccessError`` naming ``what`` otherwise."""
        for attempt in range(self.config.retries + 1):
            try:
                return func()
            except Exception as exc:  # noqa: BLE001 - classified below
                if permanent(exc):
                    raise self._permanent_error(what, exc) from exc
                if attempt == self.config.retries or cancelled():
                    raise access_error(self.url, what, exc, attempt + 1, self.fs) from exc
                self._back_off(what, exc, attempt)
        raise AssertionError("unreachable")

    def _permanent_error(self, what: str, exc: BaseException) -> ShardError:
        status = answer_status(exc)
        if status == 416:
            return ShardFormatError(
                self.url,
                f"{what}: the object ends before that range (416): it is shorter than when it was indexed",
                hint="run `dali-shards index` on the shards again (it rewrites the manifest)",
            )
        reason = "not found" if isinstance(exc, FileNotFoundError) or status in (404, 410) else exc
        return ShardAccessError(
            self.url,
            f"{what}: {reason}",
            hint="check the URL, the bucket and the credentials (storage_options=, AWS_* variables)",
        )

    def _back_off(self, what: str, exc: BaseException, attempt: int) -> None:
        cfg = self.config
        wait = min(cfg.backoff * (2**attempt), cfg.max_backoff) * (0.5 + random.random() / 2)
        log.warning(
            "dali_shards: %s of %s failed (%s: %s); retry %d of %d in %.2f s",
            what,
            self.url,
            type(exc).__name__,
            exc,
            attempt + 1,
            cfg.retries,
            wait,
        )
        self.retried += 1
        time.sleep(wait)

    def read(self, start: int, end: int, cancelled: Callable[[], bool] = lambda: False) -> bytes:
        """Bytes ``[start, end)``, fewer only at the end of the object. A failed or short answer
        is retried from its first missing byte, ``retries`` times at most."""
        return bytes(self.read_buffer(start, end, cancelled))

    def read_buffer(self, start: int, end: int, cancelled: Callable[[], bool] = lambda: False) -> Union[bytes, bytearray]:
        """``read``'s bytes in the buffer they arrived in (no copy)."""
        sink = bytearray()
        failures = 0
        while True:
            pos = start + len(sink)
            size = self.known_size()
            stop = end if size is None else min(end, size)
            if pos >= stop:
                break
            try:
                whole = self._fetch(pos, stop, sink, cancelled)
            except (Cancelled, ShardError):
                raise
            except Exception as exc:  # noqa: BLE001 - classified below
                if permanent(exc):
                    raise self._permanent_error(f"read of bytes {pos}-{stop - 1}", exc) from exc
                if failures == self.config.retries or cancelled():
                    raise access_error(self.url, f"read of bytes {pos}-{stop - 1}", exc, failures + 1, self.fs) from exc
                self._back_off(f"read of bytes {pos}-{stop - 1}", exc, failures)
                failures += 1
                continue
            if whole is not None:
                return whole
            got, size = start + len(sink), self.known_size()
            if size is None or got >= min(end, size):
                break  # complete; or a short answer from a server that does not tell the size: its end
            if self.size is None and not self.http:
                self.object_size()  # short of the size expected: is it the server's? (a stale manifest raises)
            failures += 1
            if failures > self.config.retries:
                raise ShardAccessError(
                    self.url,
                    f"the body of bytes {start}-{end - 1} keeps stopping at byte {got}",
                    hint="the server cuts responses short; check it or raise retries=",
                )
            self.retried += 1
            log.warning("dali_shards: response for %s stopped at byte %d; resuming there", self.url, got)
        return sink

    def _fetch(self, pos: int, stop: int, sink: bytearray, cancelled: Callable[[], bool]) -> Optional[bytes]:
        """Append bytes ``[pos, stop)`` to ``sink`` (fewer if the answer is short); raises on failure
        after appending what did arrive. Where ``sink`` is empty and one answer holds all the bytes,
        they are returned instead (no copy)."""
        if self.http:
            from fsspec.asyn import sync

            sync(self.fs.loop, _http_get, self, pos, stop, sink, cancelled)
            return None
        while pos < stop:
            if cancelled():
                raise Cancelled()
            piece = _pieces.get(id(self.fs), self.config.chunk_size)
            hi = min(stop, pos + piece)
            began = time.monotonic()
            try:
                data = self._timed("cat_file", self.path, start=pos, end=hi)
            except TimeoutError:
                if hi - pos > MIN_PIECE:
                    _pieces[id(self.fs)] = max(MIN_PIECE, (hi - pos) // 2)
                    log.warning("dali_shards: %s: asking for %d bytes at a time", self.url, _pieces[id(self.fs)])
                raise
            if time.monotonic() - began < self.config.request_timeout / 4 and hi - pos == piece < self.config.chunk_size:
                _pieces[id(self.fs)] = min(self.config.chunk_size, piece * 2)
            if len(data) > hi - pos:
                raise OSError(f"asked for {hi - pos} bytes at {pos}, got {len(data)}")
            if not sink and hi == stop and len(data) == stop - pos:
                return data
            sink += data
            if len(data) < hi - pos:
                return None
            pos = hi
        return None


class SizeCheck(threading.Thread):
    """``reader.object_size()`` (a metadata request, checked against the size expected) in a
    thread of its own; :meth:`result` waits for it and raises what it raised."""

    def __init__(self, reader: "RangeReader"):
        super().__init__(daemon=True, name="dali_shards-size")
        self.reader = reader
        self.error: Optional[BaseException] = None
        self.start()

    def run(self) -> None:
        try:
            self.reader.object_size()
        except BaseException as exc:  # noqa: BLE001 - handed to result()
            self.error = exc

    def result(self) -> None:
        self.join()
        if self.error is not None:
            raise self.error
