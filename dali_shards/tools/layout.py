"""Which samples go into which shard: a pure function of the inputs, the options and the seed,
whatever engine or number of tasks writes them.

- **Files** (ImageFolder trees, file lists, Parquet of paths): the list of inputs shuffled with
  ``random.Random(seed)`` (no state beyond the list itself), keyed, then cut into consecutive
  shards of ``max_count`` samples and (where a sample fits) ``max_size`` bytes of tar file.
- **Blocks** (Parquet rows of bytes, a Ray Dataset): the blocks (row groups) shuffled with
  ``random.Random(seed)``, taken in that order into *windows* of at least ``window`` samples,
  each window's samples shuffled with a seed of its own and cut into shards of ``max_count``;
  a window is read by one task, so each task holds one window, never the dataset.

Each shard has a ``digest`` of everything that decides its bytes, kept with it when it is
written, so that a re-run knows a complete shard of the same plan from any other file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple

from dali_shards.errors import ConfigError
from dali_shards.tools.imagefolder import SourceFile
from dali_shards.tools.writer import check_max_size, member_size, tar_size

log = logging.getLogger("dali_shards")
Keyed = Tuple[str, SourceFile]


def _digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=repr).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class FileShard:
    """A shard of files: its number, its URL and its (key, file) samples in order."""

    number: int
    url: str
    files: Tuple[Keyed, ...]

    @property
    def samples(self) -> int:
        return len(self.files)

    @property
    def digest(self) -> str:
        return _digest("files", self.url, [(k, list(f)) for k, f in self.files])


@dataclass(frozen=True)
class Window:
    """Blocks read together: their (opaque, picklable) descriptions and rows, and where the
    window's first sample lies in the written order."""

    index: int
    blocks: Tuple[Any, ...]
    rows: Tuple[int, ...]
    first: int

    @property
    def samples(self) -> int:
        return sum(self.rows)

    def order(self, seed: int, shuffle: bool) -> List[int]:
        """The window's samples (indexes in its blocks' rows) in their written order."""
        order = list(range(self.samples))
        if shuffle:
            random.Random(f"dali-shards window {seed} {self.index}").shuffle(order)
        return order


@dataclass(frozen=True)
class BlockShard:
    """A shard of a window: samples ``lo:hi`` of its written order."""

    number: int
    url: str
    window: Window
    lo: int
    hi: int
    recipe: str  # the digest of the options that decide its bytes (seed, shuffle, columns, keys)

    @property
    def samples(self) -> int:
        return self.hi - self.lo

    @property
    def digest(self) -> str:
        w = self.window
        return _digest("blocks", self.url, self.recipe, w.index, [repr(b) for b in w.blocks], w.rows, w.first,
                       self.lo, self.hi)  # fmt: skip


def check_options(pattern: str, max_count: int, max_size: Optional[int]) -> None:
    """ConfigErrors for an output pattern without a shard number, a count below 1, a size no tar meets."""
    if "%" not in pattern:
        raise ConfigError(f"output pattern {pattern!r} needs a %-format for the shard number, e.g. train-%06d.tar")
    if max_count < 1:
        raise ConfigError("max_count must be positive")
    check_max_size(max_size)


def key_width(samples: int) -> int:
    """Digits of numbered keys: at least 8, enough for every sample."""
    return max(8, len(str(max(samples - 1, 0))))


def file_shards(files: Sequence[SourceFile], pattern: str, *, max_count: int, max_size: Optional[int],
                shuffle: bool, seed: int, keys: Optional[Sequence[str]], size_of: Callable[[SourceFile], int]
                ) -> List[FileShard]:  # fmt: skip
    """The shards of ``files``: shuffled (``seed``), keyed (``keys``, else numbered in the written
    order) and cut (``partition``); ``size_of`` gives a file's size where ``max_size`` needs it."""
    if keys is not None and (len(keys) != len(files) or len(set(keys)) != len(keys)):
        raise ConfigError(f"keys must give each of the {len(files)} files a key of its own")
    order = list(zip(keys, files)) if keys is not None else [(None, src) for src in files]
    if shuffle:
        random.Random(seed).shuffle(order)
    width = key_width(len(order))
    keyed = [(key if key is not None else f"{i:0{width}d}", src) for i, (key, src) in enumerate(order)]
    parts = partition(keyed, max_count, max_size, size_of)
    return [FileShard(n, pattern % n, tuple(part)) for n, part in enumerate(parts)]


def partition(files: Sequence[Keyed], max_count: int, max_size: Optional[int],
              size_of: Callable[[SourceFile], int]) -> List[List[Keyed]]:  # fmt: skip
    """Split keyed files into consecutive shards of at most ``max_count`` samples and (when a
    sample fits) ``max_size`` bytes of tar file (headers, padding and end blocks counted)."""
    if max_size is None:
        return [list(files[i : i + max_count]) for i in range(0, len(files), max_count)]
    shards: List[List[Keyed]] = []
    current: List[Keyed] = []
    size = 0
    for keyed in files:
        key, src = keyed
        sample = member_size(f"{key}.{src.ext}", size_of(src))
        if src.label is not None:
            sample += member_size(f"{key}.cls", len(str(src.label)))
        if tar_size(sample) > max_size:
            log.warning("dali_shards: %s alone makes a %d-byte shard, above max_size: it gets a shard of its own", src.path, tar_size(sample))
        if current and (len(current) >= max_count or tar_size(size + sample) > max_size):
            shards.append(current)
            current, size = [], 0
        current.append(keyed)
        size += sample
    if current:
        shards.append(current)
    return shards


def windows_of(blocks: Sequence[Any], rows: Sequence[int], window: int, shuffle: bool, seed: int) -> List[Window]:
    """The blocks (with their row counts) in their shuffled order, taken into windows of at least
    ``window`` samples (the last may hold fewer); blocks without rows are left out."""
    order = [i for i in range(len(blocks)) if rows[i] > 0]
    if shuffle:
        random.Random(seed).shuffle(order)
    out: List[Window] = []
    taken: List[int] = []
    first = held = 0
    for i in order:
        taken.append(i)
        held += rows[i]
        if held >= window:
            out.append(Window(len(out), tuple(blocks[j] for j in taken), tuple(rows[j] for j in taken), first))
            first += held
            taken, held = [], 0
    if taken:
        out.append(Window(len(out), tuple(blocks[j] for j in taken), tuple(rows[j] for j in taken), first))
    return out


def block_shards(windows: Sequence[Window], pattern: str, max_count: int, recipe: str) -> List[BlockShard]:
    """Each window cut into shards of ``max_count`` samples (its last one may hold fewer), numbered on."""
    out: List[BlockShard] = []
    for w in windows:
        for lo in range(0, w.samples, max_count):
            n = len(out)
            out.append(BlockShard(n, pattern % n, w, lo, min(lo + max_count, w.samples), recipe))
    return out


def recipe_of(*options: Any) -> str:
    """The digest of the options a block shard's bytes depend on."""
    return _digest(*options)
