"""Mixed (GPU) decoding on both transfers, through the PyTorch iterator: skipped without a GPU.

Each rank runs in a process of its own, as under torchrun: a GPU pipeline initialises CUDA in its
process, after which no pipeline there may start ``fork`` workers (the other tests of this run)."""

import json
import os
import subprocess
import sys

import pytest

GPU_DEVICES = os.environ.get("DALI_SHARDS_TEST_GPUS", "")  # set by tests/conftest.py: the run's GPUs
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not GPU_DEVICES, reason="needs an NVIDIA GPU")]


def run_rank(pattern: str, transfer: str, world: int, rank: int, epochs: int) -> dict:
    """One rank's epochs: the indices it receives, its steps, and what its image batches are."""
    import torch
    from nvidia.dali import fn, types

    from dali_shards import decode_image, sharded_pipeline
    from dali_shards.pytorch import DALIShardedIterator

    @sharded_pipeline(pattern, fields=("jpg", "__index__"), batch_size=8, py_num_workers=2, shuffle=True,
                      transfer=transfer, world_size=world, rank=rank, num_threads=2, device_id=0)  # fmt: skip
    def pipe(jpg, index):
        whole = decode_image(jpg)  # picks "mixed" on a GPU
        crop = fn.decoders.image_random_crop(jpg, device="mixed", output_type=types.RGB)
        crop = fn.crop_mirror_normalize(fn.resize(crop, size=(64, 64)), mirror=fn.random.coin_flip(),
                                        dtype=types.FLOAT16, output_layout="CHW")  # fmt: skip
        return crop, fn.shapes(whole), index

    loader = DALIShardedIterator(pipe(), ["images", "shapes", "index"])
    out: dict = {"indices": [], "steps": [], "shapes": {}, "devices": set(), "dtypes": set()}
    for _ in range(epochs):
        seen, steps = [], 0
        for (batch,) in loader:
            steps += 1
            images = batch["images"]
            out["devices"].add(str(images.device.type))
            out["dtypes"].add(str(images.dtype))
            assert images.shape[1:] == (3, 64, 64) and torch.isfinite(images.float()).all()
            for shape, i in zip(batch["shapes"].tolist(), batch["index"].view(-1).tolist()):
                seen.append(i)
                out["shapes"][i] = shape
        out["indices"].append(seen)
        out["steps"].append(steps)
    return {**out, "devices": sorted(out["devices"]), "dtypes": sorted(out["dtypes"])}


def ranks(pattern: str, transfer: str, world: int, epochs: int) -> list:
    results = []
    for rank in range(world):
        args = [sys.executable, __file__, pattern, transfer, str(world), str(rank), str(epochs)]
        env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
        if GPU_DEVICES != "all":
            env["CUDA_VISIBLE_DEVICES"] = GPU_DEVICES
        done = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return results


@pytest.mark.parametrize("world", [1, 2])
def test_mixed_decode_delivers_every_image_once_on_the_gpu(photo_shards, transfer, world):
    from PIL import Image

    from dali_shards.sample_data import sample_images

    results = ranks(photo_shards["pattern"], transfer, world, epochs=2)
    photos = sample_images()
    for epoch in range(2):
        got = sorted(i for r in results for i in r["indices"][epoch])
        assert got == list(range(photo_shards["total"])), f"epoch {epoch}: not every image exactly once"
        assert len({r["steps"][epoch] for r in results}) == 1, "unequal steps across ranks"
    for r in results:
        assert r["devices"] == ["cuda"] and r["dtypes"] == ["torch.float16"]
        for i, shape in r["shapes"].items():
            w, h = Image.open(photos[int(i) % len(photos)].path).size
            assert shape == [h, w, 3], f"image {i}: decoded as {shape}"


if __name__ == "__main__":
    result = run_rank(sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6]))
    print(json.dumps(result), flush=True)
