"""Opening shards as binary streams: local paths, ``file://`` URLs and remote URLs (through
fsspec, see ``remote``; served from the local cache when it holds them), plain or compressed.

Compression is recognised from the first bytes (gzip, bzip2, xz), not from the file name, so
``.tgz``, ``.tar.gz`` and misnamed shards all work.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import threading
from typing import BinaryIO, Callable, Dict, Iterator, Optional, Sequence, Tuple
from urllib.parse import unquote, urlparse

from .cache import ShardCache
from .errors import ShardAccessError, ShardError
from .remote import DEFAULT_STORAGE, RemoteStream, StorageConfig, is_remote

READ_BUFFER = 1 << 18
_MAGIC = {
    b"\x1f\x8b": lambda raw: gzip.GzipFile(fileobj=raw, mode="rb"),
    b"BZh": bz2.BZ2File,
    b"\xfd7zXZ\x00": lzma.LZMAFile,
}


class _Decompressed(io.RawIOBase):
    """A decompressing stream that also closes the file under it; not seekable."""

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


def shard_cache(config: StorageConfig) -> Optional[ShardCache]:
    """The process's cache object for ``config.cache_dir`` (None without one)."""
    if not config.cache_dir:
        return None
    key = (config.cache_dir, config.cache_limit)
    with _cache_lock:
        if key not in _caches:
            _caches[key] = ShardCache(config.cache_dir, config.cache_limit)
        return _caches[key]


def open_shard(url: str, config: StorageConfig = DEFAULT_STORAGE, size: Optional[int] = None) -> BinaryIO:
    """A readable binary stream of a shard's tar bytes (decompressed if needed). Remote shards
    stream in ranged requests fetched ahead in the background; ``size`` (stored bytes, e.g. from
    the manifest) spares a metadata request."""
    return finish_open(start_open(url, config, size), url)


def start_open(url: str, config: StorageConfig = DEFAULT_STORAGE, size: Optional[int] = None) -> BinaryIO:
    """The raw stream of a shard: a local file (its cached copy for a remote shard), or a remote
    stream whose background fetching has started; returns without waiting for data."""
    if is_remote(url):
        cache = shard_cache(config)
        cached = cache.lookup(url, size) if cache is not None else None
        if cached is not None:
            return _open_local(cached, url)
        tee = cache.writer(url, size) if cache is not None else None
        return io.BufferedReader(RemoteStream(url, config, size, tee).start(), READ_BUFFER)
    return _open_local(local_path(url), url)


def finish_open(raw: BinaryIO, url: str) -> BinaryIO:
    """``raw`` as tar bytes: decompressed if its first bytes say so (this waits for them)."""
    return _decompressing(raw, url)


def _open_local(path: str, url: str) -> BinaryIO:
    try:
        return open(path, "rb", buffering=READ_BUFFER)
    except FileNotFoundError:
        raise ShardAccessError(url, "file not found", hint="check the shard path or pattern") from None
    except IsADirectoryError:
        raise ShardAccessError(url, "is a directory, not a tar shard", hint="check the shard pattern") from None
    except PermissionError:
        raise ShardAccessError(url, "permission denied", hint="make the shard readable by this user") from None
    except OSError as exc:
        raise ShardAccessError(url, f"cannot open: {exc}", hint="check the file system") from None


def _decompressing(raw: BinaryIO, url: str) -> BinaryIO:
    try:
        head = raw.peek(6)[:6]
    except BaseException:
        raw.close()
        raise
    for magic, opener in _MAGIC.items():
        if head.startswith(magic):
            return _Decompressed(opener(raw), raw)
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


class _Pending:
    """A shard opened ahead of its turn (fetching in the background), or the error opening it raised."""

    def __init__(self, url: str, opener: Callable[[], BinaryIO]):
        self.url = url
        self.stream: Optional[BinaryIO] = None
        self.error: Optional[BaseException] = None
        try:
            self.stream = opener()
        except ShardError as exc:
            self.error = exc

    def take(self) -> BinaryIO:
        if self.error is not None:
            raise self.error
        stream, self.stream = self.stream, None
        try:
            return finish_open(stream, self.url)
        except BaseException:
            stream.close()
            raise

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()


def read_ahead(
    urls: Sequence[str], config: StorageConfig = DEFAULT_STORAGE, sizes: Sequence[Optional[int]] = ()
) -> Iterator[Callable[[], BinaryIO]]:
    """One opener per URL, in order; while one shard is read, the next ``config.read_ahead``
    remote shards are already fetching their first chunks (local ones are announced to the
    kernel). Streams opened ahead and never taken are closed when the iteration ends."""
    sizes = list(sizes) + [None] * (len(urls) - len(sizes))
    pending: Dict[int, _Pending] = {}

    def open_at(i: int) -> _Pending:
        return _Pending(urls[i], lambda: start_open(urls[i], config, sizes[i]))

    try:
        for i in range(len(urls)):
            for j in range(i + 1, min(len(urls), i + 1 + config.read_ahead)):
                if j not in pending:
                    if is_remote(urls[j]):
                        pending[j] = open_at(j)
                    else:
                        _advise_will_need(urls[j])
                        pending[j] = None
            ahead = pending.pop(i, None)
            yield (ahead.take if ahead is not None else (lambda i=i: open_shard(urls[i], config, sizes[i])))
    finally:
        for p in pending.values():
            if p is not None:
                p.close()
