"""The built-in default dataset: 47 real CC0 photos filed under ImageNet-1k class ids.

The photos come from DALI_extra's test data (``db/single/jpeg``, originally from pixabay.com
under the CC0 license), downsized to at most 320 px. They let the quickstart, the examples and the
tests run on real JPEGs without any download.
"""

from __future__ import annotations

import os
from typing import List, NamedTuple, Sequence

from dali_shards.tools.writer import write_shard

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "imagenet")
DEFAULT_SHARD_SIZES = (11, 0, 17, 3, 16)


class SampleImage(NamedTuple):
    label: int
    path: str


def sample_images(root: str = ROOT) -> List[SampleImage]:
    """The photos as (ImageNet class id, path), sorted by class id then file name; ``root`` is a
    folder of the same layout (one folder per class id), the built-in photos by default."""
    out = []
    for cls in sorted(os.listdir(root), key=int):
        folder = os.path.join(root, cls)
        for name in sorted(os.listdir(folder)):
            if name.lower().endswith(".jpg"):
                out.append(SampleImage(int(cls), os.path.join(folder, name)))
    return out


def write_sample_shards(
    out_dir: str, shard_sizes: Sequence[int] = DEFAULT_SHARD_SIZES, prefix: str = "sample"
) -> List[str]:
    """Write the photos into shards of the given sizes (``<key>.jpg`` + ``<key>.cls``).

    Sample ``i`` (its ``__index__``) is photo ``i % 47`` with key ``f"{i:06d}"``; sizes summing to
    more than 47 reuse photos under new keys. Returns the shard paths.
    """
    images = sample_images()
    data = [open(img.path, "rb").read() for img in images]
    paths = []
    index = 0
    for n, size in enumerate(shard_sizes):
        path = os.path.join(out_dir, f"{prefix}-{n:06d}.tar")
        samples = []
        for _ in range(size):
            img = index % len(images)
            samples.append({"__key__": f"{index:06d}", "jpg": data[img], "cls": images[img].label})
            index += 1
        write_shard(path, samples)
        paths.append(path)
    return paths
