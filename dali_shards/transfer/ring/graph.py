"""The ring transfer in DALI's graph: one non-parallel external source whose callback is the ring's
feed (``feed.py``), one output per field (its dtype and dimensions from the slot format) and the
slots' ``[__index__, status]``; the feed hands DALI each sample's view as a ``TensorCPU`` (what it
takes fastest). The ring's only module that imports DALI."""

from __future__ import annotations

from typing import Any, List

from nvidia.dali import fn, types
from nvidia.dali.tensors import TensorCPU

from dali_shards.transfer.ring.assemble import output_types
from dali_shards.transfer.ring.feed import RingFeed

WRAP = TensorCPU


def feed_outputs(feed: RingFeed) -> List[Any]:
    """The external source's outputs (DataNodes): the fields in the packing's order, then the
    slot status (``no_copy`` is set per output once the graph's outputs are known)."""
    kinds = output_types(feed.packing)
    outputs = fn.external_source(
        source=feed, num_outputs=len(kinds), batch=True, parallel=False,
        dtype=[types.to_dali_type(k.dtype) for k in kinds], ndim=[k.ndim for k in kinds],
    )  # fmt: skip
    return list(outputs)
