"""What a worker spends per sample, by stage: read, parse, check, pack, hand-over.

One worker source runs in this process (no DALI, no other process), over the benchmark's JPEG shards
(bytes of ``.jpg`` and ``.cls``, image check on), and writes each mini-batch into a buffer as the ring
transfer writes it into its slot. CPU time per sample is measured without a profiler (median of
``--rounds`` epochs); a profile of one more epoch splits it into stages by where the time is spent
(each function's own time, by module):

- read: the system calls that bring the bytes (``pread``/``preadv``/``read``/``readinto``);
- parse: the tar headers and where the fields lie (``tar/`` but the header-only scan,
  ``io/positioned.py``, ``worker/located.py``);
- check: the image check (``worker/imagecheck.py``);
- pack: fields to a packed sample (``ipc/packing.py`` but the table, ``ipc/packed.py``,
  ``worker/codec.py``, ``worker/stage.py``, ``worker/decoders.py``, ``worker/outputs.py``);
- hand-over: the mini-batch's table written into the slot (``Packing.table_array``);
- plan and order: everything else (the worker source, the reading loop, NumPy and Python built-ins
  called from the stages above).

Contiguous runs (``--block 0``) and interleaving (``--block 256``, with at least as many shards as a
worker's share of a batch: ``--per-shard 64``) read differently; run both. ``--per-step`` measures
several step sizes (samples a worker fills per step: a batch of 256 shared by 2 to 16 workers fills
128 to 16) in one run, each against the first: a worker's cost per sample should not depend on it.
Prints a table and writes JSON.

    python benchmarks/worker_cost.py --block 0 && python benchmarks/worker_cost.py --block 256 --per-shard 64
    python benchmarks/worker_cost.py --per-step 256,32,16
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import sys
import time
from typing import Dict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

STAGES = ("read", "parse", "check", "pack", "hand-over", "plan and order")
_READS = ("preadv", "pread", "'read' of", "'readinto' of")
_PARSE = ("tar/format.py", "tar/header.py", "tar/spans.py", "tar/members.py", "io/positioned.py", "tar/blocks.py",
          "worker/located.py")  # fmt: skip
_PACK = ("ipc/packing.py", "ipc/packed.py", "worker/codec.py", "worker/stage.py", "worker/decoders.py",
         "worker/outputs.py")


def stage_of(filename: str, function: str) -> str:
    """The stage a profiled function's own time belongs to (see the module)."""
    filename = filename.replace(os.sep, "/")
    if function in ("table_array", "table_size") or filename.endswith("ipc/tables.py"):
        return "hand-over"
    if filename == "~" and any(r in function for r in _READS):
        return "read"
    if filename.endswith(_PARSE):
        return "parse"
    if filename.endswith("imagecheck.py"):
        return "check"
    if filename.endswith(_PACK):
        return "pack"
    return "plan and order"


def make_source(args):
    from bench_data import build_bench_shards
    from harness import bench_dir

    from dali_shards.options import ShardedOptions
    from dali_shards.setup.resolve import resolve
    from dali_shards.worker.sources import make_source as source_of

    shards = build_bench_shards(bench_dir(args.data_dir, args.samples, args.per_shard), num_samples=args.samples,
                                samples_per_shard=args.per_shard)  # fmt: skip
    opts = ShardedOptions.from_keywords(source=shards, fields=("jpg", "cls"), batch_size=2 * args.per_step,
                                        py_num_workers=2, shuffle=True, shuffle_block=args.block)  # fmt: skip
    resolved = resolve(opts)
    config = resolved.workers[0]
    def new_source():
        try:
            return source_of(config, direct=True)
        except TypeError:  # a release before the fast path (for before/after figures)
            return source_of(config)

    return config, resolved.spec.epoch(0).interleaving, new_source


def one_epoch(config, source, epoch: int, buffer) -> int:
    """An epoch's steps written into ``buffer`` as the ring's producer writes them into its slot
    (one source for every epoch, as a worker process keeps it)."""
    try:
        from dali_shards.ipc.tables import as_table
    except ImportError:  # a release before the fast path (for before/after figures)

        class as_table:  # noqa: N801 - stands in for the function
            def __init__(self, packing, samples):
                self.packing, self.samples = packing, samples

            def __len__(self):
                return len(self.samples)

            def write(self, out):
                self.packing.table_array(self.samples, out=out[: self.packing.table_size(self.samples)])

    count = 0
    for batch in source.epoch(epoch):
        table = as_table(config.packing, batch)
        table.write(buffer)
        count += len(table)
    return count


def measure(args, per_steps) -> Dict[int, Dict]:
    """Each step size's cost per sample: the sizes measured in interleaved rounds (one epoch of each
    per round), so that machine noise hits them alike; then a profile of each."""
    import numpy as np

    cases = {}
    buffer = np.empty(256 << 20, dtype=np.uint8)
    for n in per_steps:
        config, interleaving, new_source = make_source(argparse.Namespace(**{**vars(args), "per_step": n}))
        source = new_source()
        one_epoch(config, source, 0, buffer)  # warm the page cache, the imports and the worker's buffers
        cases[n] = (config, interleaving, source, [])
    for r in range(args.rounds):
        for config, _, source, costs in cases.values():
            t = time.process_time()
            count = one_epoch(config, source, r + 1, buffer)
            costs.append((time.process_time() - t) / count * 1e6)
    out = {}
    for n, (config, interleaving, source, costs) in cases.items():
        profile = cProfile.Profile()
        profile.enable()
        one_epoch(config, source, args.rounds + 1, buffer)
        profile.disable()
        own: Dict[str, float] = dict.fromkeys(STAGES, 0.0)
        for (filename, _, function), (_, _, tottime, _, _) in pstats.Stats(profile).stats.items():
            own[stage_of(filename, function)] += tottime
        total = sum(own.values())
        per_sample = statistics.median(costs)
        out[n] = {"interleaving": interleaving, "cpu_us_per_sample": per_sample, "rounds_us": costs,
                  "stages_us": {k: per_sample * v / total for k, v in own.items()}}  # fmt: skip
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--samples", type=int, default=8192)
    ap.add_argument("--per-step", default="128", help="samples a worker fills per step (comma-separated: each one measured)")
    ap.add_argument("--block", type=int, default=0, help="shuffle_block (0: contiguous runs)")
    ap.add_argument("--per-shard", type=int, default=512, help="samples per shard (interleaving needs a shard per sample of a worker's step)")
    ap.add_argument("--rounds", type=int, default=5, help="timed epochs (median)")
    ap.add_argument("--data-dir", default=os.path.join(HERE, "data"))
    ap.add_argument("--out", default=None, help="JSON (default: results/worker_cost_<mode>.json)")
    args = ap.parse_args(argv)
    cases = measure(args, [int(n) for n in args.per_step.split(",")])
    for per_step, result in cases.items():
        mode = "interleaved" if result["interleaving"] else "contiguous"
        print(f"{mode}, {per_step} samples per step: {result['cpu_us_per_sample']:.1f} us of worker CPU per sample "
              f"(median of {args.rounds} epochs: {', '.join(f'{c:.1f}' for c in result['rounds_us'])})")  # fmt: skip
        for stage, us in result["stages_us"].items():
            print(f"  {stage:15} {us:6.1f} us")
    first = next(iter(cases.values()))["cpu_us_per_sample"]
    print("\n| samples per step | us per sample | relative to the first |\n| ---: | ---: | ---: |")
    for per_step, result in cases.items():
        result["relative"] = result["cpu_us_per_sample"] / first
        print(f"| {per_step} | {result['cpu_us_per_sample']:.1f} | {result['relative']:.2f}x |")
    mode = "interleaved" if result["interleaving"] else "contiguous"
    out = args.out or os.path.join(HERE, "results", f"worker_cost_{mode}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    from harness import package_tree  # which tree was measured (an earlier one through PYTHONPATH: a before/after)

    with open(out, "w") as f:
        json.dump({"dali_shards_from": package_tree(),
                   "config": {k: v for k, v in vars(args).items() if k not in ("out", "data_dir")},
                   "cases": {str(k): v for k, v in cases.items()}}, f, indent=1)  # fmt: skip
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
