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

import itertools
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

from dali_shards.errors import ConfigError
from dali_shards.plan.random import TAG_BUCKET, permutation


def window_steps(bucket_window: int, mini_batch: int) -> int:
    """Steps per bucketing window (0: no bucketing)."""
    return max(1, bucket_window // mini_batch) if bucket_window else 0


def window_order(
    lengths: Union[Sequence[int], np.ndarray], mini_batch: int, seed: int, epoch: int, rank: int, window: int
) -> np.ndarray:
    """The emission order (indices into the window) of one window's valid samples, given their
    lengths (see the module)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    by_length = np.argsort(lengths, kind="stable")
    whole = len(by_length) // mini_batch
    chunks = by_length[: whole * mini_batch].reshape(whole, mini_batch)
    order = chunks[permutation(whole, TAG_BUCKET, seed, epoch, rank, window)].ravel()
    return np.concatenate([order, by_length[whole * mini_batch :]]).astype(np.int64)


def delivered(plan: Any, v: int, valid: int, span: int, lengths: Optional[Callable[[Any, np.ndarray], np.ndarray]]) -> np.ndarray:
    """What worker ``v`` of ``plan`` delivered in its first ``valid`` slots, stopped inside a window
    of ``span`` samples: the windows before, and the first mini-batches of that window's order,
    which ``lengths(plan, positions)`` (the samples' lengths) decides; a ConfigError without it."""
    if lengths is None:
        raise ConfigError(
            "the state was saved in the middle of a bucketing window (bucket_by): resuming it under another "
            "layout needs the lengths of that window's samples; resume under the same layout"
        )
    count = plan.worker_valid_count(v)
    order = np.fromiter(itertools.islice(plan.valid_order(v), count), dtype=np.int64, count=count)
    start = valid // span * span
    window = order[start : start + span]
    spec = plan.spec
    perm = window_order(lengths(plan, window), spec.mini_batch, spec.seed, plan.epoch, spec.rank_of(v), start // span)
    return np.concatenate([order[:start], window[perm][: valid - start]])
