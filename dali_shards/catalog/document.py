"""A manifest's catalog: built from its text (the JSON, or the binary columns beside it where they
were written with that very text), and the checks each process makes of a catalog it did not build
(where its entries may point under its own options, its sample table's size)."""

from __future__ import annotations

import json
import logging
from typing import Any, Dict, Optional, Tuple

from dali_shards.catalog.binary import read_binary, text_digest
from dali_shards.catalog.columns import Catalog
from dali_shards.catalog.entries import is_count
from dali_shards.catalog.fetch import read_text
from dali_shards.catalog.origins import check_entry_origin
from dali_shards.catalog.parse import Fields, check_version_3, checked, manifest_base, of_json, with_table
from dali_shards.catalog.table import check_table_counts, record_bytes
from dali_shards.errors import ConfigError
from dali_shards.options import StorageOptions

log = logging.getLogger("dali_shards")

MANIFEST_FORMAT = "dali-shards-manifest"
MANIFEST_VERSION = 3
BINARY_AT_LEAST = 256 << 10  # smaller manifests are parsed (their columns are not looked for)
Built = Tuple[Catalog, Dict[str, Any]]


def build(path: str, config: StorageOptions, digest: Optional[str] = None, text: Optional[bytes] = None,
          inline_warn: int = 1_000_000) -> Built:  # fmt: skip
    """The catalog of manifest ``path`` and its meta: from its columns where they match its text
    (``digest``: the SHA-256 of its text where known, sparing a read of it), else from the JSON."""
    if text is None and digest is not None:
        got = read_binary(path, digest, config)
        if got is not None:
            return from_columns(path, *got, config)
    if text is None:
        text = read_text(path, config)
    if len(text) >= BINARY_AT_LEAST:
        digest = text_digest(text)
        got = read_binary(path, digest, config)
        if got is not None:
            return from_columns(path, *got, config)
    return from_json(path, text, config, inline_warn)


def from_json(path: str, text: bytes, config: StorageOptions, inline_warn: int) -> Built:
    """A JSON manifest's catalog, every field checked (``catalog.parse``)."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"manifest {path!r} is not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
        raise ConfigError(f'{path!r} is not a dali-shards manifest (expected "format": "{MANIFEST_FORMAT}")')
    version = doc.get("version", MANIFEST_VERSION)
    if not is_count(version):
        raise ConfigError(f'manifest {path!r}: "version" must be an integer, got {version!r}')
    if version > MANIFEST_VERSION:
        raise ConfigError(f"manifest {path!r} has version {version}; upgrade dali_shards to read it")
    entries = doc.get("shards", [])
    if not isinstance(entries, list):
        raise ConfigError(f'manifest {path!r}: "shards" must be a list of entries, got {type(entries).__name__}')
    fields = of_json(path, entries, version)
    table = doc.get("sample_table")
    del doc, entries  # (the parsed document let go before the checks)
    catalog, foreign = checked(path, fields, config)
    if version >= 3:
        return _tabled(path, catalog, fields, check_version_3(path, {"sample_table": table}), foreign)
    inline = sum(int(fields.samples[i]) for i, (offsets, _) in fields.inline.items() if offsets is not None)
    if inline > inline_warn:
        log.warning(
            "dali_shards: manifest %s (version %d) holds the offsets of %d samples inline, parsed by every process "
            "that reads it: rewrite it with `dali-shards index` (version 3 keeps them in a sample table that "
            "only the workers reading a shard read)", path, version, inline,
        )  # fmt: skip
    return catalog, {"foreign": foreign, "version": version}


def from_columns(path: str, fields: Fields, meta: Dict[str, Any], config: StorageOptions) -> Built:
    """A manifest's catalog from its binary columns (``catalog.binary``)."""
    catalog, foreign = checked(path, fields, config)
    return _tabled(path, catalog, fields, check_version_3(path, meta), foreign)


def _tabled(path: str, catalog: Catalog, fields: Fields, name: str, foreign: int) -> Built:
    table = manifest_base(path) + name
    return with_table(catalog, table, fields), {"foreign": foreign, "version": MANIFEST_VERSION, "sample_table": table}


def finish(path: str, catalog: Catalog, meta: Dict[str, Any], config: StorageOptions) -> Catalog:
    """The checks every process makes of a manifest's catalog, built by it or not: an entry off a
    remote manifest's server (unless ``config.manifest_foreign_urls``), and its local sample table
    against the counts (``catalog.table.check_table_counts``)."""
    foreign = int(meta.get("foreign", -1))
    if foreign >= 0:
        url = catalog.names[foreign]
        check_entry_origin(path, foreign, url, url, config)
    table = meta.get("sample_table")
    if table is not None:
        n, cols = len(catalog), catalog.columns
        end = int(cols["table_at"][-1]) + int(record_bytes(int(cols["samples"][-1]))) if n else 0
        check_table_counts(path, table, catalog.samples, catalog.urls, config, end)  # type: ignore[arg-type]
    return catalog
