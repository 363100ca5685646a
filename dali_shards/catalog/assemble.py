"""Catalogs put together: from ``ShardInfo``s (scans, lists, tools), from the parsed fields of a
manifest's entries, and several catalogs one after the other (a source's items, a mix's streams);
one shard replaced (a shard counted again)."""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from dali_shards.catalog.columns import COLUMNS, Catalog, Inline
from dali_shards.catalog.shardinfo import ShardInfo
from dali_shards.catalog.strings import StringTable


def ext_matrix(dicts: Sequence[Optional[Mapping[str, int]]]) -> Tuple[Tuple[str, ...], np.ndarray, np.ndarray]:
    """(extensions, per-shard bytes per extension with -1 for none, whether a shard's are known)."""
    exts = tuple(sorted({e for d in dicts if d for e in d}))
    where = {e: k for k, e in enumerate(exts)}
    matrix = np.full((len(dicts), len(exts)), -1, np.int64)
    known = np.zeros(len(dicts), bool)
    for i, d in enumerate(dicts):
        if d is None:
            continue
        known[i] = True
        for e, v in d.items():
            matrix[i, where[e]] = v
    return exts, matrix, known


def from_fields(names: StringTable, prefix: np.ndarray, prefixes: Tuple[str, ...], samples: np.ndarray,
                sizes: np.ndarray, exts: Tuple[str, ...], ext_bytes: np.ndarray, has_ext: np.ndarray,
                tables: Tuple[str, ...] = (), table: Optional[np.ndarray] = None, table_at: Optional[np.ndarray] = None,
                spans: Optional[np.ndarray] = None, keys: Optional[np.ndarray] = None,
                inline: Optional[Mapping[int, Inline]] = None,
                damage: Optional[Mapping[int, Tuple[str, int]]] = None) -> Catalog:  # fmt: skip
    """A catalog of these columns (absent table columns: no shard in a sample table)."""
    n = len(samples)
    columns: Dict[str, np.ndarray] = {
        "samples": np.asarray(samples, np.int64), "bytes": np.asarray(sizes, np.int64),
        "prefix": np.asarray(prefix, np.int32), "names_data": names.data, "names_ends": names.ends,
        "ext_bytes": np.asarray(ext_bytes, np.int64).reshape(n, len(exts)), "has_ext": np.asarray(has_ext, bool),
        "table": np.full(n, -1, np.int32) if table is None else np.asarray(table, np.int32),
        "table_at": np.zeros(n, np.int64) if table_at is None else np.asarray(table_at, np.int64),
        "spans": np.zeros(n, bool) if spans is None else np.asarray(spans, bool),
        "keys": np.zeros(n, bool) if keys is None else np.asarray(keys, bool),
    }  # fmt: skip
    return Catalog(columns, prefixes, exts, tables, dict(inline or {}), dict(damage or {}))


def from_infos(infos: Sequence[ShardInfo]) -> Catalog:
    """The catalog of ``infos``, in their order."""
    exts, matrix, known = ext_matrix([s.ext_bytes for s in infos])
    tables: Dict[str, int] = {}
    table = np.array([-1 if s.table is None else tables.setdefault(s.table, len(tables)) for s in infos], np.int32)
    inline = {i: (s.offsets, s.key_crc) for i, s in enumerate(infos) if s.offsets is not None or s.key_crc is not None}
    damage = {i: (s.damage, s.lost) for i, s in enumerate(infos) if s.damage}
    return from_fields(
        StringTable.of(s.url for s in infos), np.zeros(len(infos), np.int32), ("",),
        np.array([s.samples for s in infos], np.int64), np.array([-1 if s.bytes is None else s.bytes for s in infos], np.int64),
        exts, matrix, known, tuple(tables), table, np.array([s.table_at for s in infos], np.int64),
        np.array([s.table_spans for s in infos], bool), np.array([s.table_keys for s in infos], bool), inline, damage,
    )  # fmt: skip


def as_catalog(shards: Sequence[ShardInfo]) -> Catalog:
    """``shards`` as a catalog (a catalog: itself)."""
    return shards if isinstance(shards, Catalog) else from_infos(list(shards))


def concat(catalogs: Sequence[Catalog]) -> Catalog:
    """``catalogs`` one after the other (one catalog: itself, its mapped arrays kept)."""
    if len(catalogs) == 1:
        return catalogs[0]
    if not catalogs:
        return from_infos([])
    prefixes: Dict[str, int] = {}
    tables: Dict[str, int] = {}
    exts = tuple(sorted({e for c in catalogs for e in c.exts}))
    parts: Dict[str, List[np.ndarray]] = {name: [] for name in COLUMNS if not name.startswith("names")}
    inline: Dict[int, Inline] = {}
    damage: Dict[int, Tuple[str, int]] = {}
    at = 0
    for c in catalogs:
        remap = np.array([prefixes.setdefault(p, len(prefixes)) for p in c.prefixes], np.int32)
        table_map = np.array([tables.setdefault(t, len(tables)) for t in c.tables] + [-1], np.int32)
        wide = np.full((len(c), len(exts)), -1, np.int64)
        for k, e in enumerate(c.exts):
            wide[:, exts.index(e)] = c.ext_bytes[:, k]
        cols = c.columns
        for name, value in (("samples", cols["samples"]), ("bytes", cols["bytes"]), ("prefix", remap[cols["prefix"]]),
                            ("ext_bytes", wide), ("has_ext", cols["has_ext"]), ("table", table_map[cols["table"]]),
                            ("table_at", cols["table_at"]), ("spans", cols["spans"]), ("keys", cols["keys"])):  # fmt: skip
            parts[name].append(value)
        inline.update({at + i: v for i, v in c.inline.items()})
        damage.update({at + i: v for i, v in c.damage.items()})
        at += len(c)
    joined = {name: np.concatenate(values) for name, values in parts.items()}
    names = StringTable.concat([c.names for c in catalogs])
    joined["ext_bytes"] = joined["ext_bytes"].reshape(at, len(exts))
    return Catalog({**joined, "names_data": names.data, "names_ends": names.ends}, tuple(prefixes), exts, tuple(tables),
                   inline, damage)  # fmt: skip


def replaced(catalog: Catalog, changes: Mapping[int, ShardInfo]) -> Catalog:
    """``catalog`` with shards ``changes`` replaced (few: each a catalog of its own, joined)."""
    if not changes:
        return catalog
    pieces: List[Catalog] = []
    start = 0
    for i in sorted(changes):
        if i > start:
            pieces.append(sliced(catalog, start, i))
        pieces.append(from_infos([changes[i]]))
        start = i + 1
    if start < len(catalog):
        pieces.append(sliced(catalog, start, len(catalog)))
    return concat(pieces)


def sliced(catalog: Catalog, lo: int, hi: int) -> Catalog:
    """Shards ``lo`` to ``hi`` of ``catalog`` (views of its arrays)."""
    cols = catalog.columns
    ends = cols["names_ends"][lo : hi + 1]
    names = StringTable(cols["names_data"][ends[0] : ends[-1]], ends - ends[0])
    out = {name: cols[name][lo:hi] for name in COLUMNS if not name.startswith("names")}
    inline = {i - lo: v for i, v in catalog.inline.items() if lo <= i < hi}
    damage = {i - lo: v for i, v in catalog.damage.items() if lo <= i < hi}
    return Catalog({**out, "names_data": names.data, "names_ends": names.ends}, catalog.prefixes, catalog.exts,
                   catalog.tables, inline, damage)  # fmt: skip
