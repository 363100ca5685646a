"""Where this process stands in a distributed job: world size, rank, and its GPU (if any)."""

from __future__ import annotations

import glob
import os
import sys
from typing import Optional, Tuple

from .errors import ConfigError


def _torch_world() -> Optional[Tuple[int, int]]:
    torch = sys.modules.get("torch")  # never import torch just to ask
    if torch is None:
        return None
    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return None


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
