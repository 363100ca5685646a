"""One manifest entry, read and checked (the format: see ``catalog.manifest``): every field's
type, and every count and size against what a tar shard can physically hold, before anything is
allocated or planned for it. What needs the shard itself (its size on disk, whether it is
compressed) is checked at the start: ``catalog.plausible``.

A tar member takes a 512-byte header at least, and an archive ends with a 512-byte block of
zeros, so a shard of ``n > 0`` samples holds ``512 * (n + 1)`` bytes of tar at least, besides its
members' data. Where ``sample_blocks`` is given the shard is a plain tar (its offsets are those
of its bytes), so its ``bytes`` must hold the samples' blocks, the end block, and the
``ext_bytes`` of its members within those blocks.
"""

from __future__ import annotations

import base64
import reprlib
from typing import Any, Callable, Dict, NamedTuple, Optional, TypeGuard

import numpy as np

from dali_shards.errors import ConfigError

BLOCK = 512
MAX_BYTES = 1 << 62  # no shard is larger: offsets beyond are a corrupt manifest
MAX_SAMPLES = MAX_BYTES // BLOCK  # each sample takes a 512-byte header at least

_shown = reprlib.Repr()
_shown.maxstring = _shown.maxother = 80
_shown.maxdict = _shown.maxlist = 6


class Entry(NamedTuple):
    """An entry's checked fields (``url`` as written, not yet resolved)."""

    url: str
    samples: int
    bytes: Optional[int]
    ext_bytes: Optional[Dict[str, int]]
    offsets: Optional[np.ndarray]
    key_crc: Optional[np.ndarray]


Bad = Callable[[str, str], ConfigError]


def is_count(value: object) -> TypeGuard[int]:
    """True for an int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_entry(path: str, i: int, entry: object, version: int = 2) -> Entry:
    """Entry ``i`` of manifest ``path`` (of format ``version``), its fields checked; a ConfigError
    naming the manifest, the entry and the field otherwise."""

    def bad(name: str, what: str) -> ConfigError:
        value = entry.get(name) if isinstance(entry, dict) else entry
        return ConfigError(f'manifest {path!r}: entry {i}: "{name}" must be {what}, got {_shown.repr(value)}')

    if not isinstance(entry, dict):
        raise ConfigError(
            f'manifest {path!r}: entry {i} must be an object with "url" and "samples", got {_shown.repr(entry)}'
        )
    if not isinstance(entry.get("url"), str) or not entry["url"]:
        raise bad("url", "the shard's path or URL (a string)")
    samples = entry.get("samples")
    if not is_count(samples) or not 0 <= samples <= MAX_SAMPLES:
        raise bad("samples", f"the shard's number of samples (an integer from 0 to {MAX_SAMPLES})")
    size = entry.get("bytes")
    if size is not None and (not is_count(size) or not 0 <= size <= MAX_BYTES):
        raise bad("bytes", f"the shard's size in bytes (an integer from 0 to {MAX_BYTES}) or absent")
    ext_bytes = _ext_bytes(entry.get("ext_bytes"), bad)
    offsets = _offsets(entry.get("sample_blocks"), samples, size, bad)
    if offsets is not None and ext_bytes is not None and samples:
        room = int(offsets[-1]) - BLOCK * samples  # the samples' blocks less one header each
        if sum(ext_bytes.values()) > room:
            raise bad("ext_bytes", f"member bytes that fit in the samples' blocks (at most {room} in all) or absent")
    keys = _key_crc(entry.get("key_crc32"), samples, bad)
    for flag in ("spans", "keys") if version >= 3 else ():
        if entry.get(flag, True) not in (True, False):
            raise bad(flag, "true or false, or absent")
    return Entry(entry["url"], samples, size, ext_bytes, offsets, keys)


def _ext_bytes(value: Any, bad: Bad) -> Optional[Dict[str, int]]:
    """``ext_bytes`` checked: each count, and their sum, an integer from 0 to ``MAX_BYTES``."""
    if value is None:
        return None
    what = f"a mapping of extensions to byte counts (integers >= 0, at most {MAX_BYTES} in all) or absent"
    if not isinstance(value, dict) or not all(isinstance(k, str) and is_count(v) and v >= 0 for k, v in value.items()):
        raise bad("ext_bytes", what)
    if sum(value.values()) > MAX_BYTES:
        raise bad("ext_bytes", what)
    return dict(value)


def _key_crc(text: object, samples: int, bad: Bad) -> Optional[np.ndarray]:
    """The key fingerprints ``key_crc32`` stands for (see ``catalog.manifest``), checked."""
    if text is None:
        return None
    what = f"the base64 of {samples} little-endian uint32 key fingerprints, or absent"
    if not isinstance(text, str) or len(text) != 4 * ((4 * samples + 2) // 3):
        raise bad("key_crc32", what)  # (its length known before anything is decoded)
    try:
        raw = base64.b64decode(text, validate=True)
    except ValueError:
        raise bad("key_crc32", what) from None
    if len(raw) != 4 * samples:
        raise bad("key_crc32", what)
    array = np.frombuffer(raw, dtype="<u4").astype(np.uint32)
    array.setflags(write=False)
    return array


def _offsets(blocks: object, samples: int, size: Optional[int], bad: Bad) -> Optional[np.ndarray]:
    """The offsets ``sample_blocks`` stands for (see ``catalog.manifest``), checked: one positive
    count per sample, the samples and the end-of-archive block within ``size``."""
    if blocks is None:
        return None
    what = (
        f"{samples} positive block counts separated by spaces (one per sample; the samples and the 512-byte "
        "end-of-archive block within the shard's bytes) or absent"
    )
    if not isinstance(blocks, str) or len(blocks) < 2 * samples - 1:
        raise bad("sample_blocks", what)  # (too short for one count per sample: nothing parsed)
    try:
        counts = np.array(blocks.split(), dtype=np.int64)
    except (ValueError, OverflowError):
        raise bad("sample_blocks", what) from None
    if len(counts) != samples or (counts < 1).any() or float(counts.sum(dtype=np.float64)) * BLOCK >= MAX_BYTES:
        raise bad("sample_blocks", what)  # (a sum beyond MAX_BYTES could wrap around in int64)
    ends = np.cumsum(counts) * BLOCK
    if size is not None and len(ends) and int(ends[-1]) + BLOCK > size:
        raise bad("sample_blocks", what)
    array = np.concatenate([[0], ends]).astype(np.int64)
    array.setflags(write=False)
    return array
