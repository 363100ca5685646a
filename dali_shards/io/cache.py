"""A local disk cache of remote shards, bounded in size, least recently used evicted first.

A remote shard read from its first byte to its last is copied (by the reading thread, as its
chunks arrive) into a temporary file in ``cache_dir`` and renamed into place when complete and
its size confirmed (by the server, or by the manifest the server's size was checked against);
later epochs open the local copy. Partial reads and copies of unconfirmed size leave nothing
behind. Several workers and processes may share one directory: entries appear atomically, and
reservations and eviction are serialised by a lock file.

``limit`` holds at every moment, the copies being written included: a copy's full size is
reserved when it starts (its size from the manifest, or else from the server's first answer), as
a temporary file allocated to that size on disk, so that every process sharing the directory
counts it; the least recently used complete entries are evicted to make room. A copy that cannot
fit (larger than the limit, or the room taken by copies being written) is not made: the shard is
read without one. Under a limit, a copy whose size is unknown when its first bytes arrive is not
made either; a copy that would grow past its reserved size is abandoned.

Temporary files are named after their host, process and thread. Those of processes that no
longer run on this host (a killed worker's) are removed when a process opens the cache and
whenever a copy is reserved; those of live processes count towards ``limit``.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import re
from typing import BinaryIO, List, Optional, Tuple

from dali_shards.io.cachewriter import HOST, CacheWriter, _remove
from dali_shards.pids import pid_alive

log = logging.getLogger("dali_shards")

_SUFFIX = ".shard"
# <entry>.<host>.<pid>.<thread>-<serial>.tmp; without the host or the serial: written by an earlier
# version (without the host: on this host)
_TEMP = re.compile(r"\.shard\.(?:([A-Za-z0-9_-]+)\.)?(\d+)\.(\d+)(?:-\d+)?\.tmp$")


def _stale(name: str) -> bool:
    """A temporary file left by a process of this host that no longer runs."""
    m = _TEMP.search(name)
    return m is not None and m.group(1) in (None, HOST) and not pid_alive(int(m.group(2)))


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

    def writer(self, url: str, size: Optional[int] = None) -> Optional[CacheWriter]:
        """A tee that stores ``url`` as it is read, its ``size`` reserved now (when not known: when
        the first answer tells it); None if it cannot fit in the cache (see the module)."""
        if self.limit is not None and size is not None and size > self.limit:
            return None
        w = CacheWriter(self, url, size)
        return None if size is not None and w.reserved is None else w

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

    def reserve(self, tmp: str, size: int) -> Optional[BinaryIO]:
        """A new temporary file ``tmp`` (open for writing) holding ``size`` bytes of room, allocated
        on disk where the file system can, after evicting the least recently used entries beyond the
        limit; None if the copy cannot fit. ``OSError`` if the file cannot be made."""
        fd = self._lock()
        try:
            if self.limit is not None and not self._make_room(size):
                return None
            return _preallocated(tmp, size)
        finally:
            os.close(fd)

    def _make_room(self, size: int) -> bool:
        """Evict the least recently used entries until they, the copies being written and ``size``
        fit in the limit (nothing if they cannot fit even so); whether they fit. Under the lock."""
        assert self.limit is not None  # only a cache with a limit makes room
        self.remove_stale_temps()
        entries = sorted(self.entries())
        writing = self.writing()
        if writing + size > self.limit:
            return False
        total = sum(e_size for _, e_size, _ in entries) + writing + size
        for _, e_size, path in entries:
            if total <= self.limit:
                break
            _remove(path)
            total -= e_size
        return total <= self.limit

    def admit(self, tmp: str, url: str) -> str:
        """Move a complete copy into place (its room was reserved; the least recently used beyond
        the limit are evicted, should there be any); returns its path."""
        fd = self._lock()
        try:
            final = self.path_for(url)
            os.replace(tmp, final)
            if self.limit is None:
                return final
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


def _preallocated(path: str, size: int) -> BinaryIO:
    """A new file at ``path``, open for writing from its start, ``size`` bytes long (allocated on
    disk; only its size set where the file system cannot allocate)."""
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    try:
        if size:
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise
                os.ftruncate(fd, size)  # no allocation here: the size still shows the reservation
        return os.fdopen(fd, "wb")
    except BaseException:
        os.close(fd)
        _remove(path)
        raise
