"""Train torchvision's Faster R-CNN (MobileNetV3, 320 px) on detection shards (<key>.jpg + <key>.json), fed by dali_shards.

The built-in photos are written into shards with a ``.json`` of boxes and labels per image. The photos
carry no real annotations: each gets 0 to 3 boxes drawn from its key (a stand-in for a real dataset's
annotations; images without boxes included), labelled with its photo's class. A ``map`` turns the JSON
into arrays in the dali_shards workers; DALI crops images and boxes together (``random_bbox_crop``),
decodes the crop (on the GPU when there is one), resizes and flips images and boxes. The iterator
delivers the images as one tensor, and the boxes, labels and keys, whose number differs per image, as
lists: they go into the model as they come.

    python examples/detection_train.py                          # a few steps on the CPU
    python examples/detection_train.py --data 'det-{0000..0099}.tar' --num-classes 91 --epochs 20

Printed per epoch: the loss, images/s and the fraction of time spent waiting for data; a JSON line
each in ``--out-dir`` (default ``runs/detection_train/train_log.jsonl``).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import zlib

import numpy as np
import torch
from nvidia.dali import fn, types
from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn

from dali_shards import ShardWriter, pipeline_has_gpu, sharded_pipeline
from dali_shards.pytorch import DALIShardedIterator
from dali_shards.sample_data import sample_images
from dali_shards.device import default_device_id


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--data", help="detection shards (<key>.jpg + <key>.json with 'objects': [{'box', 'label'}]); "
                    "default: the built-in photos with boxes drawn for them")  # fmt: skip
    ap.add_argument("--num-classes", type=int, default=None, help="classes, background included (default: built-in 20)")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--steps-per-epoch", type=int, default=None, help="stop each epoch early (default: 4 on the CPU)")
    ap.add_argument("--batch-size", type=int, default=None, help="default 32 on GPU, 4 on CPU")
    ap.add_argument("--image-size", type=int, default=320)
    ap.add_argument("--workers", type=int, default=2, help="dali_shards Python workers")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-dir", default=os.path.join("runs", "detection_train"), help="default %(default)s")
    return ap.parse_args(argv)


def write_detection_shards(folder: str) -> str:
    """The built-in photos with 0-3 boxes each (normalized x0, y0, x1, y1) and their class (1-19) as
    labels, in shards of 16; the manifest's path."""
    photos = sample_images()
    classes = {c: i + 1 for i, c in enumerate(sorted({p.label for p in photos}))}  # 0 is the background
    with ShardWriter(os.path.join(folder, "det-%04d.tar"), max_count=16) as writer:
        for photo in photos:
            key = os.path.splitext(os.path.basename(photo.path))[0]
            rng = np.random.default_rng(zlib.crc32(key.encode()))
            corners = rng.uniform(0.0, 0.6, size=(len(key) % 4, 2))
            boxes = np.concatenate([corners, corners + rng.uniform(0.2, 0.4, size=corners.shape)], axis=1)
            objects = [{"box": box.round(4).tolist(), "label": classes[photo.label]} for box in boxes]
            with open(photo.path, "rb") as f:
                writer.write({"__key__": key, "jpg": f.read(), "json": {"objects": objects}})
    return writer.manifest_path


def to_arrays(sample):
    """In the workers: the sample's JSON as arrays of boxes (n, 4) and labels (n,), n >= 0."""
    objects = sample["json"]["objects"]
    return {
        "jpg": sample["jpg"],
        "boxes": np.array([o["box"] for o in objects], np.float32).reshape(-1, 4),
        "labels": np.array([o["label"] for o in objects], np.int32),
    }


def make_loader(args, source: str, device_id) -> DALIShardedIterator:
    size = args.image_size

    @sharded_pipeline(source, fields=("jpg", "json"), map=to_arrays, batch_size=args.batch_size,
                      py_num_workers=args.workers, shuffle=True, seed=args.seed, device_id=device_id, num_threads=2)  # fmt: skip
    def detection(jpg, boxes, labels, __key__):
        anchor, shape, boxes, labels = fn.random_bbox_crop(
            boxes, labels, bbox_layout="xyXY", aspect_ratio=[0.5, 2.0], thresholds=[0.1, 0.3, 0.5],
            scaling=[0.3, 1.0], allow_no_crop=True, num_attempts=10,
        )  # fmt: skip
        device = "mixed" if pipeline_has_gpu() else "cpu"
        images = fn.decoders.image_slice(jpg, anchor, shape, device=device, output_type=types.RGB)
        images = fn.resize(images, size=(size, size))
        flip = fn.random.coin_flip()
        images = fn.crop_mirror_normalize(images, mirror=flip, std=255.0, dtype=types.FLOAT, output_layout="CHW")
        boxes = fn.bb_flip(boxes, ltrb=True, horizontal=flip) * float(size)  # in pixels, as torchvision takes them
        return images, boxes, labels, __key__

    # boxes and labels differ in number per image: lists in every batch, even one where they happen not to
    return DALIShardedIterator(detection(), ["images", "boxes", "labels", "keys"], ragged_outputs=["boxes", "labels"])


def train_epoch(model, optimizer, loader, device, steps: int) -> dict:
    """One epoch (``steps`` batches): the mean loss, images/s, the data-wait fraction and what the
    batches held."""
    model.train()
    loss_sum, images, boxes, empty, wait = 0.0, 0, 0, 0, 0.0
    start = time.perf_counter()
    batches = iter(loader)
    for _ in range(steps):
        t0 = time.perf_counter()
        (batch,) = next(batches)
        wait += time.perf_counter() - t0
        inputs = list(batch["images"].to(device, non_blocking=True))
        targets = [{"boxes": b.to(device), "labels": lab.to(device).long()} for b, lab in zip(batch["boxes"], batch["labels"])]  # fmt: skip
        loss = sum(model(inputs, targets).values())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss_sum += loss.item() * len(inputs)
        images += len(inputs)
        boxes += sum(len(b) for b in batch["boxes"])
        empty += sum(len(b) == 0 for b in batch["boxes"])
    if steps < len(loader):
        loader.reset()
    elapsed = time.perf_counter() - start
    return {"loss": loss_sum / max(1, images), "images": images, "images_per_s": images / elapsed,
            "data_wait_fraction": wait / elapsed, "boxes": boxes, "images_without_boxes": empty,
            "example_key": batch["keys"][0]}  # fmt: skip


def main(argv=None) -> dict:
    args = parse_args(argv)
    device_id = default_device_id()
    on_gpu = device_id is not None
    args.batch_size = args.batch_size or (32 if on_gpu else 4)
    tmp = None
    if args.data is None:
        tmp = tempfile.TemporaryDirectory(prefix="dali-shards-detection-")
        args.data = write_detection_shards(tmp.name)
        args.num_classes = args.num_classes or 20
        args.steps_per_epoch = args.steps_per_epoch or (None if on_gpu else 4)
    loader = make_loader(args, args.data, device_id)  # workers start before CUDA is touched
    device = torch.device("cuda", device_id) if on_gpu else torch.device("cpu")
    torch.manual_seed(args.seed)
    model = fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None, num_classes=args.num_classes or 91)
    model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    steps = min(len(loader), args.steps_per_epoch or len(loader))
    os.makedirs(args.out_dir, exist_ok=True)
    result: dict = {}
    with open(os.path.join(args.out_dir, "train_log.jsonl"), "a") as log:
        for epoch in range(args.epochs):
            result = {"epoch": epoch, "steps": steps, **train_epoch(model, optimizer, loader, device, steps)}
            log.write(json.dumps(result) + "\n")
            print(
                f"epoch {epoch}: loss {result['loss']:.3f}, {result['images_per_s']:.1f} images/s, "
                f"waiting for data {result['data_wait_fraction']:.1%} of the time; {result['images']} images, "
                f"{result['boxes']} boxes ({result['images_without_boxes']} images without any), "
                f"e.g. key {result['example_key']!r}"
            )
    if tmp is not None:
        tmp.cleanup()
    return result


if __name__ == "__main__":
    main()
