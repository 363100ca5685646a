"""Turning a user's ``source`` into the ordered list of shards with their sample counts.

``source`` may be a brace pattern (``data/train-{000000..000127}.tar``), a glob
(``data/train-*.tar``), a manifest (``data/manifest.json``), a directory (its tar shards), or a
list of any of these, paths and URLs (``s3://``, ``gs://``, ``http(s)://``... through fsspec).
The order given is the *canonical* order that ``__index__`` counts in (globs and directories sort
by name).

Local shards without a manifest are counted by a header scan. Remote shards are never scanned
per run: their counts come from a manifest, given or found beside them (``manifest.json``, as
written by ``dali-shards index``).
"""

from __future__ import annotations

import glob
import os
from typing import Dict, List, Sequence, Tuple, Union

from braceexpand import braceexpand

from .errors import ConfigError
from .manifest import ManifestNotFound, ShardInfo, read_manifest, scan_shards
from .remote import DEFAULT_STORAGE, StorageConfig, filesystem, is_remote
from .storage import local_path

MANIFEST_NAME = "manifest.json"

Source = Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]]
_GLOB_CHARS = set("*?[")
SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")


def is_manifest(path: str) -> bool:
    return path.endswith(".json")


def expand_pattern(pattern: str, config: StorageConfig = DEFAULT_STORAGE) -> List[str]:
    """Shard URLs of one brace pattern and/or glob, in order."""
    urls: List[str] = []
    for item in braceexpand(pattern):
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
    source: Source, on_error: str = "raise", config: StorageConfig = DEFAULT_STORAGE, counts: bool = True
) -> List[ShardInfo]:
    """The shards of ``source`` with their sample counts (a manifest, else a header scan of local
    shards; with ``on_error="skip"`` damaged or missing local shards count what can be read).
    Remote shards take their counts from a manifest beside them; with ``counts=False`` shards
    without one are listed with ``samples=-1`` (the streaming mode) instead of refused."""
    items = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    if not items:
        raise ConfigError("source is empty: give a shard pattern, a list of shards or a manifest")
    shards: List[ShardInfo] = []
    to_scan: List[str] = []
    slots: List[int] = []
    remote: List[Tuple[int, str, str]] = []
    for item in items:
        text = os.fspath(item)
        if is_manifest(text):
            shards.extend(read_manifest(text, config))
            continue
        for url in expand_pattern(text, config):
            if is_remote(url):
                remote.append((len(shards), url, text))
            else:
                slots.append(len(shards))
                to_scan.append(url)
            shards.append(ShardInfo(url, -1))
    for slot, info in zip(slots, scan_shards(to_scan, on_error=on_error, config=config)):
        shards[slot] = info
    if remote:
        known = _manifests_beside([url for _, url, _ in remote], config)
        for slot, url, pattern in remote:
            if url in known:
                shards[slot] = known[url]
            elif counts:
                folder = url.rsplit("/", 1)[0]
                raise ConfigError(
                    f"no sample count for remote shard {url!r}: remote shards are not scanned at every start. "
                    f"Run `dali-shards index '{pattern}'` once (it writes {folder}/{MANIFEST_NAME}, which is then "
                    "found automatically), pass a manifest as the source, or set samples_per_epoch= to stream "
                    "without counts (resampled)"
                )
    if not shards:
        raise ConfigError(f"source {source!r} names no shards")
    return shards


def _manifests_beside(urls: Sequence[str], config: StorageConfig) -> Dict[str, ShardInfo]:
    """The shards listed by the ``manifest.json`` of each folder holding one of ``urls``."""
    found: Dict[str, ShardInfo] = {}
    for folder in dict.fromkeys(u.rsplit("/", 1)[0] for u in urls):
        try:
            for info in read_manifest(f"{folder}/{MANIFEST_NAME}", config):
                found[info.url] = info
        except ManifestNotFound:
            continue
    return found
