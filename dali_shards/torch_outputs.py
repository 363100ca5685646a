"""Pipeline outputs made fit for PyTorch: DALI's PyTorch plugin has no tensor type for uint16,
uint32 and uint64, so such an output's batch is widened to a type that holds its values."""

from __future__ import annotations

from typing import Any

import numpy as np
from nvidia.dali import types
from nvidia.dali.tensors import TensorListCPU

from dali_shards.errors import ConfigError

# unsigned types PyTorch's DALI plugin has no tensor type for, and the type that holds their values
WIDENED = {types.DALIDataType.UINT16: np.int32, types.DALIDataType.UINT32: np.int64, types.DALIDataType.UINT64: np.int64}


def torch_ready(out: Any, name: str) -> Any:
    """``out`` (an output's batch), widened to a type PyTorch holds if it is uint16 (to int32), uint32
    (to int64) or uint64 (to int64, if every value fits); a ConfigError naming the output if not."""
    wide = WIDENED.get(out.dtype)
    if wide is None:
        return out
    if not isinstance(out, TensorListCPU):
        raise ConfigError(
            f"output {name!r} is {out.dtype} on the GPU, which PyTorch cannot take: cast it in the pipeline "
            "function, e.g. fn.cast(x, dtype=types.INT32) (INT64 for uint32 and uint64)"
        )
    arrays = [np.asarray(t) for t in out]
    if out.dtype == types.DALIDataType.UINT64 and any(a.size and a.max() > np.iinfo(np.int64).max for a in arrays):
        raise ConfigError(
            f"output {name!r} is uint64 and holds values beyond int64, which PyTorch cannot take: return int64 "
            "(or smaller) values from the map, or cast in the pipeline function"
        )
    return TensorListCPU([a.astype(wide) for a in arrays], out.layout())
