"""Benchmark shards made from the built-in photos.

Each sample is a random crop of one of the 47 built-in photos, resized and re-encoded as JPEG, with
its class (``.cls``, text), its id (``.id``: the sample's number as 8 little-endian int64 bytes,
which every loader can return as a tensor, for the exactly-once audits) and a few made-up object
boxes (``.json``: ``{"objects": [{"box": [x0, y0, x1, y1], "label": n}, ...]}``, for the ``map``
benchmark). Output is deterministic and cached by its parameters.

The built-in photos are downsized (up to 640 px); ``DALI_SHARDS_BENCH_PHOTOS`` names a folder of the
same layout with full-size photos (one folder per ImageNet class id), whose crops re-encode to
ImageNet's typical ~110 KB at 500x375 (the GPU benchmark uses the originals of the built-in photos).
"""

from __future__ import annotations

import io
import json
import os
import random
from typing import List, Optional, Sequence

import numpy as np

from dali_shards.sample_data import sample_images
from dali_shards.tools.writer import TarShardFile

VERSION = 3


def _encoded_photos(count: int, size: int, quality: int, seed: int):
    from PIL import Image

    rng = random.Random(seed)
    images = sample_images(*_photos_root())
    photos = [Image.open(img.path).convert("RGB") for img in images]
    for _ in range(count):
        k = rng.randrange(len(images))
        im = photos[k]
        w, h = im.size
        cw, ch = int(w * rng.uniform(0.6, 1.0)), int(h * rng.uniform(0.6, 1.0))
        x, y = rng.randrange(w - cw + 1), rng.randrange(h - ch + 1)
        crop = im.crop((x, y, x + cw, y + ch))
        scale = size / max(cw, ch)
        crop = crop.resize((max(1, round(cw * scale)), max(1, round(ch * scale))), Image.BICUBIC)
        if rng.random() < 0.5:
            crop = crop.transpose(Image.FLIP_LEFT_RIGHT)
        buf = io.BytesIO()
        crop.save(buf, "JPEG", quality=quality)
        yield buf.getvalue(), images[k].label


def _photos_root() -> List[str]:
    root = os.environ.get("DALI_SHARDS_BENCH_PHOTOS")
    return [os.path.abspath(root)] if root else []


def _boxes(index: int, label: int) -> str:
    """0 to 3 made-up object boxes (relative ltrb) of the sample's class, as JSON."""
    rng = random.Random(index)
    boxes = []
    for _ in range(index % 4):
        x0, y0 = rng.uniform(0, 0.6), rng.uniform(0, 0.6)
        boxes.append({"box": [round(x0, 4), round(y0, 4), round(x0 + rng.uniform(0.1, 0.4), 4),
                              round(y0 + rng.uniform(0.1, 0.4), 4)], "label": int(label)})  # fmt: skip
    return json.dumps({"objects": boxes})


def build_shards(
    out_dir: str, shard_sizes: Sequence[int], size: int = 500, quality: int = 95, seed: int = 0, prefix: str = "bench"
) -> List[str]:
    """Write (or reuse) shards of the given sizes; sample ``i`` has id ``i``."""
    stamp = {"shard_sizes": list(shard_sizes), "size": size, "quality": quality, "seed": seed, "version": VERSION,
             "photos": _photos_root()}  # fmt: skip
    stamp_path = os.path.join(out_dir, f"{prefix}-data.json")
    if os.path.exists(stamp_path):
        with open(stamp_path) as f:
            saved = json.load(f)
        if saved.get("stamp") == stamp and all(os.path.exists(p) for p in saved["paths"]):
            return saved["paths"]
    os.makedirs(out_dir, exist_ok=True)
    photos = _encoded_photos(sum(shard_sizes), size, quality, seed)
    paths = []
    index = 0
    for n, count in enumerate(shard_sizes):
        path = os.path.join(out_dir, f"{prefix}-{n:06d}.tar")
        with TarShardFile(path) as shard:
            for _ in range(count):
                jpg, label = next(photos)
                shard.add({"__key__": f"{index:08d}", "jpg": jpg, "cls": label, "id": np.int64(index).tobytes(),
                           "json": _boxes(index, label)})  # fmt: skip
                index += 1
        paths.append(path)
    with open(stamp_path, "w") as f:
        json.dump({"stamp": stamp, "paths": paths}, f)
    return paths


def build_bench_shards(
    out_dir: str,
    num_samples: int = 8192,
    samples_per_shard: int = 512,
    size: int = 500,
    quality: int = 95,
    seed: int = 0,
) -> List[str]:
    """Equal shards of ImageNet-like JPEGs (about 500x375 px)."""
    full, rest = divmod(num_samples, samples_per_shard)
    return build_shards(out_dir, [samples_per_shard] * full + ([rest] if rest else []), size, quality, seed)


AUDIT_SHARD_SIZES = (0, 37, 250, 3, 120, 511, 64, 1, 200, 90, 33)


def build_audit_shards(out_dir: str, shard_sizes: Optional[Sequence[int]] = None) -> List[str]:
    """Uneven shards (one empty) of small JPEGs, for the exactly-once audits."""
    return build_shards(out_dir, shard_sizes or AUDIT_SHARD_SIZES, size=96, quality=90, seed=1, prefix="audit")
