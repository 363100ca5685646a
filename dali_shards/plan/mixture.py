"""Weighted mixing of several datasets: what each stream contributes to every epoch. Pure, no I/O,
no DALI.

A mix is a list of ``Stream`` objects, each a source (anything ``sharded_pipeline`` takes) with at
most one of ``proportion``, ``repeat`` or ``choose`` (none: ``repeat=1``). Its shards follow one
another in the canonical order (``__index__`` counts through them all) and ``__stream__`` is a
sample's stream. Per epoch, stream ``i`` is drawn ``counts[i]`` times, exactly:

- ``choose=n``: ``n``;
- ``repeat=r``: ``round(r * size)``;
- ``proportion=p``: the ``proportion`` streams share what ``epoch_size`` leaves after the others,
  in proportion to ``p``, split by the largest remainder so that the total is exact.

``epoch_size`` defaults to the sum of the streams' counts (a ``proportion`` stream's: its size).

A stream's draws walk its samples pass after pass (``passes``: each pass every sample once, round
by round over its shards in seeded orders): epoch ``e`` takes draws ``[e * count, (e + 1) *
count)``. So, within an epoch, no sample comes twice while the count fits the stream, and a part
of a stream is drawn from all of its shards alike; over epochs, no sample repeats before every
sample of the stream has been drawn; a count larger than the stream takes whole passes and the
next part of one. The epoch's draws, as stretches of shards, are
then planned together like one dataset (``deal``: shuffled before sharding at every level, mixed
from class-sorted shards).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from dali_shards.errors import ConfigError
from dali_shards.options import BATCHING
from dali_shards.plan import passes
from dali_shards.plan.drawn import Drawn
from dali_shards.plan.units import Units

@dataclass(frozen=True)
class Stream:
    """One dataset of a mix (see the module): ``source`` as ``sharded_pipeline`` takes it, and at
    most one of ``proportion`` (a share of what ``epoch_size`` leaves), ``repeat`` (draws per epoch
    as a multiple of its size) or ``choose`` (draws per epoch)."""

    source: Any
    proportion: Optional[float] = None
    repeat: Optional[float] = None
    choose: Optional[int] = None

    def __post_init__(self) -> None:
        given = [n for n in ("proportion", "repeat", "choose") if getattr(self, n) is not None]
        if len(given) > 1:
            raise ConfigError(f"Stream({self.source!r}) gives {' and '.join(given)}: give at most one of them")
        for name in ("proportion", "repeat"):
            value = getattr(self, name)
            if value is not None and (not _real(value) or not math.isfinite(value) or value < 0):
                raise ConfigError(f"Stream({self.source!r}): {name} must be a number >= 0, got {value!r}")
        if self.proportion is not None and self.proportion <= 0:
            raise ConfigError(f"Stream({self.source!r}): proportion must be > 0, got {self.proportion!r}")
        if self.choose is not None and (not isinstance(self.choose, numbers.Integral) or isinstance(self.choose, bool) or self.choose < 0):
            raise ConfigError(f"Stream({self.source!r}): choose must be an integer >= 0, got {self.choose!r}")


def _real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def stream_counts(streams: Sequence[Stream], sizes: Sequence[int], epoch_size: Optional[int]) -> Tuple[int, ...]:
    """Draws per epoch of each stream of ``sizes`` samples (see the module); a ConfigError naming
    the stream for an empty stream, ``choose`` beyond ``epoch_size``, or proportions with nothing
    to share."""
    for i, (s, n) in enumerate(zip(streams, sizes)):
        if n == 0:
            raise ConfigError(f"stream {i} ({s.source!r}) holds no samples: a mix needs samples in every stream")
    fixed = [_fixed(s, n) for s, n in zip(streams, sizes)]
    # the default epoch: every stream's count, a proportion stream counting its size
    total = sum(n if c is None else c for c, n in zip(fixed, sizes)) if epoch_size is None else epoch_size
    for i, s in enumerate(streams):
        if s.choose is not None and s.choose > total:
            raise ConfigError(f"stream {i} ({s.source!r}): choose={s.choose} is more than epoch_size={total}")
    shared = [i for i, s in enumerate(streams) if s.proportion is not None]
    left = total - sum(c for c in fixed if c is not None)
    if left < 0 or (not shared and epoch_size is not None and left != 0):
        raise ConfigError(
            f"the streams' repeat= and choose= counts make {total - left} samples per epoch, which epoch_size="
            f"{epoch_size} cannot hold exactly: give the others a proportion=, or another epoch_size"
        )
    if shared and left == 0:
        raise ConfigError(f"stream {shared[0]} ({streams[shared[0]].source!r}) has a proportion, but nothing of "
                          f"epoch_size={total} is left after the repeat= and choose= streams: raise epoch_size")  # fmt: skip
    counts = list(fixed)
    if shared:
        for i, c in zip(shared, largest_remainder(left, [float(streams[i].proportion or 0) for i in shared])):
            counts[i] = c
    return tuple(int(c or 0) for c in counts)


def _fixed(stream: Stream, size: int) -> Optional[int]:
    if stream.choose is not None:
        return int(stream.choose)
    if stream.proportion is not None:
        return None
    return int(math.floor((1.0 if stream.repeat is None else stream.repeat) * size + 0.5))


def largest_remainder(total: int, weights: Sequence[float]) -> List[int]:
    """``total`` split in proportion to ``weights`` into integers that sum to it exactly."""
    weight = sum(weights)
    if weight <= 0:
        raise ConfigError(f"proportions must sum to more than 0, got {list(weights)}")
    exact = [total * w / weight for w in weights]
    counts = [int(math.floor(x)) for x in exact]
    for i in sorted(range(len(exact)), key=lambda i: (counts[i] - exact[i], i))[: total - sum(counts)]:
        counts[i] += 1
    return counts


@dataclass(frozen=True)
class MixSpec:
    """A resolved mix: where each stream's shards begin among all shards (``bounds``, one more than
    the streams), its draws per epoch, and how batches are formed (``batching``)."""

    bounds: Tuple[int, ...]
    counts: Tuple[int, ...]
    batching: str = "random"

    def __post_init__(self) -> None:
        if self.batching not in BATCHING:
            raise ConfigError(f"batching must be one of {BATCHING}, got {self.batching!r}")

    @property
    def epoch_size(self) -> int:
        return sum(self.counts)

    def stream_of(self, shards: np.ndarray) -> np.ndarray:
        """The stream of each shard (indices into all shards)."""
        return np.searchsorted(np.asarray(self.bounds), shards, side="right") - 1

    def units(self, sizes: np.ndarray, epoch: int, seed: int, shuffle: bool) -> Units:
        """The stretches of shards epoch ``epoch`` draws, stream after stream (see the module), one
        row per stretch (arrays over every pass drawn: ``draws`` keeps them compact)."""
        return Drawn.concat(self.draws(sizes, epoch, seed, shuffle)).units()

    def draws(self, sizes: np.ndarray, epoch: int, seed: int, shuffle: bool) -> List[Drawn]:
        """Per stream, the stretches of shards epoch ``epoch`` draws of it, whole passes kept as one
        block repeated (``drawn.Drawn``)."""
        return [self._window(i, sizes, epoch, seed, shuffle) for i in range(len(self.counts))]

    def _window(self, i: int, sizes: np.ndarray, epoch: int, seed: int, shuffle: bool) -> Drawn:
        """Stream ``i``'s draws of ``epoch``: its window of its passes (``passes``)."""
        first, stop, count = self.bounds[i], self.bounds[i + 1], self.counts[i]
        return passes.window(sizes[first:stop], epoch * count, (epoch + 1) * count, (seed, i), shuffle).shifted(first)
