"""A source's items as the parts of its catalog (a manifest's catalog, or a pattern's shards), where
each shard came from (for errors, made only when one is said), and the checks made across parts at
the start: no shard listed twice (however spelled), and local shards the size their manifest says."""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from dali_shards.catalog.columns import Catalog
from dali_shards.catalog.identity import spelled
from dali_shards.catalog.plausible import local_sizes
from dali_shards.catalog.repeats import first_repeat_across
from dali_shards.catalog.shardinfo import ShardInfo
from dali_shards.errors import ConfigError, ShardFormatError
from dali_shards.options import OnError, StaleManifest, StorageOptions

log = logging.getLogger("dali_shards")


@dataclass(eq=False)
class Part:
    """One item of a source: ``catalog`` (a manifest's, or once counted a pattern's), or ``infos``
    (a pattern's shards, until counted); ``notes``: what an origin adds for a shard (by index)."""

    where: str
    text: str
    catalog: Optional[Catalog] = None
    infos: Optional[List[ShardInfo]] = None
    matches: bool = True
    notes: Dict[int, str] = field(default_factory=dict)

    @property
    def manifested(self) -> bool:
        return self.infos is None

    def __len__(self) -> int:
        return len(self.infos) if self.infos is not None else len(self.catalog or ())

    def url(self, k: int) -> str:
        return self.infos[k].url if self.infos is not None else self.catalog.url(k)  # type: ignore[union-attr]

    def origin(self, k: int) -> str:
        """Where shard ``k`` of this part came from, for an error."""
        if self.manifested:
            said = f"{self.where}, manifest {self.text!r}, entry {k}"
        else:
            said = f"{self.where}, pattern {self.text!r}, match {k}" if self.matches else f"{self.where} ({self.text!r})"
        return said + self.notes.get(k, "")


class Origins:
    """Where each shard of a source's parts came from, by its place among all of them."""

    def __init__(self, parts: Sequence[Part]):
        self.parts = list(parts)

    def _starts(self) -> List[int]:
        starts = [0]
        for p in self.parts:
            starts.append(starts[-1] + len(p))
        return starts

    def __getitem__(self, slot: int) -> str:
        starts = self._starts()
        n = bisect.bisect_right(starts, slot) - 1
        return self.parts[n].origin(slot - starts[n])

    def of(self, part: Part) -> Callable[[int], str]:
        """Origins of ``part``'s shards, by their index in it."""
        return part.origin


def refuse_repeats(parts: Sequence[Part], origins: Origins) -> None:
    """A ConfigError naming a shard listed twice (``catalog.identity``: however spelled), both
    spellings and both places."""
    found = first_repeat_across([p.catalog if p.catalog is not None else [s.url for s in p.infos or ()] for p in parts])
    if found is None:
        return
    first, slot = found
    raise ConfigError(
        f"shard {spelled(_url_at(parts, first), _url_at(parts, slot))} is listed twice: by {origins[first]}, and by {origins[slot]}. "
        "Each shard may appear once per epoch: remove one (check the patterns, lists and manifests of source=)"
    )


def _url_at(parts: Sequence[Part], slot: int) -> str:
    for p in parts:
        if slot < len(p):
            return p.url(slot)
        slot -= len(p)
    raise IndexError(slot)


def check_manifested(catalog: Catalog, origin: Callable[[int], str], stale: StaleManifest, on_error: OnError,
                     config: StorageOptions) -> List[int]:  # fmt: skip
    """Compare the local shards of a manifest's catalog with their recorded ``bytes`` (a stat each):
    refuse a changed one (with ``on_error="skip"``: warn, and the workers skip it, counted), or
    (``stale="rescan"``) return it, to be counted again."""
    rows = np.flatnonzero(catalog.sizes >= 0)
    actual = local_sizes(catalog, rows)  # -1: remote, or met when opened
    changed = []
    for k in np.flatnonzero((actual >= 0) & (actual != catalog.sizes[rows])).tolist():
        i, size, recorded = int(rows[k]), int(actual[k]), int(catalog.sizes[rows[k]])
        if stale is StaleManifest.RESCAN:
            changed.append(i)
            continue
        how = "truncated or rewritten" if size < recorded else "rewritten"
        error = ShardFormatError(
            catalog.url(i),
            f"has {size} bytes, but {origin(i)} says {recorded}: it was {how} after the manifest was "
            f"written, so its sample count ({int(catalog.samples[i])}) cannot be trusted",
            hint="run `dali-shards index` on the shards again to rewrite the manifest, or pass "
            'stale_manifest="rescan" to count changed shards again at every start',
        )
        if on_error is OnError.RAISE:
            raise error
        log.warning("dali_shards: %s; its samples will be skipped", error)
    return changed
