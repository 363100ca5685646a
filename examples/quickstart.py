"""dali_shards quickstart: shard the built-in photos, stream them over simulated ranks, check.

Writes the 47 built-in CC0 photos (ImageNet class ids as labels) into tar shards of uneven sizes,
one of them empty, then runs a few epochs of a decoding pipeline on every simulated rank (each
with its own Python workers, as separate DDP processes would) and prints steps per rank,
images/s, and whether every sample was seen exactly once per epoch over all ranks.

    python examples/quickstart.py [--data 'shards/train-{000000..000009}.tar'] [--world-size 2] ...

Images are decoded on the GPU when there is one, on the CPU otherwise.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter

import numpy as np
from nvidia.dali import fn, types

from dali_shards import decode_image, pipeline_info, sharded_pipeline
from dali_shards.sample_data import DEFAULT_SHARD_SIZES, write_sample_shards


def make_pipeline(source, args):
    @sharded_pipeline(
        source,
        fields=("jpg", "cls", "__index__", "__valid__"),
        batch_size=args.batch_size,
        py_num_workers=args.workers,
        shuffle=True,
        seed=args.seed,
        world_size=args.world_size,
        num_threads=args.threads,
    )
    def train(jpg, cls, index, valid):
        images = decode_image(jpg, output_type=types.RGB)
        images = fn.random_resized_crop(images, size=(args.size, args.size))
        images = fn.flip(images, horizontal=fn.random.coin_flip())
        return images, cls, index, valid

    return train


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--data", help="shards (pattern, list file or manifest); default: the built-in photos")
    ap.add_argument("--world-size", type=int, default=2, help="simulated ranks")
    ap.add_argument("--workers", type=int, default=2, help="Python workers per rank (py_num_workers)")
    ap.add_argument("--batch-size", type=int, default=8, help="per rank; a multiple of --workers")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--size", type=int, default=160, help="crop size")
    ap.add_argument("--threads", type=int, default=2, help="DALI threads per pipeline")
    ap.add_argument("--seed", type=int, default=42)
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="dali-shards-quickstart-") as tmp:
        if args.data:
            source = args.data
        else:
            source = write_sample_shards(tmp, shard_sizes=DEFAULT_SHARD_SIZES)
            print(
                f"wrote {sum(DEFAULT_SHARD_SIZES)} real photos into {len(source)} shards "
                f"of sizes {DEFAULT_SHARD_SIZES} under {tmp}"
            )
        train = make_pipeline(source, args)
        pipes = [train(rank=r) for r in range(args.world_size)]
        info = pipeline_info(pipes[0])
        spec = info.spec
        print(
            f"{spec.num_samples} samples, {args.world_size} ranks x {args.workers} workers = "
            f"{spec.num_virtual_workers} virtual workers, batch {args.batch_size} per rank, "
            f"{spec.steps_per_epoch} steps per epoch, {spec.padding_per_epoch} padding slots per epoch"
        )
        for pipe in pipes:
            pipe.build()

        print(f"{'epoch':>5} {'rank':>4} {'steps':>5} {'images':>6} {'padding':>7} {'images/s':>9}")
        ok = True
        for epoch in range(args.epochs):
            seen = Counter()
            steps = []
            for rank, pipe in enumerate(pipes):
                count = padding = step = 0
                start = time.perf_counter()
                while True:
                    try:
                        images, labels, index, valid = pipe.run()
                    except StopIteration:
                        break
                    mask = np.array([bool(np.array(v)) for v in valid])
                    idx = np.array([int(np.array(i)) for i in index])
                    seen.update(idx[mask].tolist())
                    count += int(mask.sum())
                    padding += int((~mask).sum())
                    step += 1
                elapsed = time.perf_counter() - start
                pipe.reset()
                steps.append(step)
                print(f"{epoch:>5} {rank:>4} {step:>5} {count:>6} {padding:>7} {count / elapsed:>9.0f}")
            duplicates = sum(c - 1 for c in seen.values() if c > 1)
            missing = spec.num_samples - len(seen)
            equal = len(set(steps)) == 1
            good = duplicates == 0 and missing == 0 and equal
            ok &= good
            print(
                f"epoch {epoch}: {len(seen)}/{spec.num_samples} samples seen, {duplicates} duplicates, "
                f"{missing} missing, steps per rank {steps} -> {'exactly once' if good else 'FAILED'}"
            )
    print("exactly-once check: " + ("passed" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
