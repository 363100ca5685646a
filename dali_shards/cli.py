"""The ``dali-shards`` command: write, index, inspect and plan sharded datasets (no DALI needed)."""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import sys
from typing import List, Optional, Sequence, Tuple

from dali_shards import __version__
from dali_shards.errors import ConfigError, DaliShardsError, ShardAccessError
from dali_shards.tools.plan_command import add_plan_options, run_plan
from dali_shards.catalog.manifest import read_manifest, write_manifest
from dali_shards.options import StorageOptions
from dali_shards.io.filesystems import is_remote
from dali_shards.catalog.sources import MANIFEST_NAME, expand_pattern, folder_manifest, is_manifest
from dali_shards.io.storage import local_path
from dali_shards.tools.write_command import add_write_command, human_size, parse_size, storage_options  # noqa: F401 - parse_size: API


def _expand_all(patterns: Sequence[str], config: Optional[StorageOptions] = None) -> List[str]:
    """Shard URLs of patterns, globs, directories and manifests (listed, not scanned), a directory
    read as pipelines read it (``folder_manifest``: the shards its manifest.json lists, if any); a
    local shard given (not listed) that does not exist is an error naming it."""
    config = config or StorageOptions()
    urls: List[str] = []
    missing: List[str] = []
    for p in patterns:
        folder = folder_manifest(p)
        if folder is not None or is_manifest(p):
            urls += [s.url for s in (folder[1] if folder is not None else read_manifest(p, config))]
            continue
        matched = expand_pattern(p, config)
        missing += [u for u in matched if (path := local_path(u)) is not None and not os.path.exists(path)]
        urls += matched
    if missing:
        more = f" ({len(missing)} of the shards given are missing, the last {missing[-1]!r})" if missing[1:] else ""
        raise ShardAccessError(missing[0], f"file not found{more}", hint="check the shard path or pattern")
    if not urls:
        raise ConfigError("no shards given")
    return urls


def _storage(args: argparse.Namespace) -> StorageOptions:
    return storage_options(getattr(args, "storage_options", None), bool(getattr(args, "manifest_foreign_urls", False)))


def _add_storage_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--storage-options",
        metavar="JSON",
        help='fsspec options for remote URLs, e.g. \'{"endpoint_url": "http://localhost:9000"}\' '
        "(the AWS_*/GOOGLE_* environment applies too)",
    )
    p.add_argument(
        "--manifest-foreign-urls",
        action="store_true",
        help="read shards a remote manifest lists on another server or bucket, or locally (refused by default)",
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
    from dali_shards.tools.dali_index import check_distinct_index_paths, index_shards

    config = _storage(args)
    urls = _expand_all(args.patterns, config)
    manifest = args.manifest or _default_manifest(urls)
    remote = any(is_remote(u) for u in urls)
    no_idx = args.no_idx or remote  # DALI's reader reads local files only
    if not no_idx:
        check_distinct_index_paths(urls)
    infos = index_shards(urls, config, no_idx=no_idx, threads=args.threads, engine=args.engine,
                         address=args.ray_address, progress=not args.quiet)  # fmt: skip
    write_manifest(manifest, infos, config)
    print(
        f"{len(infos)} shards, {sum(i.samples for i in infos)} samples: manifest {manifest}"
        + ("" if no_idx else "; DALI index files (.idx) beside the shards")
        + ("; no .idx files for remote shards" if remote and not args.no_idx else "")
    )
    return 0


# -- inspect ------------------------------------------------------------------------------
def cmd_inspect(args: argparse.Namespace) -> int:
    from dali_shards.tools.inspect import inspect_shards, print_report

    config = _storage(args)
    report = inspect_shards(
        _expand_all(args.patterns, config), threads=args.threads, progress=not args.quiet, config=config
    )
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print_report(report)
    return 1 if report["unreadable_shards"] else 0


# -- plan ---------------------------------------------------------------------------------
def cmd_plan(args: argparse.Namespace) -> int:
    return run_plan(args, _storage(args))


# -- main ---------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """The ``dali-shards`` parser: its subcommands, and suggestions for mistyped ones and options."""
    parser = _Parser(
        prog="dali-shards",
        description="Write, index, inspect and plan WebDataset-style tar shards for dali_shards.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}", help="print the version")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    add_write_command(sub)

    p = _shards_parser(sub, "index", cmd_index)
    p.add_argument("--manifest", help="manifest path (default: manifest.json beside the shards)")
    p.add_argument("--no-idx", action="store_true", help="write only the manifest")
    p.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="scan here (threads) or in Ray tasks (pip install 'dali-shards[ray]'); the same manifest")
    p.add_argument("--ray-address", help="the Ray cluster to use (default: RAY_ADDRESS, else the one `ray start` "
                   "began on this machine, else a new local Ray instance)")
    _add_scan_options(p)
    p = _shards_parser(sub, "inspect", cmd_inspect)
    p.add_argument("--json", action="store_true", help="print JSON")
    _add_scan_options(p)
    p = _shards_parser(sub, "plan", cmd_plan, nargs="*")
    add_plan_options(p)
    _add_storage_option(p)
    return parser


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser that names the nearest option, or command, for a mistyped one."""

    def parse_known_args(  # type: ignore[override]
        self, args: Optional[Sequence[str]] = None, namespace: Optional[argparse.Namespace] = None
    ) -> Tuple[argparse.Namespace, List[str]]:
        """Parse as argparse does, once every option (and the command) is a known one."""
        argv = sys.argv[1:] if args is None else list(args)
        self._check_names(argv)
        return super().parse_known_args(argv, namespace)

    def _check_names(self, args: List[str]) -> None:
        """Exit with a suggestion at the first unknown option (and, for the main parser, command)."""
        options = [o for a in self._actions for o in a.option_strings]
        commands = [c for a in self._actions if isinstance(a, argparse._SubParsersAction) for c in a.choices]
        for token in args:
            if token == "--":
                return
            if not token.startswith("-") or token == "-" or " " in token or _NUMBER.match(token):
                if not commands:
                    continue  # a value: this parser's options were checked up to the command
                if token not in commands:
                    choices = ", ".join(map(repr, commands))
                    near = _near(token, commands)
                    self.error(f"argument COMMAND: invalid choice: {token!r} (choose from {choices}){near}")
                return
            name = token.split("=", 1)[0]
            if not any(o.startswith(name) for o in options):  # argparse takes unambiguous prefixes too
                self.error(f"unrecognized arguments: {name}{_near(name, options)}")


_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")  # argparse's negative numbers: values, not options


def _near(name: str, known: Sequence[str]) -> str:
    """``: did you mean X?`` for the known name nearest a mistyped one, if any is near."""
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f": did you mean {close[0]}?" if close else ""


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
        "samples missing a field, duplicate keys. Exits 1 if a shard cannot be read, 2 if a shard given does not "
        "exist.",
    ),
    "plan": (
        "who reads which shards, steps per rank, padding and dropped samples",
        "Print an epoch's plan: which shards (and samples) each rank's workers read, steps per rank, padding and "
        "dropped samples; for a mix of datasets (--stream), each stream's draws. Needs no DALI.",
    ),
}


def _shards_parser(sub, name: str, run, nargs: str = "+") -> argparse.ArgumentParser:
    """A subcommand over shards given as patterns."""
    help_, description = _SHARD_COMMANDS[name]
    p = sub.add_parser(name, help=help_, description=description)
    p.add_argument(
        "patterns",
        nargs=nargs,
        help="shards: brace patterns, globs, paths, manifests, or directories (read as pipelines read them: the "
        "shards their manifest.json lists, else their tar files)",
    )
    p.set_defaults(run=run)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``dali-shards`` with ``argv`` (default: the command line); returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        code = args.run(args)
        sys.stdout.flush()  # a reader gone (``| head``) is met here, not at exit
        return code
    except BrokenPipeError:
        # Python's recipe: what is left for stdout goes to devnull, so the exit flush cannot fail too
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):  # a stdout that is not a file (e.g. captured)
            pass
        return 128 + 13  # as a command ended by SIGPIPE
    except (DaliShardsError, OSError) as exc:
        print(f"dali-shards {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
