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
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

from dali_shards.errors import ConfigError
from dali_shards.options import Batching, option_default
from dali_shards.plan import passes
from dali_shards.plan.drawn import Drawn
from dali_shards.plan.units import Units
from dali_shards.stream import Stream  # noqa: F401  (where a mix's streams are read; defined below the options)

# An epoch of a mix is planned draw by draw (each rank's samples), and each pass of a stream shard by
# shard: these bound what one may ask for (docs/mixing.md#limits).
MAX_EPOCH_DRAWS = 1 << 40  # draws per epoch, of each stream and of all: 100x the largest dataset measured
MAX_STRETCHES = 1 << 22  # stretches of shards an epoch plans over (a shard in a pass), all streams together

def stream_counts(streams: Sequence[Stream], sizes: Sequence[int], epoch_size: Optional[int]) -> Tuple[int, ...]:
    """Draws per epoch of each stream of ``sizes`` samples (see the module); a ConfigError naming
    the stream for an empty stream, ``choose`` beyond ``epoch_size``, proportions with nothing to
    share, or more draws than an epoch may hold (``MAX_EPOCH_DRAWS``)."""
    for i, (s, n) in enumerate(zip(streams, sizes)):
        if n == 0:
            raise ConfigError(f"stream {i} ({s.source!r}) holds no samples: a mix needs samples in every stream")
    if epoch_size is not None and epoch_size > MAX_EPOCH_DRAWS:
        raise ConfigError(f"epoch_size={epoch_size} is more than the {MAX_EPOCH_DRAWS} draws an epoch of a mix may "
                          "hold: give a smaller epoch_size (an epoch is planned draw by draw)")  # fmt: skip
    fixed = [_fixed(i, s, n) for i, (s, n) in enumerate(zip(streams, sizes))]
    # the default epoch: every stream's count, a proportion stream counting its size
    total = sum(n if c is None else c for c, n in zip(fixed, sizes)) if epoch_size is None else epoch_size
    if total > MAX_EPOCH_DRAWS:
        raise ConfigError(f"the streams' counts make {total} draws per epoch, more than the {MAX_EPOCH_DRAWS} an epoch "
                          "of a mix may hold: lower their repeat= or choose=")  # fmt: skip
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


def _fixed(i: int, stream: Stream, size: int) -> Optional[int]:
    """Stream ``i``'s draws by ``choose`` or ``repeat`` (None: a proportion), at most ``MAX_EPOCH_DRAWS``."""
    if stream.proportion is not None:
        return None
    repeat = 1.0 if stream.repeat is None else stream.repeat
    draws = int(stream.choose) if stream.choose is not None else repeat * size
    if draws > MAX_EPOCH_DRAWS:
        given = (f"choose={draws}" if isinstance(draws, int)
                 else f"repeat={repeat:.6g} of its {size} samples makes {draws:.4g}")  # fmt: skip
        raise ConfigError(f"stream {i} ({stream.source!r}): {given} draws per epoch, more than the {MAX_EPOCH_DRAWS} "
                          "an epoch of a mix may hold: lower it")  # fmt: skip
    return draws if isinstance(draws, int) else int(math.floor(draws + 0.5))


def largest_remainder(total: int, weights: Sequence[float]) -> List[int]:
    """``total`` split in proportion to ``weights`` into integers that sum to it exactly."""
    top = max(weights, default=0.0)
    if not top > 0 or not math.isfinite(top):
        raise ConfigError(f"proportions must be finite and sum to more than 0, got {list(weights)}")
    weight = sum(weights)
    if not math.isfinite(weight) or not math.isfinite(total * top):  # huge weights: the same shares, scaled
        weights = [w / top for w in weights]  # (at most 1 each: their sum stays finite whatever the weights)
        weight = sum(weights)
    exact = [total * w / weight for w in weights]  # (as before scaling was needed: the same counts)
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
    batching: Batching = Batching(option_default("batching"))

    def __post_init__(self) -> None:
        object.__setattr__(self, "batching", Batching(self.batching))  # the option's value: checked by the options

    @property
    def epoch_size(self) -> int:
        return sum(self.counts)

    def check_plannable(self, sizes: np.ndarray) -> None:
        """A ConfigError naming the stream that takes the most stretches of shards if an epoch could
        take more than ``MAX_STRETCHES`` (a stream drawn ``count`` times: its shards in each pass the
        window of an epoch touches, at most every sample once)."""
        sizes = np.asarray(sizes, dtype=np.int64)
        stretches = []
        for first, stop, count in zip(self.bounds, self.bounds[1:], self.counts):
            size, shards = int(sizes[first:stop].sum()), int((sizes[first:stop] > 0).sum())
            passes_touched = count // size + (0 if count % size == 0 else 2) if size else 0
            stretches.append(min(count, passes_touched * shards))
        if sum(stretches) > MAX_STRETCHES:
            i = int(np.argmax(stretches))
            raise ConfigError(
                f"an epoch of this mix may plan over {sum(stretches)} stretches of shards (a shard in a pass), more "
                f"than the {MAX_STRETCHES} an epoch may hold; stream {i} takes {stretches[i]} ({self.counts[i]} draws "
                f"over its {int((sizes[self.bounds[i]:self.bounds[i + 1]] > 0).sum())} shards): lower its repeat=, "
                "proportion= or choose=, or epoch_size"
            )

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
