"""Samples/s of dali_shards' JAX iterator against its PyTorch iterator on the same pipeline.

Both read the same shards through the same ``@sharded_pipeline`` (the ``augment`` mode of
``loaders.py``: decode a random crop, resize to 224, flip, normalize to float CHW), with the same
workers, batch and DALI threads; each run in a process of its own, in interleaved rounds (A B then
B A), each figure the median over rounds. The JAX iterator's batches are global ``jax.Array``s
(``make_array_from_process_local_data`` over every device JAX has: one CPU device, or the GPU) with
their ``valid`` mask; each batch is waited for (``block_until_ready``) and its valid ids read on the
host, as the PyTorch iterator's are. Prints a table and writes JSON and Markdown with the ratio
(JAX / PyTorch: the median of each round's ratio, and the ratio of the medians).

    python benchmarks/jax_throughput.py --samples 4096 --workers 2 --rounds 3 [--device-id 0]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from typing import Dict, Iterator, List

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from harness import bench_dir, child_main, interleaved, run_child  # noqa: E402

LOADERS = {"pytorch": "dali_shards", "jax": "dali_shards_jax"}
FIGURES = ("samples_per_s", "first_batch_s", "main_process_cpu_ms_per_step", "workers_cpu_ms_per_step", "peak_memory_mb")


def jax_loader_class():
    """``loaders.DaliShardsLoader`` with the JAX iterator in place of the PyTorch one."""
    from loaders import DaliShardsLoader

    class DaliShardsJaxLoader(DaliShardsLoader):
        def __init__(self, cfg):
            if cfg.mode == "bytes":
                raise NotImplementedError("the JAX benchmark measures decoding modes")
            super().__init__(cfg)

        def iterator(self, pipe):
            from dali_shards.jax import DALIShardedIterator

            return DALIShardedIterator(pipe, ["data", "id"])

        def epoch(self) -> Iterator[np.ndarray]:
            for batch in self.it:
                batch["data"].block_until_ready()
                yield np.asarray(batch["id"])[np.asarray(batch["valid"])].astype(np.int64)

    return DaliShardsJaxLoader


def measure(args, name: str) -> Dict:
    cmd = ["--child", "throughput", "--loader", LOADERS[name], "--mode", args.mode, "--data-dir", args.data_dir,
           "--samples", str(args.samples), "--batch-size", str(args.batch_size), "--workers", str(args.workers),
           "--threads", str(args.threads), "--epochs", str(args.epochs)]  # fmt: skip
    if args.device_id is not None:
        cmd += ["--device-id", str(args.device_id)]
    result = run_child(os.path.abspath(__file__), cmd, timeout=1800)
    if "error" in result:
        raise SystemExit(f"{name} failed: {result['error']}")
    print(f"  {name:8} {result['samples_per_s']:9.0f} samples/s", flush=True)
    return result


def summary(got: Dict[str, List[Dict]]) -> Dict:
    """Medians per iterator, and the ratios JAX / PyTorch (per round, and of the medians)."""
    out: Dict = {"results": {}}
    for name, results in got.items():
        figures = {k: statistics.median(r[k] for r in results) for k in FIGURES}
        figures["rounds"] = [r["samples_per_s"] for r in results]
        out["results"][name] = figures
    jax, torch = got["jax"], got["pytorch"]
    cpu = lambda r: r["main_process_cpu_ms_per_step"] + r["workers_cpu_ms_per_step"]  # noqa: E731
    out["ratios"] = {
        "jax_vs_pytorch": out["results"]["jax"]["samples_per_s"] / out["results"]["pytorch"]["samples_per_s"],
        "jax_vs_pytorch_per_round": statistics.median(a["samples_per_s"] / b["samples_per_s"] for a, b in zip(jax, torch)),
        # CPU time per step (main process and workers): what each costs, whatever else runs on the machine
        "cpu_per_step_jax_vs_pytorch": statistics.median(cpu(a) / cpu(b) for a, b in zip(jax, torch)),
    }
    return out


def markdown(report: Dict) -> str:
    c = report["config"]
    lines = [f"# JAX iterator vs PyTorch iterator ({c['mode']}, {c['samples']} JPEGs, batch {c['batch_size']}, "
             f"{c['workers']} workers, {c['threads']} DALI threads, {report['machine']['cpus']} CPUs, "
             f"{'GPU ' + str(c['device_id']) if c['device_id'] is not None else 'CPU'}; median of {c['rounds']} "
             "interleaved rounds)", "", "| iterator | samples/s | rounds | first batch s | main-process CPU ms/step | "
             "workers' CPU ms/step | peak MB |", "| --- | ---: | --- | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for name, r in report["results"].items():
        rounds = ", ".join(f"{x:.0f}" for x in r["rounds"])
        lines.append(f"| {name} | {r['samples_per_s']:.0f} | {rounds} | {r['first_batch_s']:.2f} | "
                     f"{r['main_process_cpu_ms_per_step']:.1f} | {r['workers_cpu_ms_per_step']:.1f} | {r['peak_memory_mb']:.0f} |")  # fmt: skip
    lines += ["", *(f"- {k}: {v:.3f}" for k, v in report["ratios"].items()), ""]
    return "\n".join(lines)


def main(argv=None) -> Dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--samples", type=int, default=4096)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2, help="timed epochs per run (after a warm-up epoch)")
    ap.add_argument("--mode", default="augment", choices=("decode", "augment", "augment16"))
    ap.add_argument("--device-id", type=int, default=None, help="GPU id for mixed decode (default: CPU only)")
    ap.add_argument("--data-dir", default=os.path.join(HERE, "data"))
    ap.add_argument("--out", default=os.path.join(HERE, "results", "jax_vs_pytorch.json"))
    args = ap.parse_args(argv)
    from bench_data import build_bench_shards

    shards = build_bench_shards(bench_dir(args.data_dir, args.samples, 512), num_samples=args.samples)
    names = list(LOADERS)

    def one(r: int, name: str) -> Dict:
        if name == names[0 if r % 2 == 0 else -1]:
            print(f"round {r + 1} of {args.rounds}", flush=True)
        return measure(args, name)

    got = dict(zip(names, interleaved(names, args.rounds, one)))
    report = {
        "config": {k: v for k, v in vars(args).items() if k not in ("out", "data_dir")},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "data": {"shards": len(shards), "samples": args.samples},
        **summary(got),
    }
    text = markdown(report)
    print("\n" + text)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
        f.write(text)
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    if "--child" in sys.argv:
        import loaders

        loaders._CLASSES["dali_shards_jax"] = jax_loader_class()
        child_main()
    else:
        main()
