"""Preparing shards: `dali-shards write` with local processes and with Ray (1 and 2 CPUs), against
LitData's `optimize`, on the same ImageFolder tree of ImageNet-like JPEGs (crops of the full-size
photos re-encoded at about 110 KB: set DALI_SHARDS_BENCH_PHOTOS, see bench_data.py).

    DALI_SHARDS_BENCH_PHOTOS=/work/shared/data/imagenet-jpeg python benchmarks/prepare.py --samples 20000

Prints a table and writes benchmarks/results/prepare.json and prepare.md: samples/s and MB/s of
each, and the ratios measured in the same run (Ray at 2 CPUs / local at 2 processes, each / LitData).
LitData's `optimize` runs when `litdata` is installed (it writes its own chunk format with the same
number of worker processes, the JPEG bytes and the label stored as they are)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from benchmarks.bench_data import _encoded_photos  # noqa: E402


def build_tree(root: str, samples: int, quality: int) -> str:
    """``samples`` JPEGs in class folders under ``root`` (cached by its parameters)."""
    stamp = os.path.join(root, "stamp.json")
    want = {"samples": samples, "quality": quality, "photos": os.environ.get("DALI_SHARDS_BENCH_PHOTOS")}
    if os.path.exists(stamp) and json.load(open(stamp)) == want:
        return os.path.join(root, "train")
    shutil.rmtree(root, ignore_errors=True)
    for i, (data, label) in enumerate(_encoded_photos(samples, 500, quality, seed=0)):
        folder = os.path.join(root, "train", f"{label:04d}")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"img_{i:07d}.JPEG"), "wb") as f:
            f.write(data)
    json.dump(want, open(stamp, "w"))
    return os.path.join(root, "train")


def tree_bytes(tree: str) -> int:
    return sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(tree) for n in names)


def run_write(tree: str, out: str, args: List[str], env: Dict[str, str]) -> float:
    """Seconds one `dali-shards write` took, from the command's start (Ray's start included)."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "dali_shards.cli", "write", tree, os.path.join(out, "train-%06d.tar"), "--quiet"]
    start = time.perf_counter()
    subprocess.run(cmd + args, check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def on_ray(cpus: int, run):
    """``run(address)`` against a Ray cluster of ``cpus`` CPUs on this machine (started for it, as
    `ray start` starts a node of a cluster, and stopped after)."""
    port = 6390 + cpus
    ray = os.path.join(os.path.dirname(sys.executable), "ray")
    head = subprocess.Popen([ray, "start", "--head", "--block", f"--num-cpus={cpus}", f"--port={port}",
                             "--include-dashboard=false"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        time.sleep(8)  # the head is up (the connection itself is measured)
        return run(f"127.0.0.1:{port}")
    finally:
        head.terminate()
        head.wait(60)


LITDATA = """
import os, sys, time
from litdata import optimize
tree, out, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
classes = sorted(os.listdir(tree))
inputs = [(os.path.join(tree, c, n), i) for i, c in enumerate(classes) for n in sorted(os.listdir(os.path.join(tree, c)))]
def sample(item):
    path, label = item
    with open(path, "rb") as f:
        return {"jpg": f.read(), "cls": label}
if __name__ == "__main__":
    optimize(fn=sample, inputs=inputs, output_dir=out, chunk_bytes="64MB", num_workers=workers, mode="overwrite")
"""


def run_litdata(tree: str, out: str, workers: int, env: Dict[str, str]) -> float:
    shutil.rmtree(out, ignore_errors=True)
    script = os.path.join(tempfile.mkdtemp(), "litdata_optimize.py")
    open(script, "w").write(LITDATA)
    start = time.perf_counter()
    subprocess.run([sys.executable, script, tree, out, str(workers)], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--quality", type=int, default=98)
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "dali-shards-prepare"))
    ap.add_argument("--repeats", type=int, default=2, help="runs of each (the fastest is kept)")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "prepare"))
    args = ap.parse_args()
    tree = build_tree(os.path.join(args.work, "data"), args.samples, args.quality)
    size = tree_bytes(tree)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]),
           "RAY_ACCEPT_CLUSTER_TOKEN": "1"}  # fmt: skip
    out = os.path.join(args.work, "out")
    runs = {
        "local, 2 processes": lambda: run_write(tree, out, ["--processes", "2"], env),
        "local, 1 process": lambda: run_write(tree, out, ["--processes", "1"], env),
        "ray, 2 CPUs": lambda: on_ray(2, lambda address: run_write(tree, out, ["--engine", "ray", "--ray-address", address], env)),
        "ray, 1 CPU": lambda: on_ray(1, lambda address: run_write(tree, out, ["--engine", "ray", "--ray-address", address], env)),
    }
    try:
        import litdata  # noqa: F401

        runs["litdata optimize, 2 workers"] = lambda: run_litdata(tree, out + "-litdata", 2, env)
        runs["litdata optimize, 1 worker"] = lambda: run_litdata(tree, out + "-litdata", 1, env)
    except ImportError:
        print("litdata is not installed: its optimize is left out (pip install litdata)")
    seconds = {name: min(run() for _ in range(args.repeats)) for name, run in runs.items()}
    rows = {name: {"seconds": round(s, 2), "samples_per_s": round(args.samples / s, 1), "mb_per_s": round(size / s / 1e6, 1)}
            for name, s in seconds.items()}  # fmt: skip
    ratios = {"ray 2 CPUs / local 2 processes": seconds["local, 2 processes"] / seconds["ray, 2 CPUs"]}
    for name in [n for n in seconds if n.startswith("litdata")]:
        workers = name.rsplit(",", 1)[1].strip().split()[0]
        for ours in ("local", "ray"):
            mine = next(n for n in seconds if n.startswith(ours) and n.rsplit(",", 1)[1].strip().split()[0] == workers)
            ratios[f"{mine} / {name}"] = seconds[name] / seconds[mine]
    ratios = {k: round(v, 3) for k, v in ratios.items()}
    result = {"samples": args.samples, "bytes": size, "mean_sample_kb": round(size / args.samples / 1e3, 1),
              "cpus": os.cpu_count(), "runs": rows, "speed_ratios": ratios}  # fmt: skip
    table = ["| run | seconds | samples/s | MB/s |", "| --- | ---: | ---: | ---: |"]
    table += [f"| {n} | {r['seconds']} | {r['samples_per_s']} | {r['mb_per_s']} |" for n, r in rows.items()]
    table += ["", "| speed ratio | value |", "| --- | ---: |"] + [f"| {k} | {v} |" for k, v in ratios.items()]
    text = "\n".join(table)
    print(f"{args.samples} JPEGs, {size / 1e9:.2f} GB (mean {size / args.samples / 1e3:.0f} KB), {os.cpu_count()} CPUs\n{text}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    json.dump(result, open(args.out + ".json", "w"), indent=1)
    open(args.out + ".md", "w").write(
        f"# Preparing shards\n\n`python benchmarks/prepare.py --samples {args.samples}`: {args.samples} JPEGs, "
        f"{size / 1e9:.2f} GB (mean {size / args.samples / 1e3:.0f} KB), on {os.cpu_count()} CPUs; each the fastest "
        f"of {args.repeats} runs, from the command's start (Ray's start included).\n\n{text}\n"
    )


if __name__ == "__main__":
    main()
