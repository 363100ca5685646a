"""One catalog per node: the processes of a node that read the same manifest share one copy of its
catalog, a column file in the node's catalog folder that each maps (its pages in memory once, however
many ranks and workers map them), so that a node's memory for the catalog does not grow with its
ranks, and a remote manifest is downloaded once per node.

The file is named by a key that changes with the manifest: its location and the SHA-256 of its text
(a local file, hashed as it is read), or a remote object's location, size and the version its store
gives it (ETag, checksum, generation or modification time). The first process to need a file builds
it while holding an exclusive ``flock`` on its lock file; the others wait for the lock and then map
what it wrote. A builder writes to a temporary file and renames it into place, so that a file is
whole or absent; the lock is the kernel's, released when its holder dies, and the next waiter then
builds it. Temporary files of dead builders are removed, and files unused for ``KEEP_DAYS`` days.

The folder is ``<cache_dir>/catalogs`` when ``cache_dir`` is set, else ``dali_shards-<uid>/catalogs``
in the system's temporary folder (created private to its user; a folder another user owns is not
used). Where no folder can be used, or the lock is not had within ``WAIT_S``, a process builds its
own copy in memory.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import re
import stat
import tempfile
import time
from typing import Any, Callable, Dict, Optional, Tuple

from dali_shards.catalog.colfile import HOST, BadColumnFile, write_columns
from dali_shards.catalog.colfile import map_columns
from dali_shards.catalog.columns import Catalog
from dali_shards.pids import pid_alive
from dali_shards.options import StorageOptions

log = logging.getLogger("dali_shards")

FORMAT = 1  # of the files and of what a catalog holds: part of every key
SUFFIX = ".catalog"
KEEP_DAYS = 7.0
WAIT_S = 900.0
_TEMP = re.compile(r"\.catalog\.([A-Za-z0-9_-]+)\.(\d+)\.tmp$")
Built = Tuple[Catalog, Dict[str, Any]]


def catalog_dir(config: StorageOptions) -> Optional[str]:
    """The node's catalog folder (see the module), created; None where none can be used."""
    if config.cache_dir:
        folder = os.path.join(os.path.abspath(os.path.expanduser(config.cache_dir)), "catalogs")
    else:
        folder = os.path.join(tempfile.gettempdir(), f"dali_shards-{os.getuid()}", "catalogs")
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        st = os.stat(os.path.dirname(folder) if not config.cache_dir else folder)
        if st.st_uid != os.getuid() or (not config.cache_dir and stat.S_IMODE(st.st_mode) & 0o022):
            return None  # not ours (another user's folder in a shared /tmp)
        return folder if os.access(folder, os.W_OK | os.X_OK) else None
    except OSError:
        return None


def key_of(*parts: Any) -> str:
    """A file key from what identifies a manifest's content (and ``FORMAT``)."""
    text = "\0".join(str(p) for p in (FORMAT, *parts))
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:40]


def file_digest(path: str) -> str:
    """SHA-256 of a local file, read a MiB at a time."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def shared(folder: str, key: str, build: Callable[[], Built]) -> Built:
    """The catalog of ``key`` and its meta: mapped from the folder's file, or built by ``build``
    (by this process if it is the first, holding the lock) and written there first; a catalog that
    cannot be stored (it holds per-sample arrays in memory) is returned as built."""
    path = os.path.join(folder, key + SUFFIX)
    got = _mapped(path)
    if got is not None:
        return got
    lock = _lock(path + ".lock")
    if lock is None:
        log.warning("dali_shards: waited %.0f s for another process to build the catalog %s; building this "
                    "process's own copy", WAIT_S, path)  # fmt: skip
        return build()
    try:
        got = _mapped(path)
        if got is not None:
            return got
        _tidy(folder)
        catalog, meta = build()
        if catalog.inline or catalog.damage:
            return catalog, meta
        write_columns(path, catalog.columns, {**catalog.meta(), **meta})
        return _mapped(path) or (catalog, meta)
    finally:
        os.close(lock)


def _mapped(path: str) -> Optional[Built]:
    """The catalog in ``path`` (marked as used), if a whole one is there."""
    try:
        arrays, meta = map_columns(path)
    except FileNotFoundError:
        return None
    except (OSError, BadColumnFile) as exc:
        log.warning("dali_shards: catalog file %s cannot be used (%s); building it again", path, exc)
        _remove(path)
        return None
    try:
        os.utime(path)
    except OSError:
        pass
    catalog = Catalog(arrays, tuple(meta["prefixes"]), tuple(meta["exts"]), tuple(meta["tables"]), path=path)
    return catalog, meta


def _lock(path: str) -> Optional[int]:
    """An exclusive ``flock`` on ``path`` (the open descriptor), waiting at most ``WAIT_S``."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    deadline = time.monotonic() + WAIT_S
    pause = 0.005
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                os.close(fd)
                raise
        if time.monotonic() > deadline:
            os.close(fd)
            return None
        time.sleep(pause)
        pause = min(0.05, pause * 2)


def _tidy(folder: str) -> None:
    """Remove temporary files of builders of this host that died, and files unused for ``KEEP_DAYS``."""
    old = time.time() - KEEP_DAYS * 86400
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        full = os.path.join(folder, name)
        m = _TEMP.search(name)
        if m is not None:
            if m.group(1) == HOST and not pid_alive(int(m.group(2))):
                _remove(full)
            continue
        if name.endswith(SUFFIX):
            try:
                if os.stat(full).st_mtime < old:
                    _remove(full)
                    _remove(full + ".lock")
            except OSError:
                pass


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass

