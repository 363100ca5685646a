"""dali_shards against the loaders an ML engineer would pick instead, on the same shards and machine.

Loaders (see ``loaders.py``): dali_shards; DALI's native ``fn.readers.webdataset`` sharded by rank; the
#4892 workaround as posted; webdataset + torch DataLoader (PIL + torchvision transforms); DALI Proxy
(DataLoader workers feeding a DALI pipeline). Measured, each loader in a fresh process:

1. samples/s bytes-only and with decode + augment (random-resized-crop 224, flip, normalize), time to
   first batch, peak memory of all the loader's processes (PSS); medians of interleaved rounds;
2. a scaling table over Python workers (augment), medians of interleaved rounds;
3. an exactly-once audit: 4 simulated ranks, 2 epochs, uneven shards (one empty): duplicates and
   missing samples per epoch, and steps per rank (unequal steps hang DDP at the epoch's end).

Writes ``results/compare.json``, ``results/compare.md`` and ``results/compare.png``.

    python benchmarks/compare.py                 # about 35 minutes on 2 CPUs
    python benchmarks/compare.py --quick         # a small smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from harness import bench_dir, child_main, interleaved, run_child  # noqa: E402

LABELS = {
    "dali_shards": "dali_shards",
    "native_webdataset": "DALI fn.readers.webdataset",
    "plain_4892": "#4892 workaround (plain)",
    "webdataset_dataloader": "webdataset + DataLoader",
    "dali_proxy": "DALI Proxy",
}


def child_args(args, kind, loader, mode, **extra):
    out = [
        "--child",
        kind,
        "--loader",
        loader,
        "--mode",
        mode,
        "--data-dir",
        args.data_dir,
        "--batch-size",
        str(extra.get("batch_size", args.batch_size)),
        "--threads",
        str(args.threads),
        "--workers",
        str(extra.get("workers", args.workers)),
        "--samples",
        str(extra.get("samples", args.samples)),
        "--per-shard",
        str(extra.get("per_shard", 512)),
        "--epochs",
        str(extra.get("epochs", args.epochs)),
    ]
    if "rank" in extra:
        out += ["--rank", str(extra["rank"]), "--world-size", str(extra["world_size"])]
    if args.device_id is not None:
        out += ["--device-id", str(args.device_id)]
    return out


def audit(args, loader):
    from bench_data import build_audit_shards

    total = sum(_audit_sizes())
    build_audit_shards(os.path.join(args.data_dir, "audit"))
    ranks = [
        run_child(
            __file__,
            child_args(
                args,
                "audit",
                loader,
                "decode",
                rank=r,
                world_size=args.audit_ranks,
                batch_size=args.audit_batch,
                epochs=2,
            ),
            args.timeout,
        )
        for r in range(args.audit_ranks)
    ]
    if any("not_applicable" in r for r in ranks):
        return {"not_applicable": ranks[0]["not_applicable"]}
    failed = {str(r): res["error"] for r, res in enumerate(ranks) if "error" in res}
    done = [res for res in ranks if "error" not in res]
    if not done:
        return {"error": next(iter(failed.values())), "failed_ranks": failed}
    epochs = []
    for e in range(2):
        counts = Counter(i for r in done for i in r["ids"][e])
        steps = [r["steps"][e] if "error" not in r else None for r in ranks]
        epochs.append(
            {
                "duplicates": sum(c - 1 for c in counts.values()),
                "missing": total - len(counts),
                "steps_per_rank": steps,
                "equal_steps": len(set(steps)) == 1 and None not in steps,
            }
        )
    return {"samples": total, "epochs": epochs, "failed_ranks": failed}


def measure_scaling(args, loaders, counts):
    """Decode + augment at each worker count, every (loader, count) once per round in interleaved
    rounds (odd rounds in reverse order), so that machine noise hits them alike; medians."""
    from bench_data import build_bench_shards

    per_shard = args.scaling_samples // 16
    build_bench_shards(bench_dir(args.data_dir, args.scaling_samples, per_shard), num_samples=args.scaling_samples,
                       samples_per_shard=per_shard)  # fmt: skip
    def one(round_, cell):
        name, w = cell
        print(f"scaling round {round_} {name} with {w} workers ...", flush=True)
        extra = dict(workers=w, samples=args.scaling_samples, epochs=args.scaling_epochs, per_shard=per_shard,
                     batch_size=max(w, args.batch_size // w * w))  # fmt: skip
        return run_child(__file__, child_args(args, "throughput", name, "augment", **extra), args.timeout)

    cells = [(name, w) for name in loaders for w in counts]
    runs = dict(zip(cells, interleaved(cells, args.scaling_rounds, one)))
    return {name: {str(w): _median_run(runs[(name, w)]) for w in counts} for name in loaders}


def _median_run(runs):
    """The median run by samples/s (errors and n/a results pass through), with all rounds' rates."""
    good = sorted((r for r in runs if "samples_per_s" in r), key=lambda r: r["samples_per_s"])
    if not good:
        return runs[0]
    return {**good[(len(good) - 1) // 2], "rounds": [r.get("samples_per_s") for r in runs]}


def _audit_sizes():
    from bench_data import AUDIT_SHARD_SIZES

    return AUDIT_SHARD_SIZES


def markdown(report) -> str:
    cfg = report["config"]
    lines = [
        f"{cfg['samples']} JPEGs (~500x375 px, {report['data']['mean_kb_per_sample']:.0f} KB) in "
        f"{report['data']['shards']} shards; batch {cfg['batch_size']}, {cfg['workers']} workers, "
        f"{cfg['threads']} DALI threads; {report['machine']['cpus']} CPUs, "
        f"{'GPU ' + str(cfg['device_id']) if cfg['device_id'] is not None else 'no GPU (CPU decode)'}.",
        "",
        "| loader | bytes only, samples/s | decode + augment, samples/s | first batch, s | peak memory, MB "
        "| audit: duplicates / missing (epoch 0; 1) | audit: steps of ranks 0-3 (epoch 0; 1) |",
        "| --- | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for name in report["loaders"]:
        t = report["throughput"]
        b, a = t["bytes"].get(name, {}), t["augment"].get(name, {})
        au = report["audit"].get(name, {})
        if "epochs" in au:
            dm = "; ".join(f"{e['duplicates']} / {e['missing']}" for e in au["epochs"])
            steps = "; ".join(
                ", ".join("failed" if s is None else str(s) for s in e["steps_per_rank"]) for e in au["epochs"]
            )
            if au.get("failed_ranks"):
                reason = next(iter(au["failed_ranks"].values()))
                steps += f" (ranks {', '.join(au['failed_ranks'])} failed: {reason[:80]})"
        else:
            dm = steps = au.get("error", au.get("not_applicable", "n/a"))[:60]
        lines.append(
            f"| {LABELS[name]} | {_fmt(b)} | {_fmt(a)} | {a.get('first_batch_s', float('nan')):.2f} | "
            f"{a.get('peak_memory_mb', float('nan')):.0f} | {dm} | {steps} |"
        )
    ratios = report["ratios"]
    lines += [
        "",
        "Ratios (dali_shards / other, decode + augment): "
        + ", ".join(f"{LABELS[k]} {v:.2f}x" for k, v in ratios.items() if v),
    ]
    if report.get("scaling"):
        counts = report["config"]["scaling"]
        lines += [
            "",
            "Scaling over Python workers (decode + augment, samples/s; medians of interleaved rounds):",
            "",
            "| loader | " + " | ".join(f"{w} workers" for w in counts) + f" | {counts[-1]} vs {counts[0]} |",
            "| --- | " + " | ".join("---:" for _ in counts) + " | ---: |",
        ]
        for name, row in report["scaling"].items():
            first, last = (row.get(str(w), {}).get("samples_per_s") for w in (counts[0], counts[-1]))
            ratio = f"{last / first:.2f}x" if first and last else "n/a"
            lines.append(f"| {LABELS[name]} | " + " | ".join(_fmt(row.get(str(w), {})) for w in counts) + f" | {ratio} |")
    return "\n".join(lines) + "\n"


def _fmt(r) -> str:
    if "samples_per_s" in r:
        return f"{r['samples_per_s']:,.0f}"
    if "not_applicable" in r:
        return "n/a"
    return "error" if r else "-"


def plot(report, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    thousands = FuncFormatter(lambda x, _: f"{x / 1000:g}k" if x >= 1000 else f"{x:.0f}")

    names = report["loaders"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for ax, mode in zip(axes, ("bytes", "augment")):
        values = [report["throughput"][mode].get(n, {}).get("samples_per_s", 0) for n in names]
        bars = ax.barh(
            [LABELS[n] for n in names], values, color=["#76b900" if n == "dali_shards" else "#999999" for n in names]
        )
        ax.bar_label(bars, labels=[f"{v:,.0f}" if v else "n/a" for v in values], padding=3)
        ax.set_title({"bytes": "bytes only", "augment": "decode + augment"}[mode] + " (samples/s, higher is better)")
        ax.invert_yaxis()
        ax.set_xlim(0, max(values + [1]) * 1.25)
        ax.xaxis.set_major_formatter(thousands)
    fig.tight_layout()
    if report.get("scaling"):
        fig2, ax2 = plt.subplots(figsize=(6, 4))
        counts = report["config"]["scaling"]
        for name, row in report["scaling"].items():
            ax2.plot(
                counts,
                [row.get(str(w), {}).get("samples_per_s", float("nan")) for w in counts],
                marker="o",
                label=LABELS[name],
            )
        ax2.set_xlabel("Python workers")
        ax2.set_ylabel("samples/s (decode + augment)")
        ax2.set_xticks(counts)
        ax2.legend(fontsize=8)
        fig2.tight_layout()
        fig2.savefig(path.replace(".png", "-scaling.png"), dpi=110)
    fig.savefig(path, dpi=110)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--samples", type=int, default=8192)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=2, help="timed epochs per measurement (after a warm-up epoch)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the throughput measurements")
    ap.add_argument("--scaling", default=None, help="worker counts for the scaling table (default 1,2,4,8; '' skips)")
    ap.add_argument("--scaling-samples", type=int, default=2048)
    ap.add_argument("--scaling-rounds", type=int, default=3, help="interleaved rounds of the scaling table (median)")
    ap.add_argument("--scaling-epochs", type=int, default=2, help="timed epochs per scaling measurement")
    ap.add_argument("--audit-ranks", type=int, default=4)
    ap.add_argument("--audit-batch", type=int, default=32)
    ap.add_argument("--loaders", default=",".join(LABELS))
    ap.add_argument("--device-id", type=int, default=None, help="GPU for DALI's mixed decode (default: CPU only)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds before a measurement counts as hung")
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    ap.add_argument("--from-json", help="only rewrite the markdown and plots from a saved compare.json")
    ap.add_argument("--data-dir", default=os.path.join(HERE, "data"))
    ap.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    args = ap.parse_args(argv)
    if args.from_json:
        with open(args.from_json) as f:
            report = json.load(f)
        write_report(report, args.out_dir)
        return report
    if args.quick:
        args.samples, args.batch_size, args.epochs, args.scaling_samples, args.rounds = 384, 64, 1, 256, 1
        args.scaling_rounds, args.scaling_epochs, args.audit_ranks = 1, 1, 2
    if args.scaling is None:
        args.scaling = "1,2" if args.quick else "1,2,4,8"
    from bench_data import build_bench_shards

    loaders = args.loaders.split(",")
    shards = build_bench_shards(bench_dir(args.data_dir, args.samples, 512), num_samples=args.samples)
    mean_kb = sum(os.path.getsize(p) for p in shards) / args.samples / 1024
    throughput = {"bytes": {}, "augment": {}}
    for mode in throughput:
        runs = {name: [] for name in loaders}
        for round_ in range(args.rounds):  # interleaved rounds: noise hits every loader alike
            for name in loaders:
                print(f"throughput {mode:8} round {round_} {name} ...", flush=True)
                runs[name].append(run_child(__file__, child_args(args, "throughput", name, mode), args.timeout))
        throughput[mode] = {name: _median_run(rs) for name, rs in runs.items()}
    counts = [int(w) for w in args.scaling.split(",") if w]
    scaling = measure_scaling(args, loaders, counts) if counts else {}
    audits = {}
    for name in loaders:
        print(f"exactly-once audit {name} ...", flush=True)
        audits[name] = audit(args, name)

    def rate(mode, name):
        return throughput[mode].get(name, {}).get("samples_per_s")

    ours = rate("augment", "dali_shards")
    ratios = {
        n: (ours / rate("augment", n)) if ours and rate("augment", n) else None for n in loaders if n != "dali_shards"
    }
    report = {
        "config": {
            **{k: v for k, v in vars(args).items() if k not in ("data_dir", "out_dir", "loaders")},
            "scaling": counts,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "device": _device_name(args.device_id),
        },
        "data": {"shards": len(shards), "samples": args.samples, "mean_kb_per_sample": mean_kb},
        "loaders": loaders,
        "throughput": throughput,
        "scaling": scaling,
        "audit": audits,
        "ratios": ratios,
    }
    write_report(report, args.out_dir)
    return report


def write_report(report, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "compare.json"), "w") as f:
        json.dump(report, f, indent=1)
    text = markdown(report)
    with open(os.path.join(out_dir, "compare.md"), "w") as f:
        f.write(text)
    plot(report, os.path.join(out_dir, "compare.png"))
    print()
    print(text)
    print(f"wrote {out_dir}/compare.json, compare.md, compare.png")


def _device_name(device_id):
    if device_id is None:
        return "CPU"
    try:
        import torch

        return torch.cuda.get_device_name(device_id)
    except Exception:  # noqa: BLE001
        return f"GPU {device_id}"


if __name__ == "__main__":
    if "--child" in sys.argv:
        child_main()
    else:
        main()
