"""How mixed the batches are: distinct classes per per-rank batch, as a fraction of what an ideal
global shuffle gives, on ImageNet-like shards that are class-sorted or pre-shuffled.

Pure: the batches are the plans' (dali_shards' ``EpochPlan.iter_worker_order``; MosaicML
Streaming's own shuffle and partition functions, see ``streaming_plan``), so nothing is read; the
ideal is exact (distinct classes among ``batch`` samples drawn without replacement). For each
``shuffle_block`` given (0: a contiguous run per worker through the shuffle buffer, the planner
before interleaving) and, if installed, Streaming's ``py1e`` (its default) and ``py1s``. Peers
that must be run (DALI's reader, WebDataset + DataLoader, dali_shards itself) are measured with
``--peers``, reading smaller class-sorted shards from disk. Prints a table, writes JSON, Markdown
and a plot (``--plot``). I/O costs of the same loaders: ``shuffle_io.py``.

    python benchmarks/shuffle_quality.py --classes 1000 --per-class 1281 --shard-size 1000 --peers --plot
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
from streaming_plan import streaming_functions, streaming_rank_batches  # noqa: E402

DATA = ("class_sorted", "pre_shuffled")


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


def streaming_mix(funcs, sizes, algo, world, workers, batch, labels, steps) -> float:
    """Mean distinct labels per per-rank batch of MosaicML Streaming (``streaming_plan``)."""
    batches = streaming_rank_batches(funcs, sizes, algo, world, workers, batch, seed=1, epoch=0, steps=steps)
    return statistics.mean(len(np.unique(labels[ids])) for _, ids in batches)


def measure(args, sizes, labels, blocks, streaming) -> list:
    """One row per (ranks, workers, batch): each planner's class mix / ideal, per kind of data."""
    rows = []
    extra = {} if args.shuffle_buffer is None else {"shuffle_buffer": args.shuffle_buffer}
    grid = itertools.product(*(map(int, a.split(",")) for a in (args.ranks, args.workers, args.batches)))
    for world, workers, batch in grid:
        if batch % workers:
            continue
        ideal = expected_distinct([args.per_class] * args.classes, batch)
        row = {"ranks": world, "workers": workers, "batch": batch, "ideal_distinct": round(ideal, 1)}
        for block in blocks:
            spec = PlanSpec(sizes, world_size=world, py_num_workers=workers, batch_size=batch, seed=1, shuffle=True,
                            shuffle_block=block, **extra)  # fmt: skip
            for name in DATA:
                row[f"{name}_block{block}"] = round(class_mix(spec, labels[name], args.steps) / ideal, 3)
        for algo in ("py1e", "py1s") if streaming else ():
            for name in DATA:
                mix = streaming_mix(streaming, sizes, algo, world, workers, batch, labels[name], args.steps)
                row[f"{name}_streaming_{algo}"] = round(mix / ideal, 3)
        rows.append(row)
        cols = [c for c in row if c.startswith("class_sorted_")]
        print(f"{world} ranks x {workers} workers, batch {batch}: class-sorted "
              + ", ".join(f"{c[len('class_sorted_'):]} {row[c]:.2f}" for c in cols), flush=True)  # fmt: skip
    return rows


def write_markdown(path: str, rows: list, report: dict) -> None:
    cols = [c for name in DATA for c in rows[0] if c.startswith(name)]
    with open(path, "w") as f:
        f.write(report["setup"] + "\n\n")
        f.write("| ranks | workers | batch | ideal distinct | " + " | ".join(c.replace("_", " ") for c in cols) + " |\n")
        f.write("|---" * (4 + len(cols)) + "|\n")
        for r in rows:
            cells = [r["ranks"], r["workers"], r["batch"], r["ideal_distinct"], *(r[c] for c in cols)]
            f.write("| " + " | ".join(str(c) for c in cells) + " |\n")
        f.write("\nRange over the grid (min-max of class mix / ideal):\n\n| planner | class-sorted | pre-shuffled |\n|---|---|---|\n")
        for name, (lo1, hi1, lo2, hi2) in report["ranges"].items():
            f.write(f"| {name} | {lo1:.2f}-{hi1:.2f} | {lo2:.2f}-{hi2:.2f} |\n")
        if "peers" in report:
            p = report["peers"]
            f.write(f"\nReal loaders on class-sorted shards ({p['setup']}), distinct classes per batch / ideal:\n\n")
            f.write("| loader | class mix |\n|---|---|\n")
            for name, value in p["class_mix"].items():
                f.write(f"| {name} | {value} |\n")


def ranges(rows: list) -> dict:
    """Per planner: (min, max) over the grid on class-sorted, then on pre-shuffled shards."""
    out = {}
    for col in (c for c in rows[0] if c.startswith("class_sorted_")):
        planner = col[len("class_sorted_") :]
        a = [r[col] for r in rows]
        b = [r[f"pre_shuffled_{planner}"] for r in rows]
        out[planner] = (min(a), max(a), min(b), max(b))
    return out


def plot(path: str, rows: list) -> None:
    """Class mix on class-sorted shards per configuration, one line per planner, a panel per batch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = sorted({r["batch"] for r in rows})
    fig, axes = plt.subplots(1, len(batches), figsize=(6 * len(batches), 4), squeeze=False, sharey=True)
    for ax, batch in zip(axes[0], batches):
        sub = [r for r in rows if r["batch"] == batch]
        x = np.arange(len(sub))
        for col in (c for c in sub[0] if c.startswith("class_sorted_")):
            ax.plot(x, [r[col] for r in sub], marker="o", label=col[len("class_sorted_") :].replace("_", " "))
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
        ax.set_xticks(x, [f"{r['ranks']}x{r['workers']}" for r in sub], rotation=45)
        ax.set_title(f"class-sorted shards, batch {batch}")
        ax.set_xlabel("ranks x workers")
    axes[0][0].set_ylabel("distinct classes per batch / ideal")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--per-class", type=int, default=1281)
    ap.add_argument("--shard-size", type=int, default=1000)
    ap.add_argument("--ranks", default="1,2,4,8")
    ap.add_argument("--workers", default="1,2,4,8")
    ap.add_argument("--batches", default="32,256")
    ap.add_argument("--steps", type=int, default=20, help="steps measured per rank")
    ap.add_argument("--shuffle-buffer", type=int, default=None, help="default: the options' default")
    ap.add_argument("--blocks", default="0,64,256", help="shuffle_block values (0: contiguous runs + buffer)")
    ap.add_argument("--no-streaming", action="store_true", help="leave MosaicML Streaming out even if installed")
    ap.add_argument("--peers", action="store_true", help="also read class-sorted shards with the real loaders")
    ap.add_argument("--peer-data", default="200,130,100,32", help="classes,per_class,shard_size,batch of --peers")
    ap.add_argument("--plot", action="store_true", help="also write a PNG plot")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "shuffle_quality"))
    args = ap.parse_args(argv)
    total = args.classes * args.per_class
    sizes = tuple(min(args.shard_size, total - i) for i in range(0, total, args.shard_size))
    sorted_labels = np.arange(total) // args.per_class  # canonical order class by class
    labels = {"class_sorted": sorted_labels, "pre_shuffled": sorted_labels[np.random.default_rng(0).permutation(total)]}
    streaming = None if args.no_streaming else streaming_functions()
    rows = measure(args, sizes, labels, [int(b) for b in args.blocks.split(",")], streaming)
    setup = (
        f"{args.classes} classes x {args.per_class} samples in shards of {args.shard_size} ({len(sizes)} shards), "
        f"first {args.steps} steps of every rank, epoch 0, seed 1; dali_shards blockN = shuffle_block N "
        f"(block0: contiguous runs + buffer, the planner before); "
        + (f"MosaicML Streaming {streaming[2]} (one rank per node, its defaults)" if streaming else "Streaming not installed")
    )
    report = {"config": vars(args), "setup": setup, "rows": rows, "ranges": ranges(rows)}
    if args.peers:
        report["peers"] = peers(args)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(report, f, indent=1)
    write_markdown(args.out + ".md", rows, report)
    if args.plot:
        plot(args.out + ".png", rows)
    print(f"wrote {args.out}.json and .md" + (" and .png" if args.plot else ""))
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
