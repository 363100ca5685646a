"""The packed form in which a worker hands one sample to the pipeline.

Each sample crosses from a worker process into the pipeline as one 1-D uint8 array: a header of
int64 slots, then the bytes of the requested members. One array per sample, instead of one per
field, matters because DALI's cost per batch slot (paid for every padding dummy too) dominates
the transfer. The pipeline unpacks the fields after the worker slices are merged.

Header slots: ``[0]`` the sample's ``__index__``, ``[1]`` its ``__valid__`` flag, then per field:
``.cls``-like fields one slot (the integer), byte fields two (offset in the array and length).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Tuple

import numpy as np

from .errors import ConfigError, ShardFormatError
from .tarformat import RawSample

KEY, INDEX, VALID = "__key__", "__index__", "__valid__"
SPECIAL_FIELDS = (KEY, INDEX, VALID)
INT_EXTENSIONS = frozenset({"cls"})
INDEX_SLOT, VALID_SLOT = 0, 1


@dataclass(frozen=True)
class FieldSpec:
    """One requested field: its name, kind (bytes, int, key, index, valid), the extensions that
    may provide it (first present wins, as in ``"jpg;png"``) and its header slot."""

    name: str
    kind: str
    extensions: Tuple[str, ...]
    slot: int


class SampleLayout:
    """Packs samples for a given tuple of fields, and tells the pipeline how to unpack them."""

    def __init__(self, fields: Sequence[str]):
        if isinstance(fields, str) or not fields:
            raise ConfigError(
                f"fields must be a non-empty sequence of extensions such as ('jpg', 'cls'), got {fields!r}"
            )
        specs = []
        slot = 2
        for name in fields:
            if not isinstance(name, str) or not name.strip(" ;."):
                raise ConfigError(f"invalid field name {name!r} in fields={tuple(fields)!r}")
            if name in SPECIAL_FIELDS:
                kind = {KEY: "key", INDEX: "index", VALID: "valid"}[name]
                exts: Tuple[str, ...] = ()
            else:
                exts = tuple(e.strip().lstrip(".").lower() for e in name.split(";") if e.strip())
                kind = "int" if all(e in INT_EXTENSIONS for e in exts) else "bytes"
            if kind == "index":
                specs.append(FieldSpec(name, kind, exts, INDEX_SLOT))
            elif kind == "valid":
                specs.append(FieldSpec(name, kind, exts, VALID_SLOT))
            else:
                specs.append(FieldSpec(name, kind, exts, slot))
                slot += 1 if kind == "int" else 2
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ConfigError(f"fields must be distinct, got {tuple(fields)!r}")
        self.fields: Tuple[FieldSpec, ...] = tuple(specs)
        self.header_slots = slot
        self.header_bytes = 8 * slot
        self.extensions = frozenset(e for s in specs for e in s.extensions)

    def __repr__(self) -> str:
        return f"SampleLayout({[f.name for f in self.fields]!r})"

    def __getstate__(self):
        return {"fields": [f.name for f in self.fields]}

    def __setstate__(self, state):
        self.__init__(state["fields"])

    @property
    def has_payload(self) -> bool:
        """True when some field carries member bytes (not only integers and keys)."""
        return any(f.kind == "bytes" for f in self.fields)

    def wants(self, ext: str) -> bool:
        return ext in self.extensions

    def pack(self, sample: RawSample, index: int) -> np.ndarray:
        """The packed array of a sample read from a shard, marked valid."""
        parts = []
        ints = []
        for spec in self.fields:
            if spec.kind == "key":
                parts.append((spec.slot, sample.key.encode("utf-8")))
            elif spec.kind in ("bytes", "int"):
                data = self._member(sample, spec)
                if spec.kind == "bytes":
                    parts.append((spec.slot, data))
                else:
                    ints.append((spec.slot, self._parse_int(sample, spec, data)))
        total = self.header_bytes + sum(len(d) for _, d in parts)
        blob = np.empty(total, dtype=np.uint8)
        header = blob[: self.header_bytes].view(np.int64)
        header[INDEX_SLOT] = index
        header[VALID_SLOT] = 1
        for slot, value in ints:
            header[slot] = value
        offset = self.header_bytes
        view = memoryview(blob)
        for slot, data in parts:
            end = offset + len(data)
            view[offset:end] = data
            header[slot] = offset
            header[slot + 1] = len(data)
            offset = end
        return blob

    @staticmethod
    def as_padding(blob: np.ndarray) -> np.ndarray:
        """A copy of a packed sample marked invalid (``__valid__`` false)."""
        pad = blob.copy()
        pad[: 8 * (VALID_SLOT + 1)].view(np.int64)[VALID_SLOT] = 0
        return pad

    def unpack_header(self, blob: np.ndarray) -> np.ndarray:
        return blob[: self.header_bytes].view(np.int64)

    @staticmethod
    def _member(sample: RawSample, spec: FieldSpec) -> bytes:
        for ext in spec.extensions:
            data = sample.data.get(ext)
            if data is not None:
                return data
        present = ", ".join(sample.extensions) or "none"
        raise ShardFormatError(
            sample.url,
            f"no member for field {spec.name!r} (the sample has: {present})",
            key=sample.key,
            hint="request fields every sample has, list alternatives as 'jpg;png', or fix the shard",
        )

    @staticmethod
    def _parse_int(sample: RawSample, spec: FieldSpec, data: bytes) -> int:
        try:
            return int(data.strip())
        except ValueError:
            raise ShardFormatError(
                sample.url,
                f"field {spec.name!r} must hold a text integer, got {data[:40]!r}",
                key=sample.key,
                hint="write class labels as decimal text (e.g. b'281'), or request the field as bytes "
                "under another extension",
            ) from None
