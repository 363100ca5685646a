"""The catalog in columns: what is known of every shard of a pipeline as a few NumPy arrays (counts,
sizes, member bytes per extension, sample-table places) and one string table of names, built once
from the manifests and scans. A million shards take some 40 bytes each and no Python object; the
planner and the workers take the arrays, and one shard's ``ShardInfo`` is made only when asked for.

A catalog read from a column file (a node's shared copy: ``catalog.shared``) keeps its arrays as
views of the mapped file, shared by every process of the node that maps it, and pickles as the
file's path: a worker maps the same pages instead of receiving a copy.

Columns (per shard): ``samples`` (int64; -1: not counted, the streaming mode), ``bytes`` (int64;
-1: unknown), ``prefix`` (int32 index into ``prefixes``) and ``names`` (a shard's URL is its prefix
and its name), ``ext_bytes`` (int64, one column per extension of ``exts``; -1: no such member) with
``has_ext`` (whether its member bytes are known at all), ``table`` (int32 index into ``tables``, -1:
no sample table), ``table_at``, ``spans`` and ``keys`` (its record's place, and whether the record
holds offsets and key fingerprints). Per-sample arrays kept in memory (scans, version-2 manifests)
and a damaged shard's ``damage`` are kept by shard index, for the few shards that have them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, overload

import numpy as np

from dali_shards.catalog.colfile import map_columns
from dali_shards.catalog.shardinfo import ShardInfo
from dali_shards.catalog.strings import StringTable

CHUNK = 65536  # URLs made at once when all are read
Inline = Tuple[Optional[np.ndarray], Optional[np.ndarray]]  # (offsets, key fingerprints) in memory
COLUMNS = ("samples", "bytes", "prefix", "names_data", "names_ends", "ext_bytes", "has_ext", "table", "table_at",
           "spans", "keys")  # fmt: skip


@dataclass(frozen=True, eq=False)
class Catalog(Sequence[ShardInfo]):
    """Every shard of a pipeline, in columns (see the module); a sequence of ``ShardInfo`` views."""

    columns: Mapping[str, np.ndarray]
    prefixes: Tuple[str, ...] = ("",)
    exts: Tuple[str, ...] = ()
    tables: Tuple[str, ...] = ()
    inline: Mapping[int, Inline] = field(default_factory=dict)
    damage: Mapping[int, Tuple[str, int]] = field(default_factory=dict)  # shard -> (why, samples known lost)
    path: Optional[str] = None  # the column file it is mapped from (pickled as that)

    # -- columns ---------------------------------------------------------------------
    @property
    def samples(self) -> np.ndarray:
        return self.columns["samples"]

    @property
    def sizes(self) -> np.ndarray:
        """Each shard's stored size in bytes (-1: unknown)."""
        return self.columns["bytes"]

    @cached_property
    def names(self) -> StringTable:
        return StringTable(self.columns["names_data"], self.columns["names_ends"])

    @property
    def ext_bytes(self) -> np.ndarray:
        return self.columns["ext_bytes"]

    @property
    def has_ext(self) -> np.ndarray:
        return self.columns["has_ext"]

    @cached_property
    def member_bytes(self) -> np.ndarray:
        """Each shard's member bytes, all extensions (0 where not known)."""
        return np.where(self.ext_bytes >= 0, self.ext_bytes, 0).sum(axis=1, dtype=np.int64)

    def url(self, i: int) -> str:
        return self.prefixes[int(self.columns["prefix"][i])] + self.names[i]

    @property
    def urls(self) -> "Urls":
        return Urls(self)

    @property
    def byte_sizes(self) -> "Sizes":
        return Sizes(self)

    @property
    def offsets(self) -> "InlineColumn":
        return InlineColumn(self, 0)

    @property
    def key_crc(self) -> "InlineColumn":
        return InlineColumn(self, 1)

    def has_spans(self) -> np.ndarray:
        """Per shard, whether where each sample begins is known (inline, or in its sample table)."""
        known = (self.columns["table"] >= 0) & self.columns["spans"]
        for i, (offsets, _) in self.inline.items():
            known[i] = known[i] or offsets is not None
        return known

    def ext_present(self, exts: Sequence[str]) -> np.ndarray:
        """Per shard, whether its known member bytes include one of ``exts``."""
        cols = [self.exts.index(e) for e in exts if e in self.exts]
        if not cols:
            return np.zeros(len(self), bool)
        return (self.ext_bytes[:, cols] >= 0).any(axis=1) & self.has_ext

    def ext_total(self, exts: Sequence[str], rows: Optional[np.ndarray] = None) -> int:
        """The member bytes of ``exts`` over all shards (or a mask's ``rows``; absent members count 0)."""
        cols = [self.exts.index(e) for e in exts if e in self.exts]
        if not cols:
            return 0
        chosen = self.ext_bytes[:, cols] if rows is None else self.ext_bytes[rows][:, cols]
        return int(np.where(chosen >= 0, chosen, 0).sum())

    # -- a sequence of ShardInfo ------------------------------------------------------
    def __len__(self) -> int:
        return len(self.columns["samples"])

    @overload
    def __getitem__(self, i: int) -> ShardInfo: ...
    @overload
    def __getitem__(self, i: slice) -> List[ShardInfo]: ...
    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self.info(k) for k in range(*i.indices(len(self)))]
        i = int(i)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"shard {i} of {len(self)}")
        return self.info(i)

    def __iter__(self) -> Iterator[ShardInfo]:
        return (self.info(i) for i in range(len(self)))

    def info(self, i: int) -> ShardInfo:
        """Shard ``i`` as a ``ShardInfo``."""
        c = self.columns
        size = int(c["bytes"][i])
        ext = None
        if c["has_ext"][i]:
            ext = {e: int(v) for e, v in zip(self.exts, c["ext_bytes"][i].tolist()) if v >= 0}
        offsets, keys = self.inline.get(i, (None, None))
        why, lost = self.damage.get(i, (None, 0))
        table = int(c["table"][i])
        return ShardInfo(self.url(i), int(c["samples"][i]), None if size < 0 else size, ext, offsets, keys, why, lost,
                         None if table < 0 else self.tables[table], int(c["table_at"][i]), bool(c["spans"][i]),
                         bool(c["keys"][i]))  # fmt: skip

    # -- pickling: a mapped catalog travels as its path ---------------------------------
    def __reduce__(self) -> Any:
        if self.path is not None:
            try:
                os.utime(self.path)  # in use: kept by the folder's clean-up of unused copies
            except OSError:
                pass
            return (mapped_catalog, (self.path,))
        return (Catalog, (dict(self.columns), self.prefixes, self.exts, self.tables, dict(self.inline), dict(self.damage)))

    def meta(self) -> Dict[str, Any]:
        """What a column file keeps beside the arrays."""
        return {"prefixes": list(self.prefixes), "exts": list(self.exts), "tables": list(self.tables)}


def mapped_catalog(path: str) -> Catalog:
    """The catalog in the column file at ``path``, mapped (its arrays shared with every process
    that maps it)."""
    arrays, meta = map_columns(path)
    return Catalog(arrays, tuple(meta["prefixes"]), tuple(meta["exts"]), tuple(meta["tables"]), path=path)


class _Column(Sequence[Any]):
    """A per-shard view of a catalog, equal to the tuple of its items (one item made per index asked)."""

    def __init__(self, catalog: Catalog):
        self.catalog = catalog

    def __len__(self) -> int:
        return len(self.catalog)

    def item(self, i: int) -> Any:
        raise NotImplementedError

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self.item(k) for k in range(*i.indices(len(self)))]
        i = int(i)
        if not -len(self) <= i < len(self):
            raise IndexError(f"shard {i} of {len(self)}")
        return self.item(i % len(self))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _Column):
            return type(other) is type(self) and tuple(other) == tuple(self)
        if isinstance(other, (tuple, list)):
            return len(other) == len(self) and tuple(other) == tuple(self)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))


class Urls(_Column):
    """A catalog's shard URLs."""

    def item(self, i: int) -> str:
        return self.catalog.url(i)

    def __iter__(self) -> Iterator[str]:
        prefix, prefixes = self.catalog.columns["prefix"], self.catalog.prefixes
        for lo in range(0, len(self), CHUNK):
            names = self.catalog.names.slice(lo, lo + CHUNK)
            yield from (prefixes[p] + n for p, n in zip(prefix[lo : lo + CHUNK].tolist(), names))

    def common_prefix(self) -> str:
        """The longest prefix every URL shares."""
        cat = self.catalog
        used = np.unique(cat.columns["prefix"]) if len(cat) else np.zeros(0, np.int64)
        if len(used) != 1:
            return os.path.commonprefix(list(self))
        names = cat.names
        lengths = names.lengths()
        shared = 0
        starts = names.ends[:-1]
        while shared < int(lengths.min()) and (names.data[starts + shared] == names.data[starts[0] + shared]).all():
            shared += 1
        head = names.data[starts[0] : starts[0] + shared].tobytes().decode("utf-8", "surrogateescape")
        return cat.prefixes[int(used[0])] + head  # (a character cut in two lies after the last "/")


class Sizes(_Column):
    """A catalog's shard sizes, each an ``int`` or None (unknown)."""

    def item(self, i: int) -> Optional[int]:
        size = int(self.catalog.sizes[i])
        return None if size < 0 else size

    def __iter__(self) -> Iterator[Optional[int]]:
        return (None if s < 0 else s for s in self.catalog.sizes.tolist())


class InlineColumn(_Column):
    """Per shard, its offsets (``which=0``) or key fingerprints (1) where held in memory, else None."""

    def __init__(self, catalog: Catalog, which: int):
        super().__init__(catalog)
        self.which = which

    def item(self, i: int) -> Optional[np.ndarray]:
        got = self.catalog.inline.get(i)
        return None if got is None else got[self.which]
