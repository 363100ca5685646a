"""``torch.distributed`` as a run session's ``Ranks``: the cross-rank plan check's few integers (on
the pipeline's GPU under NCCL) and the audit's records, gathered from every rank."""

from __future__ import annotations

from typing import Any, List, Optional

import torch

from dali_shards.world import torch_dist


class TorchRanks:
    """The collectives of an initialised ``torch.distributed`` group (``session.Ranks``), looked up
    at each call: a group initialised after the iterator was made counts."""

    def size(self) -> Optional[int]:
        dist = torch_dist()
        return None if dist is None else dist.get_world_size()

    def gather_ints(self, values: List[int], device_id: Optional[int]) -> List[List[int]]:
        dist = torch_dist()
        assert dist is not None  # the session asks only where size() says there is a group
        device = torch.device("cpu")
        if dist.get_backend() == "nccl":
            device = torch.device("cuda", torch.cuda.current_device() if device_id is None else device_id)
        mine = torch.tensor(values, dtype=torch.int64, device=device)
        rows = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(rows, mine)
        return [row.tolist() for row in rows]

    def gather_objects(self, value: Any) -> List[Any]:
        dist = torch_dist()
        assert dist is not None  # the session asks only where size() says there is a group
        everyone: List[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, value)
        return everyone
