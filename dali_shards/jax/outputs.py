"""Pipeline outputs made fit for JAX, batch by batch: the same shape in every batch (JAX compiles a
program anew for every new shape).

- An output whose samples may differ in shape (a ``__key__``, bytes passed through, boxes from a
  ``map``) is padded with zeros to the per-sample bound the user gives (``pad_to``), each sample's
  true shape beside it under ``<name>_shape`` (int32, ``(batch, ndim)``). Which outputs need a
  bound is known before the first batch (the keys and the bytes the function returns as they
  come); one without a bound is a ``ConfigError``. A sample beyond its bound is a
  ``RaggedOutputError`` naming the bound to raise.
- Every other output is one dense array whose per-sample shape is that of the first batch, in every
  batch; one whose samples differ, or whose shape changes, is a ``RaggedOutputError`` saying to
  bound it (``pad_to``) or to give it one shape in the pipeline function.
- A 64-bit integer output where JAX runs without 64-bit types (``jax_enable_x64`` off, its
  default) is narrowed to 32 bits after checking that every value fits; one that does not fit is a
  ``ConfigError`` (never a silent wrap-around).

DALI's JAX iterator converts every output to one array, so the outputs above are converted here as
DALI hands them over (``StaticOutputs.prepare``), the session's status output taken out as NumPy
(its indices may exceed 32 bits) with a small placeholder in its place; ``finish`` puts the
shapes and the status beside DALI's converted batch, in the same order.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Deque, Dict, List, Mapping, Optional, Sequence, Tuple

import jax
import numpy as np
from nvidia.dali.tensors import TensorListCPU, TensorListGPU

from dali_shards.errors import ConfigError, RaggedOutputError

SHAPE_SUFFIX = "_shape"
NARROWED: Dict[np.dtype, Any] = {np.dtype(np.int64): np.int32, np.dtype(np.uint64): np.uint32}


def check_bounds(names: Sequence[str], bounded: Sequence[str], pad_to: Mapping[str, Sequence[int]]) -> None:
    """A ConfigError unless every output of ``bounded`` (those that may vary in shape) has a bound in
    ``pad_to``, every bound names an output and is a tuple of positive integers, and no
    ``<name>_shape`` is taken."""
    unknown = [n for n in pad_to if n not in names]
    if unknown:
        raise ConfigError(f"pad_to names {unknown}, which are not in output_map {list(names)}")
    for name, bound in pad_to.items():
        if not isinstance(bound, (tuple, list)) or not all(isinstance(d, int) and d > 0 for d in bound):
            raise ConfigError(f"pad_to[{name!r}] must be a tuple of positive integers (a sample's largest shape), got {bound!r}")
    missing = [n for n in bounded if n not in pad_to]
    if missing:
        raise ConfigError(
            f"outputs {missing} may differ in shape from sample to sample (keys, bytes returned as they come), and JAX "
            "needs one shape per output: give each a bound, e.g. DALIShardedIterator(..., pad_to={"
            + ", ".join(f"{n!r}: (256,)" for n in missing)
            + "}) to get it zero-padded to that shape, with each sample's true shape under '<name>_shape'"
        )
    taken = [n + SHAPE_SUFFIX for n in pad_to if n + SHAPE_SUFFIX in names]
    if taken:
        raise ConfigError(f"pad_to puts each padded output's shapes under '<name>{SHAPE_SUFFIX}', and {taken} are output names already: rename those outputs")


def x64_enabled() -> bool:
    """Whether JAX keeps 64-bit types (``jax_enable_x64``)."""
    return bool(jax.config.read("jax_enable_x64"))


class StaticOutputs:
    """The conversions above for one pipeline's outputs ``names`` (in order; ``status`` the session's
    status output, None where it has none), bounded by ``pad_to``."""

    def __init__(self, names: Sequence[str], pad_to: Mapping[str, Sequence[int]], status: Optional[str]) -> None:
        self.names, self.status = list(names), status
        self.pad_to = {n: tuple(b) for n, b in pad_to.items()}
        self.shapes: Dict[str, Tuple[int, ...]] = {}  # each dense output's per-sample shape, from its first batch
        self.x64 = x64_enabled()
        self.batches = 0
        self.pending: Deque[Dict[str, np.ndarray]] = deque()  # shapes and status of the batches converted

    def prepare(self, outs: Sequence[Any]) -> List[Any]:
        """One batch's outputs from DALI, converted where need be (what goes beside the batch kept
        until ``finish``)."""
        beside: Dict[str, np.ndarray] = {}
        ready = []
        self.batches += 1
        for out, name in zip(outs, self.names):
            if name == self.status:
                beside[name] = np.asarray(_cpu(out).as_tensor()).astype(np.int64, copy=True)
                out = TensorListCPU(np.zeros((len(out), 0), dtype=np.uint8))
            elif name in self.pad_to:
                out, beside[name + SHAPE_SUFFIX] = self._padded(out, name)
            else:
                self._check_dense(out, name)
            ready.append(self._narrowed(out, name))
        self.pending.append(beside)
        return ready

    def finish(self, batch: Dict[str, Any]) -> Tuple[Dict[str, Any], Optional[np.ndarray]]:
        """DALI's converted batch with the shapes beside it, and the status rows (None without)."""
        assert self.pending, "dali_shards internal error: a batch finished that was never prepared"
        beside = self.pending.popleft()
        status = None
        if self.status is not None:
            batch.pop(self.status, None)
            status = beside.pop(self.status)
        batch.update(beside)
        return batch, status

    def _padded(self, out: Any, name: str) -> Tuple[Any, np.ndarray]:
        bound = self.pad_to[name]
        items = [np.asarray(t) for t in _cpu(out)]
        shapes = np.array([a.shape for a in items], dtype=np.int32).reshape(len(items), -1)
        if items and shapes.shape[1] != len(bound):
            raise ConfigError(
                f"pad_to[{name!r}] = {bound} has {len(bound)} axes but the output's samples have {shapes.shape[1]}: "
                f"give a bound of {shapes.shape[1]} axes (e.g. {tuple(int(d) for d in shapes.max(axis=0))})"
            )
        over = np.flatnonzero((shapes > np.array(bound, dtype=np.int32)).any(axis=1)) if items else np.empty(0, np.int64)
        if len(over):
            raise RaggedOutputError(
                f"output {name!r} has a sample of shape {tuple(shapes[over[0]].tolist())} (batch {self.batches} of this "
                f"iterator), beyond its bound pad_to[{name!r}] = {bound}: raise the bound, or cut the samples to it in "
                "the pipeline function or the map"
            )
        filled = np.zeros((len(items), *bound), dtype=items[0].dtype if items else np.uint8)
        for i, a in enumerate(items):
            filled[(i, *[slice(0, int(d)) for d in a.shape])] = a  # type: ignore[index]
        return TensorListCPU(filled), shapes

    def _check_dense(self, out: Any, name: str) -> None:
        shapes = out.shape()
        first = tuple(shapes[0]) if len(shapes) else ()
        expected = self.shapes.setdefault(name, first)
        odd = next((tuple(s) for s in shapes if tuple(s) != expected), None)
        if odd is not None:
            raise RaggedOutputError(
                f"output {name!r} has samples of shape {expected} and {odd} (batch {self.batches} of this iterator; "
                "JAX needs one shape per output, in every batch): give its samples one shape in the pipeline function "
                f"(e.g. fn.resize, fn.crop, fn.pad), or a bound, DALIShardedIterator(..., pad_to={{{name!r}: "
                f"{tuple(max(a, b) for a, b in zip(expected, odd)) if len(expected) == len(odd) else odd}}})"
            )

    def _narrowed(self, out: Any, name: str) -> Any:
        wide: Optional[np.dtype] = _numpy_dtype(out)
        narrow = NARROWED.get(wide) if wide is not None and not self.x64 else None
        if narrow is None:
            return out
        if isinstance(out, TensorListGPU):
            raise ConfigError(
                f"output {name!r} is {wide} on the GPU, and JAX runs without 64-bit types: cast it in the pipeline "
                "function (fn.cast(x, dtype=types.INT32)), or enable them (jax.config.update('jax_enable_x64', True))"
            )
        values = np.asarray(out.as_tensor())
        info = np.iinfo(narrow)
        if values.size and (values.min() < info.min or values.max() > info.max):
            raise ConfigError(
                f"output {name!r} holds {wide} values beyond {np.dtype(narrow)}, and JAX runs without 64-bit types "
                "(it would wrap them around): enable them, jax.config.update('jax_enable_x64', True), before "
                "making the iterator"
            )
        return TensorListCPU(values.astype(narrow))


def _cpu(out: Any) -> Any:
    return out.as_cpu() if isinstance(out, TensorListGPU) else out


def _numpy_dtype(out: Any) -> Optional[np.dtype]:
    """The NumPy type of a DALI batch (None for a type NumPy has no name for)."""
    from nvidia.dali.types import to_numpy_type

    try:
        return np.dtype(to_numpy_type(out.dtype))
    except (KeyError, TypeError, ValueError):
        return None
