"""The sample table: where each sample of each shard begins and its key's fingerprint, in one
binary file beside a version-3 manifest, read one shard's record at a time by the worker that reads
that shard (a positioned read locally, one ranged request remotely). The manifest itself keeps only
per-shard entries, so the process that starts a rank never loads per-sample data.

Layout: for each shard in the manifest's order, a record of ``samples + 1`` little-endian int64
offsets (where each sample's headers begin, then where the last one ends; all -1 for a compressed
shard, whose spans are not known) followed by ``samples`` little-endian uint32 key fingerprints,
padded with zeros to a multiple of 8 bytes. A record's place follows from the counts of the shards
before it. Each record is checked when loaded (offsets that start at 0, grow by whole 512-byte
blocks and end within the shard), a damaged one a ``ShardFormatError`` naming the shard.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from dali_shards.errors import ConfigError, ShardAccessError, ShardFormatError
from dali_shards.io.filesystems import DEFAULT_STORAGE, filesystem, is_remote
from dali_shards.io.ranged import RangeReader
from dali_shards.io.storage import local_path
from dali_shards.options import StorageOptions

BLOCK = 512
TABLE_SUFFIX = ".samples"
CACHE_BYTES = 64 << 20  # records a worker keeps loaded (least recently used dropped first)


def record_bytes(samples: np.ndarray | int) -> np.ndarray | int:
    """Bytes of the record of a shard of ``samples`` samples."""
    return 8 * (samples + 1) + 8 * ((samples + 1) // 2)


def record_starts(counts: Sequence[int] | np.ndarray) -> np.ndarray:
    """Where each shard's record begins (``len(counts) + 1`` offsets: the last is the table's size)."""
    sizes = record_bytes(np.asarray(counts, dtype=np.int64))
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def encode(samples: int, offsets: Optional[np.ndarray], key_crc: Optional[np.ndarray]) -> bytes:
    """One shard's record."""
    offs = np.full(samples + 1, -1, "<i8") if offsets is None else np.asarray(offsets, "<i8")
    crc = np.zeros(samples, "<u4") if key_crc is None else np.asarray(key_crc, "<u4")
    body = offs.tobytes() + crc.tobytes()
    return body + bytes(int(record_bytes(samples)) - len(body))


def write_table(path: str, records: Iterable[bytes], config: StorageOptions = DEFAULT_STORAGE) -> None:
    """Write the sample table (a local path or a URL), whole or not at all, record by record."""
    remote = is_remote(path)
    tmp = f"{tempfile.mkdtemp(prefix='dali-shards-')}/table" if remote else f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            for record in records:
                f.write(record)
        if remote:  # one upload, there once complete
            fs, inner = filesystem(path, config)
            fs.put_file(tmp, inner)
        else:
            os.replace(tmp, path)
    finally:
        if remote:
            shutil.rmtree(os.path.dirname(tmp), ignore_errors=True)
        elif os.path.exists(tmp):  # a failed write leaves nothing
            os.remove(tmp)


def decode(url: str, raw: bytes, samples: int, size: Optional[int]) -> Tuple[Optional[np.ndarray], np.ndarray]:
    """(offsets or None for a compressed shard, key fingerprints) of shard ``url``'s record, checked."""
    if len(raw) != record_bytes(samples):
        raise _damaged(url, f"its record holds {len(raw)} bytes, not {record_bytes(samples)}")
    offsets = np.frombuffer(raw, "<i8", samples + 1).astype(np.int64)
    crc = np.frombuffer(raw, "<u4", samples, 8 * (samples + 1)).astype(np.uint32)
    crc.setflags(write=False)
    if (offsets == -1).all():
        return None, crc
    if offsets[0] != 0:
        raise ShardFormatError(
            url, "its record in the manifest's sample table does not begin where the sample counts of the manifest's "
            "entries put it: this entry's count, or one before it, was changed after the table was written (or the "
            "table is damaged)", hint="run `dali-shards index` on the shards again to rewrite the manifest and its table",
        )  # fmt: skip
    steps = np.diff(offsets)
    if (steps < BLOCK).any() or (offsets % BLOCK).any() or (size is not None and offsets[-1] + BLOCK > size):
        raise _damaged(url, "its sample offsets do not fit the shard")
    offsets.setflags(write=False)
    return offsets, crc


def _damaged(url: str, why: str) -> ShardFormatError:
    return ShardFormatError(url, f"the manifest's sample table is damaged for this shard: {why}",
                            hint="run `dali-shards index` on the shards again to rewrite the manifest and its table")  # fmt: skip


@dataclass
class SampleTables:
    """The sample tables of a pipeline's shards, read where needed: per shard (in the pipeline's
    order) the table it is in (an index into ``urls``, -1 for none) and where its record begins;
    and the records loaded so far in this process (at most ``CACHE_BYTES``). Picklable: a worker
    carries it and loads only the records of the shards it reads."""

    urls: Tuple[str, ...] = ()
    table: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    at: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    spans: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    keys: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    storage: StorageOptions = field(default_factory=StorageOptions)
    _loaded: "OrderedDict[int, Tuple[Optional[np.ndarray], np.ndarray]]" = field(default_factory=OrderedDict, repr=False)
    _bytes: int = 0

    source: Any = field(default=None, repr=False)  # the catalog these are columns of (a mapped one travels as its path)

    @classmethod
    def of(cls, shards: Sequence[Any], storage: StorageOptions) -> "SampleTables":
        """The tables of ``shards``: a ``Catalog`` (its columns), or ``ShardInfo``s (``table`` and
        ``table_at`` where in one)."""
        if hasattr(shards, "columns"):
            cols = shards.columns
            mapped = shards if getattr(shards, "path", None) is not None else None
            tables = tuple(shards.tables)  # type: ignore[attr-defined]
            return cls(tables, cols["table"], cols["table_at"], cols["spans"], cols["keys"], storage, source=mapped)
        urls: Dict[str, int] = {}
        table = np.full(len(shards), -1, np.int32)
        at = np.zeros(len(shards), np.int64)
        spans, keys = np.zeros(len(shards), bool), np.zeros(len(shards), bool)
        for i, s in enumerate(shards):
            if s.table is not None:
                table[i] = urls.setdefault(s.table, len(urls))
                at[i], spans[i], keys[i] = s.table_at, s.table_spans, s.table_keys
        return cls(tuple(urls), table, at, spans, keys, storage)

    def __getstate__(self) -> Dict[str, Any]:
        state = {**self.__dict__, "_loaded": OrderedDict(), "_bytes": 0}  # a worker loads its own
        if self.source is not None:  # a mapped catalog's columns: mapped again there
            state.update(table=None, at=None, spans=None, keys=None)
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self.table is None:
            cols = self.source.columns
            self.table, self.at, self.spans, self.keys = cols["table"], cols["table_at"], cols["spans"], cols["keys"]

    def has(self, shard: int) -> bool:
        return bool(len(self.table)) and self.table[shard] >= 0

    def load(self, shard: int, url: str, samples: int, size: Optional[int]) -> Tuple[Optional[np.ndarray], np.ndarray]:
        """Shard ``shard``'s (offsets, key fingerprints) from its table (read once, then kept)."""
        if shard in self._loaded:
            self._loaded.move_to_end(shard)
            return self._loaded[shard]
        raw = self._raw(shard, url, samples)
        got = decode(url, raw, samples, size)
        self._keep(shard, got, len(raw))
        return got


    def prefetch(self, shards: Sequence[int], urls: Sequence[str], counts: Sequence[int], sizes: Sequence[Optional[int]]) -> None:
        """Load the records of ``shards`` not loaded yet, concurrently (remote tables: one request
        each, 8 at a time)."""
        wanted = [s for s in shards if self.has(s) and s not in self._loaded]
        if len(wanted) < 2:
            return
        with ThreadPoolExecutor(max_workers=min(8, len(wanted))) as pool:
            raws = list(pool.map(lambda s: self._raw(s, urls[s], counts[s]), wanted))
        for s, raw in zip(wanted, raws):
            self._keep(s, decode(urls[s], raw, counts[s], sizes[s]), len(raw))

    def _raw(self, shard: int, url: str, samples: int) -> bytes:
        table, at = self.urls[int(self.table[shard])], int(self.at[shard])
        return read_range(table, at, at + int(record_bytes(samples)), self.storage, url)

    def _keep(self, shard: int, got: Tuple[Optional[np.ndarray], np.ndarray], size: int) -> None:
        self._loaded[shard] = got
        self._bytes += size
        while self._bytes > CACHE_BYTES and len(self._loaded) > 1:
            _, (offs, crc) = self._loaded.popitem(last=False)
            self._bytes -= (0 if offs is None else offs.nbytes) + crc.nbytes


def read_range(table: str, lo: int, hi: int, config: StorageOptions, shard: str) -> bytes:
    """Bytes ``[lo, hi)`` of a sample table; a ShardAccessError naming the shard whose record it is."""
    try:
        if not is_remote(table):
            path = local_path(table)
            assert path is not None  # not remote: local
            with open(path, "rb") as f:
                return os.pread(f.fileno(), hi - lo, lo)
        reader = RangeReader(table, config)
        try:
            return reader.read(lo, hi)
        finally:
            reader.close()
    except (OSError, ShardAccessError) as exc:
        raise ShardAccessError(shard, f"its sample table {table!r} cannot be read: {exc}",
                               hint="check that the manifest's .samples file sits beside it") from None  # fmt: skip


def check_tables(shards: Any, config: StorageOptions = DEFAULT_STORAGE) -> None:
    """A ConfigError unless every sample table ``shards`` (a ``Catalog``, or ``ShardInfo``s) point
    at holds their records: its size, from the file system or one request (records are checked again
    as workers read them)."""
    ends: Dict[str, int] = {}
    if hasattr(shards, "columns"):  # a catalog: its columns at once
        cols = shards.columns
        tabled = np.flatnonzero(cols["table"] >= 0)
        stops = cols["table_at"][tabled] + record_bytes(cols["samples"][tabled])
        for t in np.unique(cols["table"][tabled]).tolist():
            ends[shards.tables[t]] = int(stops[cols["table"][tabled] == t].max())
    else:
        for s in shards:
            if s.table is not None:
                ends[s.table] = max(ends.get(s.table, 0), s.table_at + int(record_bytes(s.samples)))
    for table, end in ends.items():
        size = _size(table, config)
        if size is not None and size >= end:
            continue
        what = "is missing" if size is None else f"holds {size} bytes, fewer than the {end} its shards' counts make"
        raise ConfigError(f"the sample table {table!r} of a manifest {what}: upload it beside its manifest, or run "
                          "`dali-shards index` on the shards again to rewrite the manifest and its table")  # fmt: skip


def check_table_counts(manifest: str, table: str, counts: Sequence[int], urls: Sequence[str],
                       config: StorageOptions = DEFAULT_STORAGE, end: Optional[int] = None) -> None:  # fmt: skip
    """A ConfigError if the local sample table of ``manifest`` holds more than the records the
    counts of its entries make (``end``, where known), or records out of the places those counts
    give them (a count changed after the table was written), naming the first entry at fault. A
    remote table is checked as workers read its records (``decode``); one missing or short, by
    ``check_tables``."""
    if is_remote(table):
        return
    size = _size(table, config)
    if size is None or size == end:
        return
    starts = record_starts(counts)
    if size == starts[-1]:
        return
    entry = _misplaced(table, starts, size)
    if entry is not None:
        raise ConfigError(
            f"manifest {manifest!r}: entry {entry} ({urls[entry]!r}) counts {counts[entry]} samples, not the samples "
            f"of its record in the sample table {table!r} (the records after it are not where its count puts them): "
            "the manifest was changed after its table was written; run `dali-shards index` on the shards again"
        )
    if size > starts[-1]:
        raise ConfigError(
            f"manifest {manifest!r}: its entries' sample counts make {starts[-1]} bytes of sample table, but {table!r} "
            f"holds {size}: its last entry counts fewer samples than its record, or entries were removed from its end "
            "after the table was written; run `dali-shards index` on the shards again"
        )


def _misplaced(table: str, starts: np.ndarray, size: int) -> Optional[int]:
    """The entry after which records stop beginning where the counts put them (a record begins
    with 0, or -1 for a compressed shard), if one does; records a short table does not reach are
    left to ``check_tables`` (a truncated table, said as such)."""
    path = local_path(table)
    if path is None or size < 8:
        return None
    heads = np.memmap(path, "<i8", mode="r", shape=(size // 8,))
    at = starts[1:-1] // 8
    first = np.zeros(len(at), np.int64)
    inside = at < len(heads)
    first[inside] = heads[at[inside]]
    off = np.flatnonzero((first != 0) & (first != -1))
    return int(off[0]) if len(off) else None


def _size(table: str, config: StorageOptions) -> Optional[int]:
    """A table's size in bytes (None: not there)."""
    if not is_remote(table):
        path = local_path(table)
        return os.path.getsize(path) if path is not None and os.path.isfile(path) else None
    reader = RangeReader(table, config)
    try:
        return reader.metadata_size() if reader.http else reader.object_size()
    except (ShardAccessError, OSError):
        return None
    finally:
        reader.close()


def table_path(manifest: str) -> str:
    """Where a manifest's sample table goes: beside it, named after it."""
    stem = manifest[: -len(".json")] if manifest.endswith(".json") else manifest
    return stem + TABLE_SUFFIX


def records_of(shards: Sequence[Any], config: StorageOptions = DEFAULT_STORAGE) -> List[bytes]:
    """The records of ``shards`` (``ShardInfo``s): from their offsets and key fingerprints in
    memory, or as they are in the table they come from."""
    out = []
    for s in shards:
        if s.offsets is None and s.key_crc is None and s.table is not None:
            out.append(read_range(s.table, s.table_at, s.table_at + int(record_bytes(s.samples)), config, s.url))
        else:
            out.append(encode(s.samples, s.offsets, s.key_crc))
    return out
