"""Samples read into a buffer as they lie in their shards, their members found and their fields
located with NumPy, many samples at a time: what the ring's fast path (``direct.py``) writes into
a table's rows. Anything out of the ordinary (an irregular member, two members of one extension, a
missing field, a bad integer, a key that is not the index's, a damaged image, a short read) raises
``NotDirect``: the caller takes the general way, which names or skips it. Imports no DALI.
"""

from __future__ import annotations

import zlib
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from dali_shards.errors import ShardFormatError
from dali_shards.fields import FieldKind
from dali_shards.io.storage import local_path
from dali_shards.tar.blocks import walk_members
from dali_shards.tar.header import BLOCK
from dali_shards.worker.decoders import decode_ints
from dali_shards.worker.imagecheck import IMAGE_EXTENSIONS, images_ok


class NotDirect(Exception):
    """This step goes the general way."""


def aligned(size: Any) -> Any:
    """``size`` rounded up to whole tar blocks."""
    return (size + BLOCK - 1) // BLOCK * BLOCK


def any_excluded(reading: Any, index: np.ndarray) -> bool:
    """Whether one of these samples is one DALI failed on (the general way skips it)."""
    skip = reading.cfg.excluded
    return bool(skip) and any(int(i) in skip for i in index.tolist())


def layout(lengths: np.ndarray) -> np.ndarray:
    """Where each of samples of ``lengths`` bytes starts when laid out one after another, each at a
    block boundary (from 0)."""
    return np.concatenate([[0], np.cumsum(aligned(lengths))[:-1]]).astype(np.int64)


def read_spans(reading: Any, unique: np.ndarray, spans: np.ndarray, buf: np.ndarray, starts: np.ndarray) -> None:
    """Read the spans of the samples at ``unique`` (places of ``reading``) into ``buf`` at ``starts``:
    one read per run of samples that follow one another in a shard and in ``buf``, each shard's runs
    in file order."""
    cfg = reading.cfg
    shard_of = np.asarray(reading.shards, dtype=np.int64)[unique]
    reading.reader.progress(int(shard_of[0]))
    joined = np.zeros(len(unique), dtype=bool)  # sample i continues sample i - 1's read
    joined[1:] = (shard_of[1:] == shard_of[:-1]) & (spans[1:, 0] == spans[:-1, 1])
    joined[1:] &= starts[1:] == starts[:-1] + (spans[:-1, 1] - spans[:-1, 0])
    first = np.flatnonzero(~joined)
    last = np.append(first[1:], len(unique)) - 1
    by_shard = np.lexsort((spans[first, 0], shard_of[first]))  # each shard's runs together, in file order
    first, last = first[by_shard], last[by_shard]
    shards, los, his, ats = shard_of[first], spans[first, 0], spans[last, 1], starts[first]
    cut = np.flatnonzero(shards[1:] != shards[:-1]) + 1  # one lookup of each shard's file
    for a, b in zip([0, *cut.tolist()], [*cut.tolist(), len(first)]):
        s = int(shards[a])
        url = cfg.urls[s]
        path = local_path(url)
        assert path is not None  # positioned reads are of local shards
        runs = list(zip(los[a:b].tolist(), his[a:b].tolist(), ats[a:b].tolist()))
        try:
            whole = reading.files.read_runs(url, path, cfg.byte_sizes[s], runs, buf)
        except (ShardFormatError, OSError):
            raise NotDirect() from None
        if not whole:
            raise NotDirect()


def located_fields(reading: Any, index: np.ndarray, unique: np.ndarray, buf: np.ndarray, starts: np.ndarray,
           ends: np.ndarray) -> List[Tuple[int, np.ndarray]]:  # fmt: skip
    """(header column, value per sample) of every field the rows carry, for the samples at
    ``unique`` (``index``: their ``__index__``) read into ``buf`` at ``[starts, ends)``; offsets are
    positions in ``buf``."""
    walk = walk_members(buf, starts, ends)
    if walk.irregular.any():
        raise NotDirect()
    packing, codec, count = reading.cfg.packing, reading.cfg.codec, len(unique)
    found = _members_by_extension(walk, count, sorted(codec.extensions))
    values: List[Tuple[int, np.ndarray]] = []
    key_at, key_len = _keys(walk, count)
    _check_keys(reading, unique, buf, key_at, key_len)
    for spec in packing.fields:
        if spec.kind == FieldKind.STREAM:
            values.append((spec.column, packing.stream_of(index)))
            continue
        if spec.kind == FieldKind.KEY:
            values += [(spec.offset_column, key_at), (spec.length_column, key_len)]
            continue
        if spec.kind not in (FieldKind.BYTES, FieldKind.INT):
            continue
        data, size = _first_present(found, spec.extensions, count)
        if spec.kind == FieldKind.INT:
            ints, ok = decode_ints(buf, data, size)
            if not ok.all():
                raise NotDirect()  # the general way names the sample
            values.append((spec.column, ints))
            continue
        if any(e in IMAGE_EXTENSIONS for e in spec.extensions) and not images_ok(buf, data, size, codec.image_check).all():
            raise NotDirect()
        values += [(spec.offset_column, data), (spec.length_column, size)]
    return values


def offset_columns(packing: Any) -> frozenset:
    """The header columns that hold a position in the table (shifted when bytes move)."""
    return frozenset(f.offset_column for f in packing.fields if f.kind in (FieldKind.BYTES, FieldKind.KEY))


def _check_keys(reading: Any, unique: np.ndarray, buf: np.ndarray, key_at: np.ndarray, key_len: np.ndarray) -> None:
    for k, a, n in zip(unique.tolist(), key_at.tolist(), key_len.tolist()):
        recorded = reading.cfg.sample_keys(reading.shards[k])
        if recorded is None:
            continue
        crc = zlib.crc32(buf[a : a + n])  # type: ignore[arg-type]  # numpy's stubs: a Buffer only on 3.12+
        if crc != int(recorded[reading.local[k]]):
            raise NotDirect()


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

