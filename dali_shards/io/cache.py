"""A local disk cache of remote shards, bounded in size, least recently used evicted first.

A remote shard read from its first byte to its last is copied (by the reading thread, as its
chunks arrive) into a temporary file in ``cache_dir`` and renamed into place when complete and
its size confirmed (by the server, or by the manifest the server's size was checked against);
later epochs open the local copy. Partial reads and copies of unconfirmed size leave nothing
behind. Several workers and processes may share one directory: entries appear atomically and
eviction is serialised by a lock file.

Temporary files are named after their host, process and thread. Those of processes that no
longer run on this host (a killed worker's) are removed when a process opens the cache and
whenever a copy is admitted; those of live processes count towards ``limit``.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
import socket
import threading
from typing import List, Optional, Tuple

from dali_shards.io.remote import Tee
from dali_shards.processes import pid_alive

log = logging.getLogger("dali_shards")

_SUFFIX = ".shard"
_HOST = re.sub(r"[^A-Za-z0-9-]", "_", socket.gethostname()) or "host"
# <entry>.<host>.<pid>.<thread>.tmp; without the host: written by an earlier version, on this host
_TEMP = re.compile(r"\.shard\.(?:([A-Za-z0-9_-]+)\.)?(\d+)\.(\d+)\.tmp$")


def _stale(name: str) -> bool:
    """A temporary file left by a process of this host that no longer runs."""
    m = _TEMP.search(name)
    return m is not None and m.group(1) in (None, _HOST) and not pid_alive(int(m.group(2)))


class ShardCache:
    """The cache in ``directory``, holding at most ``limit`` bytes (None: unbounded)."""

    def __init__(self, directory: str, limit: Optional[int] = None):
        self.directory = os.path.abspath(os.path.expanduser(directory))
        self.limit = limit
        os.makedirs(self.directory, exist_ok=True)
        self.remove_stale_temps()

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
            log.warning(
                "dali_shards: the cached copy %s of %s has %d bytes, not %d; evicted it, reading the shard from the "
                "server",
                path,
                url,
                st.st_size,
                size,
            )
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

    def evict(self, url: str) -> None:
        """Remove the copy of ``url``, if any."""
        fd = self._lock()
        try:
            _remove(self.path_for(url))
        finally:
            os.close(fd)

    def remove_stale_temps(self) -> int:
        """Remove the temporary files of processes of this host that no longer run; how many."""
        removed = 0
        with os.scandir(self.directory) as it:
            for e in it:
                if e.name.endswith(".tmp") and _stale(e.name):
                    _remove(e.path)
                    removed += 1
        if removed:
            log.info("dali_shards: removed %d temporary file(s) of dead processes from %s", removed, self.directory)
        return removed

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

    def writing(self) -> int:
        """Bytes in the temporary files of copies being written (by live processes)."""
        total = 0
        with os.scandir(self.directory) as it:
            for e in it:
                if e.name.endswith(".tmp") and not _stale(e.name):
                    try:
                        total += e.stat().st_size
                    except OSError:
                        continue
        return total

    def usage(self) -> int:
        """Bytes held: the cached shards and the copies being written."""
        return sum(size for _, size, _ in self.entries()) + self.writing()

    def _admit(self, tmp: str, url: str) -> str:
        """Move a complete copy into place, evicting the least recently used beyond the limit
        (copies being written count); returns its path."""
        fd = self._lock()
        try:
            final = self.path_for(url)
            os.replace(tmp, final)
            if self.limit is None:
                return final
            self.remove_stale_temps()
            entries = sorted(self.entries())
            total = sum(size for _, size, _ in entries) + self.writing()
            for _, size, path in entries:
                if total <= self.limit:
                    break
                if path != final:
                    _remove(path)
                    total -= size
            return final
        finally:
            os.close(fd)


class CacheWriter(Tee):
    """Copies a stream's chunks into a temporary file, admitted to the cache when complete and of
    the confirmed size (``size``: as known when the read began, e.g. from the manifest)."""

    def __init__(self, cache: ShardCache, url: str, size: Optional[int]):
        self.cache = cache
        self.url = url
        self.size = size
        self._lock = threading.Lock()
        self._tmp = f"{cache.path_for(url)}.{_HOST}.{os.getpid()}.{threading.get_ident()}.tmp"
        self._file = None
        self._written = 0
        self._done = False
        self._admitted: Optional[str] = None

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
                self._file.flush()  # its size on disk counts towards the limit
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
            if self._file is None or confirmed is None or self._written != confirmed:
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
                self._admitted = self.cache._admit(self._tmp, self.url)
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
