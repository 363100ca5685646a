"""What ``dali-shards plan`` shows: an epoch's plan as a JSON-able summary (pure, no DALI)."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Sequence, Set

import numpy as np

from dali_shards.catalog.shardinfo import ShardInfo
from dali_shards.plan.epoch import PlanSpec
from dali_shards.plan.streaming import StreamingSpec


def _names(shards: Sequence[ShardInfo]) -> List[str]:
    """Shards as the summary names them: file names (with their folders where two are alike), URLs."""
    names = [os.path.basename(s.url) if "://" not in s.url else s.url for s in shards]
    if len(set(names)) < len(names):  # e.g. a mix's streams of the same file names: with their folders
        names = [os.path.join(os.path.basename(os.path.dirname(s.url)), os.path.basename(s.url)) if "://" not in s.url
                 else s.url for s in shards]  # fmt: skip
    return names


def plan_report(spec: PlanSpec, shards: Sequence[ShardInfo], epoch: int, sources: Sequence[Any] = ()) -> Dict[str, Any]:
    """Per rank and worker, the samples, padding and shard reads of ``epoch``; and the totals; for a
    mix (``sources``: its streams' sources), each stream's draws, overall and per worker."""
    plan = spec.epoch(epoch)
    mix = spec.mixture
    begins = plan.canonical_starts[np.asarray(mix.bounds[:-1], dtype=np.int64)] if mix is not None else None
    delivered = np.zeros(len(mix.counts) if mix is not None else 0, np.int64)
    names = _names(shards)
    ranks: List[Dict[str, Any]] = []
    readers: List[Set[int]] = [set() for _ in shards]
    for rank in range(spec.world_size):
        workers = []
        for w in range(spec.py_num_workers):
            v = spec.virtual_worker(rank, w)
            valid = plan.worker_valid_count(v)
            segments = plan.worker_reads(v)
            reads = [{"shard": names[seg.shard], "samples": [seg.first, seg.stop]} for seg in segments]
            for seg in segments:
                readers[seg.shard].add(v)
            worker: Dict[str, Any] = {
                "worker": w,
                "virtual_worker": v,
                "samples": valid,
                "padding": spec.steps_per_epoch * spec.mini_batch - valid,
                "reads": reads,
            }
            if begins is not None:
                stream = np.searchsorted(begins, plan.delivered_order(v, valid), side="right") - 1
                worker["per_stream"] = np.bincount(stream, minlength=len(begins)).tolist()
                delivered += worker["per_stream"]
            workers.append(worker)
        ranks.append({"rank": rank, "steps": spec.steps_per_epoch, "workers": workers})
    summary = {
        "samples": spec.num_samples,
        "shards": len(shards),
        "empty_shards": sum(1 for s in shards if s.samples == 0),
        "world_size": spec.world_size,
        "workers_per_rank": spec.py_num_workers,
        "virtual_workers": spec.num_virtual_workers,
        "batch_size": spec.batch_size,
        "epoch": epoch,
        "shuffle": spec.shuffle,
        "seed": spec.seed,
        "last_batch": spec.last_batch.value,
        "steps_per_rank": spec.steps_per_epoch,
        "delivered": spec.planned_samples,
        "padding": spec.padding_per_epoch,
        "dropped": spec.dropped_per_epoch,
        "readers_per_shard": round(sum(map(len, readers)) / max(1, sum(1 for s in shards if s.samples)), 2),
        "ranks": ranks,
    }
    if mix is not None:
        summary["batching"] = mix.batching.value
        summary["streams"] = [
            {"stream": i, "source": str(sources[i]) if i < len(sources) else None, "shards": b - a,
             "samples": sum(s.samples for s in shards[a:b]), "draws": mix.counts[i],
             "share": mix.counts[i] / max(1, mix.epoch_size), "delivered": int(delivered[i])}
            for i, (a, b) in enumerate(zip(mix.bounds, mix.bounds[1:]))
        ]  # fmt: skip
    return summary


def streaming_report(spec: StreamingSpec, shards: Sequence[ShardInfo], epoch: int) -> Dict[str, Any]:
    """The streaming mode's plan of ``epoch``: per rank and worker, the shards it streams, in the
    order of its first pass over them when the run starts (or resumes) at ``epoch`` (a worker's
    stream then goes on pass after pass, each in a new order when shuffling, across the epochs)."""
    names = _names(shards)
    ranks = [{"rank": rank, "steps": spec.steps_per_epoch, "workers": [
        {"worker": w, "virtual_worker": (v := spec.virtual_worker(rank, w)), "samples": spec.quota,
         "shards": [names[s] for s in spec.cycle_order(v, epoch)]}
        for w in range(spec.py_num_workers)]} for rank in range(spec.world_size)]  # fmt: skip
    return {"mode": "streaming", "samples_per_epoch": spec.samples_per_epoch, "shards": len(shards),
            "world_size": spec.world_size, "workers_per_rank": spec.py_num_workers, "batch_size": spec.batch_size,
            "epoch": epoch, "shuffle": spec.shuffle, "seed": spec.seed, "last_batch": spec.last_batch.value,
            "steps_per_rank": spec.steps_per_epoch, "quota": spec.quota, "ranks": ranks}  # fmt: skip
