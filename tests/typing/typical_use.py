"""Typical use of dali_shards' public API, checked with ``mypy --strict`` (tests/integration/test_typing.py)."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping

import numpy as np
import torch
from nvidia.dali import fn

from dali_shards import ShardedOptions, ShardWriter, decode_image, sharded_pipeline
from dali_shards.pytorch import DALIShardedIterator


def write(folder: str) -> List[str]:
    with ShardWriter(f"{folder}/train-%04d.tar", max_count=100) as writer:
        writer.write({"__key__": "a", "jpg": b"...", "cls": 3, "json": {"boxes": [[0, 0, 1, 1]]}})
        writer.write({"__key__": "b", "jpg": b"...", "cls": 1, "npy": np.zeros((2, 4), np.float32)})
    counts: List[int] = writer.counts
    print(writer.manifest_path, counts)
    return writer.paths


def to_arrays(sample: Mapping[str, Any]) -> Dict[str, Any]:
    return {"jpg": sample["jpg"], "boxes": np.asarray(sample["json"]["boxes"], np.float32)}


@sharded_pipeline("train-{0000..0009}.tar", fields=("jpg", "json"), map=to_arrays, batch_size=8,
                  py_num_workers=2, shuffle=True, seed=1, last_batch="pad", transfer="ring", device_id=None,
                  num_threads=2, storage_options={"anon": True})  # fmt: skip
def detection(jpg: Any, boxes: Any, __key__: Any) -> Any:
    return fn.resize(decode_image(jpg), size=(64, 64)), boxes, __key__


def train() -> float:
    loader = DALIShardedIterator(detection(), ["images", "boxes", "keys"], ragged="list", audit=False)
    total = 0.0
    for (batch,) in loader:
        images: torch.Tensor = batch["images"]
        boxes: List[torch.Tensor] = batch["boxes"]
        keys: List[str] = batch["keys"]
        total += float(images.float().mean()) + len(boxes) + len(keys)
    state: Dict[str, Any] = loader.state_dict()
    loader.load_state_dict(state)
    print(len(loader), loader.epoch, loader.step, ShardedOptions)
    return total
