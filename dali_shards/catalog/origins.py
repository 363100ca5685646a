"""Where a manifest's entries may point.

A remote manifest's entries must lie on its own server or bucket: the same scheme and the same
host (with its port) or bucket as the manifest's URL. An absolute path or ``file://`` URL there
names a file of the machine that reads it, and another host a server the manifest's author
chose: both are refused with a ``ConfigError`` naming the manifest and the entry, unless the
storage option ``manifest_foreign_urls=True`` says that the manifest is trusted to point
anywhere. Relative entries (``../`` included) stay on the manifest's server.

A local folder's ``manifest.json`` (a directory source, or one given by name) may list shards
outside its folder (``../``, absolute paths, as ``dali-shards index --manifest`` writes for shards
elsewhere): they are read as listed, with one warning naming the manifest and an entry, since a
folder copied from elsewhere could point the loader at any file this process can read.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Iterator, Tuple

import numpy as np

from dali_shards.errors import ConfigError
from dali_shards.io.filesystems import is_remote
from dali_shards.io.storage import local_path
from dali_shards.options import StorageOptions

log = logging.getLogger("dali_shards")


def origin(url: str) -> Tuple[str, str]:
    """(scheme, host or bucket) of a remote URL, lower-cased, without user info; ``("file", "")``
    for a local path or ``file://`` URL."""
    if not is_remote(url):
        return ("file", "")
    scheme, rest = url.split("://", 1)
    authority = rest.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
    return scheme.lower(), authority.rpartition("@")[2].lower()


def _named(place: Tuple[str, str]) -> str:
    return "this machine's files" if place[0] == "file" else f"{place[0]}://{place[1]}"


def check_entry_origin(manifest: str, i: int, written: str, url: str, config: StorageOptions) -> None:
    """ConfigError if entry ``i`` of a remote ``manifest`` (``written`` as in the manifest,
    ``url`` resolved) lies off the manifest's server or bucket, unless
    ``config.manifest_foreign_urls``."""
    if not is_remote(manifest) or config.manifest_foreign_urls:
        return
    home, there = origin(manifest), origin(url)
    if there == home:
        return
    local = " (an absolute path or file:// URL is a local file)" if there[0] == "file" else ""
    raise ConfigError(
        f"manifest {manifest!r}: entry {i} ({written!r}) points at {_named(there)}{local}, off the manifest's own "
        f"{'server' if home[0].startswith('http') else 'bucket'} {_named(home)}: a remote manifest may only list "
        "shards beside it, so that a manifest served by others cannot make the loader read local files or other "
        "servers. If you trust this manifest to point anywhere, pass manifest_foreign_urls=True"
    )


def warn_outside_folder(manifest: str, urls: Any) -> None:
    """Warn once if a local folder's ``manifest`` lists local shards (``urls``, in entry order, or
    its ``Catalog``) outside its folder: they are read as listed."""
    path = local_path(manifest)
    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path))
    outside = []
    for i, url in _maybe_outside(urls):
        local = local_path(url)
        if local is not None and os.path.commonpath([folder, os.path.abspath(local)]) != folder:
            outside.append((i, url))
    if outside:
        i, url = outside[0]
        log.warning(
            "dali_shards: %s lists %d shard(s) outside its folder, e.g. entry %d (%r): they are read as listed. A "
            "folder's manifest can point the loader at any file this process can read: check that you trust it, "
            "or list the folder's shards relative to it (`dali-shards index` there)",
            manifest, len(outside), i, url,
        )  # fmt: skip


def _maybe_outside(urls: Any) -> Iterator[Tuple[int, str]]:
    """(entry, URL) of the shards that may lie outside the manifest's folder: of a catalog, those
    not plain names beside it (a name without ``/`` that is not ``.`` or ``..`` is inside)."""
    if not hasattr(urls, "columns"):
        yield from enumerate(urls)
        return
    names = urls.names
    maybe = (urls.columns["prefix"] == 0) | (names.count_bytes(b"/") > 0)
    maybe[names.short(2)] = True  # ("." and "..": looked at as the others)
    for i in np.flatnonzero(maybe).tolist():
        yield i, urls.url(i)
