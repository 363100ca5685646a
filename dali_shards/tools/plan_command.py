"""``dali-shards plan``: an epoch's plan, of one dataset or of a mix of streams (``--stream``),
printed or as JSON (see ``plan_report``). No DALI."""

from __future__ import annotations

import argparse
import json
import re
from typing import Any, Dict

from dali_shards.errors import ConfigError
from dali_shards.options import Batching, LastBatch, ShardedOptions, StorageOptions, option_default
from dali_shards.stream import Stream
from dali_shards.setup.mixing import resolve_shards
from dali_shards.setup.planspec import plan_specs
from dali_shards.tools.plan_report import plan_report, streaming_report

_STREAM = re.compile(r"^(proportion|repeat|choose)=([^:]+):(.+)$")


def parse_stream(text: str) -> Stream:
    """``--stream``'s value: ``PATTERN`` (drawn once per epoch), or ``proportion=P:PATTERN``,
    ``repeat=R:PATTERN`` or ``choose=N:PATTERN``."""
    m = _STREAM.match(text)
    if m is None:
        return Stream(text)
    kind, value, pattern = m.groups()
    try:
        number: Any = int(value) if kind == "choose" else float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--stream {text!r}: {kind} must be a number, got {value!r}") from None
    try:
        return Stream(pattern, **{kind: number})
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_plan_options(p: argparse.ArgumentParser) -> None:
    """The ``plan`` subcommand's options (its shards: ``patterns`` or ``--stream``)."""
    p.add_argument("--stream", action="append", type=parse_stream, metavar="[KIND=N:]PATTERN",
                   help="a stream of a mix, repeated for each (instead of patterns): PATTERN drawn once per epoch, or "
                   "proportion=P:PATTERN (a share of what --epoch-size leaves), repeat=R:PATTERN (R times its size), "
                   "choose=N:PATTERN (N samples)")  # fmt: skip
    p.add_argument("--epoch-size", type=int, help="a mix's samples per epoch (default: the streams' counts summed)")
    p.add_argument("--batching", choices=[b.value for b in Batching],
                   help=f"a mix's batches: random, or stratified (each stream's share in every batch; default "
                   f"{option_default('batching')})")  # fmt: skip
    p.add_argument("--samples-per-epoch", type=int,
                   help="plan the streaming mode: each worker streams its shards, this many samples per epoch in all "
                   "(shards need no sample counts)")  # fmt: skip
    p.add_argument("--world-size", type=int, default=1, help="ranks (default 1)")
    p.add_argument("--workers", type=int, required=True, help="py_num_workers per rank")
    # "--batch" stays the short form of --batch-size (not ambiguous with --batching)
    p.add_argument("--batch-size", "--batch", type=int, required=True, help="samples per batch, per rank")
    p.add_argument("--epoch", type=int, default=0, help="the epoch to plan (default 0)")
    p.add_argument("--seed", type=int, default=option_default("seed"), help="shuffle seed (default %(default)s)")
    p.add_argument("--shuffle", action="store_true", help="plan a shuffled epoch (shuffle=True)")
    p.add_argument("--last-batch", choices=[m.value for m in LastBatch], default=option_default("last_batch"),
                   help="pad: every sample once, the last batches padded; drop: whole batches only "
                   "(default %(default)s)")  # fmt: skip
    p.add_argument("--shuffle-buffer", type=int, default=option_default("shuffle_buffer"),
                   help="samples each worker holds for its buffer shuffle (default %(default)s)")  # fmt: skip
    p.add_argument("--shuffle-block", type=int, default=option_default("shuffle_block"),
                   help="pieces of shards a rank's workers interleave at once when shuffling (0: contiguous runs; "
                   "default %(default)s)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print JSON")


def _options(args: argparse.Namespace, config: StorageOptions) -> ShardedOptions:
    """The pipeline options the arguments stand for (the plan is resolved as the pipeline's is)."""
    if args.stream and args.patterns:
        raise ConfigError("give the shards as patterns (one dataset) or as --stream (a mix), not both")
    if not args.stream:
        if args.epoch_size is not None or args.batching is not None:
            raise ConfigError("--epoch-size and --batching plan a mix: give its streams with --stream")
        if not args.patterns:
            raise ConfigError("no shards given: give patterns, or streams with --stream")
    source = tuple(args.stream) if args.stream else list(args.patterns)
    return ShardedOptions(
        source=source, fields=("__index__",), batch_size=args.batch_size, py_num_workers=args.workers,
        world_size=args.world_size, rank=0, seed=args.seed, shuffle=args.shuffle, last_batch=args.last_batch,
        shuffle_buffer=args.shuffle_buffer, shuffle_block=args.shuffle_block, epoch_size=args.epoch_size,
        batching=args.batching or option_default("batching"), samples_per_epoch=args.samples_per_epoch, storage=config,
    )  # fmt: skip


def run_plan(args: argparse.Namespace, config: StorageOptions) -> int:
    """Print (or ``--json``) the plan the arguments ask for: the one the pipeline's workers follow
    (resolved the same way: ``setup.planspec.plan_specs``)."""
    options = _options(args, config)
    shards, mix = resolve_shards(options)
    spec, streaming = plan_specs(options, shards, args.world_size, mix)
    if streaming is not None:
        return _print_streaming(streaming_report(streaming, shards, args.epoch), args.json)
    summary = plan_report(spec, shards, args.epoch, [s.source for s in args.stream or ()])
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    print(
        f"{spec.num_samples} samples {'drawn ' if mix else ''}from {len(shards)} shards ({summary['empty_shards']} empty); "
        f"{spec.world_size} ranks x {spec.py_num_workers} workers = {spec.num_virtual_workers} virtual workers; "
        f"batch {spec.batch_size} per rank ({spec.mini_batch} per worker)"
    )
    print(
        f"epoch {args.epoch} ({'shuffled, seed %d' % spec.seed if spec.shuffle else 'canonical order'}, "
        f"last_batch={spec.last_batch}): {spec.steps_per_epoch} steps on every rank; "
        f"{spec.planned_samples} samples delivered, {spec.padding_per_epoch} padding slots, "
        f"{spec.dropped_per_epoch} dropped"
    )
    for s in summary.get("streams", []):
        print(f"stream {s['stream']} ({s['source']}): {s['samples']} samples in {s['shards']} shards; {s['draws']} "
              f"draws ({s['share']:.1%} of the epoch), {s['delivered']} delivered")  # fmt: skip
    for r in summary["ranks"]:
        print(f"rank {r['rank']}:")
        for w in r["workers"]:
            reads = ", ".join(f"{x['shard']}[{x['samples'][0]}:{x['samples'][1]}]" for x in w["reads"])
            pad = f" + {w['padding']} padding" if w["padding"] else ""
            per = f" (per stream {w['per_stream']})" if "per_stream" in w else ""
            print(f"  worker {w['worker']} (virtual {w['virtual_worker']}): {w['samples']} samples{per}{pad}; reads {reads}")
    return 0


def _print_streaming(summary: Dict[str, Any], as_json: bool) -> int:
    """The streaming mode's plan: each worker's shards, in the order its epoch's first pass reads them."""
    if as_json:
        print(json.dumps(summary, indent=1))
        return 0
    print(f"streaming {summary['samples_per_epoch']} samples per epoch from {summary['shards']} shards (no exactly-once: "
          f"an endless stream per worker); {summary['steps_per_rank']} steps on every rank, {summary['quota']} samples "
          "per worker")  # fmt: skip
    for r in summary["ranks"]:
        print(f"rank {r['rank']}:")
        for w in r["workers"]:
            print(f"  worker {w['worker']} (virtual {w['virtual_worker']}): streams {', '.join(w['shards'])}")
    return 0
