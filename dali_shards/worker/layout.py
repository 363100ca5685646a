"""How a worker hands its samples to the pipeline, one array per batch slot.

DALI charges a fixed price per batch slot (the padding dummies included) and copies byte ranges
slowly, so each batch slot carries one array, and the large field (``jpg``) travels as read:

- *table* layout (two or more workers): a sample's slot holds its *payload* -- the bytes of its
  largest requested field, exactly as stored. Everything else (index, valid flag, ``.cls``
  integers, keys and small byte fields) goes into a per-batch *table* that the worker puts in one
  of its padding slots: ``mini_batch`` rows of int64 header slots, then a heap of bytes. The
  pipeline copies each table to its worker's slots, merges, and cuts out each sample's row.
- *packed* layout (one worker, no padding slot to spare): a sample's slot holds one array, its
  header row followed by the bytes of all its byte fields.

Header slots: ``[0]`` the sample's ``__index__``, ``[1]`` its status (1 valid, 0 padding, -1 a
sample skipped with ``on_error="skip"``; ``__valid__`` is status == 1), then per field: ``.cls``-like
fields one slot (the integer), byte fields other than the payload two (offset and length, in the
table or the packed array). A padding slot carries a real sample and its index; a skipped slot
carries a real sample (to keep decoders fed) and the skipped sample's index.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

from dali_shards.errors import ConfigError, ShardFormatError
from dali_shards.io.tarformat import RawSample
from dali_shards.io.tarheader import printable
from dali_shards.options import ImageCheck, option_default
from dali_shards.worker.imagecheck import IMAGE_EXTENSIONS, image_problem

KEY, INDEX, VALID = "__key__", "__index__", "__valid__"
SPECIAL_FIELDS = (KEY, INDEX, VALID)
INT_EXTENSIONS = frozenset({"cls"})
INDEX_SLOT, VALID_SLOT = 0, 1
STATUS_VALID, STATUS_PADDING, STATUS_SKIPPED = 1, 0, -1
EMPTY = np.empty((0,), dtype=np.uint8)
def table_slot(worker: int, py_num_workers: int, mini_batch: int) -> int:
    """The padding slot in which ``worker`` puts its table: the first slot of the next worker."""
    return (worker + 1) % py_num_workers * mini_batch


@dataclass(frozen=True)
class FieldSpec:
    """One requested field: its name, kind (payload, bytes, int, key, index, valid), the
    extensions that may provide it (first present wins, as in ``"jpg;png"``), its header slot."""

    name: str
    kind: str
    extensions: Tuple[str, ...]
    slot: int


class Packed:
    """A sample ready for batching: its header row, its payload (table layout) and the bytes of
    its other byte fields, or (packed layout) the single array with all of them."""

    __slots__ = ("header", "payload", "parts", "blob")

    def __init__(self, header, payload=None, parts=(), blob=None):
        self.header = header
        self.payload = payload
        self.parts = parts
        self.blob = blob

    def as_padding(self) -> "Packed":
        """The same sample marked padding (the header is copied, the data shared)."""
        return self._marked(STATUS_PADDING, None)

    def as_skipped(self, index: int) -> "Packed":
        """This (real) sample standing in for skipped sample ``index``."""
        return self._marked(STATUS_SKIPPED, index)

    def _marked(self, status: int, index) -> "Packed":
        if self.blob is not None:
            blob = self.blob.copy()
            header = blob[: self.header.nbytes].view(np.int64)
        else:
            blob, header = None, self.header.copy()
        header[VALID_SLOT] = status
        if index is not None:
            header[INDEX_SLOT] = index
        return Packed(header, self.payload, self.parts, blob)


class SampleLayout:
    """Field specs, header slots, and the packing of samples for one layout."""

    def __init__(
        self,
        fields: Sequence[str],
        *,
        table: bool = False,
        payload: Optional[str] = None,
        image_check: str = option_default("image_check"),
    ):
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
            if name == payload and table:
                if kind != "bytes":
                    raise ConfigError(f"payload field {payload!r} must be a member's bytes, not {kind}")
                specs.append(FieldSpec(name, "payload", exts, -1))
            elif kind == "index":
                specs.append(FieldSpec(name, kind, exts, INDEX_SLOT))
            elif kind == "valid":
                specs.append(FieldSpec(name, kind, exts, VALID_SLOT))
            else:
                specs.append(FieldSpec(name, kind, exts, slot))
                slot += 1 if kind == "int" else 2
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ConfigError(f"fields must be distinct, got {tuple(fields)!r}")
        if payload is not None and payload not in names:
            raise ConfigError(f"payload field {payload!r} is not among the fields {tuple(names)!r}")
        self.fields: Tuple[FieldSpec, ...] = tuple(specs)
        self.table = table
        self.payload = payload if table else None
        self.image_check = ImageCheck(image_check)
        self.header_slots = slot
        self.header_bytes = 8 * slot
        self.extensions = frozenset(e for s in specs for e in s.extensions)
        self._has_key = any(s.kind == "key" for s in specs)
        # Reading straight into the arrays that go to the pipeline saves a copy per sample: the
        # payload into an array of its own; in the packed layout, when it is the only byte field
        # besides the key, the byte field into the packed array right after the header.
        self._payload_exts = frozenset(e for s in specs if s.kind == "payload" for e in s.extensions)
        heap = [s for s in specs if s.kind == "bytes"]
        self._placed = heap[0] if (not table and len(heap) == 1) else None
        self._placed_exts = frozenset(self._placed.extensions) if self._placed else frozenset()

    def __repr__(self) -> str:
        kind = f"table, payload={self.payload!r}" if self.table else "packed"
        return f"SampleLayout({[f.name for f in self.fields]!r}, {kind})"

    def __getstate__(self):
        fields = [f.name for f in self.fields]
        return {"fields": fields, "table": self.table, "payload": self.payload, "image_check": self.image_check.value}

    def __setstate__(self, state):
        self.__init__(state["fields"], table=state["table"], payload=state["payload"], image_check=state["image_check"])

    @property
    def byte_fields(self) -> Tuple[FieldSpec, ...]:
        """The fields that carry member bytes (not integers, keys, index or valid)."""
        return tuple(f for f in self.fields if f.kind in ("bytes", "payload"))

    # -- worker side ---------------------------------------------------------------------
    def destination(self, sample: RawSample, ext: str, size: int) -> Optional[np.ndarray]:
        """Where a member's data should be read (see ``tarformat.Destination``)."""
        if ext in self._payload_exts:
            return np.empty(size, dtype=np.uint8)
        if ext in self._placed_exts and sample.extra is None:
            key_bytes = len(sample.key.encode("utf-8", "surrogateescape")) if self._has_key else 0
            blob = np.empty(self.header_bytes + size + key_bytes, dtype=np.uint8)
            sample.extra = (ext, size, blob)
            return blob[self.header_bytes : self.header_bytes + size]
        return None

    def pack(self, sample: RawSample, index: int) -> Packed:
        """A sample read from a shard, ready for batching, marked valid; raises ShardFormatError
        (naming the shard and the sample) if it lacks a field or holds bad data."""
        if sample.error:
            raise ShardFormatError(sample.url, sample.error, key=sample.key, hint=sample.hint)
        parts: List[Tuple[int, bytes]] = []
        ints = []
        payload = None
        placed = None
        for spec in self.fields:
            kind = spec.kind
            if kind == "key":
                parts.append((spec.slot, sample.key.encode("utf-8", "surrogateescape")))
            elif kind == "payload":
                data = self._member(sample, spec)
                payload = data if isinstance(data, np.ndarray) else np.frombuffer(data, dtype=np.uint8)
            elif kind == "bytes":
                data = self._member(sample, spec)
                if spec is self._placed and sample.extra is not None and sample.extra[0] == self._chosen(sample, spec):
                    placed = (spec.slot, sample.extra[1], sample.extra[2])
                else:
                    parts.append((spec.slot, data))
            elif kind == "int":
                ints.append((spec.slot, self._parse_int(sample, spec, self._member(sample, spec))))
        if self.table:
            header = np.empty(self.header_slots, dtype=np.int64)
            self._fill(header, index, ints)
            return Packed(header, payload, parts)
        if placed is not None:
            slot, size, blob = placed
            offset = self.header_bytes + size
        else:
            blob = np.empty(self.header_bytes + sum(len(d) for _, d in parts), dtype=np.uint8)
            offset = self.header_bytes
        header = blob[: self.header_bytes].view(np.int64)
        self._fill(header, index, ints)
        if placed is not None:
            header[slot] = self.header_bytes
            header[slot + 1] = size
        view = memoryview(blob)
        for slot_, data in parts:
            end = offset + len(data)
            view[offset:end] = data
            header[slot_] = offset
            header[slot_ + 1] = len(data)
            offset = end
        return Packed(header, blob=blob)

    def slot_array(self, packed: Packed) -> np.ndarray:
        """What a sample's own batch slot carries."""
        if self.table:
            return packed.payload if packed.payload is not None else EMPTY
        return packed.blob

    def worker_batch(self, samples: Sequence[Packed], worker: int, py_num_workers: int, batch_size: int) -> list:
        """The full-size batch local worker ``worker`` emits: its samples in its own slice, its
        table (table layout) in its table slot, an empty dummy in every other slot."""
        m = len(samples)
        batch = [EMPTY] * batch_size
        base = worker * m
        for i, packed in enumerate(samples):
            batch[base + i] = self.slot_array(packed)
        if self.table:
            batch[table_slot(worker, py_num_workers, m)] = self.table_array(samples)
        return batch

    def table_array(self, samples: Sequence[Packed]) -> np.ndarray:
        """The table of a worker's mini-batch: one header row per sample, then the heap."""
        rows = len(samples) * self.header_bytes
        heap = sum(len(d) for p in samples for _, d in p.parts)
        table = np.empty(rows + heap, dtype=np.uint8)
        headers = table[:rows].view(np.int64).reshape(len(samples), self.header_slots)
        view = memoryview(table)
        offset = rows
        for i, p in enumerate(samples):
            headers[i] = p.header
            for slot, data in p.parts:
                end = offset + len(data)
                view[offset:end] = data
                headers[i, slot] = offset
                headers[i, slot + 1] = len(data)
                offset = end
        return table

    @staticmethod
    def _fill(header: np.ndarray, index: int, ints) -> None:
        header[INDEX_SLOT] = index
        header[VALID_SLOT] = 1
        for slot, value in ints:
            header[slot] = value

    @staticmethod
    def _chosen(sample: RawSample, spec: FieldSpec) -> Optional[str]:
        for ext in spec.extensions:
            if ext in sample.data:
                return ext
        return None

    def _member(self, sample: RawSample, spec: FieldSpec):
        for ext in spec.extensions:
            data = sample.data.get(ext)
            if data is not None:
                problem = image_problem(data, self.image_check) if ext in IMAGE_EXTENSIONS else None
                if problem:
                    raise ShardFormatError(
                        sample.url,
                        f"member {printable(sample.key)}.{ext} of field {spec.name!r} {problem}",
                        key=sample.key,
                        hint="re-encode or remove the sample, or pass on_error='skip' to skip such samples",
                    )
                return data
        present = ", ".join(sample.extensions) or "none"
        raise ShardFormatError(
            sample.url,
            f"no member for field {spec.name!r} (the sample has: {present})",
            key=sample.key,
            hint="request fields every sample has, list alternatives as 'jpg;png', or fix the shard",
        )

    @staticmethod
    def _parse_int(sample: RawSample, spec: FieldSpec, data) -> int:
        text = bytes(data)[:64].strip()  # an int64 has at most 20 characters
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not -(1 << 63) <= value < (1 << 63):
            what = "a text integer" if value is None else "an integer that fits in 64 bits"
            raise ShardFormatError(
                sample.url,
                f"field {spec.name!r} must hold {what}, got {bytes(data)[:40]!r}",
                key=sample.key,
                hint="write class labels as decimal text (e.g. b'281'), or request the field as bytes "
                "under another extension",
            )
        return value
