"""A manifest's entries into a checked catalog: every field of every entry (``catalog.entries``), where
each may point (``catalog.origins``) and no shard listed twice (``catalog.identity``), each error a
``ConfigError`` naming the manifest, the entry and the field, the first in the entries' order (an
entry's fields, then where it points, then whether it was listed before: as read one at a time).

Entries come as ``Fields``: from the JSON (``of_json``: each entry checked as it is read) or from the
binary form beside it (``catalog.binary``: checked column by column). Where every entry is a plain
name beside the manifest (no ``/``, ``%``, ``?``, ``#``, no ``.`` or ``..``, and, locally, none a
symbolic link) a shard's identity is its name, so duplicates are found by comparing names at array
speed; otherwise every entry's identity is found one at a time, as for any other source.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from dali_shards.catalog.assemble import ext_matrix, from_fields
from dali_shards.catalog.columns import Catalog, Inline
from dali_shards.catalog.entries import check_entry
from dali_shards.catalog.identity import Seen
from dali_shards.catalog.origins import check_entry_origin, origin
from dali_shards.catalog.strings import StringTable
from dali_shards.catalog.table import record_starts
from dali_shards.errors import ConfigError
from dali_shards.io.filesystems import is_remote
from dali_shards.io.storage import local_path
from dali_shards.options import StorageOptions

PLAIN_NAME_BAD = b"/%?#"


@dataclass
class Fields:
    """A manifest's entries, field by field, as written (URLs not yet resolved)."""

    names: StringTable
    samples: np.ndarray
    sizes: np.ndarray  # -1: absent
    exts: Tuple[str, ...]
    ext_bytes: np.ndarray
    has_ext: np.ndarray
    spans: np.ndarray
    keys: np.ndarray
    inline: Dict[int, Inline] = field(default_factory=dict)
    bad_at: Optional[int] = None  # the first entry whose fields are refused (the entries before it are here)
    bad: Optional[ConfigError] = None


def of_json(path: str, entries: list, version: int) -> Fields:
    """The entries of a JSON manifest, each checked; reading stops at the first refused one."""
    urls: List[str] = []
    samples: List[int] = []
    sizes: List[int] = []
    exts: List[Optional[Dict[str, int]]] = []
    spans: List[bool] = []
    keys: List[bool] = []
    inline: Dict[int, Inline] = {}
    bad_at, bad = None, None
    for i, entry in enumerate(entries):
        try:
            e = check_entry(path, i, entry, version)
        except ConfigError as exc:
            bad_at, bad = i, exc
            break
        urls.append(e.url)
        samples.append(e.samples)
        sizes.append(-1 if e.bytes is None else e.bytes)
        exts.append(e.ext_bytes)
        if e.offsets is not None or e.key_crc is not None:
            inline[i] = (e.offsets, e.key_crc)
        spans.append(entry.get("spans", True) is not False)
        keys.append(entry.get("keys", True) is not False)
    names, matrix, known = ext_matrix(exts)
    return Fields(StringTable.of(urls), np.array(samples, np.int64), np.array(sizes, np.int64), names, matrix, known,
                  np.array(spans, bool), np.array(keys, bool), inline, bad_at, bad)  # fmt: skip


def manifest_base(path: str) -> str:
    """The folder a manifest's relative entries are taken from, ending with its separator."""
    if is_remote(path):
        return posixpath.join(path.rsplit("/", 1)[0], "")
    local = local_path(path)
    assert local is not None  # not remote: local
    return os.path.join(os.path.dirname(os.path.abspath(local)), "")


def relative(names: StringTable) -> np.ndarray:
    """Per entry, whether it is taken from the manifest's folder (no ``://``, not ``/``-rooted)."""
    rooted = np.zeros(len(names), bool)
    nonempty = names.lengths() > 0
    rooted[nonempty] = names.data[names.ends[:-1][nonempty]] == ord("/")
    for i in np.flatnonzero(names.count_bytes(b":") > 0).tolist():
        rooted[i] = rooted[i] or "://" in names[i]
    return ~rooted


def checked(path: str, fields: Fields, config: StorageOptions) -> Tuple[Catalog, int]:
    """The catalog of a manifest's checked ``fields`` and the first entry off a remote manifest's
    server (-1: none; refused here unless ``config.manifest_foreign_urls``); a ConfigError for the
    first entry at fault, in the entries' order (see the module)."""
    base = manifest_base(path)
    rel = relative(fields.names)
    foreign = first_foreign(path, fields.names, rel)
    again = first_repeat(path, fields.names, rel, base)
    faults: List[Tuple[int, int, Any]] = []
    if fields.bad_at is not None:
        faults.append((fields.bad_at, 0, fields.bad))
    if foreign >= 0 and not config.manifest_foreign_urls:
        faults.append((foreign, 1, None))
    if again is not None:
        faults.append((again[1], 2, again))
    if faults:
        at, kind, what = min(faults, key=lambda f: (f[0], f[1]))
        if kind == 1:  # (an entry given whole: as written is as resolved)
            check_entry_origin(path, at, fields.names[at], fields.names[at], config)
        raise what if kind == 0 else _listed_twice(path, fields.names, base, rel, *what)
    catalog = from_fields(fields.names, rel.astype(np.int32), ("", base), fields.samples, fields.sizes, fields.exts,
                          fields.ext_bytes, fields.has_ext, spans=fields.spans, keys=fields.keys,
                          inline=fields.inline)  # fmt: skip
    return catalog, foreign


def with_table(catalog: Catalog, table: str, fields: Fields) -> Catalog:
    """``catalog`` with its shards' records in the sample table ``table`` (version 3)."""
    cols = dict(catalog.columns)
    cols["table"] = np.zeros(len(catalog), np.int32)
    cols["table_at"] = record_starts(fields.samples)[:-1]
    cols["spans"], cols["keys"] = fields.spans, fields.keys
    return Catalog(cols, catalog.prefixes, catalog.exts, (table,), catalog.inline, catalog.damage)


def first_foreign(path: str, names: StringTable, rel: np.ndarray) -> int:
    """The first entry of a remote manifest off its server or bucket (-1: none). A relative
    entry stays on it: only those given whole are compared."""
    if not is_remote(path):
        return -1
    home = origin(path)
    for i in np.flatnonzero(~rel).tolist():
        if origin(names[i]) != home:
            return i
    return -1


def plain_names(names: StringTable, rel: np.ndarray, base: str) -> bool:
    """Whether every entry is a plain name in the manifest's folder (see the module)."""
    if not rel.all() or names.count_bytes(PLAIN_NAME_BAD).any():
        return False
    if any(names[i] in ("", ".", "..") for i in names.short(2).tolist()):
        return False
    return is_remote(base) or not _any_link(names, base)


def _any_link(names: StringTable, base: str) -> bool:
    """Whether one of ``names`` is a symbolic link in the local folder ``base`` (one listing of it)."""
    folder = local_path(base)
    try:
        with os.scandir(folder or ".") as it:
            links = [e.name for e in it if e.is_symlink()]
    except OSError:
        return False
    if not links:
        return False
    listed = names.digests()
    probe = StringTable.of(links).digests()
    return bool(np.isin(probe, listed).any())


def first_repeat(path: str, names: StringTable, rel: np.ndarray, base: str) -> Optional[Tuple[int, int]]:
    """(first, again) of the first entry naming a shard listed before (however spelled), None if none."""
    if plain_names(names, rel, base):
        return names.first_repeat()
    seen: Seen[int] = Seen()
    for i, written in enumerate(names):
        url = base + written if rel[i] else written
        before = seen.before(url, i)
        if before is not None:
            return before[1], i
    return None


def _listed_twice(path: str, names: StringTable, base: str, rel: np.ndarray, j: int, i: int) -> ConfigError:
    first = base + names[j] if rel[j] else names[j]
    return ConfigError(
        f"manifest {path!r} lists shard {first!r} twice: entry {j} ({names[j]!r}) and entry {i} "
        f"({names[i]!r}); each shard may appear once: remove one of them"
    )


def check_version_3(path: str, doc: Dict[str, Any]) -> str:
    """A version-3 manifest's ``sample_table`` name, checked."""
    name = doc.get("sample_table")
    if not isinstance(name, str) or not name or "/" in name or "://" in name or name in (".", ".."):
        raise ConfigError(f'manifest {path!r}: "sample_table" must be the name of a file beside it, got {name!r}')
    return name
