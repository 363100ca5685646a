"""Length bucketing: each worker's emissions, window by window, grouped into mini-batches of similar
length. Pure, no I/O, no DALI (the lengths come from the samples, read by the caller).

A worker's emission order (the plan's) is cut into windows of ``k`` steps (``k * mini_batch``
samples; ``k = max(1, bucket_window // mini_batch)``), counted from the plan's first step. Each
window's valid samples are sorted by length (ties by their place in the window) and cut into
mini-batches; the whole mini-batches are emitted in a seeded order that the workers of a rank
share, so that at every step each worker contributes its mini-batch of the same length rank and the
rank's batch holds similar lengths; a partial mini-batch (the epoch's end) comes last, then the
padding. Every window keeps its samples, so exactly-once and equal steps hold as without
bucketing, and the samples delivered by any step are known from the plan and the lengths of one
window per worker.
"""

from __future__ import annotations

import numpy as np

from dali_shards.plan.random import TAG_BUCKET, permutation


def window_steps(bucket_window: int, mini_batch: int) -> int:
    """Steps per bucketing window (0: no bucketing)."""
    return max(1, bucket_window // mini_batch) if bucket_window else 0


def window_order(lengths: np.ndarray, mini_batch: int, seed: int, epoch: int, rank: int, window: int) -> np.ndarray:
    """The emission order (indices into the window) of one window's valid samples, given their
    lengths (see the module)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    by_length = np.argsort(lengths, kind="stable")
    whole = len(by_length) // mini_batch
    chunks = by_length[: whole * mini_batch].reshape(whole, mini_batch)
    order = chunks[permutation(whole, TAG_BUCKET, seed, epoch, rank, window)].ravel()
    return np.concatenate([order, by_length[whole * mini_batch :]]).astype(np.int64)
