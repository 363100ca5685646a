"""The PyTorch adapter: ``DALIShardedIterator`` over a sharded pipeline (``iterator``), its outputs
made fit for PyTorch (``outputs``), the cross-rank plan check (``plancheck``)."""

from dali_shards.pytorch.iterator import STATUS_OUTPUT, DALIShardedIterator, check_output_map

__all__ = ["DALIShardedIterator", "STATUS_OUTPUT", "check_output_map"]
