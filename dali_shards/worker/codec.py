"""How a sample's members become the fields that travel: which member provides each requested field
(the first present of ``"jpg;png"``), the image check of image members, and, without a ``map``,
``.cls``-like members parsed as integers and ``.npy`` members loaded; a member that is missing or
bad is a ``ShardFormatError`` naming the shard, the sample and the field. What the values then
become in a batch's slot is the slot format's (``ipc/packing.py``). Imports no DALI.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, Optional, Sequence, Tuple

import numpy as np

from dali_shards.errors import ShardFormatError
from dali_shards.fields import FieldInfo, FieldKind, input_spec
from dali_shards.options import ImageCheck, option_default
from dali_shards.ipc.packed import FieldSpec
from dali_shards.ipc.packing import Packing
from dali_shards.tar.header import printable
from dali_shards.tar.members import RawSample
from dali_shards.worker.decoders import decode_int, decode_npy
from dali_shards.worker.imagecheck import IMAGE_EXTENSIONS, image_problem
from dali_shards.worker.outputs import check_npy_dtype

SPECIAL = (FieldKind.KEY, FieldKind.INDEX, FieldKind.VALID, FieldKind.STREAM)  # fields no member provides


@dataclass(frozen=True)
class SampleCodec:
    """The requested ``fields`` read from a sample's members (see the module), images checked as
    ``image_check`` says; ``stream_starts``, in a mix, the ``__index__`` each stream begins at."""

    fields: Tuple[str, ...]
    image_check: ImageCheck = ImageCheck(option_default("image_check"))
    stream_starts: Tuple[int, ...] = (0,)
    inputs: Tuple[FieldInfo, ...] = field(init=False, repr=False, compare=False)
    extensions: FrozenSet[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 (frozen)
        set_("fields", tuple(self.fields))
        set_("image_check", ImageCheck(self.image_check))
        set_("stream_starts", tuple(int(s) for s in self.stream_starts))
        set_("inputs", tuple(input_spec(name, self.fields) for name in self.fields))
        set_("extensions", frozenset(e for _, _, exts in self.inputs for e in exts))

    def stream_of(self, index: int) -> int:
        """The stream of the sample at ``index``."""
        return int(np.searchsorted(np.asarray(self.stream_starts), index, side="right")) - 1

    def member(self, sample: RawSample, name: str, extensions: Sequence[str]) -> Tuple[str, Any]:
        """(extension, data) of field ``name``: its first present member, an image member checked."""
        for ext in extensions:
            data = sample.data.get(ext)
            if data is not None:
                problem = image_problem(data, self.image_check) if ext in IMAGE_EXTENSIONS else None
                if problem:
                    raise ShardFormatError(
                        sample.url,
                        f"member {printable(sample.key)}.{ext} of field {name!r} {problem}",
                        key=sample.key,
                        hint="re-encode or remove the sample, or pass on_error='skip' to skip such samples",
                    )
                return ext, data
        present = ", ".join(sample.extensions) or "none"
        raise ShardFormatError(
            sample.url,
            f"no member for field {name!r} (the sample has: {present})",
            key=sample.key,
            hint="request fields every sample has, list alternatives as 'jpg;png', or fix the shard",
        )

    def values(self, sample: RawSample, packing: Packing) -> Tuple[Dict[str, Any], Optional[Tuple[int, int, np.ndarray]]]:
        """The values of ``packing``'s fields (no ``map``) from the sample's members, as they
        travel (``Packing.pack_values``), and the field read into its place, if one was; a
        ShardFormatError (naming the shard and the sample) if it lacks a field or holds bad data."""
        if sample.error:
            raise ShardFormatError(sample.url, sample.error, key=sample.key, hint=sample.hint)
        values: Dict[str, Any] = {}
        placed = None
        for spec in packing.fields:
            if spec.kind in SPECIAL:
                continue
            ext, data = self.member(sample, spec.name, spec.extensions)
            if spec.kind == FieldKind.INT:
                values[spec.name] = _parse_int(sample, spec, data)
            elif spec.kind == FieldKind.ARRAY or (spec.kind == FieldKind.PAYLOAD and spec.dtype is not None):
                values[spec.name] = _parse_npy(sample, spec, data)
            elif (here := packing.placed(sample, spec, ext)) is not None:
                placed = here
            else:
                values[spec.name] = data if isinstance(data, np.ndarray) else np.frombuffer(data, dtype=np.uint8)
        return values, placed


def _parse_int(sample: RawSample, spec: FieldSpec, data: Any) -> int:
    try:
        return decode_int(data)
    except ValueError as exc:
        what = "an integer that fits in 64 bits" if "64 bits" in str(exc) else "a text integer"
        shown = f"{bytes(data[:40])!r}" + ("..." if len(data) > 40 else "")
        raise ShardFormatError(
            sample.url,
            f"field {spec.name!r} must hold {what}, got {shown} ({exc})",
            key=sample.key,
            hint="write class labels as decimal text, the whole member (e.g. b'281' or b'-3\\n'), or request "
            "the field as bytes under another extension",
        ) from None


def _parse_npy(sample: RawSample, spec: FieldSpec, data: Any) -> np.ndarray:
    try:
        array = decode_npy(data)
    except (ValueError, OSError, EOFError) as exc:
        raise ShardFormatError(
            sample.url, f"field {spec.name!r} is not a readable .npy array ({exc})", key=sample.key,
            hint="write it with np.save (numeric dtypes, no pickled objects)",
        ) from None  # fmt: skip
    check_npy_dtype(sample, spec.name, array)
    if (array.dtype.name, array.ndim) != (spec.dtype, spec.ndim):
        raise ShardFormatError(
            sample.url,
            f"field {spec.name!r} is a {array.dtype.name} array with {array.ndim} dimensions here, but "
            f"{spec.dtype} with {spec.ndim} in the first sample",
            key=sample.key,
            hint="store every sample's .npy with one dtype and number of dimensions",
        )
    return array
