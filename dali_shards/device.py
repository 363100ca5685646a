"""This process's GPU, if any, and what its state allows: which device a pipeline uses, and whether
DALI's worker pool may still fork (never once CUDA is initialised). Checks without initialising
anything."""

from __future__ import annotations

import glob
import os
import sys
from typing import Optional

from dali_shards.errors import ConfigError
from dali_shards.world import env_int


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
    local = env_int("LOCAL_RANK")
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
