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

from braceexpand import braceexpand

from dali_shards.errors import ConfigError, ManifestNotFound, ShardFormatError
from dali_shards.catalog.shardinfo import ShardInfo
from dali_shards.catalog.scan import scan_shards
from dali_shards.catalog.manifest import read_manifest
from dali_shards.catalog.folders import MANIFEST_NAME, SHARD_SUFFIXES, folder_manifest, warn_unlisted
from dali_shards.catalog.identity import Seen, ShardIdentity, spelled
from dali_shards.catalog.origins import warn_outside_folder
from dali_shards.catalog.plausible import check_counts, local_file_size
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
    """The shards of ``source`` with their sample counts (a manifest, else a header scan of local
    shards; with ``on_error="skip"`` damaged or missing local shards count what can be read).
    Remote shards take their counts from a manifest beside them; with ``counts=False`` shards
    without one are listed with ``samples=-1`` (the streaming mode) instead of refused. A shard
    listed twice is a ConfigError, and so are counts a manifest gives that the shard cannot hold
    (whatever ``on_error``); a local shard whose size is not its manifest's a ShardFormatError, or
    (``stale_manifest="rescan"``) counted again."""
    on_error = enum_option(OnError, "on_error", on_error)
    stale = enum_option(StaleManifest, "stale_manifest", stale_manifest)
    items = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    if not items:
        raise ConfigError("source is empty: give a shard pattern, a list of shards or a manifest")
    shards: List[ShardInfo] = []
    origins: List[str] = []
    manifested: List[int] = []
    to_scan: List[str] = []
    slots: List[int] = []
    remote: List[Tuple[int, str, str]] = []
    for n, item in enumerate(items):
        text = os.fspath(item)
        listed = len(items) > 1 or not isinstance(source, (str, os.PathLike))
        where = f"item {n} of the source list" if listed else "source"
        folder = folder_manifest(text)
        if folder is not None or is_manifest(text):
            text, infos = folder if folder is not None else (text, read_manifest(text, config))
            if folder is None and os.path.basename(text) == MANIFEST_NAME:
                warn_outside_folder(text, [info.url for info in infos])
            for i, info in enumerate(infos):
                manifested.append(len(shards))
                origins.append(f"{where}, manifest {text!r}, entry {i}")
                shards.append(info)
            continue
        urls = expand_pattern(text, config)
        warn_unlisted(text, urls)
        for k, url in enumerate(urls):
            if is_remote(url):
                remote.append((len(shards), url, text))
            else:
                slots.append(len(shards))
                to_scan.append(url)
            origins.append(f"{where}, pattern {text!r}, match {k}" if urls != [text] else f"{where} ({text!r})")
            shards.append(ShardInfo(url, -1))
    _refuse_duplicates(shards, origins)
    given = list(shards)  # as the manifests give them (those counted again need no check)
    _check_manifested(shards, manifested, origins, stale, on_error, config)
    for slot, info in zip(slots, scan_shards(to_scan, on_error=on_error, config=config)):
        shards[slot] = info
    beside = _count_remote(shards, remote, origins, config, counts) if remote else []
    check_counts(shards, [s for s in manifested if shards[s] is given[s]] + beside, origins, config)
    check_tables(shards, config)
    if not shards:
        raise ConfigError(f"source {source!r} names no shards")
    return shards


def _count_remote(
    shards: List[ShardInfo],
    remote: Sequence[Tuple[int, str, str]],
    origins: List[str],
    config: StorageOptions,
    counts: bool,
) -> List[int]:
    """Remote shards of patterns (slot, URL, pattern) take their counts from the manifests beside
    them (their origins then name the manifest; the slots counted so are returned); without one,
    a ConfigError with the advice (or, without ``counts``, ``samples=-1``)."""
    shard_identity = ShardIdentity()
    known = _manifests_beside([url for _, url, _ in remote], config, shard_identity)
    found = []
    for slot, url, pattern in remote:
        listed = known.get(shard_identity(url))
        if listed is not None:
            shards[slot] = dataclasses.replace(listed, url=url)
            origins[slot] += f", counted by {url.rsplit('/', 1)[0]}/{MANIFEST_NAME}"
            found.append(slot)
        elif counts:
            folder = url.rsplit("/", 1)[0]
            raise ConfigError(
                f"no sample count for remote shard {url!r}: remote shards are not scanned at every start. "
                f"Run `dali-shards index '{pattern}' --manifest local.json` once and pass local.json as the "
                f"source (works with read-only servers such as HTTP); where you can write to {folder}/, "
                f"`dali-shards index '{pattern}'` puts {MANIFEST_NAME} there, found automatically from then on. "
                "Or set samples_per_epoch= to stream without counts (resampled)"
            )
    return found


def _refuse_duplicates(shards: Sequence[ShardInfo], origins: Sequence[str]) -> None:
    """A ConfigError naming a shard listed twice (``catalog.identity``: however spelled), both
    spellings and both places."""
    seen: Seen[int] = Seen()
    for slot, info in enumerate(shards):
        before = seen.before(info.url, slot)
        if before is not None:
            url, first = before
            raise ConfigError(
                f"shard {spelled(url, info.url)} is listed twice: by {origins[first]}, and by {origins[slot]}. "
                "Each shard may appear once per epoch: remove one (check the patterns, lists and manifests of source=)"
            )


def _check_manifested(
    shards: List[ShardInfo],
    slots: Sequence[int],
    origins: Sequence[str],
    stale: StaleManifest,
    on_error: OnError,
    config: StorageOptions,
) -> None:
    """Compare the local shards listed by manifests with their recorded ``bytes`` (a stat each):
    refuse a changed one (with ``on_error="skip"``: warn, and the workers skip it, counted), or
    (``stale="rescan"``) count it again."""
    changed = []
    for slot in slots:
        info = shards[slot]
        actual = None if info.bytes is None else local_file_size(info.url)  # None: remote, or met when opened
        if actual is None or actual == info.bytes:
            continue
        if stale is StaleManifest.RESCAN:
            changed.append(slot)
            continue
        assert info.bytes is not None  # else actual is None
        how = "truncated or rewritten" if actual < info.bytes else "rewritten"
        error = ShardFormatError(
            info.url,
            f"has {actual} bytes, but {origins[slot]} says {info.bytes}: it was {how} after the manifest was "
            f"written, so its sample count ({info.samples}) cannot be trusted",
            hint="run `dali-shards index` on the shards again to rewrite the manifest, or pass "
            'stale_manifest="rescan" to count changed shards again at every start',
        )
        if on_error is OnError.RAISE:
            raise error
        log.warning("dali_shards: %s; its samples will be skipped", error)
    for slot, info in zip(changed, scan_shards([shards[s].url for s in changed], on_error=on_error, config=config)):
        log.warning(
            "dali_shards: shard %s has %s bytes, but its manifest says %s (%d samples); counted it again: %d samples",
            info.url,
            info.bytes,
            shards[slot].bytes,
            shards[slot].samples,
            info.samples,
        )
        shards[slot] = info


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
