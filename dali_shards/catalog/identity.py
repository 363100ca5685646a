"""What makes two spellings of a shard the same shard: the one notion every duplicate check uses
(patterns, lists and manifests of a source, the entries of one manifest, the streams of a mix).

A local shard (a path, relative or absolute, or a ``file://`` URL) is its real path: symlinks,
``.``/``..``, doubled slashes and the working directory resolved. A remote URL is normalised:
scheme and host lower-cased, a default port (``:80`` for http, ``:443`` for https) dropped,
percent escapes in one case (unreserved characters decoded), and in its path ``.``/``..``
segments removed and doubled slashes collapsed; its user info, query and fragment are kept as
written. So a server or bucket that serves different objects at ``a//b.tar`` and ``a/b.tar``
(or ``A/b`` and ``a/b`` of a host differing in case only) has them taken as one shard, and
refused as listed twice: rename one of them.
"""

from __future__ import annotations

import os
import re
from typing import Dict, Generic, List, Optional, Tuple, TypeVar

from dali_shards.io.storage import local_path

T = TypeVar("T")
_DEFAULT_PORTS = {"http": ":80", "https": ":443"}
_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


class ShardIdentity:
    """Callable: a shard URL's identity (see the module). The real paths of the folders met are
    remembered for the life of the object (one resolve), so that a long list costs one ``lstat``
    per local shard."""

    def __init__(self) -> None:
        self._folders: Dict[str, str] = {}

    def __call__(self, url: str) -> str:
        path = local_path(url)
        return normal_url(url) if path is None else self._real(path)

    def _real(self, path: str) -> str:
        path = path if os.path.isabs(path) else os.path.join(os.getcwd(), path)
        folder, name = os.path.split(path)
        if name in ("", ".", "..") or os.path.islink(path):
            return os.path.realpath(path)
        real = self._folders.get(folder)
        if real is None:
            real = self._folders[folder] = os.path.realpath(folder)
        return os.path.join(real, name)


def shard_identity(url: str) -> str:
    """What makes two spellings of ``url`` the same shard (see the module)."""
    return ShardIdentity()(url)


class Seen(Generic[T]):
    """The shards met so far, by identity, each with its first spelling and what the caller
    keeps of it (its place)."""

    def __init__(self) -> None:
        self._identity = ShardIdentity()
        self._first: Dict[str, Tuple[str, T]] = {}

    def before(self, url: str, value: T) -> Optional[Tuple[str, T]]:
        """The first spelling of ``url``'s shard and its value if it was met before; else None,
        and ``url`` is recorded with ``value``."""
        key = self._identity(url)
        first = self._first.get(key)
        if first is None:
            self._first[key] = (url, value)
        return first


def spelled(first: str, again: str) -> str:
    """A shard met twice, for an error: its first spelling, and the second where it differs,
    with the identity both share."""
    if first == again:
        return repr(first)
    return f"{first!r} (also as {again!r}: both are {shard_identity(first)!r})"


def normal_url(url: str) -> str:
    """A remote URL normalised (see the module); its query and fragment as written."""
    scheme, rest = url.split("://", 1)
    scheme = scheme.lower()
    cut = min((i for i in (rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    rest, tail = rest[:cut], rest[cut:]
    authority, _, path = rest.partition("/")
    user, at, host = authority.rpartition("@")
    host = _escapes(host).lower()
    port = _DEFAULT_PORTS.get(scheme)
    if port is not None and host.endswith(port):
        host = host[: -len(port)]
    return f"{scheme}://{user}{at}{host}{_path(_escapes(path))}{tail}"


def _escapes(text: str) -> str:
    """Percent escapes of unreserved characters decoded, the others upper-cased."""
    def one(match: re.Match) -> str:
        char = chr(int(match.group()[1:], 16))
        return char if char in _UNRESERVED else match.group().upper()

    return _ESCAPE.sub(one, text)


def _path(path: str) -> str:
    """``path`` (without its leading slash) as ``/``-rooted segments: empty and ``.`` segments
    dropped, each ``..`` taking the segment before it (none above the root)."""
    segments: List[str] = []
    for segment in path.split("/"):
        if segment == "..":
            if segments:
                segments.pop()
        elif segment not in ("", "."):
            segments.append(segment)
    trailing = "/" if segments and path.rsplit("/", 1)[-1] in ("", ".", "..") else ""
    return "/" + "/".join(segments) + trailing
