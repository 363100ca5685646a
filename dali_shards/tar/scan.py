"""What a scan of a shard's tar headers learns: its samples, the bytes per extension, and where
each sample begins."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import BinaryIO, Dict, Iterable, List, Optional

import numpy as np

from dali_shards.tar.format import TarReader


def key_fingerprint(key: str) -> int:
    """A sample's fingerprint as an index records it: the CRC-32 of its key (its members' name
    before the extension), so that a worker reading the sample at its span can tell that the shard
    was rewritten with other samples there."""
    return zlib.crc32(key.encode("utf-8", "surrogateescape"))


def key_fingerprints(keys: Iterable[str]) -> np.ndarray:
    """The fingerprints of samples' keys, in order, as a read-only uint32 array."""
    array = np.fromiter((key_fingerprint(k) for k in keys), dtype=np.uint32)
    array.setflags(write=False)
    return array


@dataclass
class ShardStats:
    """What a header scan learns about a shard: its samples, the bytes per extension, and (for an
    uncompressed shard) ``offsets``: the byte where each sample's headers begin, then the byte
    where the last sample ends (``samples + 1`` numbers, the first 0; see ``SampleOffsets``)."""

    samples: int = 0
    ext_bytes: Dict[str, int] = field(default_factory=dict)
    offsets: Optional[List[int]] = None
    keys: List[str] = field(default_factory=list)  # every sample's key, in order
    damage: Optional[str] = None  # a damaged shard's scan (complete_only): what ended it
    lost: int = 0  # samples seen in part before the damage (a lower bound of those lost)

    def add(self, ext: str, size: int) -> None:
        """Count ``size`` bytes of a member with extension ``ext``."""
        self.ext_bytes[ext] = self.ext_bytes.get(ext, 0) + size

    def add_sample(self, ext_sizes: Dict[str, int]) -> None:
        """Count one sample with these bytes per extension."""
        self.samples += 1
        for ext, size in ext_sizes.items():
            self.add(ext, size)


def scan_tar(stream: BinaryIO, url: str, complete_only: bool = False) -> ShardStats:
    """Scan a shard's tar headers (member data is skipped, by seeking where possible). With
    ``complete_only``, damage ends the scan instead of raising: the stats are those of the
    samples before it (a sample is complete once a header of the next one has been read), with
    what ended it (``damage``) and whether a sample was seen in part (``lost``).
    Offsets are recorded unless the stream decompresses (they could not be seeked to)."""
    pending: Dict[str, int]
    stats, pending, last = ShardStats(), {}, -1
    starts: List[int] = []
    reader = TarReader(stream, url)
    try:
        for position, key, ext, member in reader.scan():
            if position != last:
                if last >= 0:
                    stats.add_sample(pending)
                pending, last = {}, position
                starts.append(member.start if position else 0)
                stats.keys.append(key)
            pending[ext] = pending.get(ext, 0) + member.size
    except Exception as exc:  # noqa: BLE001 - the damage itself: the sample being read is left out
        if not complete_only:
            raise
        stats.damage = getattr(exc, "detail", None) or f"{type(exc).__name__}: {exc}"
        stats.lost = 1 if pending else 0
        del stats.keys[stats.samples :]
        if not getattr(stream, "decompresses", False):  # the damaged sample's start ends the last good one
            stats.offsets = starts[: stats.samples + 1] or [0]
        return stats
    if last >= 0:
        stats.add_sample(pending)
    if not getattr(stream, "decompresses", False):
        if starts:
            assert reader.end_offset is not None  # the scan ended at the end-of-archive marker
            stats.offsets = starts + [reader.end_offset]
        else:
            stats.offsets = [0]
    return stats


def count_samples(stream: BinaryIO, url: str) -> int:
    """Number of samples in a shard, from its headers alone."""
    return scan_tar(stream, url).samples
