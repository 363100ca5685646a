"""Inputs on object storage or HTTP (``s3://``, ``gs://``, ``http(s)://``, through fsspec as
reading shards does): ImageFolder trees and file lists listed there, and any input file's bytes."""

from __future__ import annotations

import os
import posixpath
from typing import Dict, List, Optional, Tuple

from dali_shards.errors import ConfigError, ShardAccessError
from dali_shards.io.filesystems import DEFAULT_STORAGE, filesystem, is_remote
from dali_shards.options import StorageOptions
from dali_shards.tools.imagefolder import (
    IMAGE_EXTENSIONS,
    SourceFile,
    _extension,
    _split_label,
    class_map_of,
    is_hidden,
    warn_hidden,
)


def _fs(url: str, config: StorageOptions):
    try:
        return filesystem(url, config)
    except ShardAccessError as exc:
        raise ConfigError(f"cannot open {url!r}: {exc.detail}; {exc.hint}") from None


def protocol_url(url: str, inner: str) -> str:
    """``inner`` (a path in ``url``'s filesystem) as a URL of the same protocol."""
    if "://" in inner:
        return inner
    return f"{url.split('://', 1)[0]}://{inner}"


def remote_listing(url: str, config: StorageOptions = DEFAULT_STORAGE) -> Dict[str, int]:
    """Every file under the folder ``url`` (recursively) with its size; {} if there is none."""
    fs, inner = _fs(url, config)
    try:
        found = fs.find(inner.rstrip("/"), detail=True, withdirs=False)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(f"cannot list {url!r}: {exc}") from None
    return {protocol_url(url, path): int(info.get("size") or 0) for path, info in found.items()}


def remote_tree(root: str, listing: Dict[str, int], class_map: Optional[Dict[str, int]], numeric: bool,
                config: StorageOptions = DEFAULT_STORAGE) -> Tuple[List[SourceFile], Dict[str, int]]:  # fmt: skip
    """The images of a remote ImageFolder tree (its ``listing``), in the order a local tree of the
    same files gives (folders sorted, then names), and the class map used."""
    base = root.rstrip("/") + "/"
    under = {url[len(base):]: size for url, size in listing.items() if url.startswith(base)}  # fmt: skip
    classes = sorted({rel.split("/", 1)[0] for rel in under if "/" in rel})
    class_map = class_map_of(root, classes, class_map, numeric)
    files, hidden = [], []
    for rel in sorted(under, key=lambda r: (posixpath.dirname(r), posixpath.basename(r))):
        if "/" not in rel or not rel.lower().endswith(IMAGE_EXTENSIONS):
            continue
        url = base + rel
        if is_hidden(rel):
            hidden.append(url)
        else:
            files.append(SourceFile(url, class_map[rel.split("/", 1)[0]], _extension(rel), under[rel]))
    warn_hidden(hidden)
    if not files:
        raise ConfigError(f"no images ({', '.join(IMAGE_EXTENSIONS)}) under {root!r}")
    return files, class_map


def remote_file_list(url: str, config: StorageOptions = DEFAULT_STORAGE) -> List[SourceFile]:
    """Files of a remote list (``path [label]`` per line, relative paths from the list's folder);
    whether each exists is found when it is read."""
    text = read_input(url, config).decode("utf-8", "replace")
    base = url.rsplit("/", 1)[0]
    files: List[SourceFile] = []
    labelled: Optional[bool] = None
    hidden: List[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        line, label = _split_label(line)
        if labelled is not None and labelled != (label is not None):
            raise ConfigError(f"{url}:{number}: give every file a label, or none")
        labelled = label is not None
        path = line if "://" in line else posixpath.join(base, line)
        if is_hidden(path):
            hidden.append(f"{url}:{number} ({line})")
        elif not _extension(path):
            raise ConfigError(f"{url}:{number}: {line!r} has no extension to name its member by")
        else:
            files.append(SourceFile(path, label, _extension(path)))
    warn_hidden(hidden)
    if not files:
        raise ConfigError(f"file list {url!r} names no files")
    return files


def read_input(path: str, config: StorageOptions = DEFAULT_STORAGE) -> bytes:
    """The bytes of an input file (local or remote); a ConfigError naming it if it cannot be read."""
    try:
        if not is_remote(path):
            with open(path[len("file://"):] if path.startswith("file://") else path, "rb") as f:  # fmt: skip
                return f.read()
        fs, inner = _fs(path, config)
        return fs.cat_file(inner)
    except (OSError, ValueError) as exc:
        why = "not found" if isinstance(exc, FileNotFoundError) else f"{type(exc).__name__}: {exc}"
        raise ConfigError(f"cannot read input file {path!r}: {why}") from None


def input_size(path: str, config: StorageOptions = DEFAULT_STORAGE) -> int:
    """The size of an input file; a ConfigError naming it if it cannot be found."""
    try:
        if not is_remote(path):
            return os.path.getsize(path)
        fs, inner = _fs(path, config)
        return int(fs.info(inner)["size"])
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"cannot read input file {path!r}: {type(exc).__name__}: {exc}") from None
