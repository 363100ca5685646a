"""The JAX adapter: ``DALIShardedIterator`` over a sharded pipeline (``iterator``: a run session,
``dali_shards.session``, fed by DALI's JAX iterator, ``feed``), its outputs static in shape
(``outputs``), the global batch assembled over every process's devices (``sharding``), JAX's
processes as the session's collectives (``ranks``), and Orbax's checkpoint handler for its state
(``checkpoint``: ``CheckpointSave``, ``CheckpointRestore``; needs ``orbax-checkpoint``, imported only
when used). Needs JAX, not PyTorch: the ``jax`` extra (``pip install 'dali-shards[jax]'``)."""

from typing import Any

try:
    import jax  # noqa: F401  (only to say what to install when it is missing)
except ImportError as _missing:  # pragma: no cover - exercised in a subprocess without JAX
    raise ImportError(
        "dali_shards.jax needs JAX, which is not installed: pip install 'dali-shards[jax]' (or jax as "
        "https://docs.jax.dev/en/latest/installation.html says for your CUDA version)",
        name="jax",
    ) from _missing

from dali_shards.jax.iterator import DALIShardedIterator  # noqa: E402

__all__ = ["CheckpointHandler", "CheckpointRestore", "CheckpointSave", "DALIShardedIterator"]


def __getattr__(name: str) -> Any:
    """Orbax's classes, imported when first asked for (``import dali_shards.jax`` needs no Orbax)."""
    if name in ("CheckpointHandler", "CheckpointRestore", "CheckpointSave"):
        from dali_shards.jax import checkpoint

        return getattr(checkpoint, name)
    raise AttributeError(f"module 'dali_shards.jax' has no attribute {name!r}")
