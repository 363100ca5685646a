"""The binary form of a version-3 manifest, beside it (``manifest.columns`` beside ``manifest.json``):
its entries in columns (``catalog.colfile``), read without parsing the JSON, which stays the
manifest (every reader of the release before reads it, and so does this one without the columns).

The columns record the SHA-256 of the JSON text they were written with; they are used only for that
exact text (a JSON edited or rewritten since, by hand or by another tool, is read as JSON). Their
fields are checked column by column as the JSON's are entry by entry, with the same errors.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

from dali_shards.catalog.assemble import ext_matrix
from dali_shards.catalog.colfile import BadColumnFile, map_columns, read_columns_bytes, write_columns
from dali_shards.catalog.entries import MAX_BYTES, MAX_SAMPLES, check_entry
from dali_shards.catalog.parse import Fields
from dali_shards.catalog.strings import StringTable
from dali_shards.io.filesystems import filesystem, is_remote
from dali_shards.io.storage import local_path
from dali_shards.options import StorageOptions

COLUMNS_SUFFIX = ".columns"
COLUMNS_FORMAT = "dali-shards-manifest-columns"
COLUMNS_MIN_SHARDS = 1000  # manifests of fewer shards are written without their columns (unless asked)


def columns_path(manifest: str) -> str:
    """Where a manifest's columns go: beside it, named after it."""
    stem = manifest[: -len(".json")] if manifest.endswith(".json") else manifest
    return stem + COLUMNS_SUFFIX


def text_digest(text: bytes) -> str:
    return hashlib.sha256(text).hexdigest()


def write_binary(manifest: str, text: bytes, entries: Sequence[Mapping[str, Any]], table: str,
                 config: StorageOptions) -> None:  # fmt: skip
    """Write the columns of a version-3 manifest whose JSON is ``text`` (its ``entries``, its
    sample table's name) beside it."""
    exts, matrix, known = ext_matrix([e.get("ext_bytes") for e in entries])
    fields = Fields(
        StringTable.of(str(e["url"]) for e in entries), np.array([e["samples"] for e in entries], np.int64),
        np.array([e.get("bytes", -1) for e in entries], np.int64), exts, matrix, known,
        np.array([e.get("spans", True) is not False for e in entries], bool),
        np.array([e.get("keys", True) is not False for e in entries], bool),
    )  # fmt: skip
    write_fields(manifest, text, fields, table, config)


def write_fields(manifest: str, text: bytes, fields: Fields, table: str, config: StorageOptions) -> None:
    """Write the columns of a version-3 manifest whose JSON is ``text`` from its entries' ``fields``."""
    arrays = {
        "names_data": fields.names.data, "names_ends": fields.names.ends, "samples": fields.samples,
        "bytes": fields.sizes, "ext_bytes": fields.ext_bytes, "has_ext": fields.has_ext, "spans": fields.spans,
        "keys": fields.keys,
    }  # fmt: skip
    meta = {"format": COLUMNS_FORMAT, "version": 3, "json_sha256": text_digest(text), "exts": list(fields.exts),
            "sample_table": table}  # fmt: skip
    target = columns_path(manifest)
    if not is_remote(manifest):
        write_columns(target, arrays, meta)
        return
    with tempfile.TemporaryDirectory() as tmp:
        local = os.path.join(tmp, "columns")
        write_columns(local, arrays, meta)
        fs, inner = filesystem(target, config)
        fs.put_file(local, inner)


def remove_stale(manifest: str) -> None:
    """Remove the columns beside a local manifest written without them (they no longer match it)."""
    path = local_path(columns_path(manifest))
    if path is not None and os.path.exists(path):
        os.unlink(path)


def read_binary(manifest: str, digest: str, config: StorageOptions) -> Optional[Tuple[Fields, Dict[str, Any]]]:
    """The entries of ``manifest`` from its columns, if they sit beside it and were written with the
    JSON text of SHA-256 ``digest``; (fields, meta), or None (read the JSON)."""
    target = columns_path(manifest)
    try:
        if is_remote(target):
            fs, inner = filesystem(target, config)
            got = read_columns_bytes(fs.cat_file(inner), target)
        else:
            path = local_path(target)
            got = map_columns(path) if path is not None and os.path.isfile(path) else None
    except (OSError, BadColumnFile, ValueError):
        return None
    except Exception:  # noqa: BLE001 - a remote store's own errors: the JSON is read instead
        return None
    if got is None:
        return None
    arrays, meta = got
    if meta.get("format") != COLUMNS_FORMAT or meta.get("json_sha256") != digest or meta.get("version") != 3:
        return None
    try:
        return checked_fields(manifest, arrays, meta), meta
    except (KeyError, ValueError, TypeError):
        return None


def checked_fields(manifest: str, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> Fields:
    """The columns as a manifest's ``Fields``, every field checked as ``catalog.entries`` checks
    the JSON's (the first entry at fault is refused with the same error)."""
    names = StringTable(arrays["names_data"], arrays["names_ends"])
    n = len(names)
    exts = tuple(str(e) for e in meta["exts"])
    samples, sizes = arrays["samples"], arrays["bytes"]
    ext_bytes, has_ext = arrays["ext_bytes"].reshape(n, len(exts)), arrays["has_ext"]
    if len(samples) != n or len(sizes) != n or len(has_ext) != n or len(arrays["spans"]) != n or len(arrays["keys"]) != n:
        raise ValueError("columns of different lengths")
    present = np.where(ext_bytes >= 0, ext_bytes, 0).astype(np.float64).sum(axis=1)
    bad = ((names.lengths() == 0) | (samples < 0) | (samples > MAX_SAMPLES) | (sizes < -1) | (sizes > MAX_BYTES)
           | (ext_bytes < -1).any(axis=1) | (present > MAX_BYTES) | (~has_ext & (ext_bytes != -1).any(axis=1)))  # fmt: skip
    fields = Fields(names, samples, sizes, exts, ext_bytes, has_ext, arrays["spans"], arrays["keys"])
    first = np.flatnonzero(bad)
    if len(first):
        at = int(first[0])
        try:
            check_entry(manifest, at, entry_of(fields, at), 3)
        except Exception as exc:  # noqa: BLE001 - the JSON's own error for this entry
            fields.bad_at, fields.bad = at, exc  # type: ignore[assignment]
        else:
            raise ValueError(f"entry {at} of the columns differs from what its JSON allows")
        fields = _cut(fields, at)
    return fields


def entry_of(fields: Fields, i: int) -> Dict[str, Any]:
    """Entry ``i`` as the JSON holds it."""
    entry: Dict[str, Any] = {"url": fields.names[i], "samples": int(fields.samples[i])}
    if fields.sizes[i] != -1:
        entry["bytes"] = int(fields.sizes[i])
    if fields.has_ext[i]:
        entry["ext_bytes"] = {e: int(v) for e, v in zip(fields.exts, fields.ext_bytes[i].tolist()) if v != -1}
    return entry


def _cut(fields: Fields, n: int) -> Fields:
    """The fields of the first ``n`` entries (those before the first refused one)."""
    ends = fields.names.ends[: n + 1]
    return Fields(StringTable(fields.names.data[: ends[-1]], ends), fields.samples[:n], fields.sizes[:n], fields.exts,
                  fields.ext_bytes[:n], fields.has_ext[:n], fields.spans[:n], fields.keys[:n], {}, fields.bad_at,
                  fields.bad)  # fmt: skip
