"""Benchmark shards made from the built-in photos: ImageNet-like JPEGs (about 500x375 px).

Each sample is a random crop of one of the 47 built-in photos, resized and re-encoded, so decode
cost and file sizes resemble ImageNet's. Output is cached by its parameters and deterministic.
"""

from __future__ import annotations

import io
import json
import os
import random
from typing import List

from dali_shards.sample_data import sample_images
from dali_shards.writer import ShardWriter


def build_bench_shards(
    out_dir: str,
    num_samples: int = 2048,
    samples_per_shard: int = 256,
    size: int = 500,
    quality: int = 95,
    seed: int = 0,
) -> List[str]:
    """Write (or reuse) ``num_samples`` JPEG+cls samples in shards under ``out_dir``."""
    from PIL import Image

    stamp = {
        "num_samples": num_samples,
        "samples_per_shard": samples_per_shard,
        "size": size,
        "quality": quality,
        "seed": seed,
        "version": 1,
    }
    stamp_path = os.path.join(out_dir, "bench-data.json")
    if os.path.exists(stamp_path):
        with open(stamp_path) as f:
            saved = json.load(f)
        if saved.get("stamp") == stamp:
            return saved["paths"]
    os.makedirs(out_dir, exist_ok=True)
    rng = random.Random(seed)
    images = sample_images()
    photos = [Image.open(img.path).convert("RGB") for img in images]
    with ShardWriter(os.path.join(out_dir, "bench-%06d.tar"), max_count=samples_per_shard) as writer:
        for i in range(num_samples):
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
            writer.write({"__key__": f"{i:08d}", "jpg": buf.getvalue(), "cls": images[k].label})
        paths = list(writer.paths)
    with open(stamp_path, "w") as f:
        json.dump({"stamp": stamp, "paths": paths}, f)
    return paths
