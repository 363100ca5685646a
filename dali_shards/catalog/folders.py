"""A local folder's ``manifest.json``: the shards a directory source reads (those it lists; tar
files there it does not list are left out, with a warning), and the warning about shards a glob or
brace pattern selects that the ``manifest.json`` beside them does not list (they are read)."""

from __future__ import annotations

import logging
import os
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from dali_shards.catalog.columns import Catalog
from dali_shards.catalog.identity import ShardIdentity
from dali_shards.catalog.manifest import read_catalog
from dali_shards.catalog.origins import warn_outside_folder
from dali_shards.catalog.repeats import identity_digests
from dali_shards.errors import ConfigError
from dali_shards.io.filesystems import DEFAULT_STORAGE
from dali_shards.io.storage import local_path
from dali_shards.options import StorageOptions

log = logging.getLogger("dali_shards")
MANIFEST_NAME = "manifest.json"
SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")


def folder_manifest(item: str, config: StorageOptions = DEFAULT_STORAGE) -> Optional[Tuple[str, Catalog]]:
    """A local directory source's ``manifest.json`` and the shards it lists, if it has a usable
    one; warns (once) about the tar files there that it does not list, which are then not read,
    and (once) about shards it lists outside the folder, which are."""
    path = local_path(item)
    if path is None or not os.path.isdir(path):
        return None
    manifest = os.path.join(path, MANIFEST_NAME)
    infos = _manifest_beside(manifest, config)
    if infos is None:
        return None
    found = [os.path.join(path, n) for n in sorted(os.listdir(path)) if n.endswith(SHARD_SUFFIXES)]
    warn_outside_folder(manifest, infos)
    unlisted = _unlisted(infos, found)
    if unlisted:
        log.warning(
            "dali_shards: directory %r: reading the %d shard(s) its %s lists; %d tar file(s) there are not listed "
            "and are left out: %s. Remove them, or run `dali-shards index` on the shards you mean to read",
            item, len(infos), MANIFEST_NAME, len(unlisted), _names(unlisted),
        )  # fmt: skip
    return manifest, infos


def warn_unlisted(pattern: str, urls: Sequence[str]) -> None:
    """Warn when existing local shards selected by a glob or brace pattern are missing from the
    ``manifest.json`` beside them (a stale manifest, or files left over from an earlier write).
    Shards a brace pattern names that do not exist are not named: they are not read (their error,
    or with ``on_error="skip"`` their warning, comes when they are counted)."""
    if urls == [pattern]:
        return
    by_folder: Dict[str, List[str]] = {}
    for url in urls:
        path = local_path(url)
        if path is not None and os.path.exists(path):
            by_folder.setdefault(os.path.dirname(os.path.abspath(path)), []).append(url)
    for folder, matched in by_folder.items():
        manifest = os.path.join(folder, MANIFEST_NAME)
        infos = _manifest_beside(manifest)
        unlisted = _unlisted(infos, matched) if infos is not None else []
        if unlisted:
            log.warning(
                "dali_shards: pattern %r selects %d existing shard(s) that %s beside them does not list: %s. They "
                "are read (counted from their headers); if they are left over from an earlier write, remove them, "
                "or give the manifest (or the directory) as the source to read what it lists",
                pattern, len(unlisted), manifest, _names(unlisted),
            )  # fmt: skip


def _manifest_beside(manifest: str, config: StorageOptions = DEFAULT_STORAGE) -> Optional[Catalog]:
    """The shards a local ``manifest.json`` lists; None if there is none, or (with a warning) if
    it is not a usable dali-shards manifest (another tool's file: the shards are then found as
    they would be without it)."""
    if not os.path.isfile(manifest):
        return None
    try:
        return read_catalog(manifest, config)
    except ConfigError as exc:
        log.warning("dali_shards: %s is not a usable dali-shards manifest (%s); ignored", manifest, exc)
        return None


def _unlisted(catalog: Catalog, paths: Sequence[str]) -> List[str]:
    """The names of the shards in ``paths`` that ``catalog`` does not list (by their identities'
    digests: for a warning, a digest shared by chance is taken as the same shard)."""
    identity = ShardIdentity()
    listed = identity_digests(catalog, identity)
    found = identity_digests(list(paths), identity)
    return [os.path.basename(p) for p, known in zip(paths, np.isin(found, listed).tolist()) if not known]


def _names(names: Sequence[str], most: int = 8) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")

