"""A Ray Dataset as the input of a write job (``engine="ray"`` only): its rows, in the Dataset's
order, cut into blocks of a fixed number of rows whatever Ray's own blocks are, each read by the
task that writes it straight from the object store (nothing passes through the driver)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Dict, List, Sequence, Tuple

from dali_shards.errors import ConfigError
from dali_shards.tools.parquet import check_label_type, rows_of

BLOCK_ROWS = 1000  # rows per block: the unit a window is made of


@dataclass(frozen=True)
class Piece:
    """Rows ``lo:hi`` of one of the Dataset's Arrow tables (its object reference)."""

    ref: Any
    lo: int
    hi: int


@dataclass(frozen=True)
class RayReader:
    """Reads a block (a tuple of pieces) in a task: the rows of its columns."""

    columns: Tuple[Tuple[str, str], ...]

    def read(self, block: Tuple[Piece, ...]) -> List[Dict[str, Any]]:
        import ray

        rows: List[Dict[str, Any]] = []
        for piece in block:
            table = ray.get(piece.ref).slice(piece.lo, piece.hi - piece.lo)
            rows += rows_of(table.to_pydict(), self.columns, "the Ray Dataset")
        return rows


def _num_rows(table: Any) -> Tuple[int, Any]:
    return table.num_rows, table.schema


def _materialized(ds: Any) -> List[Any]:
    """The Dataset's tables (object references), in its order; Ray Data's own progress bars and
    logs of its execution held back (the job's one progress line counts its samples)."""
    context = ds.context  # the Dataset's own (copied from the current one when it was made)
    kept = context.execution_options.preserve_order, context.enable_progress_bars
    context.execution_options.preserve_order, context.enable_progress_bars = True, False
    logger = logging.getLogger("ray.data")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        return list(ds.materialize().to_arrow_refs())
    finally:
        context.execution_options.preserve_order, context.enable_progress_bars = kept
        logger.setLevel(level)


def ray_dataset_blocks(ds: Any, columns: Dict[str, str]) -> Tuple["RayReader", List[Tuple[Piece, ...]], List[int]]:
    """The reader, blocks and row counts of a Ray Dataset (materialized in order), its columns checked."""
    import ray

    refs = _materialized(ds)
    counted = ray.get([ray.remote(_num_rows).remote(ref) for ref in refs])
    names = [n for _, schema in counted for n in schema.names]
    for ext, column in columns.items():
        if column not in names and any(n for n, _ in counted):
            raise ConfigError(f"the Ray Dataset has no column {column!r} (for {ext}={column}); its columns: "
                              f"{', '.join(dict.fromkeys(names))}")  # fmt: skip
    for (n, schema) in counted:
        if n and "cls" in columns:
            check_label_type("the Ray Dataset", columns["cls"], schema.field(columns["cls"]).type)
    blocks = cut(refs, [n for n, _ in counted], BLOCK_ROWS)
    return RayReader(tuple(columns.items())), blocks, [sum(p.hi - p.lo for p in b) for b in blocks]


def cut(refs: Sequence[Any], counts: Sequence[int], size: int) -> List[Tuple[Piece, ...]]:
    """The rows of tables ``refs`` (``counts`` rows each), laid end to end, in blocks of ``size``."""
    blocks: List[Tuple[Piece, ...]] = []
    current: List[Piece] = []
    room = size
    for ref, count in zip(refs, counts):
        lo = 0
        while lo < count:
            take = min(room, count - lo)
            current.append(Piece(ref, lo, lo + take))
            lo, room = lo + take, room - take
            if room == 0:
                blocks.append(tuple(current))
                current, room = [], size
    if current:
        blocks.append(tuple(current))
    return blocks
