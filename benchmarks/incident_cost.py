"""What a sample a DALI operator fails on costs under ``on_error="skip"``: per incident, finding the
sample and rebuilding the pipeline from the state at that step; and an epoch's time with 0, 1 and
more bad samples (each incident costs the same: the run stays linear in the bad samples). Two
kinds: ``zero``, JPEGs whose frame header says 0x0 pixels (DALI's CPU decoder names the sample),
and ``python``, a ``fn.python_function`` that raises on the bad samples (DALI does not name them:
the step's samples are re-run through the pipeline, ``pipeline/probe.py``).

    python benchmarks/incident_cost.py --samples 2048 --bad 0,1,8 --batch-size 64
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def write(folder: str, samples: int, bad: set, kind: str, per_shard: int = 256):
    from PIL import Image

    from dali_shards.sample_data import sample_images
    from dali_shards.testing.tars import with_jpeg_frame
    from dali_shards.testing.shards import write_shards

    photos = []
    for img in sample_images():
        buf = io.BytesIO()
        Image.open(img.path).convert("RGB").resize((160, 120)).save(buf, "JPEG", quality=85)
        photos.append(buf.getvalue())

    def sample(index, shard, position):
        jpg = photos[index % len(photos)]
        broken = index in bad and kind == "zero"
        return {
            "__key__": f"{index:08d}",
            "jpg": with_jpeg_frame(jpg, 0, 0) if broken else jpg,
            "cls": str(-index if index in bad else index),
        }

    sizes = [per_shard] * (samples // per_shard) + ([samples % per_shard] if samples % per_shard else [])
    return write_shards(folder, sizes, sample)


def _refuse_negative(cls):
    if int(cls) < 0:
        raise ValueError(f"label {int(cls)}")
    return cls


def run(paths, args) -> dict:
    from nvidia.dali import fn, types

    from dali_shards import sharded_pipeline
    from dali_shards.pytorch import DALIShardedIterator

    @sharded_pipeline(paths, fields=("jpg", "cls"), batch_size=args.batch_size, py_num_workers=args.workers,
                      on_error="skip", num_threads=2, device_id=None)  # fmt: skip
    def pipe(jpg, cls):
        images = fn.resize(fn.decoders.image(jpg, device="cpu", output_type=types.RGB), size=(64, 64))
        return images, fn.python_function(cls, function=_refuse_negative, num_outputs=1)

    start = time.perf_counter()
    it = DALIShardedIterator(pipe(), ["image", "cls"])
    delivered = sum(len(b[0]["cls"]) for b in it)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "delivered": delivered, "incidents": it.incidents}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=2048)
    ap.add_argument("--bad", default="0,1,8", help="bad samples per run (comma-separated)")
    ap.add_argument("--kinds", default="zero,python")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "incident_cost.json"))
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.kinds.split(","):
            for k in [int(b) for b in args.bad.split(",")]:
                bad = (
                    set(range(args.samples // (2 * k + 1), args.samples, max(1, args.samples // k))[:k]) if k else set()
                )
                folder = os.path.join(tmp, f"{kind}-{k}")
                os.makedirs(folder)
                got = run(write(folder, args.samples, bad, kind), args)
                assert got["delivered"] == args.samples - k, got["delivered"]
                inc = got["incidents"]
                row = {"kind": kind, "bad": k, "epoch_s": got["seconds"], "incidents": len(inc),
                       "find_s": statistics.median([i["find_s"] for i in inc]) if inc else 0.0,
                       "rebuild_s": statistics.median([i["rebuild_s"] for i in inc]) if inc else 0.0}  # fmt: skip
                rows.append(row)
                print(f"{kind:5} {k:3} bad: epoch {row['epoch_s']:6.2f} s, {row['incidents']} incidents, median find "
                      f"{row['find_s']:.3f} s + rebuild {row['rebuild_s']:.3f} s", flush=True)  # fmt: skip
    clean = {r["kind"]: r["epoch_s"] for r in rows if r["bad"] == 0}
    print("\n| image | bad samples | epoch, s | extra per incident, s | find, s (median) | rebuild, s (median) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        extra = (r["epoch_s"] - clean.get(r["kind"], r["epoch_s"])) / r["bad"] if r["bad"] else 0.0
        r["extra_per_incident_s"] = extra
        print(
            f"| {r['kind']} | {r['bad']} | {r['epoch_s']:.2f} | {extra:.2f} | {r['find_s']:.3f} | {r['rebuild_s']:.3f} |"
        )
    report = {"config": vars(args), "machine": {"cpus": os.cpu_count(), "platform": platform.platform()}, "rows": rows}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
