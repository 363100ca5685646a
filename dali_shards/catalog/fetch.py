"""A manifest's text, and what identifies its content without reading it all: a local file's
SHA-256 (hashed as it is read, a MiB at a time), a remote object's size and the version its store
gives it (one metadata request). A manifest that cannot be read is a ``ManifestNotFound`` or a
``ConfigError`` saying why, the same whichever is asked first."""

from __future__ import annotations

import hashlib
import os
from typing import Any, Dict, NamedTuple, Optional

from dali_shards.catalog.identity import normal_url
from dali_shards.errors import ConfigError, ManifestNotFound, ShardAccessError
from dali_shards.io.fsrequest import http_status, probe, unreachable
from dali_shards.io.ranged import RangeReader
from dali_shards.io.storage import local_path
from dali_shards.io.filesystems import is_remote
from dali_shards.options import StorageOptions

# what a store says of an object's version, in the order preferred (the size is always asked too)
VERSION_FIELDS = ("ETag", "etag", "Content-MD5", "md5Hash", "generation", "Digest", "VersionId", "version_id",
                  "Last-Modified", "LastModified", "last_modified", "updated", "mtime", "created")  # fmt: skip


class Identity(NamedTuple):
    """What identifies a manifest's content: its ``size``, and ``parts`` for a key (None: only its
    text does, read it); ``digest``, its text's SHA-256 where known."""

    size: int
    parts: Optional[tuple]
    digest: Optional[str] = None


def read_text(path: str, config: StorageOptions) -> bytes:
    """A manifest's text (a local path or a URL)."""
    if not is_remote(path):
        local = local_path(path)
        assert local is not None  # not remote: local
        try:
            with open(local, "rb") as f:
                return f.read()
        except FileNotFoundError:
            raise ManifestNotFound(f"manifest {path!r} not found") from None
    reader = RangeReader(path, config)
    try:
        return reader.whole("manifest read")
    except ShardAccessError as exc:
        raise _unreadable(path, reader, exc) from None


def identity(path: str, config: StorageOptions, hash_at_least: int) -> Identity:
    """What identifies the manifest's content: a local file of ``hash_at_least`` bytes or more is
    hashed (smaller ones: their size only, they are read whole anyway); a remote one asked for its
    size and version (``parts`` None where its store gives no version)."""
    if not is_remote(path):
        local = local_path(path)
        assert local is not None  # not remote: local
        try:
            size = os.stat(local).st_size
            if size < hash_at_least:
                return Identity(size, None)
            with open(local, "rb") as f:
                digest = hashlib.file_digest(f, "sha256").hexdigest()
        except FileNotFoundError:
            raise ManifestNotFound(f"manifest {path!r} not found") from None
        except IsADirectoryError:
            raise ConfigError(f"manifest {path!r} is a directory, not a manifest file") from None
        return Identity(size, ("local", os.path.abspath(local), digest), digest)
    info = _info(path, config)
    if info is None or not isinstance(info.get("size"), int):
        return Identity(0, None)
    version = {k: str(info[k]) for k in VERSION_FIELDS if info.get(k) not in (None, "")}
    parts = ("remote", normal_url(path), int(info["size"]), sorted(version.items())) if version else None
    return Identity(int(info["size"]), parts)


def _info(path: str, config: StorageOptions) -> Optional[Dict[str, Any]]:
    """The store's metadata of a remote manifest; None where it does not give them (the manifest is
    then read, and any error said then); ``ManifestNotFound`` or the ``ConfigError`` of an
    unreachable server at once."""
    reader = RangeReader(path, config)
    try:
        info = reader.retrying("manifest metadata", lambda: reader._timed("info", reader.path))
    except ShardAccessError as exc:
        cause = exc.__cause__
        under = getattr(cause, "__cause__", None)  # (fsspec's HTTP metadata says FileNotFoundError for any failure)
        if any(c is not None and unreachable(c, path) is not None for c in (cause, under)):
            raise _unreadable(path, reader, exc) from None
        if http_status(cause) in (404, 410) or (isinstance(cause, FileNotFoundError) and under is None):
            raise ManifestNotFound(f"manifest {path!r} not found") from None
        return None  # (read, and said as reading it says)
    except Exception:  # noqa: BLE001 - a store without metadata: the manifest is read instead
        return None
    finally:
        reader.close()
    return info if isinstance(info, dict) else None


def _unreadable(path: str, reader: RangeReader, exc: ShardAccessError) -> Exception:
    """The error a remote manifest that cannot be read is: not found, or a ConfigError saying why."""
    cause = exc.__cause__
    server = unreachable(cause, path) if cause is not None else None  # (a "not found" may say it too)
    if server is None and (isinstance(cause, FileNotFoundError) or http_status(cause) in (404, 410)):
        return ManifestNotFound(f"manifest {path!r} not found")
    server = server or (probe(reader.fs, path, cause) if cause is not None else None)
    if server is not None:
        return ConfigError(
            f"cannot read manifest {path!r}: the server {server} could not be reached "
            f"({type(cause).__name__}: {cause}); check that it is up and that the URL (or endpoint_url=) is right"
        )
    return ConfigError(f"cannot read manifest {path!r}: {exc.detail}; {exc.hint}")
