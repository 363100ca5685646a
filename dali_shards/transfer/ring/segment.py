"""Shared memory for the ring: anonymous segments (``memfd_create``) mapped by a worker and by the
main process, their file descriptors passed over the connection that joins them.

A segment has no name in any file system: it lives while a process maps it or holds its
descriptor, so nothing is ever left in ``/dev/shm``, whichever process dies and however (SIGKILL
included). Imports no DALI.
"""

from __future__ import annotations

import mmap
import os
from multiprocessing import reduction
from typing import Any

import numpy as np

from dali_shards.errors import ConfigError


def _memfd(name: str) -> int:
    create = getattr(os, "memfd_create", None)
    if create is None:  # pragma: no cover - Linux has it (DALI runs on Linux only)
        raise ConfigError("transfer='ring' needs memfd_create (Linux); use transfer='merge'")
    return create(name, getattr(os, "MFD_CLOEXEC", 0))


class Stretch:
    """``size`` bytes of shared memory, mapped here; ``array`` is a uint8 view of all of it."""

    def __init__(self, fd: int, size: int):
        self.fd = fd
        self.size = size
        self.map = mmap.mmap(fd, size) if size else None
        self.array = np.frombuffer(self.map, dtype=np.uint8) if self.map is not None else np.empty(0, np.uint8)

    @classmethod
    def create(cls, size: int, name: str = "dali-shards-ring") -> "Stretch":
        """A new zero-filled segment of ``size`` bytes (its descriptor kept open to pass it on)."""
        fd = _memfd(name)
        try:
            os.ftruncate(fd, size)
            return cls(fd, size)
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def received(cls, conn: Any, size: int) -> "Stretch":
        """The segment whose descriptor arrives next on ``conn`` (see ``send``), mapped; the
        descriptor is closed once mapped."""
        fd = reduction.recv_handle(conn)
        try:
            segment = cls(fd, size)
        finally:
            os.close(fd)
        if segment.map is not None and hasattr(mmap, "MADV_DONTFORK"):
            segment.map.madvise(mmap.MADV_DONTFORK)  # processes forked later must not keep it alive
        segment.fd = -1  # closed: the mapping alone keeps the memory
        return segment

    def send(self, conn: Any) -> None:
        """Pass this segment's descriptor over ``conn`` (a duplex ``multiprocessing`` connection)."""
        reduction.send_handle(conn, self.fd, os.getpid())

    def close(self) -> None:
        """Forget the segment here (the mapping goes once no view of it is left)."""
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = -1
        self.array = np.empty(0, np.uint8)
        self.map = None
