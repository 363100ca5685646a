"""What a ``map`` may return, and how each output's type is fixed for the whole run.

DALI needs every output to keep one dtype and one number of dimensions across samples. The first
sample's outputs (read when the pipeline is built) fix them: a Python ``int`` (or NumPy integer
scalar) travels as an int64 scalar; ``bytes`` as 1-D uint8; a NumPy array (or a number, bool,
list or tuple NumPy turns into one) as an array of its dtype and number of dimensions, its shape
free to vary. Strings, objects and ragged nested lists cannot go to DALI: they are refused with
an error naming the output. Imports no DALI.

An output's value is taken when the map returns: an array (or ``bytearray``/``memoryview``) that
the map still holds -- its own buffer, reused for the next sample, or a view of one -- is copied
then (one ``memcpy`` of the output's bytes; ``bytes``, ints and arrays NumPy made from lists are
not), so that a map may reuse its buffers.
"""

from __future__ import annotations

import numbers
from typing import Any, Tuple

import numpy as np

from dali_shards.errors import ShardFormatError
from dali_shards.tar.members import RawSample
from dali_shards.worker.decoders import native
from dali_shards.fields import CARRIED, DALI_DTYPES, FieldKind, OutputSpec


class OutputTypeError(TypeError):
    """An output DALI cannot take, or of another type than the first sample's."""


def _array(name: str, value: Any) -> np.ndarray:
    try:
        array = np.asarray(value)
    except ValueError as exc:  # ragged nested lists (NumPy >= 1.24)
        raise OutputTypeError(f"output {name!r} is a ragged nested list ({exc}), which DALI cannot take") from None
    if array.dtype.name not in DALI_DTYPES:
        raise OutputTypeError(
            f"output {name!r} is {type(value).__name__} of dtype {array.dtype}, which DALI cannot take: return "
            f"an int, bytes or a NumPy array of numbers or bools ({', '.join(sorted(DALI_DTYPES))}; encode strings "
            "to bytes or token ids)"
        )
    return owned(native(array), value)


def owned(array: np.ndarray, value: Any) -> np.ndarray:
    """``array`` (made from the map's ``value``), copied unless it is a new array no one else holds."""
    if array is value or array.base is not None or not array.flags.owndata:
        return array.copy()
    return array


def classify(name: str, value: Any) -> Tuple[OutputSpec, Any]:
    """The spec a value stands for, and the value as it travels (int, uint8 array or array)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = np.frombuffer(value, dtype=np.uint8)  # bytes cannot change; the other two can
        return OutputSpec(name, "bytes"), data if isinstance(value, bytes) else data.copy()
    if isinstance(value, str):
        raise OutputTypeError(
            f"output {name!r} is a str, which DALI cannot take: encode it (.encode()) or turn it into token ids"
        )
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        if not -(1 << 63) <= int(value) < (1 << 63):
            raise OutputTypeError(f"output {name!r} is {value}, which does not fit in int64")
        return OutputSpec(name, "int", "int64", 0), int(value)
    array = _array(name, value)
    return OutputSpec(name, "array", array.dtype.name, array.ndim), array


def conform(spec: OutputSpec, value: Any) -> Any:
    """``value`` as output ``spec`` travels; ``OutputTypeError`` if it is not of that type."""
    got, converted = classify(spec.name, value)
    if got == spec:
        return converted
    if spec.kind == FieldKind.ARRAY and got.kind == FieldKind.INT and spec.ndim == 0 and spec.dtype == "int64":
        return np.asarray(converted, dtype=np.int64)
    if spec.kind == FieldKind.INT and got.kind == FieldKind.ARRAY and got.ndim == 0 and got.dtype.startswith(("int", "uint")):
        return int(converted)
    if {spec, got} == {OutputSpec(spec.name, "bytes"), OutputSpec(spec.name, "array", "uint8", 1)}:
        return converted  # both travel as a 1-D uint8 array
    raise OutputTypeError(
        f"output {spec.name!r} is {got.describe()} here but {spec.describe()} in the first sample: return the same "
        "type (and dtype and number of dimensions) for every sample, e.g. np.asarray(x, dtype=np.float32)"
    )


def check_npy_dtype(sample: RawSample, name: str, array: np.ndarray) -> np.ndarray:
    """``array``, field ``name`` of ``sample`` read from an ``.npy`` member (no ``map``), if DALI
    can carry its dtype; a ShardFormatError naming the field, the shard and the sample otherwise."""
    if array.dtype.name not in DALI_DTYPES:
        raise ShardFormatError(
            sample.url, f"field {name!r} is a .npy array of dtype {array.dtype}, which DALI cannot carry",
            key=sample.key, hint=f"store it as one of {CARRIED} (e.g. a.astype(np.float32); complex numbers as a "
            "last axis of 2, np.stack([a.real, a.imag], -1)), convert it in a map=, or pass on_error='skip' to skip it",
        )  # fmt: skip
    return array
