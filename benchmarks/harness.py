"""Measuring loaders: each measurement runs in a fresh process (no other loader's workers or
prefetching running beside it), reporting JSON on its last line of output."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, TypeVar

T = TypeVar("T")

HERE = os.path.dirname(os.path.abspath(__file__))


def bench_dir(data_dir: str, samples: int, per_shard: int) -> str:
    return os.path.join(data_dir, f"bench-{samples}x{per_shard}")


class PeakMemory:
    """Peak memory of this process and all its children (PSS where the OS gives it, so shared
    memory is not counted twice; RSS otherwise), sampled in a thread."""

    def __init__(self, interval: float = 0.2, device_id: Optional[int] = None):
        import psutil

        self.root = psutil.Process()
        self.interval = interval
        self.peak = 0
        self.kind = "pss"
        self.gpu = GpuMemory(device_id) if device_id is not None else None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> int:
        import psutil

        total = 0
        for proc in [self.root, *self.root.children(recursive=True)]:
            try:
                if self.kind == "pss":
                    total += proc.memory_full_info().pss
                else:
                    total += proc.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            except AttributeError:
                self.kind = "rss"
        self.peak = max(self.peak, total)
        if self.gpu is not None:
            self.gpu.sample()
        return total

    def _run(self):
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.sample()


class GpuMemory:
    """Peak GPU memory in use on one device above what was in use when this began (NVML; the device
    is this run's alone, so that is what the loader takes: DALI's pools and the output tensors)."""

    def __init__(self, device_id: int):
        import pynvml

        pynvml.nvmlInit()
        self.nvml = pynvml
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(device_id)
        self.base = self.used()
        self.peak = 0

    def used(self) -> int:
        return int(self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used)

    def sample(self) -> None:
        self.peak = max(self.peak, self.used() - self.base)


def measure_throughput(loader_name: str, cfg, epochs: int = 2) -> dict:
    """Time to first batch, then samples/s over ``epochs`` timed epochs after a warm-up epoch (each
    epoch's time from the end of the one before: its turn included), and each step's time."""
    from loaders import open_loader

    with PeakMemory(device_id=cfg.device_id) as memory:
        start = time.perf_counter()
        loader = open_loader(loader_name, cfg)
        batches = loader.epoch()
        count = len(next(batches))
        first_batch = time.perf_counter() - start
        for ids in batches:  # the rest of the warm-up epoch
            count += len(ids)
        rates, steps, step_ms = [], 0, []
        cpu0, thread0, workers0 = time.process_time(), time.thread_time(), children_cpu_s()
        for _ in range(epochs):
            t0 = last = time.perf_counter()
            n, times = 0, []
            for ids in loader.epoch():
                now = time.perf_counter()
                times.append(1000 * (now - last))  # the first from the end of the epoch before
                last = now
                n += len(ids)
                steps += 1
            end = time.perf_counter()
            times.append(1000 * (end - last))  # the epoch's end: its last call and the pipeline's reset
            step_ms.append(times)
            rates.append(n / (end - t0))
        cpu, thread = time.process_time() - cpu0, time.thread_time() - thread0
        workers = children_cpu_s() - workers0
        shared = shared_memory_mb()
        if hasattr(loader, "close"):
            loader.close()
    rates.sort()
    return {
        "samples_per_s": rates[len(rates) // 2],
        "epochs": rates,
        "step_ms": step_ms,  # per timed epoch: each step's time, then the epoch's end
        "first_batch_s": first_batch,
        "warmup_samples": count,
        "peak_memory_mb": memory.peak / 2**20,
        "memory_kind": memory.kind,
        **({"peak_gpu_memory_mb": memory.gpu.peak / 2**20} if memory.gpu is not None else {}),
        "main_process_cpu_ms_per_step": 1000 * cpu / max(1, steps),
        "main_thread_cpu_ms_per_step": 1000 * thread / max(1, steps),
        "workers_cpu_ms_per_step": 1000 * workers / max(1, steps),
        "shared_memory_mb": shared,
    }


def children_cpu_s() -> float:
    """CPU seconds (user + system) spent so far by this process's live child processes (a loader's
    workers)."""
    import psutil

    total = 0.0
    for proc in psutil.Process().children(recursive=True):
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def shared_memory_mb() -> float:
    """Shared memory this process maps (memfd segments and /dev/shm files: the transfers' slots and
    DALI's worker-pool buffers), in MB."""
    total = 0
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and ("/memfd:" in parts[5] or parts[5].startswith("/dev/ipc/")):
                    lo, hi = (int(x, 16) for x in parts[0].split("-"))
                    total += hi - lo
    except OSError:
        return float("nan")
    return total / 2**20


def measure_audit(loader_name: str, cfg, epochs: int = 2) -> dict:
    """The ids one rank receives in each epoch, and its steps."""
    from loaders import open_loader

    loader = open_loader(loader_name, cfg)
    result = {"ids": [], "steps": []}
    for _ in range(epochs):
        ids: List[int] = []
        steps = 0
        for batch in loader.epoch():
            ids.extend(int(i) for i in batch)
            steps += 1
        result["ids"].append(ids)
        result["steps"].append(steps)
    if hasattr(loader, "close"):
        loader.close()
    return result


def interleaved(cells: Sequence[T], rounds: int, measure: Callable[[int, T], Dict]) -> List[List[Dict]]:
    """``measure(round, cell)`` of every cell once per round, odd rounds in reverse order (so that
    machine noise and drift hit every cell alike); each cell's results, in round order."""
    got: List[List[Dict]] = [[] for _ in cells]
    order = list(range(len(cells)))
    for r in range(rounds):
        for i in order if r % 2 == 0 else order[::-1]:
            got[i].append(measure(r, cells[i]))
    return got


def package_tree() -> str:
    """The source tree this process imported dali_shards from (another through ``PYTHONPATH``:
    ``run_child``'s ``tree``)."""
    import dali_shards

    return os.path.dirname(os.path.dirname(os.path.abspath(dali_shards.__file__ or "")))


def run_child(script: str, args: List[str], timeout: float, tree: Optional[str] = None) -> Dict:
    """Run ``script --child ...`` in a fresh process; its last output line is JSON (or an error).
    ``tree``: a source tree the child imports dali_shards from (an earlier version), not this one.

    The child gets a temporary directory of its own (``TMPDIR``), removed when it ends: a child
    exits at once (``os._exit``), without the clean-up that would remove what it and its loaders'
    worker processes left there."""
    cmd = [sys.executable, script, *args]
    tmp = tempfile.mkdtemp(prefix="dali-shards-bench-")
    path = [HERE, *([os.path.abspath(tree)] if tree else []), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "TMPDIR": tmp, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
    try:
        out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {timeout:.0f} s (hang?)"}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        return {"error": _reason(out.stderr or out.stdout) or f"exit code {out.returncode}"}
    try:
        return json.loads(lines[-1])
    except ValueError:
        return {"error": lines[-1][:200]}


def _reason(text: str) -> str:
    """The exception line of a failed run's output (the last one naming an error)."""
    found = re.findall(r"^\s*((?:[\w.]+(?:Error|Exception|Interrupt)|AssertionError)\b.*)$", text, re.MULTILINE)
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return (found[-1] if found else (lines[-1] if lines else "")).strip()[:300]


def child_main(argv: Optional[List[str]] = None) -> None:
    """Entry point of a measurement process: ``--child throughput|audit`` plus a loader config."""
    import argparse

    sys.path.insert(0, HERE)
    from bench_data import build_audit_shards, build_bench_shards
    from loaders import Config

    ap = argparse.ArgumentParser()
    ap.add_argument("--child", required=True, choices=("throughput", "audit"))
    ap.add_argument("--loader", required=True)
    ap.add_argument("--mode", required=True)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--samples", type=int, default=8192)
    ap.add_argument("--per-shard", type=int, default=512)
    ap.add_argument("--quality", type=int, default=95, help="JPEG quality of the benchmark shards")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--world-size", type=int, default=1)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--device-id", type=int, default=None)
    ap.add_argument("--options", default="{}", help="JSON: more sharded_pipeline options (dali_shards)")
    args = ap.parse_args(argv)
    if args.child == "audit":
        shards = build_audit_shards(os.path.join(args.data_dir, "audit"))
        os.environ["RANK"], os.environ["WORLD_SIZE"] = str(args.rank), str(args.world_size)
    else:
        shards = build_bench_shards(
            bench_dir(args.data_dir, args.samples, args.per_shard),
            num_samples=args.samples,
            samples_per_shard=args.per_shard,
            quality=args.quality,
        )
    cfg = Config(
        shards,
        mode=args.mode,
        batch_size=args.batch_size,
        workers=args.workers,
        threads=args.threads,
        world_size=args.world_size,
        rank=args.rank,
        device_id=args.device_id,
        options=json.loads(args.options),
    )
    try:
        if args.child == "audit":
            result = measure_audit(args.loader, cfg, args.epochs)
        else:
            result = measure_throughput(args.loader, cfg, args.epochs)
    except NotImplementedError as exc:
        result = {"not_applicable": str(exc)}
    if "dali_shards" in sys.modules:  # which tree was measured (see run_child's tree)
        result["dali_shards_from"] = package_tree()
    print(json.dumps(result), flush=True)
    exit_now()


def exit_now() -> None:
    """Exit without waiting for loaders to wind down, but take their worker processes along (an
    orphaned worker would keep our output pipe open)."""
    import psutil

    for proc in psutil.Process().children(recursive=True):
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    sys.stdout.flush()
    os._exit(0)
