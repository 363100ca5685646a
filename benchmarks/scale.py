"""What one process pays at internet scale: planning, resuming and reading the catalog, per
process, each case in a fresh process (its peak memory is its own), default options
(``shuffle=True``, ``shuffle_block=256``, batch 256).

Cases (``--cases``, default all):

- ``order-10k``, ``order-100k``, ``order-1m``: one worker's epoch order (what a worker computes when
  an epoch starts: the plan and its emissions) for 10k shards x 1k samples at 64 ranks x 8 workers,
  100k x 1k at 512 x 8, 1M x 10k at 4,096 x 8;
- ``elastic-10m``, ``elastic-100m``: resuming half an epoch of 10M (100M) samples, saved at 64 x 8
  (512 x 8), under 48 x 8 (384 x 8): the resume point and a new worker's emissions;
- ``manifest-10k``, ``manifest-100k``: reading the manifest of 10k (100k) shards x 1k samples with
  sample offsets and key fingerprints, as a rank's main process does at start (``read_manifest``:
  one ``ShardInfo`` per shard);
- ``catalog-10k``, ``catalog-100k``, ``catalog-1m`` (and ``-warm``), ``node-100k-1``, ``node-100k-8``,
  ``node-1m-1``, ``node-1m-8``: a rank's catalog of a manifest as ``dali-shards index`` writes it, the
  first rank of a node and the others, and 8 ranks of one node together (``catalog_cases``);
  ``catalog-smoke``, ``node-smoke-2``: the same, tiny (CI);
- ``readers-2000``, ``readers-20000``: workers reading a piece of each shard in an epoch (mean over
  shards), 2,000 shards x 200 and 20,000 x 20 at 64 x 4;
- ``first-batch``: a rank's time from ``@sharded_pipeline`` to its first batch through the public
  API, 20k tiny shards at world 512 (rank 0, 2 workers, batch 32, CPU);
- ``mix-10x100k``: ``order-1m`` for a mix of 10 streams of 100k shards x 10k samples, each drawn
  once an epoch (the same draws as one dataset of 1M shards); ``mix-10x100k-skewed``,
  ``mix-10x100k-stratified``: in proportions 1 to 10 (streams drawn in part or more than once),
  ``batching`` random or stratified; ``mix-elastic-10m``: ``elastic-10m`` for a stratified mix of
  10 streams of 1k shards x 1k samples in proportions 1 to 10;
- ``mix-choose-1e5``, ``mix-choose-1e7``: ``choose=`` 100k (10M) draws of one stream of 10 samples
  (2 shards of 5): 10k (1M) passes over it, at 64 ranks x 8 workers; ``mix-10m-1k``,
  ``mix-10m-1k-stratified``: docs/mixing.md's mix (``repeat=2``, ``proportion=3``,
  ``proportion=1``) over streams of 1,000 samples in all (100 shards of 10), ``epoch_size=10_000_000``,
  at 64 ranks x 8 workers, ``batching`` random or stratified.

Prints a table and writes ``benchmarks/results/scale.json``. Pure planning cases import no DALI.
To measure another checkout (e.g. the release before), run it with ``PYTHONPATH=<that checkout>``
and ``--out`` elsewhere.

    python benchmarks/scale.py                       # every case (about 2 minutes)
    python benchmarks/scale.py --cases order-10k,readers-2000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import catalog_cases  # noqa: E402 - beside this file
import manifest_data  # noqa: E402

NODE_RATIO = 1.2
TARGETS = {  # (seconds, MiB) or readers per shard: the targets on a 2-core machine
    "order-10k": (0.5, 150), "order-100k": (1.0, 200), "order-1m": (2.0, 500),
    "elastic-10m": (2.0, 300), "elastic-100m": (5.0, 500),
    "manifest-10k": (1.0, 150), "manifest-100k": (3.0, 400),
    # issue 47: a rank's catalog, the first of a node (it builds the node's copy) and the others (map it)
    "catalog-10k": (0.1, 10), "catalog-10k-warm": (0.1, 10), "catalog-100k": (0.5, 40), "catalog-100k-warm": (0.5, 40),
    "catalog-1m": (3.0, 300), "catalog-1m-warm": (3.0, 300), "catalog-smoke": None, "catalog-smoke-warm": None,
    # 8 ranks of a node: their catalogs' memory (PSS) at most 1.2 times one rank's
    "node-100k-1": None, "node-100k-8": "node", "node-1m-1": None, "node-1m-8": "node", "node-smoke-1": None,
    "node-smoke-2": "node",
    "readers-2000": 9.0, "readers-20000": 2.0, "first-batch": None,
    # a mix of 10 streams costs no more than one dataset of as many shards (order-1m's, elastic-10m's)
    "mix-10x100k": (2.0, 500), "mix-10x100k-skewed": (2.0, 500), "mix-10x100k-stratified": (2.0, 500),
    "mix-elastic-10m": (2.0, 300),
    # a stream drawn many times its size: a worker's cost follows its own draws, not the passes
    "mix-choose-1e5": (1.0, 200), "mix-choose-1e7": (1.0, 200), "mix-10m-1k": (1.0, 200), "mix-10m-1k-stratified": (1.0, 200),
}  # fmt: skip


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_mib() -> float:
    """This process's peak resident memory (``VmHWM``: ``ru_maxrss`` would count the parent's at
    the fork)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024


def reset_peak() -> None:
    """Start the peak over at the current resident memory, where Linux allows it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def spec_of(shards: int, per_shard: int, world: int, workers: int, streams: int = 0, batching: str = "random",
            skewed: bool = False):  # fmt: skip
    """The spec of ``shards`` shards, as one dataset or as a mix of ``streams`` streams of equal
    shards, each drawn once per epoch or (``skewed``) in proportions 1, 2, ..., ``streams`` (an
    epoch of as many samples: some streams drawn in part, others more than once)."""
    from dali_shards.plan.epoch import PlanSpec
    from dali_shards.plan.mixture import MixSpec, largest_remainder

    mix = None
    if streams:
        bounds = tuple(i * shards // streams for i in range(streams + 1))
        weights = list(range(1, streams + 1)) if skewed else [1] * streams
        mix = MixSpec(bounds, tuple(largest_remainder(shards * per_shard, weights)), batching)
    return PlanSpec((per_shard,) * shards, world_size=world, py_num_workers=workers, batch_size=256, seed=1, shuffle=True,
                    mixture=mix)  # fmt: skip


def small_mix_spec(streams, epoch_size: Any, batching: str = "random"):
    """The spec of a mix of small streams (per stream: shards, samples per shard, ``Stream``'s
    keywords) at 64 ranks x 8 workers."""
    from dali_shards.plan.epoch import PlanSpec
    from dali_shards.plan.mixture import MixSpec, Stream, stream_counts

    sizes = [per for shards, per, _ in streams for _ in range(shards)]
    bounds = [0]
    for shards, _, _ in streams:
        bounds.append(bounds[-1] + shards)
    counts = stream_counts([Stream(f"s{i}", **kw) for i, (_, _, kw) in enumerate(streams)], [n * per for n, per, _ in streams],
                           epoch_size)  # fmt: skip
    return PlanSpec(tuple(sizes), world_size=64, py_num_workers=8, batch_size=256, seed=1, shuffle=True,
                    mixture=MixSpec(tuple(bounds), counts, batching))  # fmt: skip


def case_small_mix(streams, epoch_size: Any = None, batching: str = "random") -> Callable[[], Dict[str, Any]]:
    def run() -> Dict[str, Any]:
        spec = small_mix_spec(streams, epoch_size, batching)
        emissions = spec.epoch(1).worker_emissions(spec.num_virtual_workers // 2 + 3)
        return {"emitted": len(emissions)}

    return run


DOCS_MIX = [(24, 10, {"repeat": 2}), (70, 10, {"proportion": 3}), (6, 10, {"proportion": 1})]  # docs/mixing.md's, 1,000 samples


def case_order(shards: int, per_shard: int, world: int, **mix: Any) -> Callable[[], Dict[str, Any]]:
    def run() -> Dict[str, Any]:
        spec = spec_of(shards, per_shard, world, 8, **mix)
        v = spec.num_virtual_workers // 2 + 3
        plan = spec.epoch(1)
        emissions = plan.worker_emissions(v)
        return {"emitted": len(emissions)}

    return run


def case_elastic(shards: int, per_shard: int, world: int, after: int, **mix: Any) -> Callable[[], Dict[str, Any]]:
    def run() -> Dict[str, Any]:
        from dali_shards.plan.resume import make_state, resume_point

        spec = spec_of(shards, per_shard, world, 8, **mix)
        plan = spec.epoch(2)
        state = make_state(spec, 2, [], plan, plan.steps // 2)
        new = spec_of(shards, per_shard, after, 8, **mix)
        epoch, resumed, _ = resume_point(new, state)
        emissions = resumed.worker_emissions(new.num_virtual_workers // 2)
        return {"left": int(resumed.available), "emitted": len(emissions), "epoch": epoch}

    return run


def case_manifest(path: str) -> Callable[[], Dict[str, Any]]:
    def run() -> Dict[str, Any]:
        from dali_shards.catalog.manifest import read_manifest

        shards = read_manifest(path)
        return {"shards": len(shards), "samples": sum(s.samples for s in shards)}

    return run


def case_readers(shards: int, per_shard: int) -> Callable[[], Dict[str, Any]]:
    def run() -> Dict[str, Any]:
        spec = spec_of(shards, per_shard, 64, 4)
        plan = spec.epoch(1)
        readers = [0] * shards
        for v in range(spec.num_virtual_workers):
            for shard in {seg.shard for seg in plan.worker_reads(v)}:
                readers[shard] += 1
        return {"readers_per_shard": round(sum(readers) / shards, 2), "max": max(readers)}

    return run


def case_first_batch(manifest: str) -> Callable[[], Dict[str, Any]]:
    from dali_shards import sharded_pipeline  # (imports are not what is measured)
    from dali_shards.pytorch import DALIShardedIterator

    def run() -> Dict[str, Any]:
        @sharded_pipeline(manifest, fields=("cls",), batch_size=32, py_num_workers=2, shuffle=True,
                          world_size=512, rank=0, device_id=None, num_threads=1)  # fmt: skip
        def pipe(cls):
            return cls

        next(DALIShardedIterator(pipe(), ["cls"]))
        return {}

    return run


def cases(root: str) -> Dict[str, Callable[[], Callable[[], Dict[str, Any]]]]:
    """Each case's setup (run in the parent, not measured), returning what the child measures."""
    return {
        "order-10k": lambda: case_order(10_000, 1000, 64),
        "order-100k": lambda: case_order(100_000, 1000, 512),
        "order-1m": lambda: case_order(1_000_000, 10_000, 4096),
        "elastic-10m": lambda: case_elastic(10_000, 1000, 64, 48),
        "elastic-100m": lambda: case_elastic(100_000, 1000, 512, 384),
        "manifest-10k": lambda: case_manifest(manifest_data.make_manifest(root, 10_000, 1000)),
        "manifest-100k": lambda: case_manifest(manifest_data.make_manifest(root, 100_000, 1000)),
        "readers-2000": lambda: case_readers(2000, 200),
        "readers-20000": lambda: case_readers(20_000, 20),
        "first-batch": lambda: case_first_batch(manifest_data.make_tiny_shards(root, 20_000)),
        "mix-10x100k": lambda: case_order(1_000_000, 10_000, 4096, streams=10),
        "mix-10x100k-skewed": lambda: case_order(1_000_000, 10_000, 4096, streams=10, skewed=True),
        "mix-10x100k-stratified": lambda: case_order(1_000_000, 10_000, 4096, streams=10, batching="stratified", skewed=True),
        "mix-elastic-10m": lambda: case_elastic(10_000, 1000, 64, 48, streams=10, batching="stratified", skewed=True),
        "mix-choose-1e5": lambda: case_small_mix([(2, 5, {"choose": 100_000})]),
        "mix-choose-1e7": lambda: case_small_mix([(2, 5, {"choose": 10_000_000})]),
        "mix-10m-1k": lambda: case_small_mix(DOCS_MIX, 10_000_000),
        "mix-10m-1k-stratified": lambda: case_small_mix(DOCS_MIX, 10_000_000, "stratified"),
        **{f"catalog-{size}{warm}": (lambda size=size, warm=warm: catalog_cases.case_catalog(root, size, bool(warm)))
           for size in catalog_cases.SIZES for warm in ("", "-warm")},
        **{f"node-{size}-{n}": (lambda size=size, n=n: catalog_cases.case_node(root, size, n))
           for size in catalog_cases.SIZES for n in (1, 2, 8)},
    }  # fmt: skip


def child(name: str, root: str, max_mib: int) -> None:
    if name != "first-batch":  # a pure case: a runaway one fails alone instead of exhausting the machine
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (max_mib << 20, max_mib << 20))
    run = cases(root)[name]()
    import numpy  # noqa: F401 - loaded before the baseline, as every worker has it

    import dali_shards.plan.resume  # noqa: F401

    reset_peak()
    base = rss_mib()
    start = time.perf_counter()
    extra = run()
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": round(seconds, 3), "mib": round(peak_mib() - base, 1), **extra}))


def measure(name: str, root: str, timeout: float, max_mib: int) -> Dict[str, Any]:
    cases(root)[name]()  # data made here, outside the measured process
    cmd = [sys.executable, os.path.abspath(__file__), "--child", name, "--data-dir", root, "--max-mib", str(max_mib)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout:.0f} s"}
    if out.returncode:
        last = (out.stderr.strip().splitlines() or ["exit %d" % out.returncode])[-1]
        return {"error": "out of memory (over --max-mib)" if "MemoryError" in last else last[:200]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def verdict(name: str, result: Dict[str, Any], results: Dict[str, Any]) -> str:
    target = TARGETS[name]
    if "error" in result or target is None:
        return ""
    if target == "node":  # memory against one rank's, measured in the same run
        one = results.get(name.rsplit("-", 1)[0] + "-1", {})
        return "" if "mib" not in one else "ok" if result["mib"] <= NODE_RATIO * one["mib"] else "OVER"
    if isinstance(target, tuple):
        return "ok" if result["seconds"] <= target[0] and result["mib"] <= target[1] else "OVER"
    return "ok" if result["readers_per_shard"] <= target else "OVER"


def main(argv=None) -> Dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--cases", default=",".join(TARGETS))
    ap.add_argument("--data-dir", default=os.path.join(tempfile.gettempdir(), "dali-shards-scale"))
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--max-mib", type=int, default=8192, help="address space a pure case may take (MiB)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "scale.json"))
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, args.data_dir, args.max_mib)
        return {}
    results: Dict[str, Any] = {}
    print(f"{'case':15} {'seconds':>8} {'MiB':>8} {'readers':>8}  target   verdict")
    for name in args.cases.split(","):
        result = results[name] = measure(name, args.data_dir, args.timeout, args.max_mib)
        target = TARGETS[name]
        shown = f"<= {target[0]} s, {target[1]} MiB" if isinstance(target, tuple) else \
            f"MiB <= {NODE_RATIO} x 1 rank's" if target == "node" else (f"<= {target}" if target else "-")  # fmt: skip
        if "error" in result:
            print(f"{name:15} {result['error']}", flush=True)
            continue
        cells = [result.get("seconds", ""), result.get("mib", ""), result.get("readers_per_shard", "")]
        print(f"{name:15} {cells[0]:>8} {cells[1]:>8} {cells[2]:>8}  {shown:22} {verdict(name, result, results)}", flush=True)
    report = {"machine": f"{os.cpu_count()} CPUs", "python": sys.version.split()[0], "results": results,
              "targets": {k: v for k, v in TARGETS.items()}}  # fmt: skip
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
