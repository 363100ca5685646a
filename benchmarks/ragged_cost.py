"""What ``DALIShardedIterator`` spends per batch on outputs whose samples differ in shape, and on keys.

A batch of ``--batch`` samples, each with 0-19 boxes (float32, (n, 4)), their labels (int32, (n,)) and
a key of 10-30 characters, as DALI hands them over (CPU TensorLists), is converted as the iterator
converts it (``dali_shards.pytorch.outputs.BatchOutputs``): ``ragged="list"`` (a tensor per sample),
``ragged="pad"`` (one zero-padded tensor and the shapes) and keys as ``str``; beside it, what DALI's own
iterator spends on one dense output of the same bytes (``(batch, 19, 4)`` float32: ``as_tensor`` and a
copy into a torch tensor). Median of ``--rounds`` rounds of ``--reps`` batches each. Prints a table and
writes JSON.

    python benchmarks/ragged_cost.py --batch 256
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np
import torch
from nvidia.dali.plugin.pytorch import feed_ndarray
from nvidia.dali.tensors import TensorListCPU

from dali_shards.pytorch.outputs import BatchOutputs

HERE = os.path.dirname(os.path.abspath(__file__))


def batch_outputs(batch: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 20, size=batch)
    boxes = TensorListCPU([rng.random((n, 4), dtype=np.float32) for n in counts])
    labels = TensorListCPU([rng.integers(1, 91, size=n).astype(np.int32) for n in counts])
    keys = TensorListCPU([np.frombuffer(f"n{i:08d}_{'x' * (i % 21)}".encode(), np.uint8) for i in range(batch)])
    dense = TensorListCPU(rng.random((batch, 19, 4), dtype=np.float32))
    return boxes, labels, keys, dense


def per_batch(convert, reps: int) -> float:
    start = time.perf_counter()
    for _ in range(reps):
        convert()
    return (time.perf_counter() - start) / reps * 1e6


def cases(batch: int):
    boxes, labels, keys, dense = batch_outputs(batch)
    as_list = BatchOutputs(["boxes", "labels"], ragged="list", always=["boxes", "labels"])
    as_pad = BatchOutputs(["boxes", "labels"], ragged="pad", always=["boxes", "labels"])
    as_keys = BatchOutputs(["keys"], keys=["keys"])

    def converted(outs: BatchOutputs, batch: list) -> None:
        outs.prepare(batch)
        outs.finish({})

    def dali_dense():
        tensor = dense.as_tensor()
        out = torch.empty(tensor.shape(), dtype=torch.float32)
        feed_ndarray(tensor, out)

    return {
        "dense (DALI's own copy, (B, 19, 4) float32)": dali_dense,
        "ragged='list': boxes + labels": lambda: converted(as_list, [boxes, labels]),
        "ragged='pad': boxes + labels (+ shapes)": lambda: converted(as_pad, [boxes, labels]),
        "__key__ as str": lambda: converted(as_keys, [keys]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json", default=os.path.join(HERE, "results", "ragged_cost.json"))
    args = ap.parse_args()
    convert = cases(args.batch)
    times = {name: [] for name in convert}
    for _ in range(args.rounds):  # cases interleaved within each round
        for name, fn in convert.items():
            times[name].append(per_batch(fn, args.reps))
    rows = {name: statistics.median(t) for name, t in times.items()}
    print(f"batch {args.batch}, median of {args.rounds} rounds x {args.reps} batches, CPU tensors")
    print(f"{'output':<48} {'us/batch':>10} {'us/sample':>10}")
    for name, us in rows.items():
        print(f"{name:<48} {us:>10.0f} {us / args.batch:>10.2f}")
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"batch": args.batch, "rounds": args.rounds, "reps": args.reps, "us_per_batch": rows}, f, indent=1)


if __name__ == "__main__":
    main()
