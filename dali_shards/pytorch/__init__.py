"""The PyTorch adapter: ``DALIShardedIterator`` over a sharded pipeline (``iterator``: a run session,
``dali_shards.session``, fed by DALI's PyTorch iterator), its outputs made fit for PyTorch
(``outputs``), ``torch.distributed`` as the session's collectives (``ranks``). Needs PyTorch: the
``torch`` extra (``pip install 'dali-shards[torch]'``)."""

try:
    import torch  # noqa: F401  (only to say what to install when it is missing)
except ImportError as _missing:  # pragma: no cover - exercised in a subprocess without torch
    raise ImportError(
        "dali_shards.pytorch needs PyTorch, which is not installed: pip install 'dali-shards[torch]' (or torch as "
        "https://pytorch.org/get-started says for your CUDA version)",
        name="torch",
    ) from _missing

from dali_shards.pytorch.iterator import STATUS_OUTPUT, DALIShardedIterator, check_output_map  # noqa: E402

__all__ = ["DALIShardedIterator", "STATUS_OUTPUT", "check_output_map"]
