"""The driver's side of a write job's fragments: which shards a re-run keeps (a fragment of the
same plan, and the shard there at the size it says), the records collected as tasks complete (in
a local spool file, so that the driver holds one small entry per shard), and the merge into one
manifest and its sample table, written last."""

from __future__ import annotations

import base64
import dataclasses
import glob
import json
import os
import tempfile
from typing import Any, Dict, Iterator, List, Optional, Sequence

from dali_shards.catalog.manifest import write_manifest
from dali_shards.catalog.shardinfo import ShardInfo
from dali_shards.catalog.table import record_starts, table_path
from dali_shards.io.filesystems import filesystem, is_remote
from dali_shards.options import StorageOptions
from dali_shards.tools.shardtask import fragment_url


def _listing(folder: str, storage: StorageOptions) -> Dict[str, int]:
    """Names and sizes of the files in ``folder`` ({} if there is none)."""
    if not is_remote(folder):
        try:
            return {e.name: e.stat().st_size for e in os.scandir(folder) if e.is_file()}
        except FileNotFoundError:
            return {}
    fs, inner = filesystem(folder, storage)
    fs.invalidate_cache(inner)  # what is there now, not what this process listed before
    try:
        return {p["name"].rsplit("/", 1)[-1]: int(p.get("size") or 0) for p in fs.ls(inner, detail=True)}
    except FileNotFoundError:
        return {}


def _read(url: str, storage: StorageOptions) -> Optional[Dict[str, Any]]:
    try:
        if is_remote(url):
            fs, inner = filesystem(url, storage)
            return json.loads(fs.cat_file(inner))
        with open(url, "rb") as f:
            return json.loads(f.read())
    except (OSError, ValueError):
        return None  # unreadable: the shard is written again


def kept_fragments(shards: Sequence[Any], parts: str, out_dir: str, storage: StorageOptions) -> Dict[int, Dict[str, Any]]:
    """The fragments of the planned ``shards`` that a re-run keeps: written from the same plan
    (digest), their shard present at the size the fragment says."""
    names = _listing(parts, storage)
    if not names:
        return {}
    sizes = _listing(out_dir, storage)
    kept = {}
    for shard in shards:
        name = shard.url.rsplit("/", 1)[-1]
        if name + ".json" not in names or name not in sizes:
            continue
        fragment = _read(fragment_url(parts, shard.url), storage)
        if fragment and fragment.get("digest") == shard.digest and fragment.get("bytes") == sizes[name]:
            kept[shard.number] = fragment
    return kept


class Spool:
    """The shards' entries (small, in memory) and sample-table records (in a local temporary
    file without a name, gone with the process however it ends), in any order; merged in shard
    order into the manifest at ``manifest``."""

    def __init__(self, urls: Sequence[str], manifest: str):
        self.urls = list(urls)
        self.manifest = manifest
        self.names = {u.rsplit("/", 1)[-1]: n for n, u in enumerate(self.urls)}  # a fragment names its shard
        self.entries: Dict[int, ShardInfo] = {}
        self._at: Dict[int, tuple] = {}
        self._file = tempfile.TemporaryFile(prefix="dali-shards-records-")

    def add(self, number: int, fragment: Dict[str, Any]) -> ShardInfo:
        """A shard's entry (its record in the table the merge writes) from its fragment."""
        record = base64.b64decode(fragment["record"])
        self._at[number] = (self._file.seek(0, os.SEEK_END), len(record))
        self._file.write(record)
        info = ShardInfo(self.urls[number], int(fragment["samples"]), int(fragment["bytes"]), fragment["ext_bytes"],
                         table=table_path(self.manifest), table_spans=bool(fragment["spans"]))  # fmt: skip
        self.entries[number] = info
        return info

    def records(self) -> Iterator[bytes]:
        self._file.flush()
        for number in range(len(self.urls)):
            at, size = self._at[number]
            self._file.seek(at)
            yield self._file.read(size)

    def merge(self, storage: StorageOptions) -> List[ShardInfo]:
        """Write the manifest of every shard (all must be in) and its sample table; the entries."""
        missing = [n for n in range(len(self.urls)) if n not in self.entries]
        assert not missing, f"shards {missing[:5]} have no fragment"  # the engine ran every task
        infos = [self.entries[n] for n in range(len(self.urls))]
        write_manifest(self.manifest, infos, storage, records=self.records())
        starts = record_starts([i.samples for i in infos]).tolist()
        return [dataclasses.replace(i, table_at=at) for i, at in zip(infos, starts)]

    def close(self) -> None:
        self._file.close()


def clean(parts: str, out_dir: str, storage: StorageOptions) -> None:
    """Remove the fragments (the manifest now says it all) and temporary files left by killed tasks."""
    if is_remote(parts):
        fs, inner = filesystem(parts, storage)
        if fs.exists(inner):
            fs.rm(inner, recursive=True)
        return
    for path in glob.glob(os.path.join(out_dir, ".tmp[0-9]*-*")):
        os.remove(path)
    if os.path.isdir(parts):
        for name in os.listdir(parts):
            os.remove(os.path.join(parts, name))
        os.rmdir(parts)
