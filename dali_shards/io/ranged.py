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

A read's bytes arrive in one buffer of the size asked, filled in place. Over HTTP a server may
ignore ``Range`` and answer with the whole object (see ``httpget``, ``rangesupport``): the bytes
before the range are dropped, and a stream reading the object on keeps that answer for its next
read rather than asking again.

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

import logging
import random
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Tuple, Union

from dali_shards.errors import ShardAccessError, ShardError, ShardFormatError
from dali_shards.io.filesystems import DEFAULT_STORAGE, filesystem
from dali_shards.io.fsrequest import Cancelled, access_error, answer_status, permanent, read_pieces, stale_error, timed
from dali_shards.io.httpget import HTTPBody
from dali_shards.io.rangesupport import ignores_range

if TYPE_CHECKING:
    from dali_shards.options import StorageOptions

log = logging.getLogger("dali_shards")

_confirmed: Dict[Tuple[str, int], bool] = {}  # (URL, size) the server confirmed in this process


class _Filling:
    """Bytes ``[start, start + size)`` of an object, filled in place: one buffer of the size asked,
    allocated when the first bytes arrive (never grown, so never copied); cut to what arrived."""

    def __init__(self, start: int, size: int):
        self.start, self.size, self.filled = start, size, 0
        self.buffer: Optional[bytearray] = None

    def room(self, stop: int) -> memoryview:
        """The part of the buffer for bytes ``[start + filled, stop)`` (release it after use)."""
        if self.buffer is None:
            self.buffer = bytearray(self.size)
        return memoryview(self.buffer)[self.filled : stop - self.start]

    def add(self, data: bytes) -> None:
        with self.room(self.start + self.filled + len(data)) as view:
            view[:] = data
        self.filled += len(data)

    def result(self) -> bytearray:
        if self.buffer is None:
            return bytearray()
        if self.filled < len(self.buffer):
            del self.buffer[self.filled :]
        return self.buffer


class RangeReader:
    """Retried ranged reads of one remote object (see the module's docstring). ``size`` is the
    size the caller expects (a manifest's ``bytes``), checked against the server's. ``stream``: the
    caller reads the object on in order (a whole-shard stream), so an HTTP answer holding more than
    was asked (a server ignoring ``Range``) is kept open for the next read instead of asked again;
    :meth:`close` drops it."""

    def __init__(
        self, url: str, config: Optional["StorageOptions"] = None, size: Optional[int] = None, stream: bool = False
    ):
        self.url = url
        self.config = config or DEFAULT_STORAGE
        self.fs, self.path = filesystem(url, self.config)
        self.http = url.startswith(("http://", "https://"))
        self.expected = size
        self.size: Optional[int] = None  # as the server reported it (or confirmed earlier in this process)
        if size is not None and (url, size) in _confirmed:
            self.size = size
        self.retried = 0  # transient failures overcome, for tests and logs
        self.stream = stream
        self._lock = threading.Lock()
        self._body: Optional[HTTPBody] = None  # an answer read up to its pos, kept for the next read
        self._body_lock = threading.Lock()
        self._closed = False

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
        """``read``'s bytes in the buffer they arrived in (no copy): one buffer of the size asked,
        filled in place (cut short only at the object's end)."""
        size = self.known_size()
        fill = _Filling(start, max(0, (end if size is None else min(end, size)) - start))
        failures = 0
        while True:
            pos = start + fill.filled
            size = self.known_size()
            stop = end if size is None else min(end, size)
            if pos >= stop:
                break
            try:
                whole = self._fetch(pos, stop, fill, cancelled)
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
            got, size = start + fill.filled, self.known_size()
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
        return fill.result()

    def _fetch(self, pos: int, stop: int, fill: _Filling, cancelled: Callable[[], bool]) -> Optional[bytes]:
        """Add bytes ``[pos, stop)`` to ``fill`` (fewer if the answer is short); raises on failure
        after adding what did arrive. Where ``fill`` is empty and one answer holds all the bytes,
        they are returned instead (no copy: other stores, see ``fsrequest.read_pieces``)."""
        if self.http:
            from fsspec.asyn import sync

            sync(self.fs.loop, self._http_fill, pos, stop, fill, cancelled)
            return None
        return read_pieces(self.fs, self.path, pos, stop, fill, self.config, self.url, cancelled)

    async def _http_fill(self, pos: int, stop: int, fill: _Filling, cancelled: Callable[[], bool]) -> None:
        """Bytes ``[pos, stop)`` into ``fill`` from one streamed GET (or the answer kept open at
        ``pos``); the object's size learned from its headers. A stream keeps an answer that goes on."""
        if cancelled() or self._closed:
            raise Cancelled()
        body = self._take_body(pos)
        if body is None:
            body = HTTPBody(self, pos, None if self.stream and ignores_range(self.url) else stop)
            await body.open()
        size, ok = self.known_size(), False
        stop = stop if size is None else min(stop, size)
        try:
            with fill.room(stop) as view:
                await body.read_into(view, cancelled)
            ok = True
        finally:
            fill.filled += body.pos - pos  # what arrived, also before a failure
            kept = ok and self.stream and body.pos == stop and body.more() and not cancelled()
            if kept:
                with self._body_lock:
                    if not self._closed:
                        self._body, body = body, self._body  # body: one kept before, if any
            if body is not None:
                body.close(reusable=ok and not kept)

    def _take_body(self, pos: int) -> Optional[HTTPBody]:
        """The answer kept open, if it is at ``pos`` (one elsewhere is dropped)."""
        with self._body_lock:
            body, self._body = self._body, None
        if body is not None and body.pos != pos:
            body.close(reusable=False)
            return None
        return body

    def close(self) -> None:
        """Drop an answer kept open for the next read (streams), and keep none from now on."""
        with self._body_lock:
            body, self._body, self._closed = self._body, None, True
        if body is not None:
            try:
                self.fs.loop.call_soon_threadsafe(body.close, False)
            except RuntimeError:  # the loop is gone (the interpreter is exiting): so is the connection
                pass


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
