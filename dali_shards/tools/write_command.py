"""``dali-shards write``: an ImageFolder tree or a file list into tar shards, with their manifest,
class map and keys (see ``imagefolder`` and ``folderwriter``)."""

from __future__ import annotations

import argparse
import glob
import os
import json
import re
import sys
from typing import Any, List, Optional

from dali_shards.tools.parquet import DEFAULT_COLUMNS

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``"500M"``, ``"1.5G"``, ``"64KiB"`` or a plain number of bytes."""
    m = _SIZE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use e.g. 500M, 1G or a number of bytes)")
    scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()]
    return int(float(m.group(1)) * scale)


def human_size(n: Optional[float]) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def add_write_command(sub: Any) -> None:
    """The ``write`` subcommand on ``sub`` (argparse subparsers)."""
    p = sub.add_parser(
        "write",
        help="write an ImageFolder tree or a file list into tar shards",
        description="Write an ImageFolder tree (class/xxx.jpg) or a file list (lines 'path [label]') "
        "into tar shards (<key>.<ext> + <key>.cls), with a manifest and a class map. A sample's key is its "
        "file's name without the extension, as in WebDataset's ImageNet shards; hidden files (names starting with "
        "'.', e.g. macOS's ._x.jpg) are skipped, counted in a warning. Output is deterministic: the same input "
        "and seed give the same shards.",
    )
    p.add_argument(
        "src",
        help="ImageFolder root, or a text file listing 'path [label]' per line (relative paths are taken "
        "from the list's folder; label every line or none)",
    )
    p.add_argument("out_pattern", help="output shards as a %%-format, e.g. out/train-%%06d.tar (.tar.gz to compress)")
    p.add_argument("--max-count", type=int, default=1000, help="samples per shard at most (default 1000)")
    p.add_argument(
        "--max-size",
        type=parse_size,
        default=None,
        help="bytes per tar file at most, headers and padding counted, before compression, e.g. 1G",
    )
    p.add_argument("--class-map", help="JSON {class name: index} to use (e.g. the train set's classes.json)")
    p.add_argument(
        "--numeric-classes", action="store_true", help="class directories are integer labels (e.g. ImageNet ids)"
    )
    p.add_argument(
        "--shuffle",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="mix samples across shards, seeded (the default: shards of one class each make poorly mixed "
        "batches); --no-shuffle keeps the source order (class by class for a class-folder tree)",
    )
    p.add_argument("--seed", type=int, default=0, help="shuffle seed (default 0): the same seed, the same shards")
    p.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="where the shards are written: local processes (default) or a Ray cluster (pip install "
                   "'dali-shards[ray]'); the same bytes either way")
    p.add_argument("--processes", type=int, default=None, help="parallel writers of --engine local (default: all cores)")
    p.add_argument("--ray-address", help="the Ray cluster to use (default: RAY_ADDRESS, else the one `ray start` "
                   "began on this machine, else a new local Ray instance)")
    p.add_argument("--tasks", type=int, default=None,
                   help="tasks to split the job into (default: one per shard, one per window for Parquet); the same "
                   "bytes for any number")
    p.add_argument("--columns", help="Parquet input: EXT=COLUMN,... the members and the columns they come from "
                   f"(default {DEFAULT_COLUMNS}; a column of strings under an image extension holds paths; "
                   "__key__=COLUMN keys the samples)")
    p.add_argument("--window", type=int, default=None,
                   help="Parquet input: samples mixed together, in windows of whole row groups of at least this many "
                   "rows, each read by one task (default 8 x --max-count)")
    p.add_argument("--manifest", help="manifest path (default: manifest.json beside the shards)")
    p.add_argument(
        "--numbered-keys", action="store_true",
        help="key samples 00000000, 00000001... in the written order instead of by their files' names",
    )  # fmt: skip
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--storage-options", metavar="JSON",
                   help="fsspec options for remote inputs and outputs, e.g. '{\"endpoint_url\": \"http://host:9000\"}'")
    p.set_defaults(run=cmd_write)


def cmd_write(args: argparse.Namespace) -> int:
    from dali_shards.tools.folderwriter import out_folder, write_dataset
    from dali_shards.tools.imagefolder import load_class_map

    storage = storage_options(args.storage_options)
    result = write_dataset(
        args.src, args.out_pattern, max_count=args.max_count, max_size=args.max_size, shuffle=args.shuffle,
        seed=args.seed, engine=args.engine, processes=args.processes, ray_address=args.ray_address, tasks=args.tasks,
        columns=args.columns, window=args.window, class_map=load_class_map(args.class_map) if args.class_map else None,
        numeric_classes=args.numeric_classes, numbered_keys=args.numbered_keys, manifest=args.manifest,
        storage=storage, progress=not args.quiet,
    )  # fmt: skip
    if result.renamed:
        print(
            f"dali-shards write: {len(result.renamed)} files keyed other than by their name (dots in a name become "
            f"'_', a name taken by an earlier file gets a number), e.g. {result.renamed[0][0]} -> "
            f"{result.renamed[0][1]!r}",
            file=sys.stderr,
        )
    out_dir = out_folder(args.out_pattern)
    warn_stale(args.out_pattern, out_dir, [i.url for i in result.shards], storage)
    class_map = result.class_map
    print(
        f"wrote {result.samples} samples into {len(result.shards)} shards ({human_size(result.bytes)}"
        + (f"; {result.reused} complete shards of an earlier run kept" if result.reused else "")
        + f"); manifest {result.manifest}"
        + (f"; {len(class_map)} classes in {out_dir}/classes.json" if class_map else "")
    )
    return 0


def storage_options(text: Optional[str], foreign: bool = False) -> Any:
    """``--storage-options JSON`` (and ``--manifest-foreign-urls``) as StorageOptions."""
    from dali_shards.errors import ConfigError
    from dali_shards.options import StorageOptions

    if not text:
        return StorageOptions(manifest_foreign_urls=foreign)
    try:
        options = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"--storage-options is not JSON: {exc}") from None
    if not isinstance(options, dict):
        raise ConfigError('--storage-options must be a JSON object, e.g. \'{"endpoint_url": "http://host:9000"}\'')
    return StorageOptions(storage_options=options, manifest_foreign_urls=foreign)


def warn_stale(pattern: str, out_dir: str, urls: List[str], storage: Any) -> None:
    """Warn of shards matching ``pattern`` (and, locally, DALI index files) that this write did not write."""
    shards = re.sub(r"%[-+ #0]*\d*d", "*", pattern)
    if "://" in out_dir:
        from dali_shards.io.filesystems import filesystem

        fs, inner = filesystem(shards, storage)
        fs.invalidate_cache(inner.rsplit("/", 1)[0])  # what is there now
        written = {filesystem(u, storage)[1] for u in urls}
        stale = sorted(f"{shards.split('://', 1)[0]}://{p}" for p in fs.glob(inner) if p not in written)
    else:
        written = {os.path.abspath(u) for u in urls}
        indexes = {os.path.splitext(p)[0] for p in written}
        stale = sorted(p for p in glob.glob(shards) if os.path.abspath(p) not in written)
        stale += sorted(  # DALI index files of shards this run did not write
            p for p in glob.glob(os.path.join(out_dir, "*.idx")) if os.path.splitext(os.path.abspath(p))[0] not in indexes
        )
    if stale:
        print(
            f"dali-shards write: warning: {len(stale)} files left from an earlier write (shards matching "
            f"{pattern} or .idx files of shards not written now; e.g. {stale[0]}); they are not in the "
            "manifest, but a glob (or DALI's reader) would pick them up: remove them",
            file=sys.stderr,
        )
