"""Where this process stands in a distributed job (``torch.distributed``, ``jax.distributed`` or the
environment): world size and rank (its GPU: ``device``)."""

from __future__ import annotations

import os
import sys
from typing import Optional, Tuple

from dali_shards.errors import ConfigError


def torch_dist():
    """``torch.distributed`` if it is initialised in this process, else None."""
    torch = sys.modules.get("torch")  # never import torch just to ask
    if torch is None:
        return None
    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist
    return None


def _torch_world() -> Optional[Tuple[int, int]]:
    dist = torch_dist()
    return None if dist is None else (dist.get_world_size(), dist.get_rank())


def jax_world() -> Optional[Tuple[int, int]]:
    """(process count, process index) of JAX's multi-process runtime (``jax.distributed``) if it is
    initialised in this process, else None."""
    jax = sys.modules.get("jax")  # never import JAX just to ask
    distributed = getattr(jax, "distributed", None)
    is_initialized = getattr(distributed, "is_initialized", None)
    if jax is None or is_initialized is None or not is_initialized():
        return None
    return jax.process_count(), jax.process_index()


def env_int(name: str) -> Optional[int]:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"environment variable {name}={value!r} is not an integer") from None


def resolve_world(world_size: Optional[int] = None, rank: Optional[int] = None) -> Tuple[int, int]:
    """(world_size, rank): the arguments where given, else ``torch.distributed`` when it is
    initialized, else ``jax.distributed`` (JAX's processes), else the ``WORLD_SIZE``/``RANK``
    environment variables, else (1, 0)."""
    if world_size is None or rank is None:
        found = _torch_world() or jax_world()
        if found is None:
            env_world, env_rank = env_int("WORLD_SIZE"), env_int("RANK")
            found = (env_world if env_world is not None else 1, env_rank if env_rank is not None else 0)
        world_size = found[0] if world_size is None else world_size
        rank = found[1] if rank is None else rank
    if not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"world_size must be a positive integer, got {world_size!r}")
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ConfigError(f"rank must be in 0..{world_size - 1} for world_size={world_size}, got {rank!r}")
    return world_size, rank
