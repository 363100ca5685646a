"""What ``map=`` costs (``throughput.py --map-cost``): bytes-only samples/s of dali_shards without a
map, with an identity map (the same outputs, through the Python stage) at 2 and 8 workers, and with
a map that parses each sample's ``.json`` into box and label arrays at 1, 2, 4 and 8 workers (does it
scale with workers?). Each configuration in a fresh process, in interleaved rounds; medians."""

from __future__ import annotations

import json
import os
import statistics
from typing import Dict, List, Tuple

from harness import run_child

CONFIGS: List[Tuple[str, str, int, Dict]] = (
    [(f"no map, {w} workers", "dali_shards", w, {}) for w in (2, 8)]
    + [(f"identity map, {w} workers", "dali_shards_map", w, {"map": "identity"}) for w in (2, 8)]
    + [(f"json -> arrays map, {w} workers", "dali_shards_map", w, {"map": "json"}) for w in (1, 2, 4, 8)]
)


def measure_map_cost(script: str, args) -> Dict:
    """Run every configuration in interleaved rounds; medians, the identity map's cost and the
    JSON map's scaling."""
    runs: Dict[str, List[Dict]] = {name: [] for name, *_ in CONFIGS}
    batch = max(8, args.batch_size // 8 * 8)  # a multiple of every worker count here
    for r in range(args.rounds):
        for name, loader, workers, options in CONFIGS if r % 2 == 0 else CONFIGS[::-1]:  # no order favoured
            cmd = ["--child", "throughput", "--loader", loader, "--options", json.dumps(options), "--mode", "bytes",
                   "--data-dir", args.data_dir, "--samples", str(args.samples), "--batch-size", str(batch),
                   "--workers", str(workers), "--threads", str(args.threads), "--epochs", str(args.epochs)]  # fmt: skip
            result = run_child(script, cmd, timeout=1800)
            if "error" in result:
                raise SystemExit(f"{name} failed: {result['error']}")
            runs[name].append(result)
            print(f"map cost: {name:32} {result['samples_per_s']:9.0f} samples/s", flush=True)
    rates = {name: statistics.median(r["samples_per_s"] for r in rs) for name, rs in runs.items()}
    cost = {w: 1 - rates[f"identity map, {w} workers"] / rates[f"no map, {w} workers"] for w in (2, 8)}
    base = rates["json -> arrays map, 1 workers"]
    scaling = {w: rates[f"json -> arrays map, {w} workers"] / base for w in (1, 2, 4, 8)}
    return {"batch_size": batch, "samples_per_s": rates, "identity_map_cost": cost, "json_map_scaling": scaling,
            "cpus": os.cpu_count()}  # fmt: skip
