"""JAX's processes (``jax.distributed``) as a run session's ``Ranks``: the cross-rank plan check's
integers and the audit's records gathered from every process, as JSON bytes (JAX's arrays hold no
64-bit integers by default, and the records differ in length from process to process)."""

from __future__ import annotations

import json
from typing import Any, List, Optional

import jax
import numpy as np
from jax.experimental import multihost_utils


class JaxRanks:
    """The collectives of JAX's processes (``session.Ranks``); none where there is one process."""

    def size(self) -> Optional[int]:
        count = jax.process_count()
        return count if count > 1 else None

    def gather_ints(self, values: List[int], device_id: Optional[int]) -> List[List[int]]:
        return [[int(v) for v in row] for row in self.gather_objects([int(v) for v in values])]

    def gather_objects(self, value: Any) -> List[Any]:
        blob = np.frombuffer(json.dumps(value).encode(), dtype=np.uint8)
        lengths = np.asarray(multihost_utils.process_allgather(np.array([blob.size], dtype=np.int32))).reshape(-1)
        padded = np.zeros(int(lengths.max()), dtype=np.uint8)
        padded[: blob.size] = blob
        rows = np.asarray(multihost_utils.process_allgather(padded))
        return [json.loads(bytes(row[:n])) for row, n in zip(rows, lengths.tolist())]
