"""Turning a user's ``source`` into the ordered list of shards with their sample counts.

``source`` may be a brace pattern (``data/train-{000000..000127}.tar``), a glob
(``data/train-*.tar``), a manifest (``data/manifest.json``), a directory (its tar shards), or a
list of any of these, paths and URLs. The order given is the *canonical* order that ``__index__``
counts in (globs and directories sort by name).
"""

from __future__ import annotations

import glob
import os
from typing import List, Sequence, Union

from braceexpand import braceexpand

from .errors import ConfigError
from .manifest import ShardInfo, read_manifest, scan_shards
from .storage import local_path

Source = Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]]
_GLOB_CHARS = set("*?[")
SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")


def is_manifest(path: str) -> bool:
    return path.endswith(".json")


def expand_pattern(pattern: str) -> List[str]:
    """Shard URLs of one brace pattern and/or local glob, in order."""
    urls: List[str] = []
    for item in braceexpand(pattern):
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


def resolve_source(source: Source, on_error: str = "raise") -> List[ShardInfo]:
    """The shards of ``source`` with their sample counts (manifest, else a header scan; with
    ``on_error="skip"`` damaged or missing shards count what can be read)."""
    items = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    if not items:
        raise ConfigError("source is empty: give a shard pattern, a list of shards or a manifest")
    shards: List[ShardInfo] = []
    to_scan: List[str] = []
    slots: List[int] = []
    for item in items:
        text = os.fspath(item)
        if is_manifest(text):
            shards.extend(read_manifest(text))
            continue
        for url in expand_pattern(text):
            slots.append(len(shards))
            shards.append(ShardInfo(url, -1))
            to_scan.append(url)
    for slot, info in zip(slots, scan_shards(to_scan, on_error=on_error)):
        shards[slot] = info
    if not shards:
        raise ConfigError(f"source {source!r} names no shards")
    return shards
