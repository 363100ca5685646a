"""Run by tests/test_plan_check.py under torchrun: pipelines built before the process group (as
the training example does), then a DDP-like loop with a collective per step.

``same``: every rank reads its own copy of the same shards. ``differ``: rank 1's copy has a
shorter shard (as if rewritten between the ranks' starts). Rank 0 also runs a world-size-1
pipeline alone, as a validation loop on rank 0 only would. Each rank writes what happened.
"""

import json
import os
import sys

import torch
import torch.distributed as dist

from dali_shards import ConfigError
from dali_shards.pytorch import DALIShardedIterator
from dali_shards.sample_data import write_sample_shards
from dali_shards.testing.pipelines import identity_pipeline


def make(paths, **kw):
    return identity_pipeline(paths, ("__index__",), batch_size=4, py_num_workers=2, **kw)


def main(out_dir, mode):
    rank = int(os.environ["RANK"])
    sizes = (10, 3) if mode == "differ" and rank == 1 else (10, 7)
    paths = write_sample_shards(os.path.join(out_dir, f"data-{rank}"), shard_sizes=sizes)
    train = DALIShardedIterator(make(paths)(), ["index"])  # world and rank from WORLD_SIZE / RANK
    alone = DALIShardedIterator(make(paths, world_size=1, rank=0)(), ["index"]) if rank == 0 else None
    dist.init_process_group("gloo")
    result = {"rank": rank}
    if alone is not None:  # no collective for a pipeline of world size 1: must not wait for rank 1
        result["alone"] = sum(1 for _ in alone)
    try:
        steps = 0
        for _ in train:
            total = torch.tensor([1])
            dist.all_reduce(total)  # as DDP's gradient sync: unequal steps would hang here
            steps += 1
        result["steps"] = steps
    except ConfigError as exc:
        result["error"] = str(exc)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
