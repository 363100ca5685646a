"""The options that are one of a few choices, as ``StrEnum``s (the strings users pass compare
equal to the members; code compares members with ``is``), and ``enum_option``, the one check of
such an option's value. Imported by ``options.py`` (which re-exports them) and by layers below it."""

from __future__ import annotations

from enum import Enum
from typing import Any, Type, TypeVar

from dali_shards.errors import ConfigError
from dali_shards.fields import StrEnum

E = TypeVar("E", bound=Enum)


class LastBatch(StrEnum):
    """What happens to the samples that do not fill a last global batch."""

    PAD = "pad"  # every sample once; the last batch padded, padding flagged by __valid__
    DROP = "drop"  # only whole global batches; the rest of the epoch is left out


class OnError(StrEnum):
    """What a bad sample or shard does."""

    RAISE = "raise"  # stop with a ShardError naming it
    SKIP = "skip"  # log and count it, put a flagged stand-in in its slot, go on


class StaleManifest(StrEnum):
    """What a local shard whose size differs from its manifest entry does."""

    RAISE = "raise"  # refuse it with a ShardFormatError
    RESCAN = "rescan"  # count it again from its headers


class Transfer(StrEnum):
    """How the workers' samples reach DALI (see ``dali_shards.transfer``)."""

    RING = "ring"  # the library's worker processes, a shared-memory ring each, one external source
    MERGE = "merge"  # DALI's worker pool, a parallel external source per worker, merged by conditionals


class Batching(StrEnum):
    """How a mix's global batches are formed."""

    RANDOM = "random"  # all streams shuffled together: each batch a random draw of the epoch
    STRATIFIED = "stratified"  # each stream's share in every global batch


class ImageCheck(StrEnum):
    """How much of each image a worker checks before it enters a batch."""

    STRUCTURE = "structure"  # JPEG marker walk up to EOI, PNG chunks and CRCs
    SIGNATURE = "signature"  # only the first bytes
    OFF = "off"


def enum_option(cls: Type[E], name: str, value: Any) -> E:
    """``value`` as option ``name``'s enum member (its string or the member), or a ConfigError listing the choices."""
    try:
        return cls(value)
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in cls)
        raise ConfigError(f"{name} must be one of {allowed}, got {value!r}") from None
