"""The Python stage of a worker: what becomes of a sample between its members and its batch slot.

Without a ``map`` the codec takes the members as they are (``worker/codec.py``: integers parsed,
``.npy`` loaded) and the slot format packs them (``ipc/packing.py``). With one, the requested
fields are decoded (``worker/decoders.py``, or the user's ``decoders``) into a dict, with
``"__key__"``; the map's dict of outputs is checked against the types the first sample fixed
(``worker/outputs.py``) and packed. With ``bucket_by``, the sample's length is computed too (from
the map's outputs, or from the decoded fields without a map). User code runs with the global RNGs
seeded per sample (``usercode.seed_user_rngs``). User code that raises, or returns what cannot
travel, is a ``ShardMapError`` naming the shard, the sample and the field or output. Imports no
DALI.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional, Sequence

import numpy as np

from dali_shards.errors import ConfigError, ShardError, ShardFormatError, ShardMapError
from dali_shards.tar.members import RawSample
from dali_shards.worker.codec import SPECIAL, SampleCodec
from dali_shards.worker.decoders import builtin_decoder
from dali_shards.ipc.packed import Packed
from dali_shards.ipc.packing import Packing
from dali_shards.worker.outputs import OutputSpec, OutputTypeError, conform
from dali_shards.worker.usercode import Portable, failure, interrupted, seed_user_rngs
from dali_shards.fields import INDEX, KEY, VALID, FieldKind
from dali_shards.options import option_default

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


class SampleStage:
    """Decoding, ``map`` and ``bucket_by`` of the samples ``codec`` reads, packed into ``packing``
    (see the module; None: a stage that only reads, for the first samples' types). ``decoders``
    maps a field's name to its decoder (a ``Portable``, or None for its bytes)."""

    def __init__(
        self,
        codec: SampleCodec,
        packing: Optional[Packing] = None,
        mapper: Optional[Portable] = None,
        decoders: Optional[Mapping[str, Optional[Portable]]] = None,
        bucket_by: Optional[Portable] = None,
        seed: int = option_default("seed"),
    ):
        self.codec = codec
        self._packing = packing
        self.mapper = mapper
        self.decoders = dict(decoders or {})
        self.bucket_by = bucket_by
        self.seed = seed
        self.user_code = [c for c in (mapper, bucket_by, *self.decoders.values()) if c is not None]

    def _parts(self) -> tuple:
        return self.codec, self._packing, self.mapper, self.decoders, self.bucket_by, self.seed

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SampleStage) and self._parts() == other._parts()

    def __hash__(self) -> int:
        return hash((self.codec, self._packing, self.mapper, self.bucket_by, self.seed))

    @property
    def packing(self) -> Packing:
        """The slot format the stage packs into."""
        if self._packing is None:
            raise ValueError("dali_shards internal error: this stage only reads samples; it has no slot format")
        return self._packing

    def with_packing(self, packing: Packing) -> "SampleStage":
        """The same stage packing into ``packing``."""
        return SampleStage(self.codec, packing, self.mapper, self.decoders, self.bucket_by, self.seed)

    @property
    def mapped(self) -> bool:
        return self.mapper is not None

    def inputs(self, sample: RawSample, index: int) -> Dict[str, Any]:
        """The requested fields of a sample, decoded, and its ``"__key__"``."""
        if sample.error:
            raise ShardFormatError(sample.url, sample.error, key=sample.key, hint=sample.hint)
        out: Dict[str, Any] = {KEY: sample.key}
        for name, kind, exts in self.codec.inputs:
            if kind in SPECIAL:
                stream = self.codec.stream_of(index) if kind == FieldKind.STREAM else 0
                out[name] = {FieldKind.KEY: sample.key, FieldKind.INDEX: index, FieldKind.VALID: True, FieldKind.STREAM: stream}[kind]
                continue
            ext, data = self.codec.member(sample, name, exts)
            if type(data) is bytes and name not in self.decoders and builtin_decoder(ext, self.mapper is not None) is None:
                out[name] = data  # bytes stay bytes: the common case, kept cheap
            else:
                out[name] = self._decode(sample, name, ext, data)
        return out

    def _decode(self, sample: RawSample, name: str, ext: str, data: Any) -> Any:
        if name in self.decoders:
            decoder = self.decoders[name]
            if decoder is None:
                return bytes(data)
            try:
                return decoder(bytes(data))
            except ConfigError:  # it could not be loaded in this process: not the sample's fault
                raise
            except BaseException as exc:  # noqa: BLE001 - the user's decoder (sys.exit and the like included)
                interrupted(exc)
                raise failure(sample.url, sample.key, f"the decoder of field {name!r} ({decoder.name})", exc) from None
        builtin = builtin_decoder(ext, mapped=self.mapped)
        if builtin is None:
            return data if isinstance(data, bytes) else bytes(data)
        try:
            return builtin(data)
        except Exception as exc:  # noqa: BLE001 - bad member data
            raise ShardFormatError(
                sample.url,
                f"field {name!r} (member .{ext}) cannot be decoded as .{ext}: {type(exc).__name__}: {exc}",
                key=sample.key,
                hint=f"fix the member, or pass decoders={{{name!r}: 'bytes'}} (or your own decoder), or "
                "on_error='skip'",
            ) from None

    def pack(self, sample: RawSample, index: int, epoch: int = 0) -> Packed:
        """A sample ready for batching (see the module); a ``ShardError`` naming it if it cannot.
        User code runs with the global RNGs seeded for (seed, ``epoch``, ``index``)."""
        if self.user_code:
            for code in self.user_code:  # loaded before seeding: the modules it imports get seeded too
                code.load()
            seed_user_rngs(self.seed, epoch, index)
        packing = self.packing
        if not self.mapped:
            values, placed = self.codec.values(sample, packing)
            packed = packing.pack_values(values, index, sample.key, placed)
            if self.bucket_by is not None:
                packed.length = self._length(sample, self.inputs(sample, index))
            return packed
        inputs = self.inputs(sample, index)
        result = self.run_map(sample, inputs)
        packed = packing.pack_values(self.outputs(sample, result), index, sample.key)
        if self.bucket_by is not None:
            packed.length = self._length(sample, result)
        return packed

    def run_map(self, sample: RawSample, inputs: Dict[str, Any]) -> Any:
        """The map's result for a sample's decoded fields (a ``ShardMapError`` if it raises)."""
        assert self.mapper is not None  # only a stage with a map runs it
        try:
            return self.mapper(inputs)
        except (ShardError, ConfigError):  # ConfigError: it could not be loaded in this process
            raise
        except BaseException as exc:  # noqa: BLE001 - the user's map (sys.exit and the like included)
            interrupted(exc)
            raise failure(sample.url, sample.key, f"map ({self.mapper.name})", exc) from None

    def outputs(
        self, sample: RawSample, result: Any, specs: Optional[Sequence[OutputSpec]] = None, check_types: bool = True
    ) -> Dict[str, Any]:
        """The map's ``result``, each output (of ``specs``, by default the packing's) as it
        travels; a ``ShardMapError`` naming the output that is missing or of another type than
        the first sample's."""
        if not isinstance(result, Mapping):
            raise ShardMapError(
                sample.url, f"map returned {type(result).__name__}, not a dict of outputs", key=sample.key,
                hint="return a dict whose keys are the pipeline function's parameters",
            )  # fmt: skip
        if specs is None:
            specs = self.packing.outputs
            assert specs is not None  # a map's packing lists its outputs
        values: Dict[str, Any] = {}
        for spec in specs:
            if spec.name in (KEY, INDEX, VALID):
                continue
            if spec.name not in result:
                raise ShardMapError(
                    sample.url, f"map returned no {spec.name!r} (it returned {sorted(map(str, result))})",
                    key=sample.key, hint="return every output the pipeline function takes, for every sample",
                )  # fmt: skip
            if not check_types:
                continue
            value = result[spec.name]
            if spec.kind == FieldKind.BYTES and type(value) is bytes:  # the common cases, without the general checks
                values[spec.name] = np.frombuffer(value, dtype=np.uint8)
            elif spec.kind == FieldKind.INT and type(value) is int and -(1 << 63) <= value < (1 << 63):
                values[spec.name] = value
            else:

                def convert(spec: OutputSpec = spec) -> Any:
                    return conform(spec, result[spec.name])

                values[spec.name] = self.check(sample, convert)
        return values

    @staticmethod
    def check(sample: RawSample, convert: Callable[[], Any]) -> Any:
        """``convert()``, an ``OutputTypeError`` turned into a ``ShardMapError`` naming the sample."""
        try:
            return convert()
        except OutputTypeError as exc:
            raise ShardMapError(
                sample.url, str(exc), key=sample.key, hint="return ints, bytes or NumPy arrays of numbers"
            ) from None

    def _length(self, sample: RawSample, values: Any) -> int:
        assert self.bucket_by is not None  # only a stage with bucket_by measures samples
        try:
            length = int(self.bucket_by(values))
        except ConfigError:  # it could not be loaded in this process: not the sample's fault
            raise
        except BaseException as exc:  # noqa: BLE001 - the user's bucket_by (sys.exit and the like included)
            interrupted(exc)
            raise failure(sample.url, sample.key, f"bucket_by ({self.bucket_by.name})", exc) from None
        if not INT64_MIN <= length <= INT64_MAX:
            raise ShardMapError(
                sample.url, f"bucket_by ({self.bucket_by.name}) returned {length}, which does not fit in int64",
                key=sample.key, hint="return the sample's length: a number of tokens, frames, bytes...",
            )  # fmt: skip
        return length
