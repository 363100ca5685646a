"""How mixed the batches are: distinct classes per per-rank batch, as a fraction of what an ideal
global shuffle gives, on ImageNet-like shards that are class-sorted or pre-shuffled.

Pure: the batches are the plan's (``EpochPlan.iter_worker_order``), so nothing is read; the
ideal is exact (distinct classes among ``batch`` samples drawn without replacement). Prints a
table and writes JSON and Markdown, for each ``shuffle_block`` given (0: a contiguous run per
worker through the shuffle buffer, the planner before interleaving). Peers (DALI's reader,
WebDataset + DataLoader) are measured with ``--peers``, reading smaller class-sorted shards from
disk; MosaicML Streaming is not.

    python benchmarks/shuffle_quality.py --classes 1000 --per-class 1281 --shard-size 1000
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from dali_shards.plan.epoch import PlanSpec  # noqa: E402
from dali_shards.tools.labels import expected_distinct  # noqa: E402


def class_mix(spec: PlanSpec, labels: np.ndarray, steps: int, epoch: int = 0) -> float:
    """Mean distinct labels per per-rank batch over the first ``steps`` steps of every rank."""
    plan = spec.epoch(epoch)
    m, distinct = spec.mini_batch, []
    for rank in range(spec.world_size):
        orders = []
        for w in range(spec.py_num_workers):
            pairs = itertools.islice(plan.iter_worker_order(rank * spec.py_num_workers + w), steps * m)
            orders.append(plan.canonical_index([p for p, _ in pairs]))
        for s in range(min(steps, len(orders[0]) // m)):
            batch = np.concatenate([o[s * m : (s + 1) * m] for o in orders])
            distinct.append(len(np.unique(labels[batch])))
    return statistics.mean(distinct)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--per-class", type=int, default=1281)
    ap.add_argument("--shard-size", type=int, default=1000)
    ap.add_argument("--ranks", default="1,2,4,8")
    ap.add_argument("--workers", default="1,2,4,8")
    ap.add_argument("--batches", default="32,256")
    ap.add_argument("--steps", type=int, default=20, help="steps measured per rank")
    ap.add_argument("--shuffle-buffer", type=int, default=None, help="default: the options' default")
    ap.add_argument("--blocks", default="0,64,256", help="shuffle_block values (0: contiguous runs + buffer)")
    ap.add_argument("--peers", action="store_true", help="also read class-sorted shards with the real loaders")
    ap.add_argument("--peer-data", default="200,130,100,32", help="classes,per_class,shard_size,batch of --peers")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "shuffle_quality"))
    args = ap.parse_args(argv)
    total = args.classes * args.per_class
    sizes = tuple(min(args.shard_size, total - i) for i in range(0, total, args.shard_size))
    sorted_labels = np.arange(total) // args.per_class  # canonical order class by class
    shuffled_labels = sorted_labels[np.random.default_rng(0).permutation(total)]
    extra = {} if args.shuffle_buffer is None else {"shuffle_buffer": args.shuffle_buffer}
    rows = []
    blocks = [int(b) for b in args.blocks.split(",")]
    grid = itertools.product(*(map(int, a.split(",")) for a in (args.ranks, args.workers, args.batches)))
    for world, workers, batch in grid:
        if batch % workers:
            continue
        ideal = expected_distinct([args.per_class] * args.classes, batch)
        row = {"ranks": world, "workers": workers, "batch": batch, "ideal_distinct": round(ideal, 1)}
        for block in blocks:
            spec = PlanSpec(sizes, world_size=world, py_num_workers=workers, batch_size=batch, seed=1, shuffle=True,
                            shuffle_block=block, **extra)
            for name, labels in (("class_sorted", sorted_labels), ("pre_shuffled", shuffled_labels)):
                row[f"{name}_block{block}"] = round(class_mix(spec, labels, args.steps) / ideal, 3)
        rows.append(row)
        print(f"{world} ranks x {workers} workers, batch {batch}: class-sorted "
              + ", ".join(f"block {b} {row[f'class_sorted_block{b}']:.2f}" for b in blocks)
              + "; pre-shuffled " + ", ".join(f"block {b} {row[f'pre_shuffled_block{b}']:.2f}" for b in blocks), flush=True)
    report = {"config": vars(args), "rows": rows}
    if args.peers:
        report["peers"] = peers(args)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(report, f, indent=1)
    with open(args.out + ".md", "w") as f:
        cols = [f"{n}_block{b}" for n in ("class_sorted", "pre_shuffled") for b in blocks]
        f.write("| ranks | workers | batch | ideal distinct | " + " | ".join(c.replace("_", " ") for c in cols) + " |\n")
        f.write("|---" * (4 + len(cols)) + "|\n")
        for r in rows:
            cells = [r["ranks"], r["workers"], r["batch"], r["ideal_distinct"], *(r[c] for c in cols)]
            f.write("| " + " | ".join(str(c) for c in cells) + " |\n")
        if args.peers:
            p = report["peers"]
            f.write(f"\nReal loaders on class-sorted shards ({p['setup']}), distinct classes per batch / ideal:\n\n")
            f.write("| loader | class mix |\n|---|---|\n")
            for name, value in p["class_mix"].items():
                f.write(f"| {name} | {value} |\n")
    print(f"wrote {args.out}.json and .md")
    return report


def peers(args) -> dict:
    """The class mix of the real loaders on class-sorted shards on disk (see ``shuffle_peers``)."""
    import tempfile

    from shuffle_peers import measure_peers

    classes, per_class, shard, batch = (int(x) for x in args.peer_data.split(","))
    ideal = expected_distinct([per_class] * classes, batch)
    with tempfile.TemporaryDirectory() as root:
        mix = measure_peers(root, classes, per_class, shard, batch, 2, args.steps, ideal)
    setup = f"{classes} classes x {per_class} in shards of {shard}, batch {batch}, 1 rank x 2 workers"
    for name, value in mix.items():
        print(f"{name}: {value:.2f} of ideal ({setup})", flush=True)
    return {"setup": setup, "class_mix": mix}


if __name__ == "__main__":
    main()
