"""Seeded random streams shared by every process: the same key gives the same numbers on every
rank, machine and NumPy release (PCG64's raw output, which NumPy keeps stable).

A stream is keyed by a tag (one per use, so that streams never overlap) and integers such as
(seed, epoch, worker). Every random choice of a plan, a worker's buffer shuffle or the resampled
mode's shard order comes from here.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

MASK64 = (1 << 64) - 1

# one tag per use: domain separation between the random streams
TAG_SHARD_ORDER = 0x5348_4152
TAG_BUFFER = 0x4255_4646
TAG_OWNER = 0x4F57_4E45
TAG_CYCLE = 0x4359_434C
TAG_STREAM_BUFFER = 0x5342_5546
TAG_BLOCK = 0x424C_4F43
TAG_BATCH_ORDER = 0x4241_5443
TAG_BUCKET = 0x4255_434B
TAG_RANK_CUT = 0x5243_5554
TAG_SPIN = 0x5350_494E  # plan v5: where a unit's pieces are laid from
TAG_DEAL = 0x4445_414C  # plan v5: the order the pieces are dealt to the ranks in
TAG_CHUNK = 0x4348_4E4B  # plan v5: the order within a chunk of a contiguous run
TAG_MIX = 0x4D49_5853  # a mix: the order a stream's shards are drawn in, pass after pass
TAG_STRATA = 0x5354_5241  # stratified batches: which full batches take a stream's ceiling
TAG_TURN = 0x5455_524E  # stratified batches: where a batch's stream labels start
TAG_RUN_START = 0x5253_5452  # plan v6: where the laid sequence of contiguous runs starts


def bitgen(*key: int) -> np.random.PCG64:
    """A PCG64 generator keyed by integers (each taken modulo 2**64)."""
    return np.random.PCG64(np.random.SeedSequence([int(k) & MASK64 for k in key]))


def random_ints(generator: np.random.PCG64, chunk: int = 4096) -> Iterator[int]:
    """The generator's raw 64-bit outputs, one by one, forever."""
    while True:
        yield from generator.random_raw(chunk).tolist()


def permutation(n: int, *key: int) -> np.ndarray:
    """A permutation of ``range(n)`` keyed by ``key``."""
    return np.argsort(bitgen(*key).random_raw(n), kind="stable").astype(np.int64)


def shard_permutation(num_shards: int, seed: int, epoch: int) -> np.ndarray:
    """The shard order of an epoch when shuffling: a permutation of ``range(num_shards)``."""
    return permutation(num_shards, TAG_SHARD_ORDER, seed, epoch)


def buffer_shuffle_order(n: int, buffer_size: int, seed: int, epoch: int, worker: int) -> Iterator[int]:
    """Emission order of ``range(n)`` read in order through a shuffle buffer of ``buffer_size``.

    Element ``x`` is emitted no earlier than ``x - buffer_size`` elements after it was read, so
    a reader holds at most ``buffer_size`` samples. With ``n <= buffer_size`` it is a uniform
    random permutation.
    """
    rand = random_ints(bitgen(TAG_BUFFER, seed, epoch, worker))
    size = min(buffer_size, n)
    buf = list(range(size))
    for x in range(size, n):
        j = next(rand) % size
        yield buf[j]
        buf[j] = x
    for i in range(len(buf) - 1, 0, -1):  # drain: Fisher-Yates over what is left
        j = next(rand) % (i + 1)
        buf[i], buf[j] = buf[j], buf[i]
    yield from buf
