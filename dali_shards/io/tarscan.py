"""What a scan of a shard's tar headers learns: its samples and the bytes per extension."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import BinaryIO, Dict

from dali_shards.io.tarformat import TarReader


@dataclass
class ShardStats:
    """What a header scan learns about a shard: its samples and the bytes per extension."""

    samples: int = 0
    ext_bytes: Dict[str, int] = field(default_factory=dict)

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
    samples before it (a sample is complete once a header of the next one has been read)."""
    stats, pending, last = ShardStats(), {}, -1
    try:
        for position, _, ext, member in TarReader(stream, url).scan():
            if position != last:
                if last >= 0:
                    stats.add_sample(pending)
                pending, last = {}, position
            pending[ext] = pending.get(ext, 0) + member.size
    except Exception:  # noqa: BLE001 - the damage itself: the sample being read is left out
        if not complete_only:
            raise
        return stats
    if last >= 0:
        stats.add_sample(pending)
    return stats


def count_samples(stream: BinaryIO, url: str) -> int:
    """Number of samples in a shard, from its headers alone."""
    return scan_tar(stream, url).samples
