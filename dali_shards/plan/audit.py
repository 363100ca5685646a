"""Checking an epoch: which samples every rank really received, against what the plan delivers.

``DALIShardedIterator(..., audit=True)`` records, per epoch, the ``__index__`` of every valid
sample it returns and of every sample skipped with ``on_error="skip"`` (``EpochRecord``); at the
epoch's end its run session gathers them from all ranks (under ``torch.distributed``) and reports
duplicates, missing samples, skipped samples and steps per rank (``session/audit.py``). ``summarize`` does the same for lists gathered any other way
(e.g. simulated ranks in one process). Shards counted short at the start because they are damaged
(``on_error="skip"``) lose their samples after the damage in every epoch: the report lists them
(``lost_shards``) and counts the samples known lost (``lost``: a lower bound, since those after a
shard's damage cannot be counted).
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np

from dali_shards.options import LastBatch
from dali_shards.plan import multiset
from dali_shards.plan.epoch import Lengths
from dali_shards.plan.resume import Plan


def expected_indices(plan: Plan, lengths: Optional[Lengths] = None, rank: Optional[int] = None) -> np.ndarray:
    """``__index__`` of every sample the plan delivers as valid over all ranks (or ``rank``'s),
    from its start step. ``lengths``: see ``EpochPlan.consumed`` (an epoch resumed inside a
    bucketing window; without it, such an epoch is compared with the plan's order)."""
    spec = plan.spec
    workers = range(spec.num_virtual_workers) if rank is None else spec.rank_workers(rank)
    ordered = [np.fromiter(itertools.islice(plan.valid_order(v), plan.worker_valid_count(v)), np.int64) for v in workers]
    positions = np.concatenate(ordered) if ordered else np.empty(0, np.int64)
    if plan.start_step and lengths is not None:  # each worker's own first steps (a mix may draw a sample twice)
        left = [multiset.difference(o, plan.worker_consumed(v, plan.start_step, lengths)) for v, o in zip(workers, ordered)]
        positions = np.concatenate(left) if left else positions
    elif plan.start_step:
        skip = plan.start_step * spec.mini_batch
        positions = np.concatenate([o[skip:] for o in ordered]) if ordered else positions
    return plan.canonical_index(positions)


class EpochRecord:
    """What one rank received in one epoch."""

    def __init__(self) -> None:
        self.indices: List[np.ndarray] = []
        self.skipped: List[np.ndarray] = []
        self.steps = 0

    def add(self, indices: np.ndarray, skipped: np.ndarray) -> None:
        self.indices.append(np.asarray(indices, dtype=np.int64).reshape(-1))
        self.skipped.append(np.asarray(skipped, dtype=np.int64).reshape(-1))
        self.steps += 1

    def as_tuple(self):
        cat = lambda xs: np.concatenate(xs) if xs else np.empty(0, dtype=np.int64)  # noqa: E731
        return cat(self.indices), cat(self.skipped), self.steps


def lost_shards(shards: Sequence[Any]) -> List[Dict[str, Any]]:
    """The damaged shards of a dataset (``ShardInfo``s with ``damage``, or a catalog's), as the audit lists them."""
    damaged = getattr(shards, "damage", None)
    chosen = [shards[i] for i in sorted(damaged)] if isinstance(damaged, Mapping) else [s for s in shards if getattr(s, "damage", None)]
    return [
        {"shard": s.url, "samples_read": int(s.samples), "lost_at_least": int(s.lost), "damage": s.damage}
        for s in chosen
    ]


def check_plan(plan: Plan, left: np.ndarray, lengths: Optional[Lengths] = None) -> Dict[str, Any]:
    """A resumed epoch's plan (all ranks) against ``left``, the draws its epoch had not yet delivered
    (``resume.draws_left``, found without re-planning): draws it would never deliver (but those
    ``last_batch="drop"`` drops) and draws it would deliver again."""
    planned = expected_indices(plan, lengths)
    never = multiset.difference(left, planned)
    again = multiset.difference(planned, left)
    dropped = plan.spec.last_batch is LastBatch.DROP
    return {
        "plan_missing": 0 if dropped else len(never),
        "plan_duplicates": len(again),
        "plan_examples": (never[:0] if dropped else never[:5]).tolist() + again[:5].tolist(),
    }


def summarize(
    epoch: int, ranks: Sequence, expected: np.ndarray, lost: Sequence[Dict[str, Any]] = (),
    stream_of: Optional[Callable[[np.ndarray], np.ndarray]] = None, plan_check: Optional[Dict[str, Any]] = None,
) -> Dict:  # fmt: skip
    """The audit report of an epoch from every rank's ``(indices, skipped, steps)``; ``lost``: the
    dataset's damaged shards (see ``lost_shards``). Samples are compared draw for draw: in a mix a
    sample may be planned more than once an epoch (``stream_of``: each index's stream, counted per
    stream in ``per_stream``, and what the plan delivers of each in ``expected_per_stream``; ``plan_check``:
    a resumed epoch's ``check_plan``, which must be clean too)."""
    indices = np.concatenate([np.asarray(r[0], dtype=np.int64) for r in ranks]) if ranks else np.empty(0, np.int64)
    skipped = np.unique(np.concatenate([np.asarray(r[1], dtype=np.int64) for r in ranks])) if ranks else indices
    unique, counts = np.unique(indices, return_counts=True)
    planned, times = np.unique(np.asarray(expected, dtype=np.int64), return_counts=True)
    got = np.zeros(len(planned), np.int64)
    found = np.isin(unique, planned)
    got[np.searchsorted(planned, unique[found])] = counts[found]
    short = (times > got) & ~np.isin(planned, skipped)
    missing = planned[short]
    steps = [int(r[2]) for r in ranks]
    report = {
        "epoch": int(epoch),
        "ranks": len(ranks),
        "expected": int(times.sum()),
        "delivered": int(len(indices)),
        "duplicates": int(np.maximum(got - times, 0).sum()),
        "missing": int((times - got)[short].sum()),
        "unexpected": int(counts[~found].sum()),
        "skipped": skipped.tolist(),
        "lost": sum(int(entry["lost_at_least"]) for entry in lost),
        "lost_shards": list(lost),
        "steps_per_rank": steps,
        "equal_steps": len(set(steps)) <= 1,
        "missing_examples": missing[:10].tolist(),
        "duplicate_examples": planned[got > times][:10].tolist(),
    }
    if stream_of is not None:  # delivered, and planned to be: with last_batch="drop", less than a stream's draws
        streams = [stream_of(a) if len(a) else np.empty(0, np.int64) for a in (indices, np.asarray(expected, np.int64))]
        width = max((int(x.max()) + 1 for x in streams if len(x)), default=0)
        per = [np.bincount(x, minlength=width).tolist() for x in streams]
        report["per_stream"], report["expected_per_stream"] = per
    if plan_check is not None:
        report.update(plan_check)
    wrong = [report[k] for k in ("duplicates", "missing", "unexpected", "plan_missing", "plan_duplicates") if k in report]
    report["exactly_once"] = not any(wrong) and report["equal_steps"]
    return report
