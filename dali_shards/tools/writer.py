"""Writing WebDataset-style tar shards (``<key>.<ext>`` members grouped by key), values encoded
as webdataset encodes them (``dali_shards.tools.encode``), with their manifest.

Output is deterministic: the same samples give byte-identical shards (fixed mtime, owner and
mode, gzip header without a timestamp), so shards can be checksummed and rebuilt reproducibly.
"""

from __future__ import annotations

import gzip
import inspect
import io
import logging
import math
import numbers
import os
import tarfile
from typing import Any, Dict, Iterable, List, Mapping, Optional, TypeVar, Union

from dali_shards.catalog.shardinfo import ShardInfo
from dali_shards.catalog.manifest import read_manifest, write_manifest
from dali_shards.errors import ConfigError, DaliShardsError
from dali_shards.tar.scan import ShardStats, key_fingerprints
from dali_shards.tools.encode import Value, check_names, encode

SampleData = Mapping[str, Union[Value, Any]]
MANIFEST_NAME = "manifest.json"
W = TypeVar("W", bound="_Closing")
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


def members(sample: SampleData) -> dict:
    """A sample's members (extension -> bytes), its values encoded (``encode``); a ConfigError if
    its key or a field cannot name a member that readers read back as written, or it has none."""
    key = sample.get("__key__")
    fields = [ext for ext in sample if not (isinstance(ext, str) and ext.startswith("__"))]
    names = check_names(key, fields)
    assert isinstance(key, str)  # check_names checked it
    out = {name: encode(name, sample[ext], key) for ext, name in zip(fields, names)}
    if not out:
        raise ConfigError(f"sample {key!r} has no members")
    return out


class _Closing:
    """``with`` support for writers with a ``close()``."""

    def close(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def __enter__(self: W) -> W:
        return self

    def __exit__(self, *exc: Any) -> None:
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
        self.stats = ShardStats()
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._file = open(path, "wb")
        self._gzip = None
        target: Union[io.BufferedWriter, gzip.GzipFile] = self._file
        if path.endswith((".gz", ".tgz")):
            self._gzip = target = gzip.GzipFile(fileobj=self._file, mode="wb", mtime=0, filename="")
        self._tar: Optional[tarfile.TarFile] = tarfile.open(fileobj=target, mode="w", format=tarfile.GNU_FORMAT)

    def add(self, sample: SampleData) -> None:
        """Add one sample: ``{"__key__": "000001", "jpg": b"...", "cls": 3}`` (values encoded by
        ``dali_shards.tools.encode``)."""
        data_of = members(sample)  # checks the key first
        key = sample["__key__"]
        assert isinstance(key, str)  # members() checked it
        self.add_members(key, data_of)

    def add_members(self, key: str, data_of: Mapping[str, bytes]) -> None:
        """Add one sample as its members' bytes (extension -> bytes)."""
        if self._tar is None:
            raise ConfigError(f"shard {self.path!r} is closed: samples cannot be added to it")
        assert self.offsets is not None  # None only once closed
        exts = check_names(key, data_of)
        self.offsets.append(self._tar.offset)
        self.keys.append(key)
        self.stats.add_sample({ext: len(data) for ext, data in zip(exts, data_of.values())})
        for ext, data in zip(exts, data_of.values()):
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
            assert self.offsets is not None  # None only once closed
            self.offsets = None if self._gzip is not None else self.offsets + [self._tar.offset]
            self._tar.close()
            if self._gzip is not None:
                self._gzip.close()
            self._file.close()
            self._tar = None

    def info(self) -> ShardInfo:
        """The closed shard's manifest entry: samples, bytes, bytes per extension, sample offsets
        (uncompressed shards) and key fingerprints."""
        offsets = ShardInfo.offsets_from(self.offsets)
        return ShardInfo(self.path, self.count, os.path.getsize(self.path), dict(self.stats.ext_bytes), offsets,
                         key_fingerprints(self.keys))  # fmt: skip


def write_shard(path: str, samples: Iterable[SampleData]) -> int:
    """Write exactly one shard (possibly empty); returns its number of samples."""
    with TarShardFile(path) as shard:
        for s in samples:
            shard.add(s)
    return shard.count


def kept_entries(path: str, written: List[ShardInfo]) -> List[ShardInfo]:
    """The entries of the manifest at ``path`` (if any) for shards that still exist and are not
    among ``written``: a writer adding shards to a folder keeps the others listed (warned)."""
    if not os.path.exists(path):
        return []
    try:
        listed = read_manifest(path)
    except DaliShardsError as exc:
        log.warning("dali_shards: replacing manifest %s, which cannot be read (%s)", path, exc)
        return []
    new = {os.path.abspath(i.url) for i in written}
    kept = [i for i in listed if os.path.abspath(i.url) not in new and os.path.exists(i.url)]
    if kept:
        log.warning("dali_shards: %s also lists %d shards this writer did not write (e.g. %s): kept in it; give "
                    "each dataset its own folder or manifest= path to keep them apart", path, len(kept), kept[0].url)  # fmt: skip
    return kept


WEBDATASET_NAMES = {"maxcount": "max_count", "maxsize": "max_size", "start_shard": "start"}  # theirs: ours


def _ours(names: Mapping[str, Any], ours: Dict[str, Any]) -> Dict[str, Any]:
    """``ours`` with webdataset's spellings of the same options (``maxcount=``...) in ``names``
    taken as ours; a ConfigError for an option given both ways, or one we do not have."""
    defaults = {k: v.default for k, v in inspect.signature(ShardWriter.__init__).parameters.items()}
    for name, value in names.items():
        mine = WEBDATASET_NAMES.get(name)
        if mine is None:
            raise ConfigError(
                f"ShardWriter got an unknown keyword {name!r}: its options are max_count (webdataset's maxcount), "
                "max_size (maxsize), start (start_shard) and manifest"
            )
        if ours[mine] != defaults[mine]:
            raise ConfigError(f"ShardWriter got both {mine}= and {name}= (webdataset's name for it): give one")
        ours[mine] = value
    return ours


def _whole(name: str, value: Any, least: int) -> int:
    """``value`` as an int (an integral float such as ``1e5`` too), at least ``least``."""
    try:
        number = float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else math.nan
    except OverflowError:
        number = math.inf
    if not math.isfinite(number) or number != int(number) or number < least:
        raise ConfigError(f"ShardWriter: {name} must be an integer >= {least}, got {value!r}")
    return int(value)


class ShardWriter(_Closing):
    """Writes samples into numbered shards, as webdataset's ``ShardWriter`` does, and their manifest.

    ``pattern`` is a ``%``-format with the shard number (``"out/train-%06d.tar"``; ``.tar.gz`` to
    compress), numbered from ``start``. A new shard begins after ``max_count`` samples, or before
    the file would exceed ``max_size`` bytes (tar headers, padding and end blocks counted, before
    compression; a sample larger than that gets a shard of its own). On ``close()`` (or the end of a
    ``with`` block) the manifest of the shards written (sample counts and offsets, for a fast
    start and exact resume) goes to ``manifest`` (True: ``manifest.json`` beside the shards; a
    path; False: none). webdataset's names ``maxcount``, ``maxsize`` and ``start_shard`` are taken
    for ``max_count``, ``max_size`` and ``start`` (``max_size`` is a bound: webdataset's ``maxsize``
    lets a shard pass it by one sample); any other keyword is a ConfigError naming ours.

    - ``write(sample)``: one sample, a dict with ``"__key__"`` (a str without dots) and one value
      per member extension: bytes as they are, str as UTF-8, int and float as text, dict / list as
      JSON, ``np.ndarray`` as ``.npy`` (see ``dali_shards.tools.encode``).
    - ``paths``: the shards written so far; ``counts``: their samples; ``manifest_path``: where the
      manifest went (None before ``close()`` or with ``manifest=False``).
    """

    def __init__(
        self,
        pattern: str,
        max_count: int = 1000,
        max_size: Optional[int] = None,
        start: int = 0,
        manifest: Union[bool, str] = True,
        **webdataset_names: Any,
    ) -> None:
        if not isinstance(pattern, str) or "%" not in pattern:
            raise ConfigError(f"shard pattern {pattern!r} needs a %-format for the shard number, e.g. train-%06d.tar")
        given = _ours(webdataset_names, dict(max_count=max_count, max_size=max_size, start=start))
        self.pattern = pattern
        self.max_count = _whole("max_count", given["max_count"], 1)
        self.max_size = check_max_size(None if given["max_size"] is None else _whole("max_size", given["max_size"], 0))
        self.number = _whole("start", given["start"], 0)
        self.paths: List[str] = []
        self.counts: List[int] = []
        self.manifest = manifest
        self.manifest_path: Optional[str] = None
        self._infos: List[ShardInfo] = []
        self._shard: Optional[TarShardFile] = None
        self._closed = False

    def write(self, sample: SampleData) -> None:
        """Add one sample (see the class's docstring for its values)."""
        if self._closed:
            raise ConfigError(f"this ShardWriter ({self.pattern!r}) is closed: make a new one to write more")
        data_of = members(sample)
        key = sample["__key__"]
        assert isinstance(key, str)  # members() checked it
        size = sum(member_size(f"{key}.{ext}", len(data)) for ext, data in data_of.items())
        shard = self._shard
        if (
            shard is None
            or shard.count >= self.max_count
            or (self.max_size is not None and shard.count and tar_size(shard.size + size) > self.max_size)
        ):
            self._end_shard()
            shard = self._shard = TarShardFile(self.pattern % self.number)
            self.number += 1
            self.paths.append(shard.path)
            self.counts.append(0)
        shard.add_members(key, data_of)
        self.counts[-1] += 1

    def close(self) -> None:
        """End the last shard and write the manifest (unless ``manifest=False``). Shards an
        existing manifest there lists, and this writer did not rewrite, stay in it (warned)."""
        if self._closed:
            return
        self._end_shard()
        self._closed = True
        if self.manifest is not False and self._infos:
            path = self.manifest if isinstance(self.manifest, str) else os.path.join(
                os.path.dirname(os.path.abspath(self.pattern)), MANIFEST_NAME
            )  # fmt: skip
            write_manifest(path, kept_entries(path, self._infos) + self._infos)
            self.manifest_path = path

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None:
            self.close()
            return
        self._end_shard()  # the shards are closed, but a manifest would call a broken write complete
        self._closed = True
        log.warning("dali_shards: ShardWriter(%r) left by an exception: no manifest written", self.pattern)

    def _end_shard(self) -> None:
        if self._shard is not None:
            self._shard.close()
            self._infos.append(self._shard.info())
            self._shard = None
