"""Weighted mixing of datasets: three streams with exact per-epoch proportions, measured.

The built-in photos are written as three datasets of different sizes (one "curated" set drawn
twice per epoch, one "web" set sharing what is left of the epoch with a "held-in" set in
proportion 3:1). Each epoch prints how many samples each stream delivered (``__stream__``) against
the counts planned, and checks that the draws of a stream walk it pass after pass: after any
epoch, no sample of a stream has been drawn twice more than another. With ``--batching
stratified`` it also prints how far a batch's count of a stream strayed from its share.

    python examples/mixture.py --epochs 3 [--batching stratified]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dali_shards import Stream, sharded_pipeline  # noqa: E402
from dali_shards.pytorch import DALIShardedIterator  # noqa: E402
from dali_shards.sample_data import write_sample_shards  # noqa: E402


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--epoch-size", type=int, default=120)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batching", default="random", choices=("random", "stratified"))
    return ap.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dali-shards-mixture-") as root:  # removed however the run ends
        run(args, root)


def run(args, root: str) -> None:
    curated = write_sample_shards(os.path.join(root, "curated"), shard_sizes=(6, 6))
    web = write_sample_shards(os.path.join(root, "web"), shard_sizes=(10, 10, 9, 8))
    held_in = write_sample_shards(os.path.join(root, "held-in"), shard_sizes=(5,))
    streams_of = [Stream(curated, repeat=2), Stream(web, proportion=3), Stream(held_in, proportion=1)]
    bounds = [(0, 12), (12, 49), (49, 54)]  # each stream's __index__ values: its shards one after the other

    @sharded_pipeline(streams_of, fields=("__stream__", "__index__"), epoch_size=args.epoch_size, batching=args.batching,
                      batch_size=args.batch_size, py_num_workers=args.workers, shuffle=True, seed=7,
                      device_id=None, num_threads=1)  # fmt: skip
    def mix(stream, index):
        return stream, index

    pipe = mix()
    planned = pipe.dali_shards.mixture.counts
    share = [c / sum(planned) for c in planned]
    print(f"streams: curated (12 samples, repeat=2), web (37, proportion 3), held-in (5, proportion 1); "
          f"epoch_size {args.epoch_size}; planned per epoch {list(planned)}")  # fmt: skip
    loader = DALIShardedIterator(pipe, ["stream", "index"])
    drawn: Counter = Counter()  # per sample (__index__), its draws so far
    for epoch in range(args.epochs):
        got: Counter = Counter()
        stray = 0.0  # the largest gap between a batch's count of a stream and its share
        for (batch,) in loader:
            streams = batch["stream"].reshape(-1).tolist()
            got.update(streams)
            drawn.update(batch["index"].reshape(-1).tolist())
            stray = max([stray] + [abs(streams.count(i) - len(streams) * s) for i, s in enumerate(share)])
        measured = [got[i] for i in range(len(streams_of))]
        shares = ", ".join(f"{m / args.epoch_size:.3f}" for m in measured)
        strayed = f"; a batch's count at most {stray:.2f} from its share" if args.batching == "stratified" else ""
        print(f"epoch {epoch}: delivered per stream {measured} (shares {shares}); planned {list(planned)}{strayed}")
        assert measured == list(planned), "every stream's count is exact"
        for i, (a, b) in enumerate(bounds):
            times = [drawn[x] for x in range(a, b)]
            assert max(times) - min(times) <= 1, f"stream {i} walks its samples pass after pass"
        assert args.batching != "stratified" or stray <= 1, "every batch holds each stream's share, within one"
    print("exact per-epoch proportions, pass after pass: passed")


if __name__ == "__main__":
    main()
