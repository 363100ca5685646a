"""Samples/s of dali_shards (each transfer: ``ring`` and ``merge``) vs DALI's native webdataset
reader vs the plain #4892 workaround, over a range of worker counts.

All read the same shards with the same batch size and threads, in one run, in the modes of
``--modes``: bytes only (the encoded JPEG reaches Python, no decoding) and peek (DALI reads each
JPEG's header in place: the CPU side of GPU decoding) at every worker count of ``--workers``, and
CPU decode + resize to 224x224 at ``--decode-workers``. Each configuration runs in a process of its
own, in interleaved rounds (A B C ... then ... C B A), so that machine noise hits all of them alike;
each figure is the median over rounds. Reported per configuration: samples/s, time to the first
batch (from the pipeline's construction), the main process's CPU per step (all its threads; and
its main thread alone), peak memory (PSS of the process and its workers) and the shared memory
the main process maps. Prints a table and writes JSON. (``compare.py`` adds webdataset +
DataLoader, DALI Proxy and an audit; ``--map-cost`` adds what ``map=`` costs, see ``map_cost.py``;
``--image-check-cost`` the worker-side image check's; ``--baseline TREE`` the ring of an earlier
version, in the same rounds: a before/after that this VM's drift between two runs cannot skew;
``--positions`` each step's time by its position in the epoch, and the steady and whole-epoch rates:
``positions.py``; ``--turn`` measures the epoch turn as issue 47 states it: bytes only, the ring at
2, 8 and 16 workers, 12 shards of 256 JPEGs, 12 steps per epoch, no peers, with ``--positions``.)

    python benchmarks/throughput.py --samples 8192 --batch-size 256 --workers 1,2,4,8
    python benchmarks/throughput.py --turn --rounds 5 --baseline /tmp/main-tree
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from typing import Dict, List, NamedTuple, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from harness import bench_dir, child_main, interleaved, run_child  # noqa: E402
from positions import markdown, per_round, positions_of, print_positions  # noqa: E402

TRANSFERS = ("ring", "merge")
WORKER_MODES = ("bytes", "peek")  # measured at every worker count of --workers
CHECK_OFF = "ring, image_check=off"  # the worker-side image check's cost: the same loader without it
FIGURES = ("samples_per_s", "first_batch_s", "main_process_cpu_ms_per_step", "main_thread_cpu_ms_per_step",
           "peak_memory_mb", "shared_memory_mb")  # fmt: skip


BASELINE = "ring@baseline"  # the ring as an earlier source tree has it (--baseline)


class Run(NamedTuple):
    """One configuration: its label, the harness's loader, options, mode and workers; ``tree``: the
    source tree it imports dali_shards from (None: this one)."""

    label: str
    loader: str
    options: Dict
    mode: str
    workers: int
    tree: Optional[str] = None


def configurations(args) -> List[Run]:
    """Every configuration measured (see the module)."""
    runs: List[Run] = []
    for mode in [m for m in args.modes.split(",") if m]:
        counts = args.workers if mode in WORKER_MODES else [args.decode_workers]
        for n in counts:
            runs += [Run(t, "dali_shards", {"transfer": t}, mode, n) for t in args.transfers.split(",")]
            if args.baseline and mode in WORKER_MODES:
                runs.append(Run(BASELINE, "dali_shards", {"transfer": "ring"}, mode, n, args.baseline))
        if args.peers:
            runs.append(Run("native_webdataset", "native_webdataset", {}, mode, counts[0]))  # threads, no workers
            runs.append(Run("plain_4892", "plain_4892", {}, mode, args.decode_workers))
        if args.image_check_cost:
            runs.append(Run(CHECK_OFF, "dali_shards", {"image_check": "off"}, mode, args.decode_workers))
    return runs


def measure(args, run: Run) -> Dict:
    cmd = ["--child", "throughput", "--loader", run.loader, "--options", json.dumps(run.options), "--mode",
           run.mode, "--data-dir", args.data_dir, "--samples", str(args.samples), "--per-shard", str(args.per_shard), "--batch-size",
           str(args.batch_size), "--workers", str(run.workers), "--threads", str(args.threads), "--epochs",
           str(args.epochs)]  # fmt: skip
    if args.device_id is not None:
        cmd += ["--device-id", str(args.device_id)]
    result = run_child(os.path.abspath(__file__), cmd, timeout=1800, tree=run.tree)
    if "error" in result:
        raise SystemExit(f"{run} failed: {result['error']}")
    print(f"  {run.mode:6} {run.label:24} {run.workers} workers: {result['samples_per_s']:9.0f} samples/s", flush=True)
    return result


def measure_all(args, runs: List[Run]) -> Dict[Tuple[str, str, int], Dict]:
    """Every configuration in interleaved rounds (odd rounds in reverse order); medians."""
    def one(r: int, run: Run) -> Dict:
        if run is runs[0 if r % 2 == 0 else -1]:
            print(f"round {r + 1} of {args.rounds}", flush=True)
        return measure(args, run)

    got = interleaved(runs, args.rounds, one)
    out = {}
    for run, results in zip(runs, got):
        figures = {k: statistics.median(x[k] for x in results) for k in FIGURES if k != "peak_memory_mb"}
        figures["peak_memory_mb"] = max(x["peak_memory_mb"] for x in results)
        figures["rounds"] = [x["samples_per_s"] for x in results]
        figures["dali_shards_from"] = sorted({x["dali_shards_from"] for x in results if "dali_shards_from" in x})
        if args.positions and run.loader == "dali_shards":
            figures["positions"] = {**positions_of([e for x in results for e in x["step_ms"]], args.batch_size),
                                    "rounds": per_round([x["step_ms"] for x in results], args.batch_size)}  # fmt: skip
            figures["step_ms"] = [[[round(t, 2) for t in e] for e in x["step_ms"]] for x in results]  # by round, epoch
        out[(run.mode, run.label, run.workers)] = figures
    return out


def ratios_of(results: Dict[Tuple[str, str, int], Dict], args) -> Dict[str, float]:
    """The ratios the targets are stated in (all from this one run)."""
    rate = lambda mode, label, n: results.get((mode, label, n), {}).get("samples_per_s")  # noqa: E731
    out: Dict[str, float] = {}
    for m, n in [(m, n) for m in WORKER_MODES for n in args.workers]:
        ring, merge, native = rate(m, "ring", n), rate(m, "merge", n), rate(m, "native_webdataset", args.workers[0])
        if ring and merge:
            out[f"{m}_ring_vs_merge_{n}_workers"] = ring / merge
        if ring and native:
            out[f"{m}_ring_vs_native_{n}_workers"] = ring / native
        if n != 2 and ring and rate(m, "ring", 2):  # the ring's scaling over workers (16 share a batch of 256)
            out[f"{m}_ring_{n}_vs_2_workers"] = ring / rate(m, "ring", 2)
        if ring and rate(m, BASELINE, n):  # the ratio of medians, and the median of each round's ratio
            out[f"{m}_ring_vs_baseline_{n}_workers"] = ring / rate(m, BASELINE, n)
            pairs = zip(results[(m, "ring", n)]["rounds"], results[(m, BASELINE, n)]["rounds"])
            out[f"{m}_ring_vs_baseline_{n}_workers_per_round"] = statistics.median(a / b for a, b in pairs)
    for (m, label, n), r in results.items():
        if "positions" in r:  # the epoch turn's targets (positions.py)
            out[f"{m}_{label}_{n}_workers_worst_step_vs_median"] = r["positions"]["worst_step_vs_median"]
            out[f"{m}_{label}_{n}_workers_whole_epoch_vs_steady"] = r["positions"]["whole_vs_steady"]
    d = args.decode_workers
    for label in TRANSFERS:
        if rate("decode", label, d) and rate("decode", "native_webdataset", d):
            out[f"decode_{label}_vs_native_{d}_workers"] = rate("decode", label, d) / rate("decode", "native_webdataset", d)
    for mode in ("bytes", "decode"):
        ring, native = results.get((mode, "ring", d)), results.get((mode, "native_webdataset", args.workers[0] if mode == "bytes" else d))
        if ring and native:
            out[f"{mode}_first_batch_ring_vs_native"] = ring["first_batch_s"] / native["first_batch_s"]
        if (mode, CHECK_OFF, d) in results and ring:
            out[f"{mode}_image_check_vs_off"] = ring["samples_per_s"] / results[(mode, CHECK_OFF, d)]["samples_per_s"]
    if rate("bytes", "ring", d) and rate("bytes", "plain_4892", d):
        out[f"bytes_ring_vs_plain_4892_{d}_workers"] = rate("bytes", "ring", d) / rate("bytes", "plain_4892", d)
    return out


def print_table(results: Dict[Tuple[str, str, int], Dict], ratios: Dict[str, float], header: str) -> None:
    print()
    print(header)
    print(f"{'mode':7} {'loader':24} {'workers':>7} {'samples/s':>10} {'first s':>8} {'cpu ms/step':>11} "
          f"{'main-thread ms':>14} {'peak MB':>8} {'shm MB':>7}")  # fmt: skip
    for (mode, label, n), r in results.items():
        print(f"{mode:7} {label:24} {n:7d} {r['samples_per_s']:10.0f} {r['first_batch_s']:8.2f} "
              f"{r['main_process_cpu_ms_per_step']:11.1f} {r['main_thread_cpu_ms_per_step']:14.1f} "
              f"{r['peak_memory_mb']:8.0f} {r['shared_memory_mb']:7.0f}")  # fmt: skip
    print()
    for name, value in ratios.items():
        print(f"{name:52} {value:5.2f}x")


TURN = {"samples": 3072, "per_shard": 256, "workers": "2,8,16", "modes": "bytes", "transfers": "ring", "epochs": 5,
        "positions": True, "peers": False, "out": os.path.join(HERE, "results", "throughput_turn.json")}  # fmt: skip


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--samples", type=int, default=8192, help="dataset size (a multiple of 512 x workers)")
    ap.add_argument("--per-shard", type=int, default=512, help="samples per shard")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--workers", default="1,2,4,8", help="py_num_workers measured in bytes mode (comma-separated)")
    ap.add_argument("--decode-workers", type=int, default=2, help="py_num_workers of the decode mode and the peers")
    ap.add_argument("--threads", type=int, default=2, help="DALI num_threads")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; each runs every configuration once")
    ap.add_argument("--epochs", type=int, default=2, help="timed epochs per run (after a warm-up epoch)")
    ap.add_argument("--modes", default="bytes,decode")
    ap.add_argument("--transfers", default=",".join(TRANSFERS), help="the transfers measured (comma-separated)")
    ap.add_argument("--device-id", type=int, default=None, help="GPU id for mixed decode (default: CPU only)")
    ap.add_argument("--data-dir", default=os.path.join(HERE, "data"))
    ap.add_argument("--out", default=os.path.join(HERE, "results", "throughput.json"))
    ap.add_argument("--map-cost", action="store_true", help="also measure map= (identity and JSON -> arrays)")
    ap.add_argument("--image-check-cost", action="store_true", help=f"also measure '{CHECK_OFF}'")
    ap.add_argument("--baseline", default=None, help="a source tree of an earlier version (e.g. from git archive): its "
                    f"ring measured as '{BASELINE}' in the same rounds, in the modes measured at every worker count "
                    "of --workers")  # fmt: skip
    ap.add_argument("--positions", action="store_true", help="each step's time by position in the epoch, both rates")
    ap.add_argument("--no-peers", dest="peers", action="store_false", help="leave DALI's reader and the plain "
                    "workaround out")  # fmt: skip
    ap.add_argument("--turn", action="store_true", help=f"the epoch turn as issue 47 measures it (explicit options "
                    f"win): {TURN}")  # fmt: skip
    args = ap.parse_args(argv)
    if args.turn:
        ap.set_defaults(**TURN)
        args = ap.parse_args(argv)
    args.workers = [int(w) for w in args.workers.split(",")]
    if args.peers and any(args.samples % (512 * w) for w in args.workers + [args.decode_workers]):
        ap.error("--samples must be a multiple of 512 x every worker count (the plain workaround needs equal shares)")
    return args


def main(argv=None):
    args = parse_args(argv)
    from bench_data import build_bench_shards

    shards = build_bench_shards(bench_dir(args.data_dir, args.samples, args.per_shard), num_samples=args.samples,
                                samples_per_shard=args.per_shard)  # fmt: skip
    mean_kb = sum(os.path.getsize(p) for p in shards) / args.samples / 1024
    results = measure_all(args, configurations(args))
    ratios = ratios_of(results, args)
    report = {
        "config": {k: v for k, v in vars(args).items() if k not in ("out", "data_dir")},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "data": {"shards": len(shards), "samples": args.samples, "mean_kb_per_sample": round(mean_kb, 1)},
        "results": [{"mode": m, "loader": label, "workers": n, **r} for (m, label, n), r in results.items()],
        "ratios": ratios,
    }
    if args.map_cost:
        from map_cost import measure_map_cost

        report["map"] = measure_map_cost(os.path.abspath(__file__), args)
    header = (f"{args.samples} JPEGs ({mean_kb:.0f} KB avg) in {len(shards)} shards, batch {args.batch_size}, "
              f"{args.threads} DALI threads, {os.cpu_count()} CPUs; median of {args.rounds} interleaved rounds, each "
              "run in its own process")  # fmt: skip
    print_table(results, ratios, header)
    if args.positions:
        table = {f"{m} {label} {n}w": r["positions"] for (m, label, n), r in results.items() if "positions" in r}
        title = f"Step times by position in the epoch (ms), {args.epochs} timed epochs x {args.rounds} rounds"
        print_positions(table, title)
        with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
            f.write(markdown(table, f"{title}; {header}"))
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
