"""What ``dali-shards write`` reads, found from its source: an ImageFolder tree or a file list
(local or remote), Parquet files or a folder of them, or (from Python) a Ray Dataset; as files to
write one by one (``FilesInput``), or blocks of rows read together (``BlocksInput``)."""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from dali_shards.errors import ConfigError
from dali_shards.io.filesystems import DEFAULT_STORAGE, is_remote
from dali_shards.options import StorageOptions
from dali_shards.tools import parquet
from dali_shards.tools.imagefolder import SourceFile, find_sources, stem_keys
from dali_shards.tools.remotefiles import remote_file_list, remote_listing, remote_tree


@dataclass
class FilesInput:
    """Files to write, their keys (None: numbered), the class map (None for a list) and the files
    keyed other than by their name (path, key)."""

    files: List[SourceFile]
    keys: Optional[List[str]]
    class_map: Optional[Dict[str, int]]
    renamed: List[Tuple[str, str]]


@dataclass
class BlocksInput:
    """Blocks of rows (their descriptions and row counts), the reader a task reads one with, and
    what of the options decides a row's bytes."""

    reader: Any
    blocks: Sequence[Any]
    rows: Sequence[int]
    columns: Dict[str, str]


def find_input(source: Any, *, class_map: Optional[Dict[str, int]] = None, numeric: bool = False,
               columns: Optional[str] = None, numbered_keys: bool = False,
               storage: StorageOptions = DEFAULT_STORAGE) -> Any:  # fmt: skip
    """A ``FilesInput`` or ``BlocksInput`` for ``source`` (a path, a URL or a Ray Dataset)."""
    if not isinstance(source, str):
        if type(source).__module__.startswith("ray.data"):
            from dali_shards.tools.raydata import ray_dataset_blocks

            wanted = parquet.parse_columns(columns or parquet.DEFAULT_COLUMNS)
            return BlocksInput(*ray_dataset_blocks(source, wanted), wanted)
        raise ConfigError(f"a write's source is a path, a URL or a Ray Dataset, got {type(source).__name__}")
    files = _parquet_files(source, storage)
    if files:
        return _parquet_input(files, parquet.parse_columns(columns or parquet.DEFAULT_COLUMNS), numbered_keys, storage)
    if columns is not None:
        raise ConfigError(f"--columns is for Parquet input; {source!r} holds no .parquet files")
    if is_remote(source):
        listing = remote_listing(source, storage)
        if listing:
            found, class_map = remote_tree(source, listing, class_map, numeric, storage)
        else:
            found, class_map = _remote_list(source, storage), None
    else:
        found, class_map = find_sources(source, class_map, numeric)
    return _keyed(found, class_map, numbered_keys)


def _remote_list(source: str, storage: StorageOptions) -> List[SourceFile]:
    try:
        return remote_file_list(source, storage)
    except ConfigError as exc:
        if "not found" not in str(exc):
            raise
        raise ConfigError(f"{source!r} lists no files (a folder) and is no file: give an ImageFolder tree (HTTP: on a "
                          "server that lists folders), a file list or Parquet files") from None  # fmt: skip


def _keyed(files: List[SourceFile], class_map: Optional[Dict[str, int]], numbered: bool) -> FilesInput:
    if numbered:
        return FilesInput(files, None, class_map, [])
    keys, renamed = stem_keys(files)
    return FilesInput(files, keys, class_map, renamed)


def _parquet_files(source: str, storage: StorageOptions) -> List[str]:
    """The Parquet files ``source`` names (itself, or those under the folder), sorted; [] if none."""
    if parquet.is_parquet(source):
        return [source]
    if is_remote(source):
        return sorted(u for u in remote_listing(source, storage) if parquet.is_parquet(u))
    if os.path.isdir(source):
        return sorted(glob.glob(os.path.join(glob.escape(source), "**", "*.parquet"), recursive=True))
    return []


def _parquet_input(files: List[str], columns: Dict[str, str], numbered: bool, storage: StorageOptions) -> Any:
    data = parquet.load_parquet(files, columns, storage)
    if not data.paths:
        reader = parquet.ParquetReader(data.columns, data.storage)
        return BlocksInput(reader, data.blocks, [b.rows for b in data.blocks], columns)
    image = next(e for e in columns if e not in ("cls", parquet.KEY) and parquet._image_column({e: ""}))
    found: List[SourceFile] = []
    keys: List[str] = []
    for path, rows in parquet.read_rows(data):
        for row in rows:
            label = row.get("cls")
            extra = tuple((e, v) for e, v in row.items() if e not in (image, "cls", parquet.KEY))
            found.append(SourceFile(parquet.join_path(path, str(row[image])), label, image, extra=extra))
            keys += [str(row[parquet.KEY])] if parquet.KEY in row else []
    if parquet.KEY in columns:
        return FilesInput(found, keys, None, [])
    return _keyed(found, None, numbered)
