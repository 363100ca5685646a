"""What a scan of a shard's tar headers learns: its samples, the bytes per extension, and where
each sample begins."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import BinaryIO, Dict, List, Optional

from dali_shards.io.tarformat import TarReader


@dataclass
class ShardStats:
    """What a header scan learns about a shard: its samples, the bytes per extension, and (for an
    uncompressed shard) ``offsets``: the byte where each sample's headers begin, then the byte
    where the last sample ends (``samples + 1`` numbers, the first 0; see ``SampleOffsets``)."""

    samples: int = 0
    ext_bytes: Dict[str, int] = field(default_factory=dict)
    offsets: Optional[List[int]] = None

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
    samples before it (a sample is complete once a header of the next one has been read).
    Offsets are recorded unless the stream decompresses (they could not be seeked to)."""
    stats, pending, last = ShardStats(), {}, -1
    starts: List[int] = []
    reader = TarReader(stream, url)
    try:
        for position, _, ext, member in reader.scan():
            if position != last:
                if last >= 0:
                    stats.add_sample(pending)
                pending, last = {}, position
                starts.append(member.start if position else 0)
            pending[ext] = pending.get(ext, 0) + member.size
    except Exception:  # noqa: BLE001 - the damage itself: the sample being read is left out
        if not complete_only:
            raise
        if not getattr(stream, "decompresses", False):  # the damaged sample's start ends the last good one
            stats.offsets = starts[: stats.samples + 1] or [0]
        return stats
    if last >= 0:
        stats.add_sample(pending)
    if not getattr(stream, "decompresses", False):
        stats.offsets = starts + [reader.end_offset] if starts else [0]
    return stats


def count_samples(stream: BinaryIO, url: str) -> int:
    """Number of samples in a shard, from its headers alone."""
    return scan_tar(stream, url).samples
