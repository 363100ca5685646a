"""Samples/s of dali_shards vs DALI's native webdataset reader vs the plain #4892 workaround.

All three read the same shards with the same batch size, workers and threads, in one run, in two
modes: bytes only (the encoded JPEG and its label) and CPU decode + resize to 224x224. Loaders are
measured in interleaved rounds (A B C A B C ...) so that machine noise hits all of them alike, and
each loader runs in a process of its own, and each figure is the median over rounds. Prints a table, writes JSON. Example::

    python benchmarks/throughput.py --samples 8192 --batch-size 256 --workers 2
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from nvidia.dali import fn, pipeline_def  # noqa: E402

from bench_data import build_bench_shards  # noqa: E402
from dali_shards import decode_image, sharded_pipeline  # noqa: E402
from plain_workaround import plain_pipeline  # noqa: E402


def post_processing(mode, device_id):
    def post(jpg, label):
        if mode == "bytes":
            return jpg, label
        images = decode_image(jpg, device="mixed" if device_id is not None else "cpu")
        return fn.resize(images, size=(224, 224)), label

    return post


def make_loaders(args, shards, mode):
    post = post_processing(mode, args.device_id)
    common = dict(batch_size=args.batch_size, num_threads=args.threads, device_id=args.device_id)

    def ours():
        @sharded_pipeline(
            shards,
            fields=("jpg", "cls"),
            py_num_workers=args.workers,
            shuffle=True,
            seed=0,
            shuffle_buffer=1024,
            **common,
        )
        def pipe(jpg, cls):
            return post(jpg, cls)

        return pipe()

    def native():
        @pipeline_def(**common)
        def pipe():
            jpg, cls = fn.readers.webdataset(
                paths=shards, ext=["jpg", "cls"], random_shuffle=True, initial_fill=1024, seed=0, name="reader"
            )
            return post(jpg, cls)

        return pipe()

    def plain():
        return plain_pipeline(
            shards, args.batch_size, args.workers, post, num_threads=args.threads, device_id=args.device_id
        )

    return {"dali_shards": ours, "native_webdataset": native, "plain_4892": plain}


LOADERS = ("dali_shards", "native_webdataset", "plain_4892")


def run_steps(pipe, steps):
    """Run ``steps`` iterations; returns seconds. Resets at the epoch end of iterable sources."""
    t0 = time.perf_counter()
    done = 0
    while done < steps:
        try:
            pipe.run()
        except StopIteration:
            pipe.reset()
            continue
        done += 1
    return time.perf_counter() - t0


def measure_one(args, shards, mode, loader):
    """In this process: build one loader, warm it up for an epoch, time ``--epochs`` epochs."""
    steps = math.ceil(args.samples / args.batch_size)
    pipe = make_loaders(args, shards, mode)[loader]()
    t0 = time.perf_counter()
    pipe.build()
    run_steps(pipe, 1)
    first_batch = time.perf_counter() - t0
    run_steps(pipe, steps - 1)
    rates = [steps * args.batch_size / run_steps(pipe, steps) for _ in range(args.epochs)]
    return {"samples_per_s": statistics.median(rates), "epochs": rates, "first_batch_s": first_batch}


def measure(args, mode):
    """Each loader in its own process (no background prefetching of the others), in interleaved
    rounds; the median over rounds."""
    runs = {name: [] for name in LOADERS}
    for _ in range(args.rounds):
        for name in LOADERS:
            cmd = [
                sys.executable,
                os.path.abspath(__file__),
                "--child",
                name,
                "--modes",
                mode,
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
                "--data-dir",
                args.data_dir,
            ]
            if args.device_id is not None:
                cmd += ["--device-id", str(args.device_id)]
            out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
            runs[name].append(json.loads(out.strip().splitlines()[-1]))
    return {
        name: {
            "samples_per_s": statistics.median(r["samples_per_s"] for r in rs),
            "rounds": [r["samples_per_s"] for r in rs],
            "first_batch_s": statistics.median(r["first_batch_s"] for r in rs),
        }
        for name, rs in runs.items()
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=8192, help="dataset size (a multiple of batch size)")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2, help="py_num_workers")
    ap.add_argument("--threads", type=int, default=2, help="DALI num_threads")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; each runs every loader once")
    ap.add_argument("--epochs", type=int, default=2, help="timed epochs per loader and round (after a warm-up epoch)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--modes", default="bytes,decode")
    ap.add_argument("--device-id", type=int, default=None, help="GPU id for mixed decode (default: CPU only)")
    ap.add_argument("--data-dir", default=os.path.join(HERE, "data"))
    ap.add_argument("--out", default=os.path.join(HERE, "results", "throughput.json"))
    args = ap.parse_args(argv)
    per_shard = 512
    if args.samples % (per_shard * args.workers):
        ap.error(f"--samples must be a multiple of {per_shard} x workers (the plain workaround needs equal shares)")
    shards = build_bench_shards(args.data_dir, num_samples=args.samples, samples_per_shard=per_shard)
    if args.child:
        print(json.dumps(measure_one(args, shards, args.modes, args.child)))
        return None
    mean_kb = sum(os.path.getsize(p) for p in shards) / args.samples / 1024
    results = {}
    for mode in args.modes.split(","):
        print(f"measuring {mode} ...", flush=True)
        results[mode] = measure(args, mode)
    ratios = {
        "decode_vs_native": results.get("decode", {}).get("dali_shards", {}).get("samples_per_s", 0)
        / max(1e-9, results.get("decode", {}).get("native_webdataset", {}).get("samples_per_s", 0)),
        "bytes_vs_plain_4892": results.get("bytes", {}).get("dali_shards", {}).get("samples_per_s", 0)
        / max(1e-9, results.get("bytes", {}).get("plain_4892", {}).get("samples_per_s", 0)),
        "decode_vs_plain_4892": results.get("decode", {}).get("dali_shards", {}).get("samples_per_s", 0)
        / max(1e-9, results.get("decode", {}).get("plain_4892", {}).get("samples_per_s", 0)),
        "bytes_vs_native": results.get("bytes", {}).get("dali_shards", {}).get("samples_per_s", 0)
        / max(1e-9, results.get("bytes", {}).get("native_webdataset", {}).get("samples_per_s", 0)),
    }
    report = {
        "config": {k: v for k, v in vars(args).items() if k not in ("out", "data_dir")},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "data": {"shards": len(shards), "samples": args.samples, "mean_kb_per_sample": round(mean_kb, 1)},
        "results": results,
        "ratios": ratios,
    }
    print()
    print(
        f"{args.samples} JPEGs ({mean_kb:.0f} KB avg) in {len(shards)} shards, batch {args.batch_size}, "
        f"{args.workers} workers, {args.threads} threads, {os.cpu_count()} CPUs; median of {args.rounds} rounds, "
        "each loader in its own process"
    )
    print(f"{'mode':8} {'loader':20} {'samples/s':>10} {'first batch s':>14}")
    for mode, per_loader in results.items():
        for name, r in per_loader.items():
            print(f"{mode:8} {name:20} {r['samples_per_s']:10.0f} {r['first_batch_s']:14.2f}")
    print()
    for name, value in ratios.items():
        if value:
            print(f"{name:24} {value:5.2f}x")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"\nwrote {args.out}")
    return report


if __name__ == "__main__":
    main()
