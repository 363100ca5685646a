"""The one place ``options.transfer`` is read: the pipeline's transfer object (``base.Handover``),
which then decides everything that differs between the transfers. Imports no DALI."""

from __future__ import annotations

from typing import Callable, Mapping

from dali_shards.options import ShardedOptions, Transfer
from dali_shards.transfer.base import Handover
from dali_shards.transfer.merge.transfer import MergeTransfer
from dali_shards.transfer.ring.transfer import RingTransfer

TRANSFERS: Mapping[Transfer, Callable[[ShardedOptions], Handover]] = {
    Transfer.RING: RingTransfer,
    Transfer.MERGE: MergeTransfer,
}


def transfer_for(options: ShardedOptions) -> Handover:
    """A new transfer object for one pipeline of these options (``options.transfer``)."""
    return TRANSFERS[options.transfer](options)
