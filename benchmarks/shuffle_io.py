"""What shuffling costs in I/O: bytes-only samples/s and peak memory of the loaders whose class mix
``shuffle_quality.py`` measures, reading the same shards from local disk and from an S3 server on
localhost (moto's standalone server, in a process of its own).

Loaders: dali_shards interleaved (the default, ``shuffle_block=256``), dali_shards with contiguous
runs through its 1,024-sample buffer (``shuffle_block=0``: the planner before interleaving), DALI's
``fn.readers.webdataset`` (``random_shuffle``; S3 through DALI's own AWS SDK support), and
WebDataset + DataLoader (``shardshuffle``, ``shuffle(1000)``; S3 through the server's HTTP
interface, presigned URLs read by WebDataset's ``curl`` pipes). Every configuration runs in a fresh process, in
interleaved rounds; each figure is the median over rounds (see ``harness``). Prints a table,
writes JSON and Markdown.

    python benchmarks/shuffle_io.py --samples 4096 --per-shard 64
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from harness import bench_dir, exit_now, measure_throughput, run_child  # noqa: E402

CONFIGS = (
    ("dali_shards interleaved (default)", "dali_shards", {}),
    ("dali_shards contiguous (shuffle_block=0)", "dali_shards", {"shuffle_block": 0}),
    ("DALI readers.webdataset", "native_webdataset", {}),
    ("WebDataset + DataLoader", "webdataset_dataloader", {}),
)
BASELINE = CONFIGS[1][0]
BUCKET = "bench"
STORAGES = ("local", "http", "s3")
KEYS = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}


def sources(loader: str, storage: str, paths, manifest: str, endpoint):
    """The shard list (and dali_shards options) a loader reads from local disk or S3."""
    names = [os.path.basename(p) for p in paths]
    if storage == "local":
        return ([manifest] if loader == "dali_shards" else list(paths)), {}
    if storage == "http":
        if loader == "native_webdataset":
            raise NotImplementedError("DALI's readers read local files and s3:// only")
        return ([f"{endpoint}/manifest.json"] if loader == "dali_shards" else [f"{endpoint}/{n}" for n in names]), {}
    if loader == "dali_shards":
        opts = {"endpoint_url": endpoint, "key": "k", "secret": "s", "client_kwargs": {"region_name": "us-east-1"}}
        return [f"s3://{BUCKET}/manifest.json"], {"storage_options": opts}
    if loader == "native_webdataset":
        return [f"s3://{BUCKET}/{n}" for n in names], {}
    import boto3  # WebDataset: HTTP GETs (curl) of presigned URLs, as for private objects without the aws CLI

    s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="k", aws_secret_access_key="s", region_name="us-east-1")
    return [s3.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": n}, ExpiresIn=3600) for n in names], {}


def child(argv) -> None:
    """Measure one configuration; print JSON."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--config", type=int, required=True)
    ap.add_argument("--storage", choices=STORAGES, required=True)
    ap.add_argument("--endpoint")
    ap.add_argument("--data", required=True)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=2)
    a = ap.parse_args(argv)
    from loaders import Config

    with open(os.path.join(a.data, "bench-data.json")) as f:
        paths = json.load(f)["paths"]
    _, loader, options = CONFIGS[a.config]
    try:
        shards, more = sources(loader, a.storage, paths, os.path.join(a.data, "manifest.json"), a.endpoint)
    except NotImplementedError as exc:
        print(json.dumps({"error": f"n/a: {exc}"}), flush=True)
        exit_now()
    if a.storage == "s3":
        os.environ.update(KEYS, AWS_ENDPOINT_URL=a.endpoint, AWS_ENDPOINT_URL_S3=a.endpoint, S3_ENDPOINT=a.endpoint,
                          S3_USE_HTTPS="0", S3_VERIFY_SSL="0")  # DALI's AWS SDK reads these
    cfg = Config(shards, mode="bytes", batch_size=a.batch_size, workers=a.workers, threads=a.threads,
                 options={**options, **more})
    try:
        result = measure_throughput(loader, cfg, a.epochs)
    except Exception as exc:  # noqa: BLE001 - reported in the table
        result = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"}
    print(json.dumps(result), flush=True)
    exit_now()


def range_cost(endpoint: str, sizes_mb=(1, 4, 32), requests: int = 20) -> dict:
    """Milliseconds the S3 server takes for a 256 KiB ranged GET, and for the whole object, by
    object size (one request at a time): what a ranged read costs this server."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="k", aws_secret_access_key="s", region_name="us-east-1")
    out = {}
    for mb in sizes_mb:
        key = f"range-cost-{mb}"
        s3.put_object(Bucket=BUCKET, Key=key, Body=os.urandom(mb << 20))
        for what, extra in (("256 KiB range", {"Range": "bytes=0-262143"}), ("whole object", {})):
            t = time.perf_counter()
            for _ in range(requests):
                s3.get_object(Bucket=BUCKET, Key=key, **extra)["Body"].read()
            out[f"{mb} MB object, {what}"] = round((time.perf_counter() - t) / requests * 1000, 1)
        s3.delete_object(Bucket=BUCKET, Key=key)
    return out


def summarise(runs, stored_per_sample: float):
    """Median samples/s, MB/s, peak memory and first batch per (config, storage)."""
    rows = []
    for (name, storage), results in runs.items():
        ok = [r for r in results if "samples_per_s" in r]
        med = lambda key, ok=ok: statistics.median([r[key] for r in ok]) if ok else None  # noqa: E731
        rows.append({
            "loader": name, "storage": storage, "samples_per_s": med("samples_per_s"),
            "mb_per_s": med("samples_per_s") * stored_per_sample / 1e6 if ok else None,
            "peak_memory_mb": med("peak_memory_mb"), "first_batch_s": med("first_batch_s"),
            "rounds": [r.get("samples_per_s") for r in ok],
            "errors": sorted({r["error"] for r in results if "error" in r}),
        })  # fmt: skip
    base = {r["storage"]: r for r in rows if r["loader"] == BASELINE}
    for r in rows:
        b = base.get(r["storage"])
        ok = b is not None and r["samples_per_s"] and b["samples_per_s"]
        r["vs_contiguous_speed"] = r["samples_per_s"] / b["samples_per_s"] if ok else None
        r["vs_contiguous_memory"] = r["peak_memory_mb"] / b["peak_memory_mb"] if ok else None
    return rows


def markdown(rows, setup: str) -> str:
    fmt = lambda v, f: "n/a" if v is None else format(v, f)  # noqa: E731
    lines = [setup, "", "| loader | storage | samples/s | MB/s | vs contiguous | peak memory (MB) | vs contiguous | "
             "first batch (s) |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for r in rows:
        lines.append(
            f"| {r['loader']} | {r['storage']} | {fmt(r['samples_per_s'], '.0f')} | {fmt(r['mb_per_s'], '.0f')} | "
            f"{fmt(r['vs_contiguous_speed'], '.2f')} | {fmt(r['peak_memory_mb'], '.0f')} | "
            f"{fmt(r['vs_contiguous_memory'], '.2f')} | {fmt(r['first_batch_s'], '.2f')} |"
        )
        if r["errors"] and r["samples_per_s"] is None:
            lines[-1] = lines[-1][:-1] + f" {r['errors'][0][:80]} |"
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--data-dir", default=os.path.join(HERE, "data"))
    ap.add_argument("--out", default=os.path.join(HERE, "results", "shuffle_io"))
    ap.add_argument("--samples", type=int, default=4096)
    ap.add_argument("--per-shard", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2, help="timed epochs per measurement (after a warm-up epoch)")
    ap.add_argument("--configs", default=",".join(str(i) for i in range(len(CONFIGS))), help="indices into CONFIGS")
    ap.add_argument("--storage", default=",".join(STORAGES))
    args = ap.parse_args(argv)
    from bench_data import build_bench_shards
    from remote import _start, _upload

    from dali_shards.catalog.scan import scan_shards
    from dali_shards.catalog.manifest import write_manifest

    data = bench_dir(args.data_dir, args.samples, args.per_shard)
    paths = build_bench_shards(data, num_samples=args.samples, samples_per_shard=args.per_shard)
    manifest = os.path.join(data, "manifest.json")
    write_manifest(manifest, scan_shards(paths))
    stored = sum(os.path.getsize(p) for p in paths)
    configs = [int(i) for i in args.configs.split(",")]
    storages = args.storage.split(",")
    servers, endpoints = [], {}
    runs = {(CONFIGS[c][0], s): [] for s in storages for c in configs}
    try:
        costs = None
        if "s3" in storages:
            server, port = _start(["s3"])
            servers.append(server)
            endpoints["s3"] = f"http://127.0.0.1:{port}"
            _upload(endpoints["s3"], paths, manifest)
            costs = range_cost(endpoints["s3"])
            print("S3 server, ms per request:", costs, flush=True)
        if "http" in storages:
            server, port = _start(["http", data])
            servers.append(server)
            endpoints["http"] = f"http://127.0.0.1:{port}"
        for r in range(args.rounds):
            for storage in storages:
                for c in configs:
                    cmd = ["--child", "--config", str(c), "--storage", storage, "--data", data,
                           "--batch-size", str(args.batch_size), "--workers", str(args.workers),
                           "--threads", str(args.threads), "--epochs", str(args.epochs)]  # fmt: skip
                    if storage in endpoints:
                        cmd += ["--endpoint", endpoints[storage]]
                    t = time.perf_counter()
                    result = run_child(os.path.abspath(__file__), cmd, timeout=900)
                    runs[(CONFIGS[c][0], storage)].append(result)
                    rate = result.get("samples_per_s")
                    print(f"round {r + 1}: {CONFIGS[c][0]:42} {storage:5} "
                          + (f"{rate:8.0f} samples/s, {result['peak_memory_mb']:5.0f} MB" if rate else result.get("error", "?"))
                          + f"  ({time.perf_counter() - t:.0f} s)", flush=True)  # fmt: skip
    finally:
        for server in servers:
            server.kill()
    rows = summarise(runs, stored / args.samples)
    setup = (
        f"{args.samples} JPEGs ({stored / args.samples / 1e3:.0f} KB each) in {len(paths)} shards of {args.per_shard}, "
        f"bytes only, batch {args.batch_size}, {args.workers} workers, {args.threads} threads, median of "
        f"{args.rounds} interleaved rounds x {args.epochs} epochs, each in a fresh process; peak memory: PSS of the "
        f"process and its workers; {os.cpu_count()} CPUs; S3: moto's server on localhost"
    )
    text = markdown(rows, setup)
    if costs:
        text += "\nThe S3 server's time per request, one at a time (ms): " + ", ".join(f"{k}: {v}" for k, v in costs.items()) + "\n"
    print("\n" + text)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    report = {"setup": setup, "args": vars(args), "machine": platform.platform(), "rows": rows, "s3_request_ms": costs}
    with open(args.out + ".json", "w") as f:
        json.dump(report, f, indent=1)
    with open(args.out + ".md", "w") as f:
        f.write(text)
    return report


if __name__ == "__main__":
    if "--child" in sys.argv:
        child(sys.argv[1:])
    else:
        main()
