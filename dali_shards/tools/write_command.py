"""``dali-shards write``: an ImageFolder tree or a file list into tar shards, with their manifest,
class map and keys (see ``imagefolder`` and ``folderwriter``)."""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import sys
from typing import Any, Optional

from dali_shards.catalog.manifest import write_manifest

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
    p.add_argument("--processes", type=int, default=None, help="parallel writers (default: all cores)")
    p.add_argument("--manifest", help="manifest path (default: manifest.json beside the shards)")
    p.add_argument(
        "--numbered-keys", action="store_true",
        help="key samples 00000000, 00000001... in the written order instead of by their files' names",
    )  # fmt: skip
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=cmd_write)


def cmd_write(args: argparse.Namespace) -> int:
    from dali_shards.tools.imagefolder import find_sources, load_class_map, save_class_map, stem_keys
    from dali_shards.tools.folderwriter import write_dataset

    class_map = load_class_map(args.class_map) if args.class_map else None
    files, class_map = find_sources(args.src, class_map, args.numeric_classes)
    keys = None
    if not args.numbered_keys:
        keys, renamed = stem_keys(files)
        if renamed:
            print(
                f"dali-shards write: {len(renamed)} files keyed other than by their name (dots in a name become "
                f"'_', a name taken by an earlier file gets a number), e.g. {renamed[0][0]} -> {renamed[0][1]!r}",
                file=sys.stderr,
            )
    out_dir = os.path.dirname(os.path.abspath(args.out_pattern))
    created = not os.path.exists(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    try:
        infos = write_dataset(
            files,
            args.out_pattern,
            max_count=args.max_count,
            max_size=args.max_size,
            shuffle=args.shuffle,
            seed=args.seed,
            processes=args.processes,
            progress=not args.quiet,
            keys=keys,
        )
    except BaseException:
        if created:  # a failed write leaves no folder behind
            shutil.rmtree(out_dir, ignore_errors=True)
        raise
    manifest = args.manifest or os.path.join(out_dir, "manifest.json")
    write_manifest(manifest, infos)
    written = {os.path.abspath(i.url) for i in infos}
    pattern = re.sub(r"%[-+ #0]*\d*d", "*", args.out_pattern)
    indexes = {os.path.splitext(p)[0] for p in written}
    stale = sorted(p for p in glob.glob(pattern) if os.path.abspath(p) not in written)
    stale += sorted(  # DALI index files of shards this run did not write
        p for p in glob.glob(os.path.join(out_dir, "*.idx")) if os.path.splitext(os.path.abspath(p))[0] not in indexes
    )
    if stale:
        print(
            f"dali-shards write: warning: {len(stale)} files left from an earlier write (shards matching "
            f"{args.out_pattern} or .idx files of shards not written now; e.g. {stale[0]}); they are not in the "
            "manifest, but a glob (or DALI's reader) would pick them up: remove them",
            file=sys.stderr,
        )
    if class_map is not None:
        save_class_map(os.path.join(out_dir, "classes.json"), class_map)
    total = sum(i.samples for i in infos)
    print(
        f"wrote {total} samples into {len(infos)} shards ({human_size(sum(i.bytes or 0 for i in infos))}); "
        f"manifest {manifest}" + (f"; {len(class_map)} classes in {out_dir}/classes.json" if class_map else "")
    )
    return 0
