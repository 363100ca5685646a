"""Samples/s of dali_shards vs DALI's native webdataset reader vs the plain #4892 workaround.

All three read the same shards with the same batch size, workers and threads, in one run, in two
modes: bytes only (the encoded JPEG reaches Python, no decoding) and CPU decode + resize to 224x224.
Loaders are measured in interleaved rounds (A B C A B C ...), each in a process of its own, so that
machine noise hits all of them alike; each figure is the median over rounds. Prints a table and
writes JSON. (``compare.py`` adds webdataset + DataLoader, DALI Proxy, memory and an audit;
``--map-cost`` adds what ``map=`` costs, see ``map_cost.py``.)

    python benchmarks/throughput.py --samples 8192 --batch-size 256 --workers 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from harness import bench_dir, child_main, run_child  # noqa: E402

LOADERS = ("dali_shards", "native_webdataset", "plain_4892")
CHECK_OFF = "dali_shards, image_check=off"  # the worker-side image check's cost: the same loader without it


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=8192, help="dataset size (a multiple of 512 x workers)")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2, help="py_num_workers")
    ap.add_argument("--threads", type=int, default=2, help="DALI num_threads")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; each runs every loader once")
    ap.add_argument("--epochs", type=int, default=2, help="timed epochs per loader and round (after a warm-up epoch)")
    ap.add_argument("--modes", default="bytes,decode")
    ap.add_argument("--device-id", type=int, default=None, help="GPU id for mixed decode (default: CPU only)")
    ap.add_argument("--data-dir", default=os.path.join(HERE, "data"))
    ap.add_argument("--out", default=os.path.join(HERE, "results", "throughput.json"))
    ap.add_argument("--map-cost", action="store_true", help="also measure map= (identity and JSON -> arrays)")
    ap.add_argument(
        "--image-check-cost",
        action="store_true",
        help=f"also measure dali_shards without its image check ('{CHECK_OFF}')",
    )
    args = ap.parse_args(argv)
    if args.samples % (512 * args.workers):
        ap.error("--samples must be a multiple of 512 x workers (the plain workaround needs equal shares)")
    from bench_data import build_bench_shards

    shards = build_bench_shards(bench_dir(args.data_dir, args.samples, 512), num_samples=args.samples)
    mean_kb = sum(os.path.getsize(p) for p in shards) / args.samples / 1024
    results = {}
    for mode in [m for m in args.modes.split(",") if m]:  # --modes '' measures only what --map-cost adds
        print(f"measuring {mode} ...", flush=True)
        names = LOADERS + ((CHECK_OFF,) if args.image_check_cost else ())
        runs = {name: [] for name in names}
        for _ in range(args.rounds):
            for name in names:
                cmd = [
                    "--child",
                    "throughput",
                    "--loader",
                    "dali_shards" if name == CHECK_OFF else name,
                    "--options",
                    json.dumps({"image_check": "off"} if name == CHECK_OFF else {}),
                    "--mode",
                    mode,
                    "--data-dir",
                    args.data_dir,
                    "--samples",
                    str(args.samples),
                    "--batch-size",
                    str(args.batch_size),
                    "--workers",
                    str(args.workers),
                    "--threads",
                    str(args.threads),
                    "--epochs",
                    str(args.epochs),
                ]
                if args.device_id is not None:
                    cmd += ["--device-id", str(args.device_id)]
                result = run_child(os.path.abspath(__file__), cmd, timeout=1800)
                if "error" in result:
                    raise SystemExit(f"{name} ({mode}) failed: {result['error']}")
                runs[name].append(result)
        results[mode] = {
            name: {
                "samples_per_s": statistics.median(r["samples_per_s"] for r in rs),
                "rounds": [r["samples_per_s"] for r in rs],
                "first_batch_s": statistics.median(r["first_batch_s"] for r in rs),
                "peak_memory_mb": max(r["peak_memory_mb"] for r in rs),
            }
            for name, rs in runs.items()
        }

    def ratio(mode, other):
        r = results.get(mode, {})
        return r["dali_shards"]["samples_per_s"] / r[other]["samples_per_s"] if r and other in r else None

    ratios = {
        "decode_vs_native": ratio("decode", "native_webdataset"),
        "bytes_vs_plain_4892": ratio("bytes", "plain_4892"),
        "decode_vs_plain_4892": ratio("decode", "plain_4892"),
        "bytes_vs_native": ratio("bytes", "native_webdataset"),
    }
    if args.image_check_cost:
        ratios.update({f"{mode}_image_check_vs_off": ratio(mode, CHECK_OFF) for mode in results})
    if args.map_cost:
        from map_cost import measure_map_cost

        map_report = measure_map_cost(os.path.abspath(__file__), args)
        ratios.update({f"identity_map_cost_{w}_workers": c for w, c in map_report["identity_map_cost"].items()})
    report = {
        "config": {k: v for k, v in vars(args).items() if k not in ("out", "data_dir")},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "data": {"shards": len(shards), "samples": args.samples, "mean_kb_per_sample": round(mean_kb, 1)},
        "results": results,
        "ratios": ratios,
    }
    if args.map_cost:
        report["map"] = map_report
    print()
    print(
        f"{args.samples} JPEGs ({mean_kb:.0f} KB avg) in {len(shards)} shards, batch {args.batch_size}, "
        f"{args.workers} workers, {args.threads} threads, {os.cpu_count()} CPUs; median of {args.rounds} rounds, "
        "each loader in its own process"
    )
    print(f"{'mode':8} {'loader':30} {'samples/s':>10} {'first batch s':>14}")
    for mode, per_loader in results.items():
        for name, r in per_loader.items():
            print(f"{mode:8} {name:30} {r['samples_per_s']:10.0f} {r['first_batch_s']:14.2f}")
    print()
    for name, value in ratios.items():
        if value:
            print(f"{name:30} {value:5.2f}x")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"\nwrote {args.out}")
    return report


if __name__ == "__main__":
    if "--child" in sys.argv:
        child_main()
    else:
        main()
