"""A model's training speed with no data loader: the ceiling a loader's training run is compared with.

The training step of ``examples/imagenet_tar_train.py`` (torchvision model, SGD, bf16 autocast and
channels-last on a GPU) on one fixed random batch that is already on the device; prints and writes
images/s as JSON.

    python benchmarks/train_ceiling.py --arch resnet50 --out benchmarks/results/gpu/train_ceiling.json
"""

from __future__ import annotations

import argparse
import json
import time


def main(argv=None) -> dict:
    import torch
    import torchvision

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="resnet50")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--steps", type=int, default=100, help="timed steps")
    ap.add_argument("--warmup", type=int, default=15, help="untimed steps first")
    ap.add_argument("--out", help="write the result here (JSON)")
    args = ap.parse_args(argv)
    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda" if on_gpu else "cpu")
    memory_format = torch.channels_last if on_gpu else torch.contiguous_format
    model = torchvision.models.get_model(args.arch, num_classes=1000).to(device, memory_format=memory_format)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    criterion = torch.nn.CrossEntropyLoss()
    size = (args.batch_size, 3, args.image_size, args.image_size)
    images = torch.randn(size, device=device).contiguous(memory_format=memory_format)
    labels = torch.randint(0, 1000, (args.batch_size,), device=device)

    def step():
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=on_gpu):
            loss = criterion(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    def sync():
        if on_gpu:
            torch.cuda.synchronize()

    for _ in range(args.warmup):
        step()
    sync()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync()
    rate = args.steps * args.batch_size / (time.perf_counter() - start)
    result = {"model": args.arch, "batch_size": args.batch_size, "amp": "bf16 autocast" if on_gpu else "none",
              "channels_last": on_gpu, "steps": args.steps, "warmup_steps": args.warmup, "images_per_s": rate,
              "device": torch.cuda.get_device_name() if on_gpu else "cpu"}  # fmt: skip
    print(f"{args.arch}, batch {args.batch_size}, no loader: {rate:,.0f} images/s", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
