"""Before the first batch, every rank checks that all planned the same epoch (one small all-gather
through the framework's collectives, ``feed.Ranks``): a clear error on every rank instead of a hang
in the next collective."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Callable, Dict, List, Mapping, Optional

from dali_shards.errors import ConfigError
from dali_shards.options import LastBatch
from dali_shards.session.feed import Ranks


_SUMMARY = ("plan", "rank", "steps", "samples", "shards", "epoch", "world_size", "py_num_workers", "batch_size", "drop")


_NAMES = ("names", "name_set")  # shard names do not change a plan: ranks may read copies named apart


def plan_fingerprint(state: Mapping[str, Any], steps: int, spec: Any, rank: int) -> List[int]:
    """What every rank must agree on before its first batch, as integers (see ``_SUMMARY``): a
    fingerprint of the iterator's ``state_dict()``, its ``len()`` and the batch layout, then a few
    readable figures and the rank."""
    layout = [spec.world_size, spec.py_num_workers, spec.batch_size, spec.last_batch]
    plan_state = {**state, "dataset": {k: v for k, v in state.get("dataset", {}).items() if k not in _NAMES}}
    plan_state.pop("excluded", None)  # each rank's own (the samples its DALI operators failed on)
    blob = json.dumps([plan_state, steps, layout], sort_keys=True, default=str).encode()
    fingerprint = int(hashlib.sha1(blob).hexdigest()[:15], 16)
    epoch = int(state.get("epoch", -1))
    drop = int(spec.last_batch is LastBatch.DROP)
    return [fingerprint, rank, steps, int(spec.num_samples), len(spec.shard_sizes), epoch, *layout[:3], drop]


def check_same_plan(
    ranks: Ranks, world_size: int, summary: Callable[[], List[int]], device_id: Optional[int] = None
) -> None:
    """In a process group (``ranks``) of ``world_size`` ranks, gather every rank's
    :func:`plan_fingerprint` (one all-gather of a few integers, on GPU ``device_id`` where the group
    needs one: every rank must call it) and raise a ``ConfigError`` on every rank unless all planned
    the same epoch, with distinct ranks. Does nothing without such a group (e.g. for a pipeline of
    world size 1 used on one rank only)."""
    if ranks.size() != world_size:
        return
    rows = ranks.gather_ints(summary(), device_id)
    everyone = [dict(zip(_SUMMARY, row)) for row in rows]
    numbers = sorted(s["rank"] for s in everyone)
    if len({s["plan"] for s in everyone}) == 1 and numbers == list(range(world_size)):
        return
    problem = _plan_problem(numbers, world_size)
    raise ConfigError(f"{problem}. Going on would hang the next collective. {_describe(everyone)}")


def _plan_problem(ranks: List[int], world_size: int) -> str:
    if ranks != list(range(world_size)):
        return f"the pipelines' ranks are {ranks}, not 0..{world_size - 1}: leave rank unset or pass dist.get_rank()"
    return (
        "the ranks planned different epochs: give every rank the same shards (a shard rewritten while the ranks "
        "started does this too: use a manifest), the same options and the same resume state"
    )


def _describe(everyone: List[Dict[str, int]]) -> str:
    return "The ranks: " + "; ".join(
        f"process {i} (pipeline rank {s['rank']}): {s['steps']} steps, {s['samples']} samples in {s['shards']} "
        f"shards, epoch {s['epoch']}, world_size={s['world_size']}, py_num_workers={s['py_num_workers']}, "
        f"batch_size={s['batch_size']}, last_batch={'drop' if s['drop'] else 'pad'}, plan {s['plan']:x}"
        for i, s in enumerate(everyone)
    )
