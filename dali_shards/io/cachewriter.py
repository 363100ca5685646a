"""A copy of a remote shard being written into the cache (:class:`CacheWriter`, a stream's tee):
chunks written in order into a temporary file whose room was reserved in the cache, admitted when
complete and of the confirmed size, removed otherwise (see ``io.cache``)."""

from __future__ import annotations

import itertools
import logging
import os
import re
import socket
import threading
from typing import TYPE_CHECKING, BinaryIO, Optional

from dali_shards.io.remote import Tee

if TYPE_CHECKING:
    from dali_shards.io.cache import ShardCache

log = logging.getLogger("dali_shards")

HOST = re.sub(r"[^A-Za-z0-9-]", "_", socket.gethostname()) or "host"
_serial = itertools.count()  # temporary files of one thread for the same shard never share a name


class CacheWriter(Tee):
    """Copies a stream's chunks into a temporary file, admitted to the cache when complete and of
    the confirmed size (``size``: as known when the read began, e.g. from the manifest). The room
    for the copy is reserved in the cache when its size is known (``reserved``; see the module)."""

    def __init__(self, cache: "ShardCache", url: str, size: Optional[int]):
        self.cache = cache
        self.url = url
        self.size = size
        self.reserved: Optional[int] = None
        self._lock = threading.Lock()
        serial = next(_serial)
        self._tmp = f"{cache.path_for(url)}.{HOST}.{os.getpid()}.{threading.get_ident()}-{serial}.tmp"
        self._file: Optional[BinaryIO] = None
        self._written = 0
        self._done = False
        self._admitted: Optional[str] = None
        if size is not None:
            self._reserve(size)

    def _reserve(self, size: int) -> None:
        try:
            self._file = self.cache.reserve(self._tmp, size)
        except OSError as exc:
            log.warning("dali_shards: cannot cache %s (%s)", self.url, exc)
        if self._file is None:
            self._done = True  # not cached: no room
            log.debug("dali_shards: no room for %d bytes in the cache for %s: read without a copy", size, self.url)
        else:
            self.reserved = size

    def begin(self, size: Optional[int]) -> None:
        """The object's size as its first answer told it (None: unknown): the room is reserved now
        if it was not; a copy of unknown size is not made under a limit."""
        with self._lock:
            if self._done or (self.reserved is not None and size in (None, self.reserved)):
                return
            if self.reserved is not None or (size is None and self.cache.limit is not None):
                self._fail()
            elif size is not None:
                self._reserve(size)

    def write(self, offset: int, data: bytes) -> None:
        with self._lock:
            if self._done:
                return
            if offset != self._written or (self.reserved is not None and offset + len(data) > self.reserved):
                self._fail()
                return
            try:
                if self._file is None:
                    if self.cache.limit is not None:  # no room reserved: not cached
                        self._fail()
                        return
                    self._file = open(self._tmp, "wb")
                self._file.write(data)
                self._written += len(data)
            except OSError as exc:
                log.warning("dali_shards: cannot cache %s (%s)", self.url, exc)
                self._fail()

    def complete(self, size: Optional[int] = None) -> None:
        """The stream reached the end; ``size`` is the object's size as the server confirmed it
        (None: only the size known at the start, if any, confirms it)."""
        with self._lock:
            if self._done:
                return
            self._done = True
            confirmed = size if size is not None else self.size
            sized = confirmed is not None and self._written == confirmed and self.reserved in (None, confirmed)
            if self._file is None or not sized:
                if self._file is not None:
                    log.warning(
                        "dali_shards: not caching %s: %d bytes read, the server's size is %s",
                        self.url,
                        self._written,
                        "unknown" if confirmed is None else confirmed,
                    )
                self._discard()
                return
            try:
                self._file.close()
                self._admitted = self.cache.admit(self._tmp, self.url)
            except OSError as exc:
                log.warning("dali_shards: cannot cache %s (%s)", self.url, exc)
                _remove(self._tmp)

    def abandon(self) -> None:
        with self._lock:
            if not self._done:
                self._fail()

    def withdraw(self) -> None:
        """Reading the shard failed: keep no copy of it (abandoned, or evicted if admitted)."""
        with self._lock:
            if not self._done:
                self._fail()
            elif self._admitted is not None:
                self.cache.evict(self.url)
                self._admitted = None

    def _fail(self) -> None:
        self._done = True
        self._discard()

    def _discard(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
        _remove(self._tmp)


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass
