"""Draws as multisets: in a mix a sample may be drawn more than once an epoch, and each draw must be
delivered, resumed and audited as one. Pure NumPy, no I/O, no DALI."""

from __future__ import annotations

from typing import Tuple

import numpy as np


def counted(values: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """The distinct values (sorted) and how many times each occurs."""
    return np.unique(np.asarray(values, dtype=np.int64).reshape(-1), return_counts=True)


def difference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a`` less ``b``, draw for draw: each value as many times as it occurs in ``a`` beyond its
    occurrences in ``b`` (sorted)."""
    va, ca = counted(a)
    vb, cb = counted(b)
    if not len(vb):
        return np.repeat(va, ca)
    at = np.minimum(np.searchsorted(vb, va), len(vb) - 1)
    left = ca - np.where(vb[at] == va, cb[at], 0)
    keep = left > 0
    return np.repeat(va[keep], left[keep])


def layers(values: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """``values`` sorted by (layer, value): layer ``k`` holds each value occurring more than ``k``
    times once, so that each layer is a set. Returns the sorted values and each one's layer."""
    v = np.sort(np.asarray(values, dtype=np.int64).reshape(-1))
    if not len(v):
        return v, v.copy()
    first = np.concatenate([[True], v[1:] != v[:-1]])
    starts = np.flatnonzero(first)
    layer = np.arange(len(v)) - np.repeat(starts, np.diff(np.append(starts, len(v))))
    order = np.lexsort((v, layer))
    return v[order], layer[order]
