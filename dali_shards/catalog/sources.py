"""Turning a user's ``source`` into the ordered list of shards with their sample counts.

``source`` may be a brace pattern (``data/train-{000000..000127}.tar``), a glob
(``data/train-*.tar``), a manifest (``data/manifest.json``), a directory (the shards its
``manifest.json`` lists; without one, its tar shards), or a list of any of these, paths and URLs
(``s3://``, ``gs://``, ``http(s)://``... through fsspec). The order given is the *canonical* order
that ``__index__`` counts in (globs and directories sort by name).

A directory with a ``manifest.json`` is read as that manifest: tar files there that it does not
list (left over from an earlier write) are left out, with one warning naming them; shards it lists
outside the folder (``../``, absolute paths) are read, with one warning (``catalog.origins``). A
local glob or brace pattern that selects existing shards the ``manifest.json`` beside them does not
list reads them, with a warning naming them (shards a brace pattern names that do not exist are
a ``ShardAccessError``, or skipped with ``on_error="skip"``).

Local shards without a manifest are counted by a header scan. Remote shards are never scanned
per run: their counts come from a manifest, given or found beside them (``manifest.json``, as
written by ``dali-shards index``).

A shard listed twice (by patterns, lists or manifests, however spelled) is refused. A local shard
whose size differs from its manifest's ``bytes`` is refused (with ``on_error="skip"`` the workers
skip it, counted), or counted again with ``stale_manifest="rescan"``; every shard is checked again
when opened (see ``storage``). Counts no shard of its size could hold are refused at the start
(``catalog.plausible``); a remote manifest may list only shards on its own server or bucket,
unless ``manifest_foreign_urls=True`` (``catalog.origins``).
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import os
from typing import Dict, List, Sequence, Tuple, Union

import numpy as np
from braceexpand import braceexpand

from dali_shards.errors import ConfigError, ManifestNotFound
from dali_shards.catalog.assemble import concat, from_infos, replaced
from dali_shards.catalog.columns import Catalog
from dali_shards.catalog.shardinfo import ShardInfo
from dali_shards.catalog.scan import scan_shards
from dali_shards.catalog.manifest import read_catalog, read_manifest
from dali_shards.catalog.folders import MANIFEST_NAME, SHARD_SUFFIXES, folder_manifest, warn_unlisted
from dali_shards.catalog.identity import ShardIdentity
from dali_shards.catalog.origins import warn_outside_folder
from dali_shards.catalog.parts import Origins, Part, check_manifested, refuse_repeats
from dali_shards.catalog.plausible import check_counts
from dali_shards.catalog.table import check_tables
from dali_shards.options import StorageOptions
from dali_shards.io.filesystems import DEFAULT_STORAGE, filesystem, is_remote
from dali_shards.io.storage import local_path
from dali_shards.options import OnError, StaleManifest, enum_option, option_default

log = logging.getLogger("dali_shards")

Source = Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]]
_GLOB_CHARS = set("*?[")


def is_manifest(path: str) -> bool:
    return path.endswith(".json")


def expand_pattern(pattern: str, config: StorageOptions = DEFAULT_STORAGE) -> List[str]:
    """Shard URLs of one brace pattern and/or glob, in order."""
    urls: List[str] = []
    try:
        items = list(braceexpand(pattern))
    except ValueError:  # braceexpand's UnbalancedBracesError
        raise ConfigError(
            f"pattern {pattern!r} has unbalanced braces: write a range as {{000000..000127}}, both braces, "
            "or list the shards"
        ) from None
    for item in items:
        if is_remote(item) and _GLOB_CHARS & set(item.split("://", 1)[1]) and not item.startswith("http"):
            fs, inner = filesystem(item, config)
            protocol = item.split("://", 1)[0]
            matches = sorted(f"{protocol}://{m}" for m in fs.glob(inner))
            if not matches:
                raise ConfigError(f"pattern {item!r} matches no objects")
            urls.extend(matches)
            continue
        path = local_path(item)
        if path is not None and os.path.isdir(path):
            found = sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith(SHARD_SUFFIXES))
            if not found:
                raise ConfigError(f"directory {item!r} holds no tar shards ({', '.join(SHARD_SUFFIXES)})")
            urls.extend(found)
        elif path is not None and _GLOB_CHARS & set(path):
            matches = sorted(glob.glob(path))
            if not matches:
                raise ConfigError(f"pattern {item!r} matches no files")
            urls.extend(matches)
        else:
            urls.append(item)
    return urls


def resolve_source(
    source: Source,
    on_error: OnError | str = option_default("on_error"),
    config: StorageOptions = DEFAULT_STORAGE,
    counts: bool = True,
    stale_manifest: StaleManifest | str = option_default("stale_manifest"),
) -> List[ShardInfo]:
    """The shards of ``source`` with their sample counts, one ``ShardInfo`` each (``resolve_catalog``)."""
    return list(resolve_catalog(source, on_error, config, counts, stale_manifest))


def resolve_catalog(
    source: Source,
    on_error: OnError | str = option_default("on_error"),
    config: StorageOptions = DEFAULT_STORAGE,
    counts: bool = True,
    stale_manifest: StaleManifest | str = option_default("stale_manifest"),
) -> Catalog:
    """The catalog of ``source``: its shards with their sample counts (a manifest, else a header
    scan of local shards; with ``on_error="skip"`` damaged or missing local shards count what can
    be read). Remote shards take their counts from a manifest beside them; with ``counts=False``
    shards without one are listed with ``samples=-1`` (the streaming mode) instead of refused. A
    shard listed twice is a ConfigError, and so are counts a manifest gives that the shard cannot
    hold (whatever ``on_error``); a local shard whose size is not its manifest's a
    ShardFormatError, or (``stale_manifest="rescan"``) counted again."""
    on_error = enum_option(OnError, "on_error", on_error)
    stale = enum_option(StaleManifest, "stale_manifest", stale_manifest)
    items = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    if not items:
        raise ConfigError("source is empty: give a shard pattern, a list of shards or a manifest")
    parts = [_part(os.fspath(item), n, items, source, config) for n, item in enumerate(items)]
    origins = Origins(parts)
    if not (len(parts) == 1 and parts[0].manifested):  # (a manifest refuses its own repeats when read)
        refuse_repeats(parts, origins)
    checked = []  # (part, its rows whose counts a manifest gives: checked against their shards)
    for part in parts:
        if part.catalog is not None:
            changed = check_manifested(part.catalog, origins.of(part), stale, on_error, config)
            rescanned = scan_shards([part.catalog.url(i) for i in changed], on_error=on_error, config=config)
            for i, info in zip(changed, rescanned):
                log.warning(
                    "dali_shards: shard %s has %s bytes, but its manifest says %s (%d samples); counted it again: "
                    "%d samples", info.url, info.bytes, part.catalog.sizes[i], part.catalog.samples[i], info.samples,
                )  # fmt: skip
            part.catalog = replaced(part.catalog, dict(zip(changed, rescanned)))
            given = np.ones(len(part.catalog), bool)
            given[changed] = False  # (those counted again need no check)
            checked.append((part, np.flatnonzero(given)))
    _count_patterns(parts, on_error, config, counts, checked)
    for part, rows in checked:
        assert part.catalog is not None  # counted
        check_counts(part.catalog, rows, origins.of(part), config)
    catalog = concat([p.catalog for p in parts if p.catalog is not None])
    check_tables(catalog, config)
    if not len(catalog):
        raise ConfigError(f"source {source!r} names no shards")
    return catalog


def _part(text: str, n: int, items: Sequence[object], source: Source, config: StorageOptions) -> Part:
    """Item ``n`` of the source: a manifest's catalog, or a pattern's shards (not yet counted)."""
    listed = len(items) > 1 or not isinstance(source, (str, os.PathLike))
    where = f"item {n} of the source list" if listed else "source"
    folder = folder_manifest(text, config)
    if folder is not None or is_manifest(text):
        text, catalog = folder if folder is not None else (text, read_catalog(text, config))
        if folder is None and os.path.basename(text) == MANIFEST_NAME:
            warn_outside_folder(text, catalog)
        return Part(where, text, catalog=catalog)
    urls = expand_pattern(text, config)
    warn_unlisted(text, urls)
    return Part(where, text, infos=[ShardInfo(url, -1) for url in urls], matches=urls != [text])


def _count_patterns(parts: Sequence[Part], on_error: str, config: StorageOptions, counts: bool, checked: list) -> None:
    """The patterns' shards counted: local ones scanned (all at once), remote ones by the manifests
    beside them (those then checked as a manifest's are)."""
    local = [(p, k) for p in parts if p.infos is not None for k, s in enumerate(p.infos) if not is_remote(s.url)]
    urls = [p.infos[k].url for p, k in local]  # type: ignore[index]
    for (part, k), info in zip(local, scan_shards(urls, on_error=on_error, config=config)):
        part.infos[k] = info  # type: ignore[index]
    remote = [(p, k) for p in parts if p.infos is not None for k, s in enumerate(p.infos) if is_remote(s.url)]
    beside = _count_remote(remote, config, counts) if remote else set()
    for part in parts:
        if part.infos is not None:
            part.catalog = from_infos(part.infos)
            rows = [k for k in range(len(part.infos)) if (id(part), k) in beside]
            if rows:
                checked.append((part, np.array(rows, np.int64)))


def _count_remote(remote: Sequence[Tuple[Part, int]], config: StorageOptions, counts: bool) -> set:
    """Remote shards of patterns (part, index) take their counts from the manifests beside them
    (their origins then name the manifest; those counted so are returned, as (id(part), index));
    without one, a ConfigError with the advice (or, without ``counts``, ``samples=-1``)."""
    shard_identity = ShardIdentity()
    known = _manifests_beside([p.infos[k].url for p, k in remote], config, shard_identity)  # type: ignore[index]
    found = set()
    for part, k in remote:
        url = part.infos[k].url  # type: ignore[index]
        listed = known.get(shard_identity(url))
        if listed is not None:
            part.infos[k] = dataclasses.replace(listed, url=url)  # type: ignore[index]
            part.notes[k] = f", counted by {url.rsplit('/', 1)[0]}/{MANIFEST_NAME}"
            found.add((id(part), k))
        elif counts:
            folder = url.rsplit("/", 1)[0]
            raise ConfigError(
                f"no sample count for remote shard {url!r}: remote shards are not scanned at every start. "
                f"Run `dali-shards index '{part.text}' --manifest local.json` once and pass local.json as the "
                f"source (works with read-only servers such as HTTP); where you can write to {folder}/, "
                f"`dali-shards index '{part.text}'` puts {MANIFEST_NAME} there, found automatically from then on. "
                "Or set samples_per_epoch= to stream without counts (resampled)"
            )
    return found


def _manifests_beside(urls: Sequence[str], config: StorageOptions, identity: ShardIdentity) -> Dict[str, ShardInfo]:
    """The shards listed by the ``manifest.json`` of each folder holding one of ``urls``, by
    their identity (``catalog.identity``: an entry ``./x.tar`` counts the shard ``x.tar``)."""
    found: Dict[str, ShardInfo] = {}
    for folder in dict.fromkeys(u.rsplit("/", 1)[0] for u in urls):
        try:
            for info in read_manifest(f"{folder}/{MANIFEST_NAME}", config):
                found[identity(info.url)] = info
        except ManifestNotFound:
            continue
    return found
