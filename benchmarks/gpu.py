"""dali_shards against DALI's native ``fn.readers.webdataset`` with mixed (GPU) decoding, on one GPU.

The ImageNet training transform on the GPU (random-resized-crop 224 decoded by nvJPEG/nvImageCodec,
flip, normalize, FP16 CHW output), batch 256, for dali_shards on each transfer at several Python
worker counts, and the native reader (DALI threads only) measured beside each worker count; then the
ring's bytes-only scaling over the same worker counts. Each configuration runs in a fresh process,
in interleaved rounds; reported: images/s, time to first batch (from the pipeline's construction),
peak host memory (PSS of the process and its workers) and peak GPU memory (NVML, above what was in
use before). Writes ``gpu.json`` and ``gpu.md`` (device, driver, CUDA and DALI versions included).

    python benchmarks/gpu.py --device-id 0 --workers 2,8,16 --out-dir benchmarks/results/gpu
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from typing import Dict, List, NamedTuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from harness import bench_dir, child_main, interleaved, run_child  # noqa: E402

TRANSFERS = ("ring", "merge")
NATIVE = "native_webdataset"


class Run(NamedTuple):
    label: str
    loader: str
    transfer: str
    mode: str
    workers: int


def configurations(workers: List[int]) -> List[Run]:
    runs = []
    for n in workers:
        runs += [Run(t, "dali_shards", t, "augment16", n) for t in TRANSFERS]
        runs.append(Run("native", NATIVE, "", "augment16", n))
    runs += [Run("ring", "dali_shards", "ring", "bytes", n) for n in workers]
    runs.append(Run("native", NATIVE, "", "bytes", workers[0]))
    return runs


def measure(args, run: Run) -> Dict:
    cmd = ["--child", "throughput", "--loader", run.loader, "--mode", run.mode, "--data-dir", args.data_dir,
           "--samples", str(args.samples), "--per-shard", str(args.per_shard), "--quality", str(args.quality),
           "--batch-size", str(args.batch_size), "--workers", str(run.workers), "--threads", str(args.threads),
           "--epochs", str(args.epochs), "--options", json.dumps({"transfer": run.transfer} if run.transfer else {})]  # fmt: skip
    if args.device_id >= 0:
        cmd += ["--device-id", str(args.device_id)]
    result = run_child(os.path.abspath(__file__), cmd, timeout=args.timeout)
    rate = result.get("samples_per_s")
    shown = f"{rate:9.0f} images/s" if rate else result.get("error", result)
    print(f"  {run.mode:9} {run.label:6} {run.workers:2} workers: {shown}", flush=True)
    return result


def measure_all(args, runs: List[Run]) -> Dict[Run, Dict]:
    """Every configuration in interleaved rounds (odd rounds reversed); the median round of each.
    The merge transfer (kept for comparison, no target) runs in the first ``--merge-rounds`` only."""
    merge_rounds = args.rounds if args.merge_rounds is None else args.merge_rounds

    def one(round_: int, run: Run) -> Dict:
        return measure(args, run) if run.transfer != "merge" or round_ < merge_rounds else {}

    out = {}
    for run, results in zip(runs, interleaved(runs, args.rounds, one)):
        results = [r for r in results if r]
        good = sorted((r for r in results if "samples_per_s" in r), key=lambda r: r["samples_per_s"])
        out[run] = (
            {**good[(len(good) - 1) // 2], "rounds": [r.get("samples_per_s") for r in results]} if good else results[0]
        )
    return out


def versions(device_id: int) -> Dict:
    import nvidia.dali
    import torch

    found = {"dali": nvidia.dali.__version__, "torch": torch.__version__, "cuda_torch": torch.version.cuda,
             "python": platform.python_version(), "cpus": os.cpu_count()}  # fmt: skip
    if device_id < 0:
        return {**found, "device": "CPU (a smoke run: CPU decode)", "driver": "-", "cuda_driver": "-"}
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(device_id)
    cuda = pynvml.nvmlSystemGetCudaDriverVersion()

    def text(value):
        return value.decode() if isinstance(value, bytes) else value

    return {
        **found,
        "device": text(pynvml.nvmlDeviceGetName(handle)),
        "driver": text(pynvml.nvmlSystemGetDriverVersion()),
        "cuda_driver": f"{cuda // 1000}.{cuda % 1000 // 10}",
    }


def markdown(report) -> str:
    v, cfg = report["versions"], report["config"]
    res = {(r["mode"], r["label"], r["workers"]): r for r in report["results"]}
    lines = [
        f"{v['device']}, driver {v['driver']}, CUDA {v['cuda_driver']} (PyTorch {v['torch']}, CUDA {v['cuda_torch']}), "
        f"DALI {v['dali']}, {v['cpus']} CPUs. {cfg['samples']} JPEGs ({report['data']['mean_kb_per_sample']:.0f} KB, "
        f"~500x375) in {report['data']['shards']} shards; batch {cfg['batch_size']}, {cfg['threads']} DALI threads; "
        f"median of {cfg['rounds']} interleaved round(s) (of two, the lower), each run in its own process.",
        "",
        "Mixed decode + random-resized-crop 224, flip, normalize, FP16 (images/s; ratio to the native reader "
        "measured beside it):",
        "",
        "| Python workers | loader | images/s | vs native | first batch, s | vs native | peak host MB | peak GPU MB |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for n in cfg["workers"]:
        native = res.get(("augment16", "native", n), {})
        for label in (*TRANSFERS, "native"):
            r = res.get(("augment16", label, n), {})
            lines.append(_row(n, label, r, native))
    lines += ["", "Bytes only (no decode), the ring's scaling over workers:", "",
              "| Python workers | samples/s | relative to the first |", "| ---: | ---: | ---: |"]  # fmt: skip
    first = res.get(("bytes", "ring", cfg["workers"][0]), {}).get("samples_per_s")
    for n in cfg["workers"]:
        rate = res.get(("bytes", "ring", n), {}).get("samples_per_s")
        lines.append(f"| {n} | {_num(rate)} | {_ratio(rate, first)} |")
    native = res.get(("bytes", "native", cfg["workers"][0]), {}).get("samples_per_s")
    lines.append(f"\nDALI's native reader, bytes only: {_num(native)} samples/s.")
    lines += ["", f"CPU per step of {cfg['batch_size']}, mixed decode (ms, over the timed epochs): the main thread (the loop and our "
              "hand-off), the process's other threads (DALI's), the Python workers (ours):", "",
              "| Python workers | loader | main thread | other threads | workers | in all |",
              "| ---: | --- | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for n in cfg["workers"]:
        for label in (*TRANSFERS, "native"):
            lines.append(_cpu_row(n, label, res.get(("augment16", label, n), {})))
    return "\n".join(lines) + "\n"


def _cpu_row(n, label, r) -> str:
    if "main_process_cpu_ms_per_step" not in r:
        return f"| {n} | {label} | - | - | - | - |"
    main, process = r["main_thread_cpu_ms_per_step"], r["main_process_cpu_ms_per_step"]
    workers = r.get("workers_cpu_ms_per_step", 0.0)
    return f"| {n} | {label} | {main:.1f} | {process - main:.1f} | {workers:.1f} | {process + workers:.1f} |"


def _row(n, label, r, native) -> str:
    if "samples_per_s" not in r:
        return f"| {n} | {label} | {r.get('error', 'n/a')[:80]} | | | | | |"
    return (f"| {n} | {label} | {_num(r['samples_per_s'])} | {_ratio(r['samples_per_s'], native.get('samples_per_s'))}"
            f" | {r['first_batch_s']:.2f} | {_ratio(r['first_batch_s'], native.get('first_batch_s'))} | "
            f"{r['peak_memory_mb']:.0f} | {r.get('peak_gpu_memory_mb', float('nan')):.0f} |")  # fmt: skip


def _num(x) -> str:
    return f"{x:,.0f}" if x else "-"


def _ratio(a, b) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device-id", type=int, default=0, help="the GPU; -1: CPU decode (a smoke run without a GPU)")
    ap.add_argument("--workers", default="2,8,16", help="py_num_workers (comma-separated)")
    ap.add_argument("--samples", type=int, default=4096)
    ap.add_argument("--per-shard", type=int, default=256)
    ap.add_argument("--quality", type=int, default=98, help="JPEG quality (98: ~100 KB from full-size photos)")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--threads", type=int, default=8, help="DALI num_threads, every loader")
    ap.add_argument("--epochs", type=int, default=2, help="timed epochs per run (after a warm-up epoch)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--merge-rounds", type=int, default=None, help="rounds that measure merge (default: --rounds)")
    ap.add_argument("--data-only", action="store_true", help="build the benchmark shards and exit")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--data-dir", default=os.path.join(HERE, "data"))
    ap.add_argument("--out-dir", default=os.path.join(HERE, "results", "gpu"))
    args = ap.parse_args(argv)
    workers = [int(w) for w in args.workers.split(",")]
    from bench_data import build_bench_shards

    shards = build_bench_shards(bench_dir(args.data_dir, args.samples, args.per_shard), num_samples=args.samples,
                                samples_per_shard=args.per_shard, quality=args.quality)  # fmt: skip
    mean_kb = sum(os.path.getsize(p) for p in shards) / args.samples / 1024
    print(f"{args.samples} JPEGs, {mean_kb:.0f} KB on average, in {len(shards)} shards", flush=True)
    if args.data_only:
        return {"shards": shards}
    results = measure_all(args, configurations(workers))
    report = {
        "versions": versions(args.device_id),
        "config": {**{k: v for k, v in vars(args).items() if k not in ("data_dir", "out_dir")}, "workers": workers},
        "data": {"shards": len(shards), "samples": args.samples, "mean_kb_per_sample": round(mean_kb, 1)},
        "results": [{"mode": r.mode, "label": r.label, "workers": r.workers, **res} for r, res in results.items()],
    }
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "gpu.json"), "w") as f:
        json.dump(report, f, indent=1)
    text = markdown(report)
    with open(os.path.join(args.out_dir, "gpu.md"), "w") as f:
        f.write(text)
    print(text, flush=True)
    return report


if __name__ == "__main__":
    if "--child" in sys.argv:
        child_main()
    else:
        main()
