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
import statistics
import subprocess
import sys
import tempfile
from typing import Callable, Dict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from benchmarks.bench_data import _encoded_photos  # noqa: E402
from benchmarks.harness import interleaved  # noqa: E402


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


WRITE = """
import sys, time
from dali_shards.tools.folderwriter import write_dataset
tree, out, engine, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
if engine == "ray":  # a cluster of n CPUs, up before the job (as a cluster is)
    import os, ray
    ray.init(address="local", num_cpus=n, include_dashboard=False, configure_logging=False, log_to_driver=False,
             _temp_dir=os.environ["DALI_SHARDS_BENCH_RAY_TMP"])
start = time.perf_counter()
write_dataset(tree, out + "/train-%06d.tar", engine=engine, **({"processes": n} if engine == "local" else {}))
print(time.perf_counter() - start)
"""


def run_write(tree: str, out: str, engine: str, n: int, env: Dict[str, str]) -> float:
    """Seconds one write job took (`dali-shards write` as a Python call in a fresh process), from
    the call; Ray's cluster started before it."""
    shutil.rmtree(out, ignore_errors=True)
    done = subprocess.run([sys.executable, "-c", WRITE, tree, out, engine, str(n)], check=True, env=env,
                          capture_output=True, text=True)  # fmt: skip
    return float(done.stdout.strip().splitlines()[-1])


LITDATA = """
import os, sys, time
from litdata import optimize
tree, out, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
def sample(item):
    path, label = item
    with open(path, "rb") as f:
        return {"jpg": f.read(), "cls": label}
if __name__ == "__main__":
    start = time.perf_counter()  # from listing the files, as write_dataset's time counts it
    classes = sorted(os.listdir(tree))
    inputs = [(os.path.join(tree, c, n), i) for i, c in enumerate(classes) for n in sorted(os.listdir(os.path.join(tree, c)))]
    optimize(fn=sample, inputs=inputs, output_dir=out, chunk_bytes="64MB", num_workers=workers, mode="overwrite")
    print(time.perf_counter() - start)
"""


def run_litdata(tree: str, out: str, workers: int, env: Dict[str, str]) -> float:
    shutil.rmtree(out, ignore_errors=True)
    script = os.path.join(os.path.dirname(out), "litdata_optimize.py")  # in the work folder
    open(script, "w").write(LITDATA)
    done = subprocess.run([sys.executable, script, tree, out, str(workers)], check=True, env=env,
                          capture_output=True, text=True)  # fmt: skip
    return float(done.stdout.strip().splitlines()[-1])


def timed(run: Callable[[], float]) -> float:
    """One run's seconds, the writes of the run before it flushed to disk first (not counted)."""
    os.sync()
    return run()


def ratios_of(seconds: Dict[str, float]) -> Dict[str, float]:
    """Speed ratios: Ray at 2 CPUs against local processes at 2; each of ours against LitData at
    the same number of processes."""
    ratios = {"ray 2 CPUs / local 2 processes": seconds["local, 2 processes"] / seconds["ray, 2 CPUs"]}
    for name in [n for n in seconds if n.startswith("litdata")]:
        workers = name.rsplit(",", 1)[1].strip().split()[0]
        for ours in ("local", "ray"):
            mine = next(n for n in seconds if n.startswith(ours) and n.rsplit(",", 1)[1].strip().split()[0] == workers)
            ratios[f"{mine} / {name}"] = seconds[name] / seconds[mine]
    return {k: round(v, 3) for k, v in ratios.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--quality", type=int, default=98)
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "dali-shards-prepare"))
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every run (the median is kept)")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "prepare"))
    args = ap.parse_args()
    tree = build_tree(os.path.join(args.work, "data"), args.samples, args.quality)
    size = tree_bytes(tree)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]),
           "DALI_SHARDS_BENCH_RAY_TMP": os.path.join(args.work, "ray")}  # fmt: skip
    out = os.path.join(args.work, "out")
    runs: Dict[str, Callable[[], float]] = {
        "local, 2 processes": lambda: run_write(tree, out, "local", 2, env),
        "local, 1 process": lambda: run_write(tree, out, "local", 1, env),
        "ray, 2 CPUs": lambda: run_write(tree, out, "ray", 2, env),
        "ray, 1 CPU": lambda: run_write(tree, out, "ray", 1, env),
    }
    try:
        import litdata  # noqa: F401

        runs["litdata optimize, 2 workers"] = lambda: run_litdata(tree, out + "-litdata", 2, env)
        runs["litdata optimize, 1 worker"] = lambda: run_litdata(tree, out + "-litdata", 1, env)
    except ImportError:
        print("litdata is not installed: its optimize is left out (pip install litdata)")
    names = list(runs)
    load = os.getloadavg()[0]
    rounds = dict(zip(names, interleaved(names, args.rounds, lambda _, name: {"s": timed(runs[name])})))
    shutil.rmtree(env["DALI_SHARDS_BENCH_RAY_TMP"], ignore_errors=True)
    seconds = {name: statistics.median(r["s"] for r in rounds[name]) for name in names}
    rows = {name: {"seconds": round(s, 2), "samples_per_s": round(args.samples / s, 1), "mb_per_s": round(size / s / 1e6, 1),
                   "rounds_s": [round(r["s"], 2) for r in rounds[name]]} for name, s in seconds.items()}  # fmt: skip
    result = {"samples": args.samples, "bytes": size, "mean_sample_kb": round(size / args.samples / 1e3, 1),
              "cpus": os.cpu_count(), "load_average": f"{load:.1f} to {os.getloadavg()[0]:.1f}", "rounds": args.rounds,
              "runs": rows, "speed_ratios": ratios_of(seconds)}  # fmt: skip
    report(args, size, result)


def report(args: argparse.Namespace, size: int, result: Dict) -> None:
    """Print the table; write it (prepare.md) and the JSON (prepare.json)."""
    rows, ratios = result["runs"], result["speed_ratios"]
    table = ["| run | seconds | samples/s | MB/s | each round (s) |", "| --- | ---: | ---: | ---: | --- |"]
    table += [f"| {n} | {r['seconds']} | {r['samples_per_s']} | {r['mb_per_s']} | {', '.join(map(str, r['rounds_s']))} |"
              for n, r in rows.items()]  # fmt: skip
    table += ["", "| speed ratio | value |", "| --- | ---: |"] + [f"| {k} | {v} |" for k, v in ratios.items()]
    text = "\n".join(table)
    what = f"{args.samples} JPEGs, {size / 1e9:.2f} GB (mean {size / args.samples / 1e3:.0f} KB), on {os.cpu_count()} CPUs"
    print(f"{what}\n{text}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    json.dump(result, open(args.out + ".json", "w"), indent=1)
    open(args.out + ".md", "w").write(
        f"# Preparing shards\n\n`python benchmarks/prepare.py --samples {args.samples} --rounds {args.rounds}`: {what}; "
        f"load average {result['load_average']} (other jobs on the machine) over the runs; the median of "
        f"{args.rounds} interleaved rounds (every run once per round, odd rounds in reverse order), each run in a "
        "fresh process, timed from the call (a Ray cluster of that many CPUs started before, as a cluster is; "
        "LitData's `optimize` from the same point: before listing the files), the previous run's writes flushed "
        f"to disk before it.\n\n{text}\n"
    )


if __name__ == "__main__":
    main()
