"""Where this process stands in a distributed job: world size, rank, and its GPU (if any)."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import sys
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from dali_shards.errors import ConfigError


def _torch_dist():
    """``torch.distributed`` if it is initialised in this process, else None."""
    torch = sys.modules.get("torch")  # never import torch just to ask
    if torch is None:
        return None
    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist
    return None


def _torch_world() -> Optional[Tuple[int, int]]:
    dist = _torch_dist()
    return None if dist is None else (dist.get_world_size(), dist.get_rank())


def _env_int(name: str) -> Optional[int]:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"environment variable {name}={value!r} is not an integer") from None


def resolve_world(world_size: Optional[int] = None, rank: Optional[int] = None) -> Tuple[int, int]:
    """(world_size, rank): the arguments where given, else ``torch.distributed`` when it is
    initialized, else the ``WORLD_SIZE``/``RANK`` environment variables, else (1, 0)."""
    if world_size is None or rank is None:
        found = _torch_world()
        if found is None:
            env_world, env_rank = _env_int("WORLD_SIZE"), _env_int("RANK")
            found = (env_world if env_world is not None else 1, env_rank if env_rank is not None else 0)
        world_size = found[0] if world_size is None else world_size
        rank = found[1] if rank is None else rank
    if not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"world_size must be a positive integer, got {world_size!r}")
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ConfigError(f"rank must be in 0..{world_size - 1} for world_size={world_size}, got {rank!r}")
    return world_size, rank


def gpu_available() -> bool:
    """True if an NVIDIA GPU is visible to this process; never initialises CUDA (so DALI's
    ``fork`` workers can still start afterwards)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1", "none", "NoDevFiles"):
        return False
    return bool(glob.glob("/proc/driver/nvidia/gpus/*")) or os.path.exists("/dev/nvidia0")


def default_device_id() -> Optional[int]:
    """The GPU this process should use (``LOCAL_RANK``, else 0), or None without a GPU."""
    if not gpu_available():
        return None
    local = _env_int("LOCAL_RANK")
    return local if local is not None else 0


def cuda_initialized() -> bool:
    """True if CUDA is already initialised in this process (by DALI or torch); checks without
    initialising anything."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            return True
    except Exception:  # noqa: BLE001 - a CPU-only torch
        pass
    backend = sys.modules.get("nvidia.dali.backend")
    try:
        return bool(backend is not None and backend.IsDriverInitialized())
    except Exception:  # noqa: BLE001
        return False


def check_start_method(start_method: str) -> None:
    """Refuse, with what to do, a ``fork`` start once CUDA is initialised (DALI cannot fork then)."""
    if start_method == "fork" and cuda_initialized():
        raise ConfigError(
            "CUDA is already initialised in this process (by torch or another library), so the pipeline's "
            "Python workers cannot be started with 'fork' (DALI's default). Create and build the dali_shards "
            "pipelines (or their DALIShardedIterator) before touching the GPU -- before model.cuda(), "
            "torch.cuda calls and init_process_group('nccl') -- or pass py_start_method='spawn' to the pipeline"
        )


_SUMMARY = ("plan", "rank", "steps", "samples", "shards", "epoch", "world_size", "py_num_workers", "batch_size", "drop")


_NAMES = ("names", "name_set")  # shard names do not change a plan: ranks may read copies named apart


def plan_summary(state: Mapping[str, Any], steps: int, spec: Any, rank: int) -> List[int]:
    """What every rank must agree on before its first batch, as integers (see ``_SUMMARY``): a
    fingerprint of the iterator's ``state_dict()``, its ``len()`` and the batch layout, then a few
    readable figures and the rank."""
    layout = [spec.world_size, spec.py_num_workers, spec.batch_size, spec.last_batch]
    plan_state = {**state, "dataset": {k: v for k, v in state.get("dataset", {}).items() if k not in _NAMES}}
    blob = json.dumps([plan_state, steps, layout], sort_keys=True, default=str).encode()
    fingerprint = int(hashlib.sha1(blob).hexdigest()[:15], 16)
    epoch = int(state.get("epoch", -1))
    drop = int(spec.last_batch == "drop")
    return [fingerprint, rank, steps, int(spec.num_samples), len(spec.shard_sizes), epoch, *layout[:3], drop]


def check_same_plan(world_size: int, summary: Callable[[], List[int]], device_id: Optional[int] = None) -> None:
    """Under an initialised ``torch.distributed`` group of ``world_size`` ranks, gather every
    rank's :func:`plan_summary` (one all-gather of a few integers, on GPU ``device_id`` under
    NCCL: every rank must call it) and raise a ``ConfigError`` on every rank unless all planned the
    same epoch, with distinct ranks. Does nothing without such a group (e.g. for a pipeline of
    world size 1 used on one rank only)."""
    dist = _torch_dist()
    if dist is None or dist.get_world_size() != world_size:
        return
    torch = sys.modules["torch"]
    device = torch.device("cpu")
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device() if device_id is None else device_id)
    mine = torch.tensor(summary(), dtype=torch.int64, device=device)
    rows = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(rows, mine)
    everyone = [dict(zip(_SUMMARY, row.tolist())) for row in rows]
    ranks = sorted(s["rank"] for s in everyone)
    if len({s["plan"] for s in everyone}) == 1 and ranks == list(range(world_size)):
        return
    problem = _plan_problem(ranks, world_size)
    raise ConfigError(f"{problem}. Going on would hang the next collective. {_describe(everyone)}")


def _plan_problem(ranks: List[int], world_size: int) -> str:
    if ranks != list(range(world_size)):
        return f"the pipelines' ranks are {ranks}, not 0..{world_size - 1}: leave rank unset or pass dist.get_rank()"
    return (
        "the ranks planned different epochs: give every rank the same shards (a shard rewritten while the ranks "
        "started does this too: use a manifest), the same options and the same resume state"
    )


def _describe(everyone: List[Dict[str, int]]) -> str:
    return "The ranks: " + "; ".join(
        f"process {i} (pipeline rank {s['rank']}): {s['steps']} steps, {s['samples']} samples in {s['shards']} "
        f"shards, epoch {s['epoch']}, world_size={s['world_size']}, py_num_workers={s['py_num_workers']}, "
        f"batch_size={s['batch_size']}, last_batch={'drop' if s['drop'] else 'pad'}, plan {s['plan']:x}"
        for i, s in enumerate(everyone)
    )
