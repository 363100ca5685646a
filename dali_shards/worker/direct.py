"""The ring's fast path: a step's samples read straight into the slot, located and checked with
NumPy a step at a time, no Python object per sample or member.

For the common case -- planned epochs, no ``map``/``decoders``/``bucket_by``, byte, integer, key,
index and valid fields, local shards whose sample offsets are known, mini-batches of at least
``MIN_DIRECT`` samples -- a worker writes each step's table into its slot itself: header rows,
then each sample's span as it lies in the shard (one ``preadv`` per sample from the page cache
into shared memory: the only copy), its members found by ``tar/blocks.py``, the rows pointing
at the members' bytes (a key at its header's name). Integers are parsed, keys checked against the
index's fingerprints and images checked per sample, in place. Anything out of the ordinary in a
step (an irregular member, a bad or missing field, a damaged image, a stale index, a read error)
makes the whole step go the general way (``Interleaved`` per sample, ``Packing.table_array``),
which raises or skips exactly as it always does. Imports no DALI.
"""

from __future__ import annotations

import zlib
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from dali_shards.errors import ShardFormatError
from dali_shards.io.storage import local_path
from dali_shards.tar.blocks import walk_members
from dali_shards.tar.header import BLOCK
from dali_shards.worker.decoders import decode_int
from dali_shards.worker.imagecheck import IMAGE_EXTENSIONS, images_ok
from dali_shards.shm.packing import INDEX_COLUMN, STATUS_PADDING, STATUS_VALID, VALID_COLUMN, Packed
from dali_shards.shm.packed import table_rows
from dali_shards.worker.pieces import Interleaved
from dali_shards.worker.clock import StepClock
from dali_shards.worker.reader import Skipped
from dali_shards.worker.standin import StandIn
from dali_shards.shm.tables import Grow
from dali_shards.fields import FieldKind
from dali_shards.plan.mode import Planned

MIN_DIRECT = 32  # below this many samples per step the general way costs less
DIRECT_KINDS = frozenset({FieldKind.BYTES, FieldKind.INT, FieldKind.KEY, FieldKind.INDEX, FieldKind.VALID, FieldKind.STREAM})


class NotDirect(Exception):
    """This step goes the general way."""


def direct_fits(config: Any) -> bool:
    """Whether a worker's steps can take the fast path, as far as its options say (the shards
    are checked per epoch)."""
    packing, stage, spec = config.packing, config.stage, config.spec
    return (
        packing.table and packing.payload is None and not stage.user_code and spec.mini_batch >= MIN_DIRECT
        and all(f.kind in DIRECT_KINDS for f in packing.fields) and isinstance(config.mode, Planned)
    )  # fmt: skip


def _aligned(size: int) -> int:
    return (size + BLOCK - 1) // BLOCK * BLOCK


class DirectBatches:
    """One epoch of a worker's steps as ``DirectStep``s (the ring's fast path), stamped in the
    control block and cut short where the main process says, as ``planned.EpochBatches``."""

    def __init__(self, source: Any, epoch: int, plan: Any, emissions: Sequence[Tuple[int, bool]]):
        self.source, self.epoch, self.plan = source, epoch, plan
        self.emissions = list(emissions)
        order = list(dict.fromkeys(pos for pos, _ in self.emissions))
        self.place = {pos: k for k, pos in enumerate(order)}
        reader = source.reader(plan)
        self.reading = reading = Interleaved(plan, order, self.place.__contains__, reader)
        self.good = StandIn(reading.cfg, reread=reading.item)
        cfg = reading.cfg
        offsets = {s: cfg.sample_offsets(s) for s in set(reading.shards)}
        self.spans = np.array([(int(offsets[s][i]), int(offsets[s][i + 1]))  # type: ignore[index]  # positioned: known
                               for s, i in zip(reading.shards, reading.local)], dtype=np.int64).reshape(-1, 2)  # fmt: skip
        self.index = plan.canonical_starts[np.asarray(reading.shards, dtype=np.int64)] + np.asarray(reading.local)
        sizes = np.array([-1 if cfg.byte_sizes[s] is None else cfg.byte_sizes[s] for s in reading.shards], np.int64)
        # spans inside their shards as counted: a bad or stale index takes the general way, which says so
        self.sane = (self.spans[:, 0] <= self.spans[:, 1]) & (self.spans[:, 1] <= sizes)
        self.clock = iter(StepClock(source.stamps, epoch, plan.steps - plan.start_step))

    def __iter__(self) -> "DirectBatches":
        return self

    def __next__(self) -> "DirectStep":
        try:
            step = next(self.clock)
        except StopIteration:
            self.reading.close()
            raise
        m = self.plan.spec.mini_batch
        part = self.emissions[step * m : (step + 1) * m]
        return DirectStep(self, [self.place[p] for p, _ in part], [ok for _, ok in part])


class DirectStep:
    """One step's table, written into a slot by ``write`` (see the module). ``capacity`` bounds what
    the fast path writes; the general way may need more (``Grow``: ask again with a larger slot)."""

    def __init__(self, epoch: DirectBatches, places: Sequence[int], valid: Sequence[bool]):
        self.epoch, self.reading, self.good = epoch, epoch.reading, epoch.good
        self.places, self.valid = list(places), list(valid)
        self.packing = self.reading.cfg.packing
        self.unique = np.array(list(dict.fromkeys(self.places)), dtype=np.int64)  # padding repeats the last sample
        self.rows_bytes = len(self.places) * self.packing.header_bytes
        self.spans = epoch.spans[self.unique]
        lengths = self.spans[:, 1] - self.spans[:, 0]
        self.starts = _aligned(self.rows_bytes) + np.concatenate([[0], np.cumsum(-(-lengths // BLOCK) * BLOCK)[:-1]])
        self.capacity = int(self.starts[-1] + lengths[-1]) if len(lengths) else self.rows_bytes
        self._packed: Optional[List[Packed]] = None

    def __len__(self) -> int:
        return len(self.places)

    def write(self, out: np.ndarray) -> int:
        """Write the table into ``out``; the bytes it takes."""
        if self._packed is None:
            try:
                return self._direct(out)
            except NotDirect:
                self._packed = self._general()
        size = self.packing.table_size(self._packed)
        if size > len(out):
            raise Grow(size)
        self.packing.table_array(self._packed, out=out[:size])
        return size

    # -- the fast path ---------------------------------------------------------------------
    def _direct(self, out: np.ndarray) -> int:
        if not self.epoch.sane[self.unique].all() or self._excluded():
            raise NotDirect()
        if self.capacity > len(out):
            raise Grow(self.capacity)
        self._read(out)
        ends = self.starts + (self.spans[:, 1] - self.spans[:, 0])
        walk = walk_members(out, self.starts, ends)
        if walk.irregular.any():
            raise NotDirect()
        at = {k: u for u, k in enumerate(self.unique.tolist())}
        rows = table_rows(out, len(self.places), self.packing.header_columns)
        fields = self._fields(out, walk, len(self.unique))
        which = np.array([at[k] for k in self.places])
        rows[:, INDEX_COLUMN] = self.epoch.index[self.unique][which]
        rows[:, VALID_COLUMN] = np.where(self.valid, STATUS_VALID, STATUS_PADDING)
        for slot, values in fields:
            rows[:, slot] = values[which]
        self.good.remember(place=int(self.unique[-1]))
        return self.capacity

    def _excluded(self) -> bool:
        """Whether a sample of this step is one DALI failed on (the general way skips it)."""
        excluded = self.reading.cfg.excluded
        return bool(excluded) and any(int(i) in excluded for i in self.epoch.index[self.unique].tolist())

    def _read(self, out: np.ndarray) -> None:
        """Read every sample's span into ``out`` after the rows, each at its (block-aligned) start."""
        reading, cfg = self.reading, self.reading.cfg
        shards = [reading.shards[k] for k in self.unique.tolist()]
        reading.reader.progress(shards[0])
        for s, (lo, hi), at in zip(shards, self.spans.tolist(), self.starts.tolist()):
            url = cfg.urls[s]
            path = local_path(url)
            assert path is not None  # positioned reads are of local shards
            try:
                got = reading.files.read_into(url, path, (lo, hi), cfg.byte_sizes[s], out[at : at + hi - lo])
            except (ShardFormatError, OSError):
                raise NotDirect() from None
            if got != hi - lo:
                raise NotDirect()

    def _fields(self, out: np.ndarray, walk: Any, count: int) -> List[Tuple[int, np.ndarray]]:
        """(header slot, value per unique sample) of every field the rows carry."""
        found = _members_by_extension(walk, count, sorted(self.packing.extensions))
        values: List[Tuple[int, np.ndarray]] = []
        key_at, key_len = _keys(walk, count)
        self._check_keys(out, key_at, key_len)
        for spec in self.packing.fields:
            if spec.kind == FieldKind.STREAM:
                values.append((spec.column, self.packing.stream_of(self.epoch.index[self.unique])))
                continue
            if spec.kind == FieldKind.KEY:
                values += [(spec.offset_column, key_at), (spec.length_column, key_len)]
                continue
            if spec.kind not in (FieldKind.BYTES, FieldKind.INT):
                continue
            data, size = _first_present(found, spec.extensions, count)
            if spec.kind == FieldKind.INT:
                values.append((spec.column, np.array([_int(out, d, z) for d, z in zip(data, size)], dtype=np.int64)))
                continue
            if any(e in IMAGE_EXTENSIONS for e in spec.extensions):
                self._check_images(out, data, size)
            values += [(spec.offset_column, data), (spec.length_column, size)]
        return values

    def _check_keys(self, out: np.ndarray, key_at: np.ndarray, key_len: np.ndarray) -> None:
        reading = self.reading
        for k, a, n in zip(self.unique.tolist(), key_at.tolist(), key_len.tolist()):
            recorded = reading.cfg.sample_keys(reading.shards[k])
            if recorded is None:
                continue
            crc = zlib.crc32(out[a : a + n])  # type: ignore[arg-type]  # numpy's stubs: a Buffer only on 3.12+
            if crc != int(recorded[reading.local[k]]):
                raise NotDirect()

    def _check_images(self, out: np.ndarray, data: np.ndarray, size: np.ndarray) -> None:
        if not images_ok(out, data, size, self.packing.image_check).all():
            raise NotDirect()

    # -- the general way ---------------------------------------------------------------------
    def _general(self) -> List[Packed]:
        """The step's samples read and packed one by one, errors raised or skipped as always; a
        skipped sample's stand-in is the last good sample before it (as ``EpochBatches`` picks it)."""
        unique = self.unique.tolist()
        items: Dict[int, Any] = {k: self.reading.item(k) for k in unique}
        out, good = [], None
        for k, valid in zip(self.places, self.valid):
            item = items[k]
            if isinstance(item, Skipped):
                stand_in = good or self.good.sample(items[j] for j in unique)
                out.append(stand_in.as_skipped(item.index) if valid else stand_in.as_padding())
                continue
            if valid:
                good = item
                self.good.remember(item, k)
            out.append(item if valid else item.as_padding())
        return out


EXT_BYTES = 16  # extensions up to this long are compared as two words (longer ones: the general way)


def _ext_codes(member: Any) -> np.ndarray:
    """Each member's extension, lower-cased, as two 64-bit words (zero-padded)."""
    start = member.key_end + 1
    if (member.name_end - start > EXT_BYTES).any():
        raise NotDirect()
    cols = np.minimum(start[:, None] + np.arange(EXT_BYTES), 99)
    ext = member.name[np.arange(len(start))[:, None], cols]
    ext = np.where(cols < member.name_end[:, None], ext, 0).astype(np.uint8)
    ext = np.where((ext >= 65) & (ext <= 90), ext + 32, ext).astype(np.uint8)
    return np.ascontiguousarray(ext).view(np.uint64)


def _code(ext: str) -> np.ndarray:
    raw = ext.encode("utf-8", "surrogateescape")[:EXT_BYTES].ljust(EXT_BYTES, b"\0")
    return np.frombuffer(raw, dtype=np.uint64)


def _members_by_extension(walk: Any, count: int, wanted: Sequence[str]) -> Dict[str, Tuple[np.ndarray, np.ndarray]]:
    """Per wanted extension, (data offset, size) per sample (-1 where it has none); a sample with
    two members of one extension (wanted or not) goes the general way, which names it."""
    codes = np.zeros((count, len(walk.rounds), 2), dtype=np.uint64)
    present = np.zeros((count, len(walk.rounds)), dtype=bool)
    for r, member in enumerate(walk.rounds):
        codes[member.samples, r] = _ext_codes(member)
        present[member.samples, r] = True
    for a in range(len(walk.rounds)):
        for b in range(a + 1, len(walk.rounds)):
            if (present[:, a] & present[:, b] & (codes[:, a] == codes[:, b]).all(axis=1)).any():
                raise NotDirect()
    found: Dict[str, Tuple[np.ndarray, np.ndarray]] = {}
    for ext in wanted:
        data, size = np.full(count, -1, np.int64), np.zeros(count, np.int64)
        target = _code(ext)
        for r, member in enumerate(walk.rounds):
            hit = (codes[member.samples, r] == target).all(axis=1)
            data[member.samples[hit]], size[member.samples[hit]] = member.data[hit], member.size[hit]
        found[ext] = (data, size)
    return found


def _first_present(found: Dict[str, Tuple[np.ndarray, np.ndarray]], extensions: Sequence[str], count: int):
    """Per sample, the first of ``extensions`` it has (the field's alternatives, in order)."""
    data, size = np.full(count, -1, np.int64), np.zeros(count, np.int64)
    for ext in extensions:
        d, z = found[ext]
        take = (data < 0) & (d >= 0)
        data[take], size[take] = d[take], z[take]
    if (data < 0).any():
        raise NotDirect()  # a sample without the field: the general way names it
    return data, size


def _keys(walk: Any, count: int) -> Tuple[np.ndarray, np.ndarray]:
    """Where each sample's key lies (its first member's name) and its length."""
    first = walk.rounds[0]
    key_at, key_len = np.zeros(count, np.int64), np.zeros(count, np.int64)
    key_at[first.samples], key_len[first.samples] = first.header, first.key_end
    return key_at, key_len


def _int(out: np.ndarray, at: int, size: int) -> int:
    try:
        return decode_int(out[at : at + size])
    except ValueError:
        raise NotDirect() from None
