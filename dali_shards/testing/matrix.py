"""The contract in every combination: start method x transfer x plan x source x storage x queues.

``check(config)`` runs one configuration (``contract``: two epochs on 2 ranks, a mid-epoch resume
under the same layout and on 3 ranks, every sample checked against its tar, each draw once, equal
steps, the audit agreeing). ``pairwise()`` is a small set of configurations covering every pair of
values of any two axes (what CI runs); ``configurations()`` is the whole grid::

    python -m dali_shards.testing.matrix            # the pairwise set
    python -m dali_shards.testing.matrix --all      # every valid combination
    python -m dali_shards.testing.matrix --only transfer=merge plan=compressed

Imports DALI when a configuration runs."""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from dali_shards.options import option_default
from dali_shards.testing import contract

AXES: Dict[str, Tuple[str, ...]] = {
    "start": ("fork", "spawn"),
    "transfer": ("ring", "merge"),
    "plan": ("interleaved", "contiguous", "one_shard", "three_shards", "compressed", "streaming", "bucketed"),
    "source": ("one", "random_mix", "stratified_mix"),
    "storage": ("local", "http"),
    "queues": ("default", "separated"),
}
SIZES = {"one_shard": (30,), "three_shards": (9, 0, 14, 6)}  # the rest: enough shards to interleave
MANY = (7, 0, 12, 5, 9, 3, 11, 6, 8, 4)
WORLD, WORKERS, BATCH, STOP, ELASTIC = 2, 2, 4, 3, 3


@dataclass(frozen=True)
class Config:
    start: str = "fork"
    transfer: str = option_default("transfer")
    plan: str = "interleaved"
    source: str = "one"
    storage: str = "local"
    queues: str = "default"

    def invalid(self) -> Optional[str]:
        """Why the library refuses this combination (each refusal is tested on its own), or None."""
        if self.queues == "separated" and self.transfer == "merge":
            return "the merge transfer takes one prefetch queue depth"
        if self.plan == "streaming" and self.source != "one":
            return "a mix needs counts: samples_per_epoch cannot go with it"
        if self.plan == "bucketed" and self.source == "stratified_mix":
            return "stratified batches keep each stream's share: bucketing reorders them"
        return None

    def __str__(self) -> str:
        return " ".join(f"{k}={v}" for k, v in asdict(self).items())


def configurations() -> List[Config]:
    """Every valid combination."""
    every = (Config(*values) for values in itertools.product(*AXES.values()))
    return [c for c in every if c.invalid() is None]


def pairwise(candidates: Optional[Sequence[Config]] = None) -> List[Config]:
    """A few configurations covering every pair of values (of two axes) that some valid
    configuration has: greedily, the one covering most pairs not yet covered, in a fixed order."""
    candidates = list(candidates or configurations())
    pairs_of = {c: _pairs(c) for c in candidates}
    left = set().union(*pairs_of.values())
    chosen: List[Config] = []
    while left:
        best = max(candidates, key=lambda c: (len(pairs_of[c] & left), -candidates.index(c)))
        chosen.append(best)
        left -= pairs_of[best]
    return chosen


def _pairs(config: Config) -> set:
    items = list(asdict(config).items())
    return {(a, b) for a, b in itertools.combinations(items, 2)}


class Dataset:
    """A configuration's data: its source as the pipeline takes it, the reference samples (read
    with ``tarfile``), where each stream begins among them and each stream's draws per epoch."""

    def __init__(self, config: Config, root: str, server_url: Optional[str] = None):
        from dali_shards import Stream

        sizes = SIZES.get(config.plan, MANY)
        gz = config.plan == "compressed"
        small = (5,) if len(sizes) == 1 else (3, 0, 2)  # a mix's second stream: a few samples drawn many times
        parts = [sizes] if config.source == "one" else [sizes, small]
        folder = os.path.join(root, f"{config.plan}-{config.source}")
        self.paths: List[List[str]] = []
        first = 0
        for i, part in enumerate(parts):
            self.paths.append(contract.write_dataset(os.path.join(folder, f"s{i}"), part, first, gz))
            first += sum(part)
        self.reference = contract.read_tars([p for paths in self.paths for p in paths])
        self.shard_starts = list(itertools.accumulate([0, *(n for part in parts for n in part)]))[:-1]
        self.bounds = [0] + list(itertools.accumulate(sum(p) for p in parts))
        where = [os.path.join(folder, f"s{i}", "manifest.json") for i in range(len(parts))]
        if server_url is not None:
            where = [f"{server_url}/{os.path.relpath(w, root)}" for w in where]
        n = [b - a for a, b in zip(self.bounds, self.bounds[1:])]
        if config.source == "one":
            self.source: Any = where[0]
            self.counts = [n[0]]
        elif config.source == "random_mix":  # a stream drawn twice over, one 8.2 times
            self.source = [Stream(where[0], repeat=2), Stream(where[1], choose=8 * n[1] + 1)]
            self.counts = [2 * n[0], 8 * n[1] + 1]
        else:  # stratified, with repeats
            self.source = [Stream(where[0], choose=n[0] + 3), Stream(where[1], repeat=3)]
            self.counts = [n[0] + 3, 3 * n[1]]


def factory(config: Config, data: Dataset) -> Tuple[Any, List[str]]:
    """The configuration's ``@sharded_pipeline`` factory, and its outputs' names."""
    from dali_shards.testing.pipelines import identity_pipeline

    mix = config.source != "one"
    options: Dict[str, Any] = dict(batch_size=BATCH, py_num_workers=WORKERS, world_size=WORLD, shuffle=True, seed=3,
                                   transfer=config.transfer, py_start_method=config.start, shuffle_buffer=5)  # fmt: skip
    if config.source == "stratified_mix":
        options["batching"] = "stratified"
    if config.queues == "separated":
        options.update(prefetch_queue_depth={"cpu_size": 3, "gpu_size": 2}, exec_dynamic=False)
    if config.plan == "contiguous":
        options["shuffle_block"] = 0
    if config.plan == "streaming":
        options["samples_per_epoch"] = 40
    names = ["key", "dat", "cls", "index"] + (["stream"] if mix else [])
    fields = ["__key__", "dat", "cls", "__index__"] + (["__stream__"] if mix else [])
    if config.plan == "bucketed":  # a map (no keys in its outputs), bucketing windows by length
        def pick(s: Dict[str, Any]) -> Dict[str, Any]:
            return {"dat": s["dat"], "cls": s["cls"], "index": s["__index__"], **({"stream": s["__stream__"]} if mix else {})}

        names = names[1:]
        options.update(map=pick, bucket_by=lambda s: len(s["dat"]), bucket_window=8, outputs=" ".join(names))
    return identity_pipeline(data.source, fields, **options), names


def check(config: Config, root: str, server_url: Optional[str] = None) -> Dict[str, Any]:
    """Run the contract on ``config`` (an AssertionError says what broke); what it checked."""
    data = Dataset(config, root, server_url)
    make, names = factory(config, data)
    planned = config.plan != "streaming"
    mix = config.source != "one"
    runs, states, its = contract.run_world(make, names, WORLD, 2, mix, audit=planned, stop=STOP)
    if not planned:  # the streaming mode's __index__ is shard << 32 | position
        contract.canonical(runs, data.shard_starts)
    steps = [[len(d.steps) for d in rank] for rank in runs]
    assert all(s == steps[0] for s in steps), f"ranks' steps differ: {steps}"
    whole = []
    for epoch in range(2):
        got = [s for rank in runs for s in rank[epoch].samples]
        contract.check_samples(got, data.reference, data.bounds)
        drawn = Counter(s["index"] for s in got)
        whole.append(drawn)
        if planned:
            one = Counter(range(len(data.reference))) if not mix else None
            contract.check_draws(drawn, one, data.bounds, data.counts)
            audits = [it.audits[epoch] for it in its]
            assert all(a["exactly_once"] for a in audits), f"epoch {epoch}: the audit says {audits}"
    assert states[0] is not None and all(s == states[0] for s in states), "the ranks' states differ"
    rest = contract.rest_of_epoch(make, names, WORLD, states[0], mix, planned)
    for rank in range(WORLD):
        want = [[s["index"] for s in step] for step in runs[rank][0].steps[STOP:]]
        got_rest = [[s["index"] for s in step] for step in rest[rank].steps]
        assert got_rest == want if planned else len(got_rest) == len(want), f"rank {rank}: resumed {got_rest} != {want}"
    if planned:  # elastic: the first STOP steps on 2 ranks, the rest of the epoch on 3
        first = Counter(s["index"] for rank in runs for step in rank[0].steps[:STOP] for s in step)
        on_three = lambda **kw: make(**{**kw, "world_size": ELASTIC})  # noqa: E731
        again = contract.rest_of_epoch(on_three, names, ELASTIC, states[0], mix, True)
        after = [s for d in again for s in d.samples]
        contract.check_samples(after, data.reference, data.bounds)
        assert first + Counter(s["index"] for s in after) == whole[0], "elastic resume: not every draw once"
        assert len({len(d.steps) for d in again}) == 1, "elastic resume: ranks' steps differ"
    return {"steps": steps[0], "samples": [sum(w.values()) for w in whole]}


def run(configs: Iterable[Config], out=sys.stdout) -> List[Tuple[Config, Optional[str], float]]:
    """Check each configuration (a local HTTP server for ``storage=http``); a line each."""
    from dali_shards.testing.servers import HTTPShardServer

    results = []
    with tempfile.TemporaryDirectory(prefix="dali-shards-matrix-") as root, HTTPShardServer(root) as server:
        for config in configs:
            started = time.perf_counter()
            try:
                check(config, root, server.url if config.storage == "http" else None)
                error = None
            except Exception as exc:  # noqa: BLE001 - each configuration's failure is reported
                error = f"{type(exc).__name__}: {exc}"
            seconds = time.perf_counter() - started
            results.append((config, error, seconds))
            print(f"{'ok  ' if error is None else 'FAIL'} {seconds:5.1f} s  {config}" + (f"\n      {error}" if error else ""),
                  file=out, flush=True)  # fmt: skip
    return results


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dali_shards.testing.matrix", description=__doc__.split("\n\n")[0])
    ap.add_argument("--all", action="store_true", help="every valid combination (default: the pairwise set)")
    ap.add_argument("--only", nargs="*", default=[], metavar="AXIS=VALUE", help="only configurations with these values")
    args = ap.parse_args(argv)
    logging.getLogger("dali_shards").setLevel(logging.ERROR)  # what the configurations' data sets off, said once
    configs = configurations() if args.all else pairwise()
    for want in args.only:
        axis, _, value = want.partition("=")
        if axis not in AXES or value not in AXES[axis]:
            ap.error(f"--only {want!r}: axes and values are {AXES}")
        configs = [c for c in configs if getattr(c, axis) == value]
    print(f"{len(configs)} configuration(s)", flush=True)
    results = run(configs)
    failed = [c for c, e, _ in results if e is not None]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
