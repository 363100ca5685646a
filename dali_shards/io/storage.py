"""Opening shards as binary streams: local paths, ``file://`` URLs and remote URLs (through
fsspec, see ``remote``; served from the local cache when it holds them), plain or compressed.

Compression is recognised from the first bytes (gzip, bzip2, xz), not from the file name, so
``.tgz``, ``.tar.gz`` and misnamed shards all work. A shard opened with the size its manifest
(or the count at start) recorded is checked against it: a local file by its size when opened, a
remote object by the size its server reports.

Readers go through :func:`read_attempts`: a cached copy that fails to read is evicted and the
shard read from its server once more; a server's copy that fails to read is not kept.
"""

from __future__ import annotations

import bz2
import gzip
import io
import logging
import lzma
import os
import threading
import zlib
from typing import Any, BinaryIO, Callable, Dict, Iterator, Optional, Sequence, Tuple
from urllib.parse import unquote, urlparse

from dali_shards.io.cache import CacheWriter, ShardCache
from dali_shards.errors import ShardAccessError, ShardError, ShardFormatError
from dali_shards.options import StorageOptions
from dali_shards.io.filesystems import DEFAULT_STORAGE, is_remote
from dali_shards.io.remote import RemoteStream

log = logging.getLogger("dali_shards")

READ_BUFFER = 1 << 18
_MAGIC: Dict[bytes, Callable[[BinaryIO], Any]] = {
    b"\x1f\x8b": lambda raw: gzip.GzipFile(fileobj=raw, mode="rb"),
    b"BZh": bz2.BZ2File,
    b"\xfd7zXZ\x00": lzma.LZMAFile,
}
_COMPRESSION = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz"}


def compression_of(head: bytes) -> Optional[str]:
    """The compression a shard's first bytes announce (``"gzip"``, ``"bzip2"``, ``"xz"``), as
    opening it recognises it; None for a plain tar."""
    return next((name for magic, name in _COMPRESSION.items() if head.startswith(magic)), None)


class _Decompressed(io.RawIOBase):
    """A decompressing stream that also closes the file under it; not seekable."""

    decompresses = True  # byte offsets in the tar are not offsets in the file

    def __init__(self, stream, raw):
        super().__init__()
        self._stream = stream
        self._raw = raw

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        return self._stream.readinto(buffer)

    def read(self, size: int = -1) -> bytes:
        return self._stream.read(size)

    def close(self) -> None:
        if not self.closed:
            try:
                self._stream.close()
            finally:
                self._raw.close()
                super().close()


def local_path(url: str) -> Optional[str]:
    """The filesystem path of a local shard URL, or None if it is not local."""
    if url.startswith("file://"):
        return unquote(urlparse(url).path)
    if "://" in url:
        return None
    return url


def shard_size(url: str) -> Optional[int]:
    """Size of a local shard in bytes, if it exists (remote sizes come from manifests)."""
    path = local_path(url)
    if path is None:
        return None
    try:
        return os.path.getsize(path)
    except OSError:
        return None


_caches: Dict[Tuple[str, Optional[int]], ShardCache] = {}
_cache_lock = threading.Lock()


def shard_cache(config: StorageOptions) -> Optional[ShardCache]:
    """The process's cache object for ``config.cache_dir`` (None without one)."""
    if not config.cache_dir:
        return None
    key = (config.cache_dir, config.cache_limit)
    with _cache_lock:
        if key not in _caches:
            _caches[key] = ShardCache(config.cache_dir, config.cache_limit)
        return _caches[key]


def open_shard(url: str, config: StorageOptions = DEFAULT_STORAGE, size: Optional[int] = None) -> BinaryIO:
    """A readable binary stream of a shard's tar bytes (decompressed if needed). Remote shards
    stream in ranged requests fetched ahead in the background. ``size`` (stored bytes, e.g. from
    the manifest) is checked against the shard's (a ``ShardFormatError`` if they differ) and
    spares a metadata request over HTTP."""
    return ShardOpener(url, config, size)()


def finish_open(raw: BinaryIO, url: str) -> BinaryIO:
    """``raw`` as tar bytes: decompressed if its first bytes say so (this waits for them)."""
    return _decompressing(raw, url)


def open_local(path: str, url: str, size: Optional[int] = None) -> BinaryIO:
    """The local file at ``path`` (shard ``url``), buffered; a ``ShardAccessError`` if it cannot be
    opened, a ``ShardFormatError`` if it does not have ``size`` bytes (when given)."""
    try:
        f = open(path, "rb", buffering=READ_BUFFER)
    except FileNotFoundError:
        raise ShardAccessError(url, "file not found", hint="check the shard path or pattern") from None
    except IsADirectoryError:
        raise ShardAccessError(url, "is a directory, not a tar shard", hint="check the shard pattern") from None
    except PermissionError:
        raise ShardAccessError(url, "permission denied", hint="make the shard readable by this user") from None
    except OSError as exc:
        raise ShardAccessError(url, f"cannot open: {exc}", hint="check the file system") from None
    actual = os.fstat(f.fileno()).st_size
    if size is not None and actual != size:
        f.close()
        raise ShardFormatError(
            url,
            f"has {actual} bytes, but {size} when it was counted (its manifest, or the scan at start): it changed "
            "since, so its sample count cannot be trusted",
            hint="run `dali-shards index` on the shards again to rewrite the manifest (or restart, so that it is "
            "counted again)",
        )
    return f


def _decompressing(raw: BinaryIO, url: str) -> BinaryIO:
    try:
        head = raw.peek(6)[:6]  # type: ignore[attr-defined]  # a buffered reader (typeshed's BinaryIO has no peek)
    except BaseException:
        raw.close()
        raise
    for magic, opener in _MAGIC.items():
        if head.startswith(magic):
            return _Decompressed(opener(raw), raw)  # type: ignore[return-value]  # a RawIOBase (BinaryIO is nominal)
    return raw


def _advise_will_need(url: str) -> None:
    """Ask the kernel to start reading a local shard into the page cache."""
    path = local_path(url)
    if path is None or not hasattr(os, "posix_fadvise"):
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    except OSError:
        pass
    finally:
        os.close(fd)


class ShardOpener:
    """Opens one shard when called (a remote one may be started ahead with :meth:`start`), and
    remembers what it opened: its cached copy, or the cache copy being written, so that
    :func:`read_attempts` can evict a copy that fails to read."""

    def __init__(self, url: str, config: StorageOptions = DEFAULT_STORAGE, size: Optional[int] = None):
        self.url = url
        self.config = config
        self.size = size
        self.cached: Optional[str] = None  # the cached copy opened last, if any
        self._tee: Optional[CacheWriter] = None
        self._ahead: Optional[BinaryIO] = None
        self._error: Optional[ShardError] = None

    def start(self) -> "ShardOpener":
        """Start opening now (a remote stream begins fetching); errors wait for the call."""
        try:
            self._ahead = self.start_raw()
        except ShardError as exc:
            self._error = exc
        return self

    def __call__(self, from_server: bool = False) -> BinaryIO:
        """The shard's tar bytes; ``from_server`` passes over the cache (to read its server's copy)."""
        raw, self._ahead = self._ahead, None
        if from_server and raw is not None:
            raw.close()
            raw = None
        if raw is None:
            if self._error is not None and not from_server:
                raise self._error
            raw = self.start_raw(from_server)
        try:
            return finish_open(raw, self.url)
        except BaseException:
            raw.close()
            raise

    def start_raw(self, from_server: bool = False) -> BinaryIO:
        """The raw stream: a local file (its cached copy for a remote shard), or a remote stream whose
        background fetching has started; returns without waiting for data."""
        self.cached, self._tee = None, None
        if not is_remote(self.url):
            path = local_path(self.url)
            assert path is not None  # not remote: local
            return open_local(path, self.url, self.size)
        cache = shard_cache(self.config)
        if cache is not None and not from_server:
            self.cached = cache.lookup(self.url, self.size)
            try:
                if self.cached is not None:
                    return open_local(self.cached, self.url)
            except ShardAccessError:  # evicted meanwhile by another process
                self.cached = None
        self._tee = cache.writer(self.url, self.size) if cache is not None else None
        return io.BufferedReader(RemoteStream(self.url, self.config, self.size, self._tee).start(), READ_BUFFER)

    def drop_copy(self) -> None:
        """Reading what was opened failed: keep no cached copy of the shard."""
        if self._tee is not None:
            self._tee.withdraw()
        cache = shard_cache(self.config)
        if self.cached is not None and cache is not None:
            cache.evict(self.url)

    def close(self) -> None:
        """Close a stream started ahead and never taken."""
        raw, self._ahead = self._ahead, None
        if raw is not None:
            raw.close()


READ_ERRORS = (ShardError, OSError, EOFError, zlib.error, lzma.LZMAError)


class Attempt:
    """One attempt at reading a shard: ``with attempt as stream:`` (see :func:`read_attempts`)."""

    def __init__(self, opener: Callable[..., BinaryIO], from_server: bool = False):
        self.opener = opener
        self.from_server = from_server
        self.retry = False
        self._stream: Optional[BinaryIO] = None

    def __enter__(self) -> BinaryIO:
        self._stream = self.opener(from_server=True) if self.from_server else self.opener()
        return self._stream

    def __exit__(self, kind: Any, exc: Optional[BaseException], tb: Any) -> bool:
        assert self._stream is not None  # set by __enter__
        self._stream.close()
        if exc is None or not isinstance(exc, READ_ERRORS) or not isinstance(self.opener, ShardOpener):
            return False
        opener = self.opener
        cached = opener.cached
        opener.drop_copy()
        if cached is None or self.from_server:
            return False
        log.warning(
            "dali_shards: the cached copy %s of shard %s cannot be read (%s); evicted it, reading the shard from "
            "the server",
            cached,
            opener.url,
            exc,
        )
        self.retry = True
        return True


def read_attempts(opener: Callable[..., BinaryIO]) -> Iterator[Attempt]:
    """Attempts at reading one shard::

        for attempt in read_attempts(opener):
            with attempt as stream:
                ...  # read it; pass over what an earlier attempt already delivered

    The first reads what ``opener`` opens. If that was a cached copy of a remote shard and
    reading it raises a read error (a tar, decompression or I/O error), the copy is evicted with a
    warning naming it, the error is swallowed, and a second attempt reads the shard from its
    server. A server's copy that fails to read is not kept in the cache (the error goes on)."""
    first = Attempt(opener)
    yield first
    if first.retry:
        yield Attempt(opener, from_server=True)


def read_ahead(
    urls: Sequence[str], config: StorageOptions = DEFAULT_STORAGE, sizes: Sequence[Optional[int]] = ()
) -> Iterator[ShardOpener]:
    """One opener per URL, in order; while one shard is read, the next ``config.read_ahead``
    remote shards are already fetching their first chunks (local ones are announced to the
    kernel). Streams opened ahead and never taken are closed when the iteration ends."""
    sizes = list(sizes) + [None] * (len(urls) - len(sizes))
    pending: Dict[int, Optional[ShardOpener]] = {}
    current: Optional[ShardOpener] = None
    try:
        for i in range(len(urls)):
            for j in range(i + 1, min(len(urls), i + 1 + config.read_ahead)):
                if j not in pending:
                    if is_remote(urls[j]):
                        pending[j] = ShardOpener(urls[j], config, sizes[j]).start()
                    else:
                        _advise_will_need(urls[j])
                        pending[j] = None
            current = pending.pop(i, None) or ShardOpener(urls[i], config, sizes[i])
            yield current
    finally:
        for p in [current, *pending.values()]:
            if p is not None:
                p.close()  # a stream started ahead and never taken
