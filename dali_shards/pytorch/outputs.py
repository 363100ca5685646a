"""Pipeline outputs made fit for PyTorch, batch by batch, for ``DALIShardedIterator``.

- An output whose samples may differ in shape (boxes from a ``map``, text bytes) cannot be one
  tensor. A *ragged* output comes as a list of per-sample tensors on the pipeline's device
  (``ragged="list"``, the default), or padded with zeros into one tensor of the largest shape, with
  each sample's shape beside it under ``<name>_shape`` (``ragged="pad"``, an int64 ``(batch, ndim)``
  tensor), in every batch. Which outputs are ragged is fixed before the first batch: those named in
  ``ragged_outputs``, or where it is not given, the bytes fields passed through unchanged (a
  member's bytes, a ``map``'s bytes outputs). Every other output is one dense tensor per batch
  (arrays too: fixed-size features are the common case); one whose samples turn out to differ in
  shape is a ``RaggedOutputError`` saying how to declare it.
- An output that is the ``__key__`` field comes as a list of ``str``.
- DALI's PyTorch plugin has no tensor type for uint16, uint32 and uint64: such an output is widened
  to a type that holds its values (int32, int64, int64).

DALI's iterator converts every output to one tensor, so the outputs above are converted here, as
DALI hands them over (``BatchOutputs.prepare``), a small placeholder going on in their place, and
put into the batch DALI's iterator returns (``finish``), in the same order.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Deque, Dict, List, Sequence, Tuple

import numpy as np
import torch
from nvidia.dali import types
from nvidia.dali.plugin.pytorch.torch_utils import to_torch_tensor
from nvidia.dali.tensors import TensorListCPU, TensorListGPU

from dali_shards.errors import ConfigError, RaggedOutputError

# unsigned types PyTorch's DALI plugin has no tensor type for, and the type that holds their values
WIDENED = {types.DALIDataType.UINT16: np.int32, types.DALIDataType.UINT32: np.int64, types.DALIDataType.UINT64: np.int64}
RAGGED = ("list", "pad")
SHAPE_SUFFIX = "_shape"


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
    arrays = [np.asarray(t) for t in out]  # type: ignore[attr-defined]  # DALI: iterable by __getitem__, no __iter__
    if out.dtype == types.DALIDataType.UINT64 and any(a.size and a.max() > np.iinfo(np.int64).max for a in arrays):
        raise ConfigError(
            f"output {name!r} is uint64 and holds values beyond int64, which PyTorch cannot take: return int64 "
            "(or smaller) values from the map, or cast in the pipeline function"
        )
    return TensorListCPU([a.astype(wide) for a in arrays], out.layout())


def key_strings(out: Any) -> List[str]:
    """A ``__key__`` output's samples as strings (UTF-8, invalid bytes kept as surrogate escapes)."""
    cpu = out.as_cpu() if isinstance(out, TensorListGPU) else out
    # DALI's TensorList stubs have no __iter__ (it iterates by __getitem__)
    return [np.asarray(t).tobytes().decode("utf-8", "surrogateescape") for t in cpu]  # type: ignore[union-attr]


def per_sample(out: Any) -> List[torch.Tensor]:
    """An output's samples as tensors of their own shapes, on the output's device (copies)."""
    if isinstance(out, TensorListCPU):  # NumPy copies: a quarter of the cost of DALI's per-sample conversion
        # DALI's TensorList stubs have no __iter__ (it iterates by __getitem__)
        return [torch.from_numpy(np.array(t)) for t in out]  # type: ignore[attr-defined]
    return [to_torch_tensor(out[i], copy=True) for i in range(len(out))]


def padded(out: Any) -> Dict[str, torch.Tensor]:
    """An output's samples zero-padded to the largest shape, and each sample's shape."""
    cpu = isinstance(out, TensorListCPU)
    items: List[Any] = [np.asarray(t) for t in out] if cpu else per_sample(out)
    shapes = np.array([list(a.shape) for a in items], dtype=np.int64).reshape(len(items), -1)
    size = (len(items), *(shapes.max(axis=0).tolist() if len(items) else []))
    if cpu:  # filled with NumPy, then one tensor over it
        filled = _fill(np.zeros(size, dtype=items[0].dtype if items else np.uint8), items)
        return {"": torch.from_numpy(filled), SHAPE_SUFFIX: torch.from_numpy(shapes)}
    first = items[0] if items else torch.empty(0)
    batch = _fill(torch.zeros(size, dtype=first.dtype, device=first.device), items)
    return {"": batch, SHAPE_SUFFIX: torch.from_numpy(shapes).to(first.device)}


def _fill(batch: Any, items: Sequence[Any]) -> Any:
    """``batch`` (NumPy or torch) with each item copied into the start of its row."""
    for i, a in enumerate(items):
        where: Tuple[Any, ...] = (i, *[slice(0, d) for d in a.shape])
        batch[where] = a
    return batch


class BatchOutputs:
    """The conversions above for one iterator: ``names`` its outputs (in order), ``keys`` those that
    are the ``__key__`` field, ``ragged`` how ragged outputs come, ``always`` the ragged outputs (the
    rest are dense in every batch)."""

    def __init__(self, names: Sequence[str], keys: Sequence[str] = (), ragged: str = "list", always: Sequence[str] = ()):
        self.check(ragged, names, always)
        self.names, self.keys, self.ragged = list(names), set(keys), ragged
        self.ragged_names = set(always) - self.keys
        self.batches = 0
        self.pending: Deque[Dict[str, Any]] = deque()  # converted outputs of the batches in flight

    @staticmethod
    def check(ragged: str, names: Sequence[str], always: Sequence[str] = ()) -> None:
        """A ConfigError if ``ragged`` is not an option, ``always`` names an output there is not,
        or (padding) a ``<name>_shape`` is taken."""
        if ragged not in RAGGED:
            raise ConfigError(f"ragged must be one of {RAGGED}, got {ragged!r}")
        unknown = [n for n in always if n not in names]
        if unknown:
            raise ConfigError(f"ragged_outputs names {unknown}, which are not in output_map {list(names)}")
        taken = [n + SHAPE_SUFFIX for n in names if n + SHAPE_SUFFIX in names]
        if ragged == "pad" and taken:
            raise ConfigError(
                f"ragged='pad' puts each padded output's shapes under '<name>{SHAPE_SUFFIX}', and {taken} are "
                "output names already: rename those outputs"
            )

    def prepare(self, outs: Sequence[Any]) -> List[Any]:
        """One batch's outputs from DALI: converted where need be (kept until ``finish``), with a
        placeholder in their place for DALI's own conversion."""
        converted: Dict[str, Any] = {}
        ready = []
        for out, name in zip(outs, self.names):
            out = torch_ready(out, name)
            if name in self.keys:
                converted[name] = key_strings(out)
            elif name in self.ragged_names:
                converted.update(self._ragged(out, name))
            elif out.is_dense_tensor():
                ready.append(out)
                continue
            else:
                raise self._undeclared(out, name)
            ready.append(TensorListCPU(np.zeros((len(out), 0), dtype=np.uint8)))
        self.pending.append(converted)
        self.batches += 1
        return ready

    def _undeclared(self, out: Any, name: str) -> RaggedOutputError:
        shapes = list(dict.fromkeys(tuple(s) for s in out.shape()))[:2]
        declared = sorted(self.ragged_names | {name})
        return RaggedOutputError(
            f"output {name!r} has samples of different shapes ({shapes[0]} and {shapes[1]}, in batch "
            f"{self.batches + 1} of this iterator) but is taken as one dense tensor per batch: declare it ragged with "
            f"DALIShardedIterator(..., ragged_outputs={declared}) to get it as "
            + ("a list of per-sample tensors" if self.ragged == "list" else f"a padded tensor with {name}{SHAPE_SUFFIX}")
            + " in every batch, or give its samples one shape in the pipeline function (e.g. fn.resize)"
        )

    def finish(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        """DALI's converted batch with the outputs converted here in their places."""
        assert self.pending, "dali_shards internal error: a batch finished that was never prepared"
        batch.update(self.pending.popleft())
        return batch

    def _ragged(self, out: Any, name: str) -> Dict[str, Any]:
        if self.ragged == "list":
            return {name: per_sample(out)}
        return {name + suffix: value for suffix, value in padded(out).items()}


def device_of(batch: Dict[str, Any]) -> torch.device:
    """The device of a batch's first tensor (a list's first tensor; the CPU if there is none)."""
    for value in batch.values():
        if isinstance(value, list):
            value = next((v for v in value if isinstance(v, torch.Tensor)), None)
        if isinstance(value, torch.Tensor):
            return value.device
    return torch.device("cpu")


def select(batch: Dict[str, Any], rows: np.ndarray) -> Dict[str, Any]:
    """The batch with only the samples at ``rows`` (an index array): tensors indexed, lists picked."""
    keep = torch.from_numpy(rows)
    out: Dict[str, Any] = {}
    for name, value in batch.items():
        if isinstance(value, list):
            out[name] = [value[i] for i in rows.tolist()]
        else:
            out[name] = value[keep.to(value.device)]
    return out
