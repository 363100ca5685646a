"""Naming the sample behind DALI's "Failed to decode sample #i": its slot ``i`` in the batch the
iterator was fetching, mapped through the plan to its shard, position and key.

DALI's decoders stop the pipeline on an image they cannot decode, naming only the slot. The
structural check in the workers (``worker/imagecheck.py``) catches most damage first, as a
skippable per-sample error; what it misses ends here, as a ``ShardFormatError`` that says where
the sample is. The pipeline cannot go on after such a failure, whatever ``on_error`` says.
"""

from __future__ import annotations

import re
from typing import Any, Optional

import numpy as np

from dali_shards.plan.mode import Streaming
from dali_shards.errors import ShardFormatError
from dali_shards.io.storage import local_path, open_shard
from dali_shards.tar.format import TarReader
from dali_shards.tar.header import printable
from dali_shards.worker.imagecheck import IMAGE_EXTENSIONS

_FAILED = re.compile(r"Failed to decode sample #(\d+)")


def decode_failure(exc: BaseException, info: Any, epoch: int, step: int) -> Optional[ShardFormatError]:
    """A ShardFormatError naming the sample DALI's decoder failed on, or None if ``exc`` is not
    such a failure (or the sample cannot be told: the streaming mode, bucketing, which reorders
    samples within windows by their lengths, a step off the plan)."""
    text = "\n".join(str(e) for e in (exc, exc.__cause__, exc.__context__) if e is not None)
    match = _FAILED.search(text)
    if match is None or isinstance(info.mode, Streaming) or info.spec.bucket_window:
        return None
    slot = int(match.group(1))
    plan = info.plan(epoch)
    row = step - plan.start_step
    if not 0 <= row < plan.steps - plan.start_step or not 0 <= slot < info.spec.batch_size:
        return None
    index = int(plan.rank_batches(info.rank)[0][step, slot])
    starts = plan.canonical_starts
    shard = int(np.searchsorted(starts, index, side="right")) - 1
    while shard > 0 and info.shards[shard].samples == 0:  # empty shards share their start
        shard -= 1
    position = index - int(starts[shard])
    url = info.shards[shard].url
    fields = [f.name for f in info.packing.byte_fields if IMAGE_EXTENSIONS.intersection(f.extensions)]
    return ShardFormatError(
        url,
        f"DALI's decoder failed on sample {position} of the shard (slot #{slot} of step {step} of epoch {epoch}, "
        f"field {' or '.join(repr(f) for f in fields) or 'unknown'}): the image is damaged in a way the "
        f"workers' image_check={info.options.image_check.value!r} does not catch (e.g. inside its compressed data)",
        key=_key_at(url, position),
        hint="remove or re-encode that sample; on_error='skip' cannot skip a sample DALI's decoder fails on",
    )


def _key_at(url: str, position: int) -> Optional[str]:
    """The key of sample ``position`` of a local shard, from its headers (None if unknown)."""
    if local_path(url) is None:
        return None
    try:
        with open_shard(url) as stream:
            for pos, key, _, _ in TarReader(stream, url).scan():
                if pos == position:
                    return printable(key)
    except Exception:  # noqa: BLE001 - only a better message was at stake
        return None
    return None
