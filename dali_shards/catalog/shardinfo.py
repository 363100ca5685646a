"""What the catalog knows of one shard: its sample count, sizes and where its samples lie."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Sequence, Union

import numpy as np


@dataclass(frozen=True)
class ShardInfo:
    """A shard's URL, its number of samples, its stored size in bytes, the bytes of its members
    per extension, and ``offsets``: where each sample's headers begin and where the last one ends
    (``samples + 1`` byte offsets, int64; uncompressed shards only), and ``key_crc``, each sample's
    key fingerprint (``io.tarscan.key_fingerprint``, uint32) -- each when known, in memory. A
    version-3 manifest's shards keep both in its sample table instead (``table``, their record at
    ``table_at``: ``catalog.table``), loaded by the worker that reads the shard. A damaged
    shard counted with ``on_error="skip"`` says why in ``damage``, and how many samples are known
    lost in ``lost`` (at least; those after the damage cannot be counted)."""

    url: str
    samples: int
    bytes: Optional[int] = None
    ext_bytes: Optional[Dict[str, int]] = field(default=None, hash=False)
    offsets: Optional[np.ndarray] = field(default=None, hash=False, compare=False, repr=False)
    key_crc: Optional[np.ndarray] = field(default=None, hash=False, compare=False, repr=False)
    damage: Optional[str] = field(default=None, compare=False)  # why only ``samples`` could be counted
    lost: int = field(default=0, compare=False)  # with ``damage``: samples known lost (more may be)
    table: Optional[str] = field(default=None, compare=False, repr=False)  # its sample table (version 3)
    table_at: int = field(default=0, compare=False, repr=False)  # where its record begins there
    table_spans: bool = field(default=True, compare=False, repr=False)  # the record holds its offsets
    table_keys: bool = field(default=True, compare=False, repr=False)  # ... and its key fingerprints

    @property
    def has_spans(self) -> bool:
        """Whether where each sample begins is known (inline, or in the manifest's sample table)."""
        return self.offsets is not None or (self.table is not None and self.table_spans)
    @staticmethod
    def offsets_from(values: Optional[Union[Sequence[int], np.ndarray]]) -> Optional[np.ndarray]:
        """``values`` as the read-only int64 array ``offsets`` holds (None stays None)."""
        if values is None:
            return None
        array = np.asarray(values, dtype=np.int64)
        array.setflags(write=False)
        return array
