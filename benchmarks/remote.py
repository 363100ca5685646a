"""Samples/s of dali_shards streaming from a local S3 server vs local disk, with and without
read-ahead, and with request latency added by a delaying proxy.

The S3 server (moto's standalone server) and the proxy run in processes of their own; every
configuration is measured in a fresh process, in interleaved rounds, median over rounds (see
``harness``). The pipeline delivers the encoded JPEG bytes (no decoding), so storage is the
bottleneck. Workers stream whole shards (contiguous runs, ``shuffle_block=0``: what ``read_ahead``
applies to); interleaved reading over the same servers is measured by ``shuffle_io.py``. Prints a
table, writes JSON and markdown.

    python benchmarks/remote.py --samples 4096 --per-shard 64 --latency-ms 50
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from harness import bench_dir, exit_now, measure_throughput, run_child  # noqa: E402

BUCKET = "bench"


def _start(args):
    """A server process; its port (the first line it prints)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "dali_shards.testing.servers", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    line = proc.stdout.readline().strip()
    if not line.isdigit():
        proc.kill()
        raise RuntimeError(f"server {args} did not start")
    return proc, int(line)


def _upload(endpoint: str, paths, manifest: str) -> None:
    from dali_shards.catalog.table import table_path

    import boto3

    s3 = boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id="k", aws_secret_access_key="s", region_name="us-east-1"
    )
    s3.create_bucket(Bucket=BUCKET)
    for p in [*paths, manifest, table_path(manifest)]:
        s3.upload_file(p, BUCKET, os.path.basename(p))


def child(argv) -> None:
    """Measure one configuration; print JSON."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--source", required=True)
    ap.add_argument("--endpoint")
    ap.add_argument("--read-ahead", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--mode", default="bytes")
    a = ap.parse_args(argv)
    from loaders import Config

    options = {"read_ahead": a.read_ahead, "shuffle_block": 0}  # read_ahead is for whole-shard streams
    if a.endpoint:
        options["storage_options"] = {
            "endpoint_url": a.endpoint,
            "key": "k",
            "secret": "s",
            "client_kwargs": {"region_name": "us-east-1"},
        }
    cfg = Config(
        [a.source], mode=a.mode, batch_size=a.batch_size, workers=a.workers, threads=a.threads, options=options
    )
    print(json.dumps(measure_throughput("dali_shards", cfg, a.epochs)), flush=True)
    exit_now()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--data-dir", default=os.path.join(HERE, "data"))
    ap.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    ap.add_argument("--samples", type=int, default=4096)
    ap.add_argument("--per-shard", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2, help="timed epochs per measurement (after a warm-up epoch)")
    ap.add_argument("--latency-ms", type=float, default=50.0, help="delay the proxy adds to each request")
    ap.add_argument("--read-ahead", default="2,8", help="read_ahead values to compare with none (comma-separated)")
    ap.add_argument("--mode", choices=("bytes", "decode"), default="bytes")
    ap.add_argument("--quick", action="store_true", help="a small smoke run (CI)")
    args = ap.parse_args(argv)
    if args.quick:
        args.samples, args.per_shard, args.rounds, args.epochs, args.batch_size = 512, 32, 1, 1, 32
        args.read_ahead = "2"

    from bench_data import build_bench_shards

    from dali_shards.catalog.scan import scan_shards
    from dali_shards.catalog.manifest import write_manifest

    data = bench_dir(args.data_dir, args.samples, args.per_shard)
    paths = build_bench_shards(data, num_samples=args.samples, samples_per_shard=args.per_shard)
    manifest = os.path.join(data, "manifest.json")
    write_manifest(manifest, scan_shards(paths))
    stored = sum(os.path.getsize(p) for p in paths)

    servers = []
    try:
        s3, s3_port = _start(["s3"])
        servers.append(s3)
        direct = f"http://127.0.0.1:{s3_port}"
        _upload(direct, paths, manifest)
        proxy, proxy_port = _start(["proxy", f"127.0.0.1:{s3_port}", "--delay", str(args.latency_ms / 1000)])
        servers.append(proxy)
        slow = f"http://127.0.0.1:{proxy_port}"
        remote = f"s3://{BUCKET}/manifest.json"
        lat = f"S3 + {args.latency_ms:g} ms"
        aheads = [int(x) for x in str(args.read_ahead).split(",") if x.strip()]
        configs = [("local disk", manifest, None, aheads[0] if aheads else 2)]
        for label, endpoint in (("S3", direct), (lat, slow)):
            configs.append((f"{label}, no read-ahead", remote, endpoint, 0))
            configs += [(f"{label}, read_ahead={n}", remote, endpoint, n) for n in aheads]
        runs = {name: [] for name, *_ in configs}
        for r in range(args.rounds):
            for name, source, endpoint, ahead in configs:
                cmd = [
                    "--child",
                    "--source",
                    source,
                    "--read-ahead",
                    str(ahead),
                    "--batch-size",
                    str(args.batch_size),
                    "--workers",
                    str(args.workers),
                    "--threads",
                    str(args.threads),
                    "--epochs",
                    str(args.epochs),
                    "--mode",
                    args.mode,
                ] + (["--endpoint", endpoint] if endpoint else [])
                t = time.perf_counter()
                result = run_child(os.path.abspath(__file__), cmd, timeout=900)
                runs[name].append(result)
                rate = result.get("samples_per_s")
                print(
                    f"round {r + 1}: {name:32} "
                    + (f"{rate:9.0f} samples/s" if rate else result.get("error", "?"))
                    + f"  ({time.perf_counter() - t:.0f} s)",
                    flush=True,
                )
    finally:
        for p in servers:
            p.kill()

    table = []
    base = None
    for name, *_ in configs:
        rates = [x["samples_per_s"] for x in runs[name] if "samples_per_s" in x]
        errors = [x["error"] for x in runs[name] if "error" in x]
        med = statistics.median(rates) if rates else None
        if name == "local disk":
            base = med
        table.append(
            {
                "config": name,
                "samples_per_s": med,
                "mb_per_s": med * stored / args.samples / 1e6 if med else None,
                "vs_local": med / base if med and base else None,
                "first_batch_s": statistics.median([x["first_batch_s"] for x in runs[name] if "first_batch_s" in x])
                if rates
                else None,
                "rounds": rates,
                "errors": errors,
            }
        )
    lines = [
        "| configuration | samples/s | MB/s | vs local disk | first batch (s) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for row in table:
        fmt = lambda v, f: "error" if v is None else format(v, f)  # noqa: E731
        lines.append(
            f"| {row['config']} | {fmt(row['samples_per_s'], '.0f')} | {fmt(row['mb_per_s'], '.0f')} | "
            f"{fmt(row['vs_local'], '.2f')}x | {fmt(row['first_batch_s'], '.2f')} |"
        )
    setup = (
        f"{args.samples} JPEGs ({stored / args.samples / 1e3:.0f} KB each) in {len(paths)} shards of "
        f"{args.per_shard}, {args.mode} mode, batch {args.batch_size}, {args.workers} workers, {args.threads} "
        f"threads, median of {args.rounds} interleaved rounds x {args.epochs} epochs, {os.cpu_count()} CPUs, "
        "moto S3 server and proxy on localhost"
    )
    text = "\n".join(lines)
    print("\n" + setup + "\n\n" + text)
    os.makedirs(args.out_dir, exist_ok=True)
    name = "remote-quick" if args.quick else "remote"
    with open(os.path.join(args.out_dir, f"{name}.json"), "w") as f:
        json.dump({"setup": setup, "args": vars(args), "machine": platform.platform(), "results": table}, f, indent=1)
    with open(os.path.join(args.out_dir, f"{name}.md"), "w") as f:
        f.write(setup + "\n\n" + text + "\n")


if __name__ == "__main__":
    if "--child" in sys.argv:
        child(sys.argv[1:])
    else:
        main()
