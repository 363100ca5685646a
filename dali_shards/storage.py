"""Opening shards as binary streams: local paths and ``file://`` URLs, plain or compressed.

Compression is recognised from the first bytes (gzip, bzip2, xz), not from the file name, so
``.tgz``, ``.tar.gz`` and misnamed shards all work.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
from typing import BinaryIO, Optional
from urllib.parse import unquote, urlparse

from .errors import ShardAccessError

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
    """Size of the stored shard in bytes, if cheaply known."""
    path = local_path(url)
    if path is None:
        return None
    try:
        return os.path.getsize(path)
    except OSError:
        return None


def open_shard(url: str) -> BinaryIO:
    """A readable binary stream of a shard's tar bytes (decompressed if needed)."""
    path = local_path(url)
    if path is None:
        raise ShardAccessError(
            url,
            f"unsupported URL scheme {url.split('://', 1)[0]!r}",
            hint="use local paths or file:// URLs",
        )
    try:
        raw = open(path, "rb", buffering=READ_BUFFER)
    except FileNotFoundError:
        raise ShardAccessError(url, "file not found", hint="check the shard path or pattern") from None
    except IsADirectoryError:
        raise ShardAccessError(url, "is a directory, not a tar shard", hint="check the shard pattern") from None
    except PermissionError:
        raise ShardAccessError(url, "permission denied", hint="make the shard readable by this user") from None
    except OSError as exc:
        raise ShardAccessError(url, f"cannot open: {exc}", hint="check the file system") from None
    head = raw.peek(6)[:6]
    for magic, opener in _MAGIC.items():
        if head.startswith(magic):
            return _Decompressed(opener(raw), raw)
    return raw
