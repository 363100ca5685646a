"""The catalog cases of ``benchmarks/scale.py`` (issue 47): a rank's catalog of a version-3 manifest as
``dali-shards index`` writes it (``manifest_data``), read in a fresh process, and the ranks of one node
reading it together.

- ``catalog-10k``, ``catalog-100k``, ``catalog-1m`` (10k shards x 1k samples, 100k x 1k, 1M x 10k):
  the first rank of a node, whose node has no copy yet (it builds the node's copy); ``-warm``: every
  other rank (the node's copy is there: mapped). A release without the columnar catalog reads the
  manifest (``read_manifest``) in both.
- ``node-100k-1``, ``node-100k-8``, ``node-1m-1``, ``node-1m-8``: 1 or 8 ranks of one node started
  together (one process each, the node's copy not there yet), each reading the catalog and keeping it;
  the node's time (from the start signal until every rank holds its catalog) and memory: the sum over
  ranks of the increase of each one's proportional set size (PSS, ``/proc/<pid>/smaps_rollup``: pages
  a process shares with others count as their share, so that a map shared by 8 counts once in all)
  while every rank still holds its catalog, each having read all of it once (every column: a mapped
  file's pages then count). ``hwm_mib``: the sum of the ranks' peak resident growth.

A rank's case reports ``mib``, its peak resident growth while it loads (scale.py's measure),
``loaded_mib``, its resident growth once loaded, and ``held_mib``, once it has read every column.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = {"10k": (10_000, 1000), "100k": (100_000, 1000), "1m": (1_000_000, 10_000), "smoke": (4000, 10)}


def load(path: str, cache_dir: str) -> Any:
    """What a rank's main process holds of the manifest: its catalog (a release before: its ShardInfos)."""
    from dali_shards.options import StorageOptions

    config = StorageOptions(cache_dir=cache_dir)
    try:
        from dali_shards.catalog.manifest import read_catalog
    except ImportError:
        from dali_shards.catalog.manifest import read_manifest

        return read_manifest(path, config)
    return read_catalog(path, config)


def touch(shards: Any) -> None:
    """Read every column of a catalog once, as a rank that uses all of it does (a mapped file's pages
    then count in its memory); a release before's ``ShardInfo``s are all in memory already."""
    for array in getattr(shards, "columns", {}).values():
        array.view(np.uint8).sum() if array.size else None


def rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def count(shards: Any) -> int:
    samples = getattr(shards, "samples", None)
    return int(samples.sum()) if samples is not None else sum(s.samples for s in shards)


def manifest(root: str, size: str) -> str:
    sys.path.insert(0, HERE)
    from manifest_data import write_synthetic

    return write_synthetic(root, *SIZES[size])


def case_catalog(root: str, size: str, warm: bool) -> Callable[[], Dict[str, Any]]:
    """The setup (parent and child) and the measured read of one rank."""
    path = manifest(root, size)
    if warm:
        cache = os.path.join(root, f"cache-warm-{size}")
        if not os.path.isdir(os.path.join(cache, "catalogs")):  # built once, by another process
            subprocess.run([sys.executable, __file__, "--build", path, cache], check=True)
    else:
        cache = tempfile.mkdtemp(prefix="cache-cold-", dir=root)
        atexit.register(shutil.rmtree, cache, True)
    held: List[Any] = []

    def run() -> Dict[str, Any]:
        before = rss_kib()
        held.append(load(path, cache))
        loaded = rss_kib()
        touch(held[-1])
        return {"shards": len(held[-1]), "samples": count(held[-1]), "loaded_mib": round((loaded - before) / 1024, 1),
                "held_mib": round((rss_kib() - before) / 1024, 1)}  # fmt: skip

    return run


def pss_kib() -> int:
    with open("/proc/self/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Pss:"))


def hwm_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))


def case_node(root: str, size: str, ranks: int) -> Callable[[], Dict[str, Any]]:
    path = manifest(root, size)

    def run() -> Dict[str, Any]:
        cache = tempfile.mkdtemp(prefix="cache-node-", dir=root)
        try:
            return node(path, cache, ranks)
        finally:
            shutil.rmtree(cache, ignore_errors=True)

    return run


def node(path: str, cache: str, ranks: int) -> Dict[str, Any]:
    """``ranks`` processes reading the catalog together (see the module)."""
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", path, cache], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for _ in range(ranks)]  # fmt: skip
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        for p in procs:  # every rank alive: each one's baseline PSS taken now
            p.stdin.write("base\n")
            p.stdin.flush()
        for p in procs:
            assert p.stdout.readline().strip() == "based"
        start = time.perf_counter()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        seconds = [float(p.stdout.readline()) for p in procs]
        wall = time.perf_counter() - start
        for p in procs:  # every rank has read all of its catalog before any is measured
            assert p.stdout.readline().strip() == "touched"
        for p in procs:
            p.stdin.write("measure\n")
            p.stdin.flush()
        rows = [json.loads(p.stdout.readline()) for p in procs]
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(timeout=60)
    return {"seconds": round(wall, 3), "mib": round(sum(r["pss"] for r in rows) / 1024, 1), "ranks": ranks,
            "rank_seconds_max": round(max(seconds), 3), "hwm_mib": round(sum(r["hwm"] for r in rows) / 1024, 1),
            "shards": rows[0]["shards"]}  # fmt: skip


def rank(path: str, cache: str) -> None:
    """One rank of the node case, driven by its parent line by line."""
    import numpy  # noqa: F401 - loaded before the baseline, as a rank has it

    import dali_shards.plan.resume  # noqa: F401
    from dali_shards.catalog import manifest as _  # noqa: F401

    print("ready", flush=True)
    sys.stdin.readline()
    base_pss, base_hwm = pss_kib(), hwm_kib()
    print("based", flush=True)
    sys.stdin.readline()
    start = time.perf_counter()
    held = load(path, cache)
    print(time.perf_counter() - start, flush=True)
    touch(held)
    print("touched", flush=True)
    sys.stdin.readline()
    print(json.dumps({"pss": pss_kib() - base_pss, "hwm": hwm_kib() - base_hwm, "shards": len(held)}), flush=True)
    sys.stdin.readline()


if __name__ == "__main__":
    if sys.argv[1] == "--rank":
        rank(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "--build":
        load(sys.argv[2], sys.argv[3])
