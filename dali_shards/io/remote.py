"""Reading objects from remote storage (``s3://``, ``gs://``, ``http(s)://``... through fsspec)
as sequential streams: ranged requests of ``chunk_size`` bytes fetched ahead in a background
thread, each retried with exponential backoff and resumed at the byte it stopped at (see
``ranged`` for the retries and what ``request_timeout`` bounds). From an HTTP server that ignores
``Range`` (it answers with the whole object, see ``rangesupport``) an object is read in one GET,
its body delivered ``chunk_size`` bytes at a time as the reader takes them (the same ``chunks_ahead``
held ready; the connection waits meanwhile), not downloaded whole once per chunk.

A request that raises a transient error (connection reset or refused, 5xx, timeout, a body cut
short) is retried; "not found", "permission denied" and a range past the end are not. After
``retries`` retries the reader raises :class:`~dali_shards.errors.ShardAccessError` naming the
URL, so a stalled server never hangs a worker.
"""

from __future__ import annotations

import io
import logging
import threading
from collections import deque
from typing import Any, Callable, Deque, Optional, Tuple, Union

from dali_shards.errors import ShardAccessError
from dali_shards.options import StorageOptions
from dali_shards.io.filesystems import DEFAULT_STORAGE
from dali_shards.io.ranged import RangeReader, SizeCheck

log = logging.getLogger("dali_shards")

class Tee:
    """Where a stream copies its bytes (the cache): the object's size as its first answer told it
    (``begin``, None if unknown), sequential chunks, then complete (with the object's size as the
    server or the manifest confirmed it, None if unconfirmed) or abandon."""

    def begin(self, size: Optional[int]) -> None: ...

    def write(self, offset: int, data: bytes) -> None: ...

    def complete(self, size: Optional[int] = None) -> None: ...

    def abandon(self) -> None: ...


class RemoteStream(io.RawIOBase):
    """A remote object as a readable stream. A background thread fetches the next
    ``chunks_ahead`` chunks while the consumer reads; seeking is supported when the size is
    known (a seek outside the fetched window restarts the fetching there). ``tee`` receives the
    chunks of an uninterrupted read from byte 0 and is completed at its end, or abandoned."""

    def __init__(
        self, url: str, config: StorageOptions = DEFAULT_STORAGE, size: Optional[int] = None, tee: Optional[Tee] = None
    ):
        super().__init__()
        self.url = url
        self._reader = RangeReader(url, config, size, stream=True)
        self._config = config
        self._cond = threading.Condition()
        self._chunks: Deque[Tuple[int, Union[bytes, bytearray]]] = deque()
        self._frontier = 0  # the next byte the fetching thread asks for
        self._eof_at: Optional[int] = None
        self._error: Optional[BaseException] = None
        self._gen = 0
        self._pos = 0
        self._cur = b""
        self._cur_start = 0
        self._tee = tee
        self._started = False

    # -- background fetching ---------------------------------------------------------------
    def start(self) -> "RemoteStream":
        """Begin fetching from the current position (done on the first read otherwise)."""
        with self._cond:
            if not self._started:
                self._restart(self._pos)
        return self

    def _restart(self, offset: int) -> None:
        if self._started or offset != 0:
            self._drop_tee()
        self._started = True
        self._gen += 1
        self._chunks.clear()
        self._error = None
        self._eof_at = None
        self._frontier = offset
        self._cur, self._cur_start = b"", offset
        threading.Thread(
            target=self._fetch_loop, args=(self._gen, offset), daemon=True, name="dali_shards-read-ahead"
        ).start()

    def _drop_tee(self) -> None:
        tee, self._tee = self._tee, None
        if tee is not None:
            tee.abandon()

    def _fetch_loop(self, gen: int, offset: int) -> None:
        """The background thread: chunks from ``offset`` on, ``chunks_ahead`` held ready, until the
        end of the object or until the stream moves on (``gen``) or closes; an error is handed to
        the reader."""

        def stale() -> bool:
            return gen != self._gen or self.closed

        try:
            check = self._size_check()
            while self._wait_for_room(stale):
                data, done = self._fetch_chunk(offset, stale, check)
                check = None
                if not self._publish(offset, data, done, stale) or done:
                    return
                offset += len(data)
        except BaseException as exc:  # noqa: BLE001 - handed to the reader
            with self._cond:
                if gen == self._gen:
                    self._error = exc
                    self._cond.notify_all()

    def _size_check(self) -> Optional[SizeCheck]:
        """What checks the object's size against the manifest's, where the server has not told it:
        asked now (no manifest size), or alongside the first read."""
        reader = self._reader
        if reader.http or reader.size is not None:
            return None
        if reader.expected is None:
            reader.object_size()  # needed before the first read
            return None
        return SizeCheck(reader)

    def _wait_for_room(self, stale: Callable[[], bool]) -> bool:
        """Wait until fewer than ``chunks_ahead`` chunks are held; False if the stream moved on."""
        with self._cond:
            while len(self._chunks) >= self._config.chunks_ahead and not stale():
                self._cond.wait()
            return not stale()

    def _fetch_chunk(self, offset: int, stale: Callable[[], bool], check: Optional[SizeCheck]) -> Tuple[Any, bool]:
        """The chunk at ``offset`` and whether it is the object's last."""
        cfg, reader = self._config, self._reader
        size = reader.known_size()
        if size is not None and offset >= size:
            data: Any = b""
        else:
            data = reader.read_buffer(offset, offset + cfg.chunk_size, cancelled=stale)
        if check is not None:
            check.result()  # a stale manifest fails before any byte is delivered
        size = reader.known_size()
        return data, len(data) < cfg.chunk_size or (size is not None and offset + len(data) >= size)

    def _publish(self, offset: int, data: Any, done: bool, stale: Callable[[], bool]) -> bool:
        """Hand a chunk to the reader, and to the cache's copy; False if the stream moved on."""
        tee = self._tee
        if tee is not None and offset == 0:
            tee.begin(self._reader.known_size())  # the room for the copy, reserved now if it was not
        if tee is not None and done:  # published before the reader sees the end
            if data:
                tee.write(offset, data)
            tee.complete(self._confirmed_size())
        with self._cond:
            if stale():
                return False
            if data:
                self._chunks.append((offset, data))
            self._frontier = offset + len(data)
            if done:
                self._eof_at = self._frontier
            self._cond.notify_all()
            tee = self._tee
        if tee is not None and data and not done:
            tee.write(offset, data)
        return True

    def _confirmed_size(self) -> Optional[int]:
        """The object's size as the server (or else the manifest) gave it; one metadata request
        if neither did; None if the server never tells it (its copy is then not cached)."""
        reader = self._reader
        if reader.known_size() is None:
            try:
                reader.size = reader.metadata_size()
            except ShardAccessError:
                return None
        return reader.known_size()

    # -- the stream --------------------------------------------------------------------------
    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self._reader.known_size() is not None or not self._reader.http

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_CUR:
            offset += self._pos
        elif whence == io.SEEK_END:
            size = self._reader.object_size()
            if size is None:
                raise io.UnsupportedOperation("the server does not report the object's size")
            offset += size
        if offset < 0:
            raise ValueError("negative seek position")
        self._pos = offset  # the fetching moves lazily, on the next read
        return offset

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        n = 0
        while n < len(view):
            got = self._read_some(view[n:])
            if got == 0:
                break
            n += got
        return n

    def _read_some(self, view: memoryview) -> int:
        pos = self._pos
        while True:
            rel = pos - self._cur_start
            if 0 <= rel < len(self._cur):
                k = min(len(view), len(self._cur) - rel)
                view[:k] = self._cur[rel : rel + k]
                self._pos = pos + k
                return k
            with self._cond:
                if not self._started or pos < self._cur_start:
                    self._restart(pos)
                while self._chunks and self._chunks[0][0] + len(self._chunks[0][1]) <= pos:
                    self._chunks.popleft()  # passed over by a seek
                    self._cond.notify_all()
                if self._chunks:
                    if self._chunks[0][0] > pos:
                        self._restart(pos)
                        continue
                    self._cur_start, self._cur = self._chunks.popleft()
                    self._cond.notify_all()
                    continue
                if self._eof_at is not None and pos >= self._eof_at:
                    return 0
                if pos > self._frontier + self._config.chunk_size or (self._eof_at is not None):
                    self._restart(pos)  # far ahead of the fetching: start again there
                    continue
                if self._error is not None:
                    raise self._error
                self._cond.wait()

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            return self.readall()
        buf = bytearray(size)
        n = self.readinto(buf)
        del buf[n:]
        return bytes(buf)

    def close(self) -> None:
        with self._cond:
            if self.closed:
                return
            super().close()
            self._chunks.clear()
            self._cond.notify_all()
            tee, self._tee = self._tee, None
        if tee is not None and self._eof_at is None:
            tee.abandon()
        self._reader.close()

    @property
    def retried(self) -> int:
        return self._reader.retried
