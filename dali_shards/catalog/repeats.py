"""A shard listed twice across catalogs (a source's items, a mix's streams), however spelled
(``catalog.identity``), found at array speed: every shard's identity digested (a catalog of plain
names beside its manifest: its folder's identity and each name, without a string per shard; any
other: each identity made), the digests sorted, and only shards of equal digests compared by their
identities."""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

from dali_shards.catalog.columns import Catalog
from dali_shards.catalog.identity import ShardIdentity
from dali_shards.catalog.parse import plain_names
from dali_shards.catalog.strings import StringTable, first_repeat

Piece = Union[Catalog, Sequence[str]]  # a catalog, or a list of URLs


def _plain_prefix(catalog: Catalog, identity: ShardIdentity) -> Optional[str]:
    """The identity every name of ``catalog`` is appended to, if it is a manifest's catalog of
    plain names (``catalog.parse``); else None."""
    if len(catalog.prefixes) != 2 or not len(catalog) or not (catalog.columns["prefix"] == 1).all():
        return None
    base = catalog.prefixes[1]
    if not plain_names(catalog.names, np.ones(len(catalog), bool), base):
        return None
    probe = identity(base + "x")
    return probe[:-1] if probe.endswith("/x") else None


def identity_digests(piece: Piece, identity: ShardIdentity) -> np.ndarray:
    """A digest of each shard's identity (``StringTable.digests`` of it)."""
    if isinstance(piece, Catalog):
        prefix = _plain_prefix(piece, identity)
        if prefix is not None:
            return piece.names.digests(prefix.encode("utf-8", "surrogateescape"))
        piece = piece.urls
    return StringTable.of(identity(u) for u in piece).digests()


def _url(pieces: Sequence[Piece], starts: List[int], slot: int) -> str:
    n = int(np.searchsorted(starts, slot, side="right")) - 1
    piece = pieces[n]
    return piece.url(slot - starts[n]) if isinstance(piece, Catalog) else piece[slot - starts[n]]


def first_repeat_across(pieces: Sequence[Piece]) -> Optional[Tuple[int, int]]:
    """(first, again): places among all of ``pieces``' shards, one after the other, of the first
    shard met a second time (``again`` the smallest such place) and where it was first met; None if
    none is."""
    identity = ShardIdentity()
    digest = np.concatenate([identity_digests(p, identity) for p in pieces]) if pieces else np.zeros(0, np.uint64)
    starts = [0]
    for p in pieces:
        starts.append(starts[-1] + len(p))
    return first_repeat(digest, lambda slot: identity(_url(pieces, starts, slot)))
