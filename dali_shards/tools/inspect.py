"""What a set of shards holds: samples, fields and their sizes, gaps, duplicate keys, and how
clustered the ``.cls`` labels are (class-sorted shards make poorly mixed batches).

Reads tar headers (member data is seeked over) and the small ``.cls`` members, shards in parallel.
"""

from __future__ import annotations

from array import array
from concurrent.futures import ThreadPoolExecutor
from collections import Counter
from dataclasses import dataclass, field
import sys
from typing import Dict, List, Optional, Sequence

import numpy as np
from tqdm import tqdm

from dali_shards.options import StorageOptions

from dali_shards.io.filesystems import DEFAULT_STORAGE
from dali_shards.catalog.scan import stored_size
from dali_shards.io.storage import open_shard
from dali_shards.tar.format import TarReader
from dali_shards.tools.labels import LABEL_EXT, clustering, shard_labels
from dali_shards.tools.write_command import human_size

EXAMPLES = 5


@dataclass
class ShardReport:
    url: str
    samples: int = 0
    bytes: Optional[int] = None
    keys: List[str] = field(default_factory=list)
    ext_sizes: Dict[str, array] = field(default_factory=dict)
    ext_keys: Dict[str, set] = field(default_factory=dict)
    duplicate_members: List[str] = field(default_factory=list)
    error: Optional[str] = None
    labels: Counter = field(default_factory=Counter)


def scan_report(url: str, config: StorageOptions = DEFAULT_STORAGE) -> ShardReport:
    """Keys and member sizes per extension of one shard (an unreadable shard is reported, not raised)."""
    report = ShardReport(url, bytes=stored_size(url, config))
    try:
        with open_shard(url, config) as stream:
            for position, key, ext, member in TarReader(stream, url).scan():
                if position == len(report.keys):
                    report.keys.append(key)
                report.ext_sizes.setdefault(ext, array("q")).append(member.size)
                holders = report.ext_keys.setdefault(ext, set())
                if position in holders:
                    report.duplicate_members.append(member.name)
                holders.add(position)
        if LABEL_EXT in report.ext_sizes:
            report.labels = shard_labels(url, config)
    except Exception as exc:  # noqa: BLE001 - an inspection reports every kind of damage
        report.error = str(exc)
    report.samples = len(report.keys)
    return report


def inspect_shards(
    urls: Sequence[str], threads: int = 8, progress: bool = False, config: StorageOptions = DEFAULT_STORAGE
) -> dict:
    """A JSON-able summary of the shards: per shard, per field, missing fields, duplicate keys."""
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(urls)))) as pool:
        reports = list(
            tqdm(
                pool.map(lambda u: scan_report(u, config), urls), total=len(urls), disable=not progress, desc="scanning"
            )
        )
    total = sum(r.samples for r in reports)
    fields = {}
    for ext in sorted({e for r in reports for e in r.ext_sizes}):
        sizes = np.concatenate([np.frombuffer(r.ext_sizes[ext], dtype=np.int64) for r in reports if ext in r.ext_sizes])
        missing = [
            r.keys[i]
            for r in reports
            if r.samples
            for i in sorted(set(range(r.samples)) - r.ext_keys.get(ext, set()))[:EXAMPLES]
        ]
        pct = np.percentile(sizes, [0, 50, 90, 99, 100]).round().astype(int).tolist()
        having = sum(len(r.ext_keys.get(ext, ())) for r in reports)
        fields[ext] = {
            "samples": having,
            "missing": total - having,
            "missing_examples": missing[:EXAMPLES],
            "bytes": int(sizes.sum()),
            "size_min_p50_p90_p99_max": pct,
        }
    seen: Dict[str, str] = {}
    duplicates = []
    for r in reports:
        for k in r.keys:
            if k in seen:
                duplicates.append({"key": k, "shards": [seen[k], r.url]})
            else:
                seen[k] = r.url
    return {
        "shards": len(reports),
        "samples": total,
        "bytes": sum(r.bytes or 0 for r in reports),
        "empty_shards": [r.url for r in reports if r.samples == 0 and not r.error],
        "unreadable_shards": [{"url": r.url, "error": r.error} for r in reports if r.error],
        "per_shard": [{"url": r.url, "samples": r.samples, "bytes": r.bytes, "error": r.error} for r in reports],
        "fields": fields,
        "duplicate_keys": len(duplicates),
        "duplicate_examples": duplicates[:EXAMPLES],
        "duplicate_members": sum(len(r.duplicate_members) for r in reports),
        "duplicate_member_examples": [m for r in reports for m in r.duplicate_members][:EXAMPLES],
        "labels": clustering([r.labels for r in reports if not r.error]),
    }


def print_report(report: dict) -> None:
    """The text form of an ``inspect_shards`` report (a class-sorted warning on stderr)."""
    print(f"{report['shards']} shards, {report['samples']} samples, {human_size(report['bytes'])}")
    counts = [s["samples"] for s in report["per_shard"] if not s["error"]]  # unreadable shards count nothing
    bad = len(report["unreadable_shards"])
    if counts or bad:
        spread = f"min {min(counts)}, max {max(counts)}, " if counts else ""
        print(f"samples per readable shard: {spread}empty {len(report['empty_shards'])}, unreadable {bad}")
    print(f"{'field':12} {'samples':>9} {'missing':>8} {'size min / p50 / p90 / p99 / max':>40}")
    for ext, f in report["fields"].items():
        sizes = " / ".join(human_size(v) for v in f["size_min_p50_p90_p99_max"])
        print(f"{ext:12} {f['samples']:>9} {f['missing']:>8} {sizes:>40}")
        if f["missing_examples"]:
            print(f"{'':12} e.g. missing in: {', '.join(f['missing_examples'])}")
    print(
        f"duplicate keys: {report['duplicate_keys']}"
        + "".join(f"\n  {d['key']!r} in {d['shards'][0]} and {d['shards'][1]}" for d in report["duplicate_examples"])
    )
    if report["duplicate_members"]:
        print(
            f"duplicate members within a sample: {report['duplicate_members']}, "
            f"e.g. {', '.join(report['duplicate_member_examples'])}"
        )
    _print_labels(report["labels"])
    for entry in report["unreadable_shards"]:
        print(f"unreadable: {entry['error']}")


def _print_labels(labels: Optional[dict]) -> None:
    if labels is None:
        return
    print(
        f"labels (.cls): {labels['classes']} classes; a shard holds {labels['mean_distinct_per_shard']} on "
        f"average, {labels['expected_if_mixed']} if its samples were mixed at random (ratio {labels['ratio']})"
    )
    if labels["class_sorted"]:
        print(
            "warning: the shards look class-sorted: batches will see few classes. Rewrite them mixed "
            "(`dali-shards write` shuffles by default)",
            file=sys.stderr,
        )
