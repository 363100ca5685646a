"""What one task of a write job does, on any engine: write whole shards (under a temporary name,
then renamed, or uploaded in one request: a shard is there whole or not at all), then each
shard's *fragment*: its manifest entry, its sample-table record and the digest of the plan it was
written from, which the job merges into the manifest and a re-run checks to keep the shard."""

from __future__ import annotations

import base64
import json
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from dali_shards.catalog.table import encode
from dali_shards.errors import ConfigError
from dali_shards.io.filesystems import DEFAULT_STORAGE, filesystem, is_remote
from dali_shards.options import StorageOptions
from dali_shards.tools.layout import BlockShard, FileShard, Window
from dali_shards.tools.parquet import KEY, members_of
from dali_shards.tools.remotefiles import read_input
from dali_shards.tools.writer import TarShardFile

PARTS = ".dali-shards-write"  # the fragments' folder, beside the shards
READ_AHEAD = 16  # remote input files fetched at once by a task


@dataclass(frozen=True)
class Target:
    """Where a job's shards and fragments go, and the storage options to reach them."""

    parts: str
    storage: StorageOptions = DEFAULT_STORAGE


def fragment_url(parts: str, shard_url: str) -> str:
    return f"{parts}/{shard_url.rsplit('/', 1)[-1]}.json"


def put_bytes(url: str, data: bytes, storage: StorageOptions) -> None:
    """``data`` at ``url`` whole or not at all (a local file renamed into place; one remote PUT)."""
    if is_remote(url):
        fs, inner = filesystem(url, storage)
        fs.pipe_file(inner, data)
        return
    tmp = os.path.join(os.path.dirname(url), f".tmp{os.getpid()}-{os.path.basename(url)}")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, url)


class ShardOut:
    """One shard being written: into a temporary file beside it (locally) or in a temporary
    folder (remotely), published by ``finish`` with its fragment."""

    def __init__(self, url: str, target: Target):
        self.url, self.target = url, target
        self._folder = tempfile.mkdtemp(prefix="dali-shards-") if is_remote(url) else None
        name = url.rsplit("/", 1)[-1]
        # the temporary name ends as the shard's does (.tar.gz is compressed) and is hidden from globs
        where = self._folder or os.path.dirname(os.path.abspath(url))
        self.tmp = os.path.join(where, f".tmp{os.getpid()}-{name}")
        self.shard = TarShardFile(self.tmp)
        self._keys: Dict[str, int] = {}

    def add(self, key: str, members: Dict[str, bytes], where: str) -> None:
        if key in self._keys:
            raise ConfigError(f"{where}: key {key!r} is given to two samples of shard {self.url!r}; "
                              "keys must be distinct")  # fmt: skip
        self._keys[key] = 1
        self.shard.add({"__key__": key, **members})

    def finish(self, digest: str) -> Dict[str, Any]:
        """Publish the shard, then its fragment; the fragment."""
        self.shard.close()
        info = self.shard.info()
        record = encode(info.samples, info.offsets, info.key_crc)
        fragment = {"digest": digest, "url": self.url.rsplit("/", 1)[-1], "samples": info.samples,
                    "bytes": info.bytes, "ext_bytes": dict(sorted((info.ext_bytes or {}).items())),
                    "spans": info.offsets is not None, "record": base64.b64encode(record).decode("ascii")}  # fmt: skip
        if is_remote(self.url):
            fs, inner = filesystem(self.url, self.target.storage)
            fs.put_file(self.tmp, inner)
        else:
            os.replace(self.tmp, self.url)
        put_bytes(fragment_url(self.target.parts, self.url), json.dumps(fragment).encode(), self.target.storage)
        self.close()
        return fragment

    def close(self) -> None:
        """Remove what is left of the temporary file (a failed shard leaves nothing)."""
        self.shard.close()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
        elif os.path.exists(self.tmp):
            os.remove(self.tmp)


def file_members(src: Any, storage: StorageOptions) -> Dict[str, Any]:
    """A file's sample: its bytes under its extension, its label as ``cls``, its other members."""
    out: Dict[str, Any] = {src.ext: read_input(src.path, storage)}
    if src.label is not None:
        out["cls"] = str(src.label)
    out.update(src.extra)
    return out


def write_files(task: Tuple[Target, Sequence[FileShard]]) -> List[Dict[str, Any]]:
    """Write shards of files; their fragments. Remote files are fetched ``READ_AHEAD`` at a time."""
    target, shards = task
    out = []
    with ThreadPoolExecutor(max_workers=READ_AHEAD) as pool:
        for shard in shards:
            writing = ShardOut(shard.url, target)
            try:
                sources = [src for _, src in shard.files]
                read = lambda src: file_members(src, target.storage)  # noqa: E731
                members = pool.map(read, sources) if any(is_remote(s.path) for s in sources) else map(read, sources)
                for (key, src), sample in zip(shard.files, members):
                    writing.add(key, sample, src.path)
                out.append(writing.finish(shard.digest))
            finally:
                writing.close()
    return out


@dataclass(frozen=True)
class WindowTask:
    """The shards of one window to write, how to read its blocks and how its samples are keyed."""

    target: Target
    reader: Any  # read(block) -> rows ({extension: value}); pickled to the task
    window: Window
    shards: Tuple[BlockShard, ...]
    seed: int
    shuffle: bool
    width: int  # digits of numbered keys (rows without a __key__ column)


def write_window(task: WindowTask) -> List[Dict[str, Any]]:
    """Read a window's blocks, then write the shards asked of it; their fragments."""
    rows: List[Dict[str, Any]] = []
    for block in task.window.blocks:
        rows += task.reader.read(block)
    order = task.window.order(task.seed, task.shuffle)
    out = []
    for shard in task.shards:
        writing = ShardOut(shard.url, task.target)
        try:
            for position in range(shard.lo, shard.hi):
                row = rows[order[position]]
                key = str(row[KEY]) if KEY in row else f"{task.window.first + position:0{task.width}d}"
                check_label(row.get("cls"), key)
                writing.add(key, members_of(row, key), f"sample {key!r}")
            out.append(writing.finish(shard.digest))
        finally:
            writing.close()
    return out


def check_label(value: Any, key: str) -> None:
    """A ConfigError unless a label is absent or an integer."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ConfigError(f"sample {key!r}: label (.cls) {value!r} is not an integer class index")


def run_task(task: Any) -> List[Dict[str, Any]]:
    """Any task of a write job (what an engine runs)."""
    return write_window(task) if isinstance(task, WindowTask) else write_files(task)
