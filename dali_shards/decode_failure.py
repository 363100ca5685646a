"""Naming a sample a DALI operator failed on: its ``__index__`` mapped through the plan to its
shard, position and key, and the ``ShardFormatError`` that says so (``on_error="raise"``).

The structural check in the workers (``worker/imagecheck.py``) catches most damage first, as a
skippable per-sample error; what it misses (a frame header of 0x0 or 65000x65000 pixels, damage
inside the compressed data, a crop window larger than the image) fails in DALI. Which sample that
was is found by ``pytorch/incidents.py``; under ``on_error="skip"`` the iterator goes on without
it. Imports no DALI.
"""

from __future__ import annotations

import re
from typing import Any, Optional, Tuple

import numpy as np

from dali_shards.errors import ShardFormatError
from dali_shards.io.storage import local_path, open_shard
from dali_shards.tar.format import TarReader
from dali_shards.tar.header import printable
from dali_shards.worker.imagecheck import IMAGE_EXTENSIONS

FAILED_SAMPLE = re.compile(r"Failed to decode sample #(\d+)")  # DALI's decoders name the batch place


def locate(info: Any, plan: Any, index: int) -> Tuple[int, int]:
    """The shard and the position in it of the sample at canonical ``index``."""
    starts = plan.canonical_starts
    shard = int(np.searchsorted(starts, index, side="right")) - 1
    while shard > 0 and info.shards[shard].samples == 0:  # empty shards share their start
        shard -= 1
    return shard, index - int(starts[shard])


def sample_error(
    info: Any, url: str, position: int, key: Optional[str], operator: str, step: int, epoch: int, count: int = 1
) -> ShardFormatError:
    """The error for ``on_error="raise"``: DALI's ``operator`` failed on this sample."""
    fields = [f.name for f in info.packing.byte_fields if IMAGE_EXTENSIONS.intersection(f.extensions)]
    more = f" ({count - 1} more sample(s) of the step fail too)" if count > 1 else ""
    return ShardFormatError(
        url,
        f"DALI's {operator} failed on sample {position} of the shard (step {step} of epoch {epoch}){more}; "
        f"if it is an image (field {' or '.join(repr(f) for f in fields) or 'none'}), it is damaged in a way "
        f"the workers' image_check={info.options.image_check.value!r} does not catch (e.g. a frame header of "
        "0x0 pixels, or damage inside its compressed data)",
        key=key if key is not None else key_at(url, position),
        hint="on_error='skip' leaves such samples out and goes on (DALIShardedIterator); or remove or re-encode it",
    )


def key_at(url: str, position: int) -> Optional[str]:
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
