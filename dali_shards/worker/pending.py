"""Samples a planned worker read ahead of their emission (an interleaved reading order, a bucketing
window), kept by position until their slot comes. Imports no DALI."""

from __future__ import annotations

from collections import Counter
from typing import Dict, List, Tuple

from dali_shards.worker.reader import Item


def draws(emissions: List[Tuple[int, bool]]) -> List[int]:
    """The positions of ``emissions`` in order, each as many times as it is drawn valid (once where
    it only pads)."""
    counts = Counter(pos for pos, ok in emissions if ok)
    for pos, _ in emissions:
        counts.setdefault(pos, 1)
    return sorted(counts.elements())


class Pending:
    """Samples read ahead of their emission, by position: one per draw (a mix may draw a sample
    twice in an epoch), taken oldest first."""

    def __init__(self) -> None:
        self._items: Dict[int, List[Item]] = {}

    def put(self, pos: int, item: Item) -> None:
        self._items.setdefault(pos, []).append(item)

    def __contains__(self, pos: int) -> bool:
        return pos in self._items

    def __len__(self) -> int:
        return sum(len(items) for items in self._items.values())

    def pop(self, pos: int) -> Item:
        items = self._items[pos]
        item = items.pop(0)
        if not items:
            del self._items[pos]
        return item

    def values(self) -> List[Item]:
        return [item for items in self._items.values() for item in items]

    def clear(self) -> None:
        self._items.clear()
