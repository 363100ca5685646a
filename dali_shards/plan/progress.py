"""What a plan's first steps delivered, and what is left of its epoch (plan versions 5 and 6): the rest is
stretches of shards, computed from each worker's parts without listing the samples delivered.
Pure, no I/O, no DALI.

Samples are counted draw for draw (``multiset``): in a mix a sample may be drawn twice an epoch.
After ``k`` steps, worker ``v`` delivered the first ``min(count, k * mini_batch)`` samples of its
reading order: whole blocks, then a prefix of each of its parts in the block it stopped in
(``deal.consumed_counts``, counted for all workers at once), or whole chunks of its run and a known part of the next
(``runs.chunk_done``). With length bucketing, a worker stopped inside a window delivered samples of
that window that its lengths decide (``bucket.delivered``): those not delivered are left as
samples of their own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional, Tuple

import numpy as np

from dali_shards.plan import bucket, multiset
from dali_shards.plan.deal import consumed_counts_many
from dali_shards.plan.runs import chunk_done
from dali_shards.plan.units import Streams, Units

if TYPE_CHECKING:
    from dali_shards.plan.epoch import EpochPlan, Lengths


def singles(plan: "EpochPlan", positions: np.ndarray) -> Units:
    """Samples (``__index__``) as units, draw for draw (a sample listed twice is in two units): each
    run of consecutive samples of one shard, one unit."""
    pos, layer = multiset.layers(positions)
    if not len(pos):
        return Units.of([], [], [])
    shard, local = plan.locate(pos)
    cut = np.flatnonzero((np.diff(pos) != 1) | (np.diff(shard) != 0) | (np.diff(layer) != 0)) + 1
    first, last = np.concatenate([[0], cut]), np.concatenate([cut, [len(pos)]]) - 1
    return Units.of(shard[first], local[first], local[last] + 1)


def worker_left(plan: "EpochPlan", v: int, done: int) -> Units:
    """What is left of worker ``v``'s reading after its first ``done`` samples."""
    return workers_left(plan, [(v, done)])


def workers_left(plan: "EpochPlan", done: List[Tuple[int, int]]) -> Units:
    """What is left of each worker ``v``'s reading after its first ``d`` samples, for ``(v, d)`` in
    ``done``: the parts it stopped in are counted all at once (``consumed_counts_many``)."""
    if not plan.interleaving:
        return Units.concat([_run_left(plan, v, d) for v, d in done])
    left: List[Units] = []
    partial: List[Streams] = []
    took: List[int] = []
    for v, d in done:
        for part, here in plan.worker_progress(v, d):
            if here == 0:
                left.append(part.as_units())
            elif here < int(part.length.sum()):
                partial.append(part)
                took.append(here)
    counts = consumed_counts_many([p.length for p in partial], took)
    return Units.concat(left + [p.remainder(c) for p, c in zip(partial, counts)])


def in_turn(parts: List[Streams], done: int) -> List[Tuple[Streams, int]]:
    """Each of ``parts`` read one after the other, with how many of its samples the first
    ``done`` took."""
    out, before = [], 0
    for part in parts:
        total = int(part.length.sum())
        out.append((part, min(max(done - before, 0), total)))
        before += total
    return out


def _run_left(plan: "EpochPlan", v: int, done: int) -> Units:
    """What is left of worker ``v``'s run after its first ``done`` samples (chunk by chunk)."""
    run = plan.worker_parts(v)[0]
    n, spec = int(run.length.sum()), plan.spec
    if not spec.shuffle:
        return _after(run, done)
    whole, taken = chunk_done(n, spec.shuffle_buffer, done, spec.seed, plan.epoch, v)
    if not len(taken):
        return _after(run, whole)
    chunk_end = min(n, whole + spec.shuffle_buffer)
    order = np.concatenate(run.positions(plan.canonical_starts)) if len(run) else np.zeros(0, np.int64)
    untaken = np.setdiff1d(np.arange(whole, chunk_end), taken)
    return Units.concat([singles(plan, order[untaken]), _after(run, chunk_end)])


def _after(run, done: int) -> Units:
    """A run's samples after its first ``done`` (the run's streams laid end to end)."""
    ends = np.cumsum(run.length)
    return run.remainder(np.clip(done - (ends - run.length), 0, run.length))


def remaining(plan: "EpochPlan", steps: int, lengths: Optional["Lengths"] = None) -> Units:
    """The samples of ``plan`` not delivered in its first ``steps`` steps, as units (``lengths``:
    see ``EpochPlan.consumed``)."""
    spec = plan.spec
    m = spec.mini_batch
    span = bucket.window_steps(spec.bucket_window, m) * m
    left: List[Units] = []
    plain: List[Tuple[int, int]] = []
    for v in range(spec.num_virtual_workers):
        count = plan.worker_valid_count(v)
        valid = min(count, steps * m)
        if not (span and valid % span and valid < count):
            plain.append((v, valid))
            continue
        start = valid // span * span  # stopped inside the window at ``start``
        upto = min(count, start + span)
        window = plan.delivered_order(v, upto)[start:]
        got = bucket.delivered(plan, v, valid, span, lengths)[start:]
        left += [singles(plan, multiset.difference(window, got)), worker_left(plan, v, upto)]
    return Units.concat([workers_left(plan, plain), *left])
