"""A local disk cache of remote shards, bounded in size, least recently used evicted first.

A remote shard read from its first byte to its last is copied (by the reading thread, as its
chunks arrive) into a temporary file in ``cache_dir`` and renamed into place when complete; later
epochs open the local copy. Partial reads leave nothing behind. Several workers and processes may
share one directory: entries appear atomically and eviction is serialised by a lock file.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import threading
from typing import List, Optional, Tuple

from .remote import Tee

log = logging.getLogger("dali_shards")

_SUFFIX = ".shard"


class ShardCache:
    """The cache in ``directory``, holding at most ``limit`` bytes (None: unbounded)."""

    def __init__(self, directory: str, limit: Optional[int] = None):
        self.directory = os.path.abspath(os.path.expanduser(directory))
        self.limit = limit
        os.makedirs(self.directory, exist_ok=True)

    def path_for(self, url: str) -> str:
        digest = hashlib.sha256(url.encode()).hexdigest()[:24]
        base = "".join(c if c.isalnum() or c in "-_." else "_" for c in url.rsplit("/", 1)[-1])[-80:]
        return os.path.join(self.directory, f"{digest}-{base}{_SUFFIX}")

    def lookup(self, url: str, size: Optional[int] = None) -> Optional[str]:
        """The local copy of ``url`` (marked as just used), if cached with the expected size."""
        path = self.path_for(url)
        try:
            st = os.stat(path)
        except OSError:
            return None
        if size is not None and st.st_size != size:
            log.warning("dali_shards: cached copy of %s has %d bytes, not %d; reading it again", url, st.st_size, size)
            _remove(path)
            return None
        try:
            os.utime(path)  # least recently used = oldest mtime
        except OSError:
            return None
        return path

    def writer(self, url: str, size: Optional[int] = None) -> Optional["CacheWriter"]:
        """A tee that stores ``url`` as it is read, or None if it cannot fit in the cache."""
        if self.limit is not None and size is not None and size > self.limit:
            return None
        return CacheWriter(self, url, size)

    def _lock(self):
        fd = os.open(os.path.join(self.directory, ".lock"), os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd

    def entries(self) -> List[Tuple[float, int, str]]:
        """(last use, bytes, path) of the cached shards."""
        out = []
        with os.scandir(self.directory) as it:
            for e in it:
                if e.name.endswith(_SUFFIX):
                    try:
                        st = e.stat()
                    except OSError:
                        continue
                    out.append((st.st_mtime, st.st_size, e.path))
        return out

    def usage(self) -> int:
        """Bytes held."""
        return sum(size for _, size, _ in self.entries())

    def _admit(self, tmp: str, url: str) -> None:
        """Move a complete copy into place, evicting the least recently used beyond the limit."""
        fd = self._lock()
        try:
            final = self.path_for(url)
            os.replace(tmp, final)
            if self.limit is None:
                return
            entries = sorted(self.entries())
            total = sum(size for _, size, _ in entries)
            for _, size, path in entries:
                if total <= self.limit:
                    break
                if path != final:
                    _remove(path)
                    total -= size
        finally:
            os.close(fd)


class CacheWriter(Tee):
    """Copies a stream's chunks into a temporary file; admitted to the cache when complete."""

    def __init__(self, cache: ShardCache, url: str, size: Optional[int]):
        self.cache = cache
        self.url = url
        self.size = size
        self._lock = threading.Lock()
        self._tmp = f"{cache.path_for(url)}.{os.getpid()}.{threading.get_ident()}.tmp"
        self._file = None
        self._written = 0
        self._done = False

    def write(self, offset: int, data: bytes) -> None:
        with self._lock:
            if self._done:
                return
            if offset != self._written:
                self._fail()
                return
            try:
                if self._file is None:
                    self._file = open(self._tmp, "wb")
                self._file.write(data)
                self._written += len(data)
            except OSError as exc:
                log.warning("dali_shards: cannot cache %s (%s)", self.url, exc)
                self._fail()

    def complete(self) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
            if self._file is None or (self.size is not None and self._written != self.size):
                self._discard()
                return
            try:
                self._file.close()
                self.cache._admit(self._tmp, self.url)
            except OSError as exc:
                log.warning("dali_shards: cannot cache %s (%s)", self.url, exc)
                _remove(self._tmp)

    def abandon(self) -> None:
        with self._lock:
            if not self._done:
                self._fail()

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
