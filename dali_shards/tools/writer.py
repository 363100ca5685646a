"""Writing WebDataset-style tar shards (``<key>.<ext>`` members grouped by key).

Output is deterministic: the same samples give byte-identical shards (fixed mtime, owner and
mode, gzip header without a timestamp), so shards can be checksummed and rebuilt reproducibly.
"""

from __future__ import annotations

import gzip
import io
import logging
import os
import random
import tarfile
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import TYPE_CHECKING, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from tqdm import tqdm

from dali_shards.errors import ConfigError
from dali_shards.catalog.manifest import ShardInfo
from dali_shards.io.tarscan import ShardStats, key_fingerprints

if TYPE_CHECKING:
    from dali_shards.tools.imagefolder import SourceFile

SampleData = Mapping[str, Union[bytes, str, int]]
log = logging.getLogger("dali_shards")
BLOCK, RECORD = tarfile.BLOCKSIZE, tarfile.RECORDSIZE


def member_size(name: str, size: int) -> int:
    """Bytes a member takes in a GNU-format tar: its header (and long-name header, for names over
    100 bytes) and its data padded to the 512-byte block."""
    n = len(name.encode("utf-8"))
    long_name = BLOCK + _padded(n + 1) if n > tarfile.LENGTH_NAME else 0
    return long_name + BLOCK + _padded(size)


def tar_size(content: int) -> int:
    """The size of a tar file whose members take ``content`` bytes: with the two end-of-archive
    blocks and the padding to the 10,240-byte record that ``tarfile`` (like GNU tar) adds."""
    return -(-(content + 2 * BLOCK) // RECORD) * RECORD


def check_max_size(max_size: Optional[int]) -> Optional[int]:
    """``max_size`` if a tar file can be that small (tarfile pads every file to 10,240 bytes)."""
    if max_size is not None and max_size < RECORD:
        raise ConfigError(
            f"max size {max_size} bytes is below {RECORD}, the smallest tar file (tarfile pads to 10,240-byte "
            "records): give at least 10K"
        )
    return max_size


def _padded(size: int) -> int:
    return size + (-size % BLOCK)


def _member_bytes(value: Union[bytes, bytearray, memoryview, str, int]) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, (str, int)):
        return str(value).encode("utf-8")
    raise TypeError(f"sample values must be bytes, str or int, got {type(value).__name__}")


class _Closing:
    """``with`` support for writers with a ``close()``."""

    def close(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class TarShardFile(_Closing):
    """One shard being written; ``.tar.gz``/``.tgz`` paths are gzip-compressed. ``size`` counts
    the bytes its members take (see ``member_size``), before compression; ``offsets`` (once
    closed, uncompressed shards only) where each sample begins and the last one ends, for its
    manifest entry."""

    def __init__(self, path: str):
        self.path = path
        self.count = 0
        self.size = 0
        self.offsets: Optional[List[int]] = []
        self.keys: List[str] = []
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._file = open(path, "wb")
        self._gzip = None
        target = self._file
        if path.endswith((".gz", ".tgz")):
            self._gzip = target = gzip.GzipFile(fileobj=self._file, mode="wb", mtime=0, filename="")
        self._tar = tarfile.open(fileobj=target, mode="w", format=tarfile.GNU_FORMAT)

    def add(self, sample: SampleData) -> None:
        """Add one sample: ``{"__key__": "000001", "jpg": b"...", "cls": 3}``."""
        key = sample.get("__key__")
        if not isinstance(key, str) or not key or "." in os.path.basename(key):
            raise ConfigError(f"each sample needs a '__key__' string without dots, got {key!r}")
        members = {ext.lstrip("."): _member_bytes(v) for ext, v in sample.items() if not ext.startswith("__")}
        if not members:
            raise ConfigError(f"sample {key!r} has no members")
        self.offsets.append(self._tar.offset)
        self.keys.append(key)
        for ext, data in members.items():
            info = tarfile.TarInfo(f"{key}.{ext}")
            info.size = len(data)
            info.mtime = 0
            info.mode = 0o444
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            self._tar.addfile(info, io.BytesIO(data))
            self.size += member_size(info.name, len(data))
        self.count += 1

    def close(self) -> None:
        if self._tar is not None:
            self.offsets = None if self._gzip is not None else self.offsets + [self._tar.offset]
            self._tar.close()
            if self._gzip is not None:
                self._gzip.close()
            self._file.close()
            self._tar = None


def write_shard(path: str, samples: Iterable[SampleData]) -> int:
    """Write exactly one shard (possibly empty); returns its number of samples."""
    with TarShardFile(path) as shard:
        for s in samples:
            shard.add(s)
    return shard.count


class ShardWriter(_Closing):
    """Writes samples into numbered shards, starting a new shard after ``max_count`` samples or
    before the file would exceed ``max_size`` bytes (tar headers, padding and end blocks counted;
    before compression; a sample larger than that gets a shard of its own). ``pattern`` is a
    ``%``-format with the shard number, e.g. ``"out/train-%06d.tar"``."""

    def __init__(self, pattern: str, max_count: int = 1000, max_size: Optional[int] = None, start: int = 0):
        if "%" not in pattern:
            raise ConfigError(f"shard pattern {pattern!r} needs a %-format for the shard number, e.g. train-%06d.tar")
        if max_count < 1:
            raise ConfigError("max_count must be at least 1")
        self.pattern = pattern
        self.max_count = max_count
        self.max_size = check_max_size(max_size)
        self.number = start
        self.paths: List[str] = []
        self.counts: List[int] = []
        self._shard: Optional[TarShardFile] = None

    def write(self, sample: SampleData) -> None:
        key = sample.get("__key__")
        size = sum(member_size(f"{key}.{k.lstrip('.')}", len(_member_bytes(v))) for k, v in sample.items() if not k.startswith("__"))
        shard = self._shard
        if (
            shard is None
            or shard.count >= self.max_count
            or (self.max_size is not None and shard.count and tar_size(shard.size + size) > self.max_size)
        ):
            self.close()
            shard = self._shard = TarShardFile(self.pattern % self.number)
            self.number += 1
            self.paths.append(shard.path)
            self.counts.append(0)
        shard.add(sample)
        self.counts[-1] += 1

    def close(self) -> None:
        if self._shard is not None:
            self._shard.close()
            self._shard = None


def partition(files: Sequence[Tuple[str, "SourceFile"]], max_count: int, max_size: Optional[int]) -> List[list]:
    """Split keyed files into consecutive shards of at most ``max_count`` samples and (when a
    sample fits) ``max_size`` bytes of tar file (headers, padding and end blocks counted)."""
    shards: List[list] = []
    current: list = []
    size = 0
    for keyed in files:
        key, src = keyed
        sample = member_size(f"{key}.{src.ext}", os.path.getsize(src.path))
        if src.label is not None:
            sample += member_size(f"{key}.cls", len(str(src.label)))
        if max_size is not None and tar_size(sample) > max_size:
            log.warning("dali_shards: %s alone makes a %d-byte shard, above max_size: it gets a shard of its own", src.path, tar_size(sample))
        if current and (len(current) >= max_count or (max_size is not None and tar_size(size + sample) > max_size)):
            shards.append(current)
            current, size = [], 0
        current.append(keyed)
        size += sample
    if current:
        shards.append(current)
    return shards


def _write_files_shard(task) -> "ShardInfo":
    path, keyed = task
    stats = ShardStats()
    with TarShardFile(path) as shard:
        for key, src in keyed:
            with open(src.path, "rb") as f:
                data = f.read()
            sample = {"__key__": key, src.ext: data}
            stats.add(src.ext, len(data))
            if src.label is not None:
                sample["cls"] = str(src.label)
                stats.add("cls", len(sample["cls"]))
            shard.add(sample)
    offsets, keys = ShardInfo.offsets_from(shard.offsets), key_fingerprints(shard.keys)
    return ShardInfo(path, shard.count, os.path.getsize(path), stats.ext_bytes, offsets, keys)


def write_dataset(
    files: Sequence["SourceFile"],
    pattern: str,
    *,
    max_count: int = 1000,
    max_size: Optional[int] = None,
    shuffle: bool = True,
    seed: int = 0,
    processes: Optional[int] = None,
    progress: bool = False,
) -> List["ShardInfo"]:
    """Write files (with their labels as ``.cls``) into shards named by ``pattern``
    (``out/train-%06d.tar``), in parallel, mixed across shards unless ``shuffle=False``. Keys
    number the samples in the (shuffled, with ``seed``) order, so the output is the same for the
    same input, whatever the parallelism."""
    if "%" not in pattern:
        raise ConfigError(f"output pattern {pattern!r} needs a %-format for the shard number, e.g. train-%06d.tar")
    if max_count < 1:
        raise ConfigError("max_count must be positive")
    check_max_size(max_size)
    order = list(files)
    if shuffle:
        random.Random(seed).shuffle(order)
    width = max(8, len(str(len(order) - 1)))
    keyed = [(f"{i:0{width}d}", src) for i, src in enumerate(order)]
    tasks = [(pattern % n, part) for n, part in enumerate(partition(keyed, max_count, max_size))]
    bar = tqdm(total=len(order), unit="sample", disable=not progress, desc="writing shards")
    infos: List[Optional[ShardInfo]] = [None] * len(tasks)
    workers = min(processes or os.cpu_count() or 1, len(tasks))
    try:
        if workers <= 1:
            for i, task in enumerate(tasks):
                infos[i] = _write_files_shard(task)
                bar.update(infos[i].samples)
        else:
            with ProcessPoolExecutor(max_workers=workers) as pool:
                futures = {pool.submit(_write_files_shard, task): i for i, task in enumerate(tasks)}
                for future in as_completed(futures):
                    infos[futures[future]] = future.result()
                    bar.update(infos[futures[future]].samples)
    finally:
        bar.close()
    return infos
