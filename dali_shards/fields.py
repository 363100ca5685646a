"""Field names: what a requested field is (its kind and the member extensions that may provide it),
the special fields, the check of the ``decoders`` option, and what a ``map``'s output is
(``OutputSpec``) with the dtypes an array may travel as. The options layer checks ``fields`` with
it; the slot format (``ipc/``) and the worker's codec (``worker/``) build on it. Imports nothing of
the package but its errors.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple, Union

from dali_shards.errors import ConfigError

try:
    from enum import StrEnum
except ImportError:  # Python 3.10

    class StrEnum(str, Enum):  # type: ignore[no-redef]
        """A ``str`` enum whose members print as their values."""

        __str__ = str.__str__
        __format__ = str.__format__  # type: ignore[assignment]  # str's (its format_spec positional-only)


class FieldKind(StrEnum):
    """What travels in a field's header columns (see ``ipc/packing.py``)."""

    PAYLOAD = "payload"  # the large byte field (or array) of the table layout, in a slot of its own
    BYTES = "bytes"  # a member's bytes: offset and length
    INT = "int"  # a text integer (.cls, .index, .label): the value
    ARRAY = "array"  # a .npy member or a map's array output: offset, length, shape
    KEY = "key"  # the sample's key (bytes)
    INDEX = "index"  # its position in the canonical order (header slot 0)
    VALID = "valid"  # its status (header slot 1)
    STREAM = "stream"  # a mix's stream it was drawn from (one column, from its index)


KEY, INDEX, VALID, STREAM = "__key__", "__index__", "__valid__", "__stream__"
SPECIAL_FIELDS = (KEY, INDEX, VALID, STREAM)
SPECIAL_KINDS = {KEY: FieldKind.KEY, INDEX: FieldKind.INDEX, VALID: FieldKind.VALID, STREAM: FieldKind.STREAM}
INT_EXTENSIONS = frozenset({"cls", "index", "label"})
Decoder = Callable[[bytes], Any]
FieldInfo = Tuple[str, FieldKind, Tuple[str, ...]]  # name, kind, extensions


def input_spec(name: Any, fields: Sequence[Any]) -> FieldInfo:
    """(name, kind, extensions) of a requested field (``"jpg;png"``: the first present wins)."""
    if not isinstance(name, str) or not name.strip(" ;."):
        raise ConfigError(f"invalid field name {name!r} in fields={tuple(fields)!r}")
    if name in SPECIAL_KINDS:
        return name, SPECIAL_KINDS[name], ()
    exts = tuple(e.strip().lstrip(".").lower() for e in name.split(";") if e.strip())
    if all(e in INT_EXTENSIONS for e in exts):
        return name, FieldKind.INT, exts
    return name, (FieldKind.ARRAY if all(e == "npy" for e in exts) else FieldKind.BYTES), exts


def check_fields(fields: Any) -> Tuple[str, ...]:
    """The ``fields`` option, checked (names, alternatives, duplicates): as a tuple."""
    if isinstance(fields, str) or not isinstance(fields, Sequence) or not fields:
        raise ConfigError(f"fields must be a non-empty sequence of field names, e.g. ('jpg', 'cls'), got {fields!r}")
    names = [input_spec(name, fields)[0] for name in fields]
    if len(set(names)) != len(names):
        raise ConfigError(f"fields must be distinct, got {tuple(fields)!r}")
    return tuple(fields)


def check_decoders(decoders: Optional[Mapping[str, Union[str, Decoder]]], fields: Sequence[str]) -> Dict[str, Optional[Decoder]]:
    """The ``decoders`` option, checked: field name -> decoder (None: bytes)."""
    if decoders is None:
        return {}
    if not isinstance(decoders, Mapping):
        raise ConfigError(f"decoders must map field names to callables or 'bytes', got {decoders!r}")
    out: Dict[str, Optional[Decoder]] = {}
    for name, decoder in decoders.items():
        if name not in fields:
            raise ConfigError(f"decoders names field {name!r}, which is not among fields={tuple(fields)!r}")
        if decoder == "bytes" or decoder is None:
            out[name] = None
        elif callable(decoder):
            out[name] = decoder
        else:
            raise ConfigError(f"decoders[{name!r}] must be a callable (bytes -> value) or 'bytes', got {decoder!r}")
    return out


# the dtypes an array travels as (DALI's types): the one list, which the transfers use too
DALI_DTYPES = frozenset(
    {"bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64", "float16", "float32", "float64"}
)
CARRIED = ", ".join(sorted(DALI_DTYPES))  # the dtypes an array travels as, for messages


@dataclass(frozen=True)
class OutputSpec:
    """One output of ``map``: its name, kind (``int``, ``bytes`` or ``array``; ``special`` for
    ``__key__``, ``__index__``, ``__valid__``, ``__stream__``), NumPy dtype name and number of
    dimensions."""

    name: str
    kind: str
    dtype: str = "uint8"
    ndim: int = 1

    def describe(self) -> str:
        if self.kind == FieldKind.INT:
            return "a Python int"
        if self.kind == FieldKind.BYTES:
            return "bytes"
        return f"a {self.dtype} array with {self.ndim} dimension{'s' if self.ndim != 1 else ''}"

    def info(self) -> FieldInfo:
        """(name, kind, no extensions): the output as a field that travels."""
        return self.name, SPECIAL_KINDS.get(self.name) or FieldKind(self.kind), ()


def check_carried_type(name: str, dtype: str) -> None:
    """A ConfigError unless an array of ``dtype`` can go to DALI (the first sample's checks make
    sure it can: this guards the transfers, which take only those)."""
    if dtype not in DALI_DTYPES:
        raise ConfigError(f"field {name!r} would travel as a {dtype} array, which DALI cannot carry (only {CARRIED})")
