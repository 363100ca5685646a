"""What a worker spends per sample, by stage: read, parse, check, pack, hand-over.

One worker source runs in this process (no DALI, no other process), over the benchmark's JPEG shards
(bytes of ``.jpg`` and ``.cls``, image check on), and writes each mini-batch into a buffer as the ring
transfer writes it into its slot. CPU time per sample is measured without a profiler (median of
``--rounds`` epochs); a profile of one more epoch splits it into stages by where the time is spent
(each function's own time, by module):

- read: the system calls that bring the bytes (``pread``/``preadv``/``read``/``readinto``);
- parse: the tar headers (``tar/format.py``, ``tar/header.py``, ``tar/spans.py``,
  ``io/positioned.py``);
- check: the image check (``worker/imagecheck.py``);
- pack: fields to a packed sample (``shm/packing.py`` but the table, ``slots.py``, ``stage.py``,
  ``decoders.py``, ``outputs.py``);
- hand-over: the mini-batch's table written into the slot (``Packing.table_array``);
- plan and order: everything else (the worker source, the reading loop, NumPy and Python built-ins
  called from the stages above).

Contiguous runs (``--block 0``) and interleaving (``--block 256``, with at least as many shards as a
worker's share of a batch: ``--per-shard 64``) read differently; run both. Prints a table and writes
JSON.

    python benchmarks/worker_cost.py --block 0 && python benchmarks/worker_cost.py --block 256 --per-shard 64
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
_PARSE = ("tarformat.py", "tarheader.py", "spanparse.py", "positioned.py", "tarblocks.py")
_PACK = ("packing.py", "slots.py", "stage.py", "decoders.py", "outputs.py")


def stage_of(filename: str, function: str) -> str:
    """The stage a profiled function's own time belongs to (see the module)."""
    if function in ("table_array", "table_size") or filename.endswith("tables.py"):
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
    opts = ShardedOptions.from_keywords(source=shards, fields=("jpg", "cls"), batch_size=args.batch_size,
                                        py_num_workers=2, shuffle=True, shuffle_block=args.block)  # fmt: skip
    resolved = resolve(opts)
    config = resolved.workers[0]
    def new_source():
        try:
            return source_of(config, direct=True)
        except TypeError:  # a release before the fast path (for before/after figures)
            return source_of(config)

    return config, resolved.spec.epoch(0).interleaving, new_source


def one_epoch(config, new_source, epoch: int, buffer) -> int:
    """An epoch's steps written into ``buffer`` as the ring's producer writes them into its slot."""
    try:
        from dali_shards.shm.tables import as_table
    except ImportError:  # a release before the fast path (for before/after figures)

        class as_table:  # noqa: N801 - stands in for the function
            def __init__(self, packing, samples):
                self.packing, self.samples = packing, samples

            def __len__(self):
                return len(self.samples)

            def write(self, out):
                self.packing.table_array(self.samples, out=out[: self.packing.table_size(self.samples)])

    count = 0
    for batch in new_source().epoch(epoch):
        table = as_table(config.packing, batch)
        table.write(buffer)
        count += len(table)
    return count


def measure(args) -> Dict:
    import numpy as np

    config, interleaving, new_source = make_source(args)
    buffer = np.empty(256 << 20, dtype=np.uint8)
    one_epoch(config, new_source, 0, buffer)  # warm the page cache and the imports
    costs = []
    for r in range(args.rounds):
        t = time.process_time()
        n = one_epoch(config, new_source, r + 1, buffer)
        costs.append((time.process_time() - t) / n * 1e6)
    profile = cProfile.Profile()
    profile.enable()
    one_epoch(config, new_source, args.rounds + 1, buffer)
    profile.disable()
    own: Dict[str, float] = dict.fromkeys(STAGES, 0.0)
    for (filename, _, function), (_, _, tottime, _, _) in pstats.Stats(profile).stats.items():
        own[stage_of(filename, function)] += tottime
    total = sum(own.values())
    per_sample = statistics.median(costs)
    return {
        "interleaving": interleaving,
        "cpu_us_per_sample": per_sample,
        "rounds_us": costs,
        "stages_us": {k: per_sample * v / total for k, v in own.items()},
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--samples", type=int, default=8192)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--block", type=int, default=0, help="shuffle_block (0: contiguous runs)")
    ap.add_argument("--per-shard", type=int, default=512, help="samples per shard (interleaving needs a shard per sample of a worker's step)")
    ap.add_argument("--rounds", type=int, default=5, help="timed epochs (median)")
    ap.add_argument("--data-dir", default=os.path.join(HERE, "data"))
    ap.add_argument("--out", default=None, help="JSON (default: results/worker_cost_<mode>.json)")
    args = ap.parse_args(argv)
    result = measure(args)
    mode = "interleaved" if result["interleaving"] else "contiguous"
    print(f"{mode}: {result['cpu_us_per_sample']:.1f} us of worker CPU per sample (median of {args.rounds} epochs: "
          f"{', '.join(f'{c:.1f}' for c in result['rounds_us'])})")  # fmt: skip
    for stage, us in result["stages_us"].items():
        print(f"  {stage:15} {us:6.1f} us")
    out = args.out or os.path.join(HERE, "results", f"worker_cost_{mode}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump({"config": {k: v for k, v in vars(args).items() if k not in ("out", "data_dir")}, **result}, f,
                  indent=1)  # fmt: skip
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
