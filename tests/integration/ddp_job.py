"""Run by tests/test_distributed.py under torchrun: a DDP-like loop over a sharded pipeline.

Every step all-reduces something, as DDP's gradient sync does, so ranks with different step
counts would hang; the iterator audits every epoch across the ranks. Rank 0 writes the audits.
"""

import json
import os
import sys

import torch
import torch.distributed as dist

from dali_shards import sharded_pipeline
from dali_shards.pytorch import DALIShardedIterator
from dali_shards.sample_data import write_sample_shards


def main(out_dir, sizes, epochs, batch_size, workers, last_batch):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    data = os.path.join(out_dir, "data")
    if rank == 0:
        write_sample_shards(data, shard_sizes=sizes)
    dist.barrier()

    @sharded_pipeline(
        os.path.join(data, "sample-*.tar"),
        fields=("cls", "__index__"),
        batch_size=batch_size,
        py_num_workers=workers,
        shuffle=True,
        seed=3,
        last_batch=last_batch,
        num_threads=1,
        device_id=None,
    )
    def pipe(cls, index):
        return cls, index

    it = DALIShardedIterator(pipe(), ["label", "index"], audit=True)  # world and rank from torch.distributed
    steps = []
    for _ in range(epochs):
        n = 0
        for (batch,) in it:
            total = torch.tensor([len(batch["index"])])
            dist.all_reduce(total)  # a collective per step: unequal steps would hang here
            n += 1
        steps.append(n)
    if rank == 0:
        with open(os.path.join(out_dir, "audit.json"), "w") as f:
            json.dump({"audits": it.audits, "steps": steps, "world": dist.get_world_size()}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    out, sizes, epochs, batch, workers, last_batch = sys.argv[1:7]
    main(out, [int(s) for s in sizes.split(",")], int(epochs), int(batch), int(workers), last_batch)
