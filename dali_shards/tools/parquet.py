"""Parquet input for ``dali-shards write``: files or folders of them (a Hugging Face dataset's
Parquet export, img2dataset's output), each row a sample. ``columns`` maps member extensions to
columns (``jpg=image,cls=label,json=meta``): a column of bytes (or a Hugging Face image, a struct
of ``bytes`` and ``path``) is written as it is, a column of strings under an image extension is
read as the paths of the files to write, ``cls`` must hold integers, any other column is encoded
as ``ShardWriter`` encodes values (``__key__=COLUMN`` keys the samples by a column). Needs
``pyarrow`` (the extra ``dali-shards[ray]``)."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

from dali_shards.errors import ConfigError
from dali_shards.io.filesystems import DEFAULT_STORAGE, filesystem, is_remote
from dali_shards.options import StorageOptions
from dali_shards.tools.encode import encode
from dali_shards.worker.imagecheck import IMAGE_EXTENSIONS

DEFAULT_COLUMNS = "jpg=image,cls=label"
KEY = "__key__"


def import_pyarrow() -> Any:
    """``pyarrow.parquet``, or a ConfigError saying how to install it."""
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ConfigError(f"Parquet input needs pyarrow, which is not installed ({exc}): "
                          "pip install 'dali-shards[ray]' (or pyarrow)") from None  # fmt: skip
    return pq


def parse_columns(text: str) -> Dict[str, str]:
    """``"jpg=image,cls=label"`` as {extension: column}; a ConfigError for a malformed one."""
    out: Dict[str, str] = {}
    for part in text.split(","):
        ext, sep, column = part.strip().partition("=")
        ext, column = ext.strip().lstrip("."), column.strip()
        if not sep or not ext or not column:
            raise ConfigError(f"--columns {text!r}: each item is EXT=COLUMN (e.g. jpg=image,cls=label), got {part!r}")
        if ext.lower() in {e.lower() for e in out}:
            raise ConfigError(f"--columns {text!r} names extension {ext!r} twice")
        out[ext] = column
    if not [e for e in out if e != KEY]:
        raise ConfigError(f"--columns {text!r} names no member")
    return out


class Block(NamedTuple):
    """One row group: its file, its index in the file, its rows."""

    file: str
    group: int
    rows: int


@dataclass(frozen=True)
class ParquetInput:
    """Parquet files (in order), their row groups, and the columns to write."""

    files: Tuple[str, ...]
    blocks: Tuple[Block, ...]
    columns: Tuple[Tuple[str, str], ...]  # (extension, column)
    paths: bool  # the image column holds paths (each row's file is read), not bytes
    storage: StorageOptions = DEFAULT_STORAGE

    @property
    def samples(self) -> int:
        return sum(b.rows for b in self.blocks)


def is_parquet(path: str) -> bool:
    return path.lower().endswith(".parquet")


def open_parquet(path: str, config: StorageOptions) -> Any:
    """A ``pyarrow.parquet.ParquetFile`` of a local path or URL; a ConfigError naming it if unreadable."""
    pq = import_pyarrow()
    try:
        if is_remote(path):
            fs, inner = filesystem(path, config)
            return pq.ParquetFile(fs.open(inner, "rb"))
        return pq.ParquetFile(path)
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise ConfigError(f"cannot read Parquet file {path!r}: {exc}") from None


def load_parquet(files: Sequence[str], columns: Dict[str, str], config: StorageOptions = DEFAULT_STORAGE) -> ParquetInput:
    """The row groups of ``files`` (from their footers only), the columns checked: each must exist
    in every file, ``cls`` hold integers."""
    blocks: List[Block] = []
    paths: Optional[bool] = None
    for path in files:
        meta = open_parquet(path, config)
        schema = meta.schema_arrow
        for ext, column in columns.items():
            if schema.get_field_index(column) < 0:
                raise ConfigError(f"Parquet file {path!r} has no column {column!r} (for {ext}={column}); its columns: "
                                  f"{', '.join(schema.names)} (say which with --columns EXT=COLUMN,...)")  # fmt: skip
        image = _image_column(columns)
        if image is not None:
            as_paths = _is_text(schema.field(columns[image]).type)
            paths = as_paths if paths is None else paths
            if paths != as_paths:
                raise ConfigError(f"column {columns[image]!r} holds paths in some Parquet files and bytes in others "
                                  f"(e.g. {path!r}): give one kind")  # fmt: skip
        if "cls" in columns:
            check_label_type(path, columns["cls"], schema.field(columns["cls"]).type)
        blocks += [Block(path, g, meta.metadata.row_group(g).num_rows) for g in range(meta.metadata.num_row_groups)]
    return ParquetInput(tuple(files), tuple(blocks), tuple(columns.items()), bool(paths), config)


def _image_column(columns: Dict[str, str]) -> Optional[str]:
    return next((e for e in columns if "." + e.lower() in IMAGE_EXTENSIONS), None)


def _is_text(kind: Any) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_string(kind) or pa.types.is_large_string(kind))


def check_label_type(where: str, column: str, kind: Any) -> None:
    """A ConfigError unless the label column holds integers."""
    import pyarrow as pa

    if not pa.types.is_integer(kind):
        raise ConfigError(f"Parquet file {where!r}: label column {column!r} holds {kind}, not integers; "
                          "labels (.cls) must be integer class indices")  # fmt: skip


def read_block(block: Block, columns: Sequence[Tuple[str, str]], storage: StorageOptions) -> List[Dict[str, Any]]:
    """The rows of one row group as {extension: value} (``columns``: (extension, column))."""
    names = list(dict.fromkeys(c for _, c in columns))
    try:
        table = open_parquet(block.file, storage).read_row_group(block.group, columns=names)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read row group {block.group} of Parquet file {block.file!r}: {exc}") from None
    return rows_of(table.to_pydict(), columns, block.file)


def rows_of(values: Dict[str, list], columns: Sequence[Tuple[str, str]], where: str) -> List[Dict[str, Any]]:
    """Rows of a table's columns (``to_pydict()``) as {extension: value}, a Hugging Face image
    (``{"bytes": ..., "path": ...}``) as its bytes; a ConfigError for a missing value."""
    n = len(next(iter(values.values()))) if values else 0
    rows: List[Dict[str, Any]] = [{} for _ in range(n)]
    for ext, column in columns:
        for row, value in zip(rows, values[column]):
            if isinstance(value, dict) and "bytes" in value and "path" in value and ext != "json":
                value = value["bytes"] if value["bytes"] is not None else value["path"]
            if value is None:
                raise ConfigError(f"{where}: column {column!r} ({ext}) has an empty value (null); every sample needs one")
            row[ext] = value
    return rows


def members_of(row: Dict[str, Any], key: str) -> Dict[str, bytes]:
    """A row's members (extension -> bytes), values encoded as ``ShardWriter`` encodes them."""
    return {ext: encode(ext, value, key) for ext, value in row.items() if ext != KEY}


def join_path(base_file: str, path: str) -> str:
    """A path from a Parquet row, taken from the Parquet file's folder when relative."""
    if "://" in path or path.startswith("/"):
        return path
    return posixpath.join(posixpath.dirname(base_file), path)


def read_rows(data: ParquetInput) -> List[Tuple[str, List[Dict[str, Any]]]]:
    """Every row of every file (for a Parquet of paths, read on the driver): (file, rows)."""
    names = list(dict.fromkeys(c for _, c in data.columns))
    out = []
    for path in data.files:
        try:
            table = open_parquet(path, data.storage).read(columns=names)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read Parquet file {path!r}: {exc}") from None
        out.append((path, rows_of(table.to_pydict(), data.columns, path)))
    return out


@dataclass(frozen=True)
class ParquetReader:
    """Reads a Parquet input's row groups in a task: what every task is sent, so it holds the
    columns and storage options only, never the input's list of row groups."""

    columns: Tuple[Tuple[str, str], ...]
    storage: StorageOptions = DEFAULT_STORAGE

    def read(self, block: Block) -> List[Dict[str, Any]]:
        return read_block(block, self.columns, self.storage)
