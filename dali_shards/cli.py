"""The ``dali-shards`` command: write, index, inspect and plan sharded datasets (no DALI needed)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List, Optional, Sequence

from dali_shards.errors import ConfigError, DaliShardsError
from dali_shards.options import option_default
from dali_shards.tools.plan_report import plan_summary
from dali_shards.catalog.manifest import ShardInfo, read_manifest, scan_shard, write_manifest
from dali_shards.plan.epoch import LAST_BATCH_MODES, PlanSpec
from dali_shards.options import StorageOptions
from dali_shards.io.filesystems import is_remote
from dali_shards.catalog.sources import MANIFEST_NAME, expand_pattern, is_manifest, resolve_source
from dali_shards.tools.write_command import add_write_command, human_size, parse_size  # noqa: F401 - parse_size: API

def _expand_all(patterns: Sequence[str], config: Optional[StorageOptions] = None) -> List[str]:
    """Shard URLs of patterns, globs, directories and manifests (read, not scanned)."""
    config = config or StorageOptions()
    urls = [
        u
        for p in patterns
        for u in ([s.url for s in read_manifest(p, config)] if is_manifest(p) else expand_pattern(p, config))
    ]
    if not urls:
        raise ConfigError("no shards given")
    return urls


def _storage(args: argparse.Namespace) -> StorageOptions:
    text = getattr(args, "storage_options", None)
    if not text:
        return StorageOptions()
    try:
        options = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"--storage-options is not JSON: {exc}") from None
    if not isinstance(options, dict):
        raise ConfigError('--storage-options must be a JSON object, e.g. \'{"endpoint_url": "http://host:9000"}\'')
    return StorageOptions(storage_options=options)


def _add_storage_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--storage-options",
        metavar="JSON",
        help='fsspec options for remote URLs, e.g. \'{"endpoint_url": "http://localhost:9000"}\' '
        "(the AWS_*/GOOGLE_* environment applies too)",
    )


def _add_scan_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=int, default=8, help="shards scanned in parallel (default 8)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_storage_option(p)


def _default_manifest(urls: Sequence[str]) -> str:
    folders = {u.rsplit("/", 1)[0] if is_remote(u) else os.path.dirname(os.path.abspath(u)) for u in urls}
    if len(folders) != 1:
        raise ConfigError("the shards are in several directories; say where the manifest goes with --manifest")
    folder = folders.pop()
    return f"{folder}/{MANIFEST_NAME}" if is_remote(folder) else os.path.join(folder, MANIFEST_NAME)


# -- index --------------------------------------------------------------------------------
def cmd_index(args: argparse.Namespace) -> int:
    from concurrent.futures import ThreadPoolExecutor

    from tqdm import tqdm

    from dali_shards.tools.dali_index import check_distinct_index_paths, write_dali_index

    config = _storage(args)
    urls = _expand_all(args.patterns, config)
    manifest = args.manifest or _default_manifest(urls)
    remote = any(is_remote(u) for u in urls)
    no_idx = args.no_idx or remote  # DALI's reader reads local files only
    if not no_idx:
        check_distinct_index_paths(urls)

    def index(url: str) -> ShardInfo:
        return scan_shard(url, config=config) if no_idx else write_dali_index(url)

    with ThreadPoolExecutor(max_workers=max(1, min(args.threads, len(urls)))) as pool:
        infos = list(tqdm(pool.map(index, urls), total=len(urls), disable=args.quiet, desc="indexing"))
    write_manifest(manifest, infos, config)
    print(
        f"{len(infos)} shards, {sum(i.samples for i in infos)} samples: manifest {manifest}"
        + ("" if no_idx else "; DALI index files (.idx) beside the shards")
        + ("; no .idx files for remote shards" if remote and not args.no_idx else "")
    )
    return 0


# -- inspect ------------------------------------------------------------------------------
def cmd_inspect(args: argparse.Namespace) -> int:
    from dali_shards.tools.inspect import inspect_shards

    config = _storage(args)
    report = inspect_shards(
        _expand_all(args.patterns, config), threads=args.threads, progress=not args.quiet, config=config
    )
    if args.json:
        print(json.dumps(report, indent=1))
        return 1 if report["unreadable_shards"] else 0
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
    for bad in report["unreadable_shards"]:
        print(f"unreadable: {bad['error']}")
    return 1 if report["unreadable_shards"] else 0


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


# -- plan ---------------------------------------------------------------------------------
def cmd_plan(args: argparse.Namespace) -> int:
    config = _storage(args)
    shards: List[ShardInfo] = [s for p in args.patterns for s in resolve_source(p, config=config)]
    spec = PlanSpec(
        tuple(s.samples for s in shards),
        world_size=args.world_size,
        py_num_workers=args.workers,
        batch_size=args.batch_size,
        seed=args.seed,
        shuffle=args.shuffle,
        last_batch=args.last_batch,
        shuffle_buffer=args.shuffle_buffer,
    )
    summary = plan_summary(spec, shards, args.epoch)
    ranks = summary["ranks"]
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    print(
        f"{spec.num_samples} samples in {len(shards)} shards ({summary['empty_shards']} empty); "
        f"{spec.world_size} ranks x {spec.py_num_workers} workers = {spec.num_virtual_workers} virtual workers; "
        f"batch {spec.batch_size} per rank ({spec.mini_batch} per worker)"
    )
    print(
        f"epoch {args.epoch} ({'shuffled, seed %d' % spec.seed if spec.shuffle else 'canonical order'}, "
        f"last_batch={spec.last_batch}): {spec.steps_per_epoch} steps on every rank; "
        f"{spec.planned_samples} samples delivered, {spec.padding_per_epoch} padding slots, "
        f"{spec.dropped_per_epoch} dropped"
    )
    for r in ranks:
        print(f"rank {r['rank']}:")
        for w in r["workers"]:
            reads = ", ".join(f"{x['shard']}[{x['samples'][0]}:{x['samples'][1]}]" for x in w["reads"])
            pad = f" + {w['padding']} padding" if w["padding"] else ""
            print(f"  worker {w['worker']} (virtual {w['virtual_worker']}): {w['samples']} samples{pad}; reads {reads}")
    return 0


# -- main ---------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dali-shards",
        description="Write, index, inspect and plan WebDataset-style tar shards for dali_shards.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    add_write_command(sub)

    p = _shards_parser(sub, "index", cmd_index)
    p.add_argument("--manifest", help="manifest path (default: manifest.json beside the shards)")
    p.add_argument("--no-idx", action="store_true", help="write only the manifest")
    _add_scan_options(p)
    p = _shards_parser(sub, "inspect", cmd_inspect)
    p.add_argument("--json", action="store_true", help="print JSON")
    _add_scan_options(p)
    p = _shards_parser(sub, "plan", cmd_plan)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--workers", type=int, required=True, help="py_num_workers per rank")
    p.add_argument("--batch-size", type=int, required=True, help="per rank")
    p.add_argument("--epoch", type=int, default=0)
    p.add_argument("--seed", type=int, default=option_default("seed"))
    p.add_argument("--shuffle", action="store_true")
    p.add_argument("--last-batch", choices=LAST_BATCH_MODES, default=option_default("last_batch"))
    p.add_argument("--shuffle-buffer", type=int, default=option_default("shuffle_buffer"))
    p.add_argument("--json", action="store_true", help="print JSON")
    _add_storage_option(p)
    return parser


_SHARD_COMMANDS = {  # name: (help, description)
    "index": (
        "write the manifest (and DALI .idx files) of existing shards",
        "Scan shards' tar headers; write a manifest of per-shard sample counts (so pipelines start without "
        "scanning) and DALI index files so fn.readers.webdataset can use the same shards without a scan. Remote "
        "shards (s3://, gs://, http(s)://) get the manifest only, beside them where the storage is writable "
        "(else use --manifest).",
    ),
    "inspect": (
        "shards, samples, fields, sizes, missing fields, duplicate keys",
        "Summarise shards from their tar headers: samples per shard, fields and their counts, size percentiles, "
        "samples missing a field, duplicate keys. Exits 1 if a shard cannot be read.",
    ),
    "plan": (
        "who reads which shards, steps per rank, padding and dropped samples",
        "Print an epoch's plan: which shards (and samples) each rank's workers read, steps per rank, padding and "
        "dropped samples. Needs no DALI.",
    ),
}


def _shards_parser(sub, name: str, run) -> argparse.ArgumentParser:
    """A subcommand over shards given as patterns."""
    help_, description = _SHARD_COMMANDS[name]
    p = sub.add_parser(name, help=help_, description=description)
    p.add_argument("patterns", nargs="+", help="shards: brace patterns, globs, directories, paths or a manifest")
    p.set_defaults(run=run)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (DaliShardsError, OSError) as exc:
        print(f"dali-shards {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
