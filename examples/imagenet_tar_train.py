"""Train a torchvision ResNet on WebDataset-style ImageNet shards (<key>.jpg + <key>.cls), fed by dali_shards.

One process per GPU under torchrun (DDP over NCCL; gloo on CPU), mixed-precision and channels_last on
GPU. The training pipeline decodes on the GPU (a random crop is decoded straight from the JPEG), flips
and normalizes; validation resizes and center-crops, unshuffled, with last_batch="pad" so that top-1
counts every validation image exactly once (padding is removed by the iterator).

    torchrun --nproc_per_node 8 examples/imagenet_tar_train.py --arch resnet50 --epochs 90 \\
        --data '/data/imagenet/train-{000000..001281}.tar' --val-data '/data/imagenet/val-{000000..000049}.tar'

    python examples/imagenet_tar_train.py     # built-in photos: a small model, a few steps, on the CPU

Shards can be made with `dali-shards write IMAGENET/train out/train-%06d.tar --shuffle`; a manifest
beside them (from `dali-shards write` or `dali-shards index`) saves the start-up scan. With
`--checkpoint DIR` each epoch saves the model, the optimizer and the data loader's state;
`--resume DIR` continues from there (on the same or another number of GPUs). The per-epoch JSON log
goes to `--out-dir` (default `runs/imagenet_tar_train/train_log.jsonl`). The fields read are
"jpg;jpeg;png": the first of these members a sample has (ImageNet's own files are `.JPEG`;
`dali-shards write` stores them as `.jpg`, other tools may keep `.jpeg`).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import torch
import torch.distributed as dist
import torchvision
from nvidia.dali import fn, types
from tqdm import tqdm

from dali_shards import pipeline_has_gpu, pipeline_info, sharded_pipeline
from dali_shards.world import resolve_world
from dali_shards.device import default_device_id
from dali_shards.pytorch import DALIShardedIterator
from dali_shards.sample_data import write_sample_shards

MEAN = [0.485 * 255, 0.456 * 255, 0.406 * 255]
STD = [0.229 * 255, 0.224 * 255, 0.225 * 255]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument(
        "--data",
        help="training shards (pattern, list or manifest; local, s3://, gs:// or https://); default: the built-in photos",
    )
    ap.add_argument("--val-data", help="validation shards; default: the training shards when --data is not given")
    ap.add_argument("--arch", default="resnet18", help="a torchvision.models classification model (default resnet18)")
    ap.add_argument("--num-classes", type=int, default=1000)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=None, help="per process (default 256 on GPU, 8 on CPU)")
    ap.add_argument("--workers", type=int, default=2, help="dali_shards Python workers per process")
    ap.add_argument("--threads", type=int, default=4, help="DALI threads per pipeline")
    ap.add_argument("--lr", type=float, default=None, help="peak learning rate (default 0.1 x global batch / 256)")
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=1e-4)
    ap.add_argument("--image-size", type=int, default=None, help="training crop (default 224 on GPU, 64 on CPU)")
    ap.add_argument("--steps-per-epoch", type=int, default=None, help="stop each epoch early (smoke runs)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-dir", default=os.path.join("runs", "imagenet_tar_train"), help="where logs go (default %(default)s)")
    ap.add_argument("--log-json", help="JSON lines log, one line per epoch (rank 0; default OUT_DIR/train_log.jsonl)")
    ap.add_argument("--checkpoint", help="directory to save the model, optimizer and data loader state in, each epoch")
    ap.add_argument("--resume", help="a --checkpoint directory to continue from (the data loader included)")
    ap.add_argument(
        "--storage-options", help='fsspec options for remote shards, JSON (e.g. \'{"endpoint_url": "..."}\')'
    )
    ap.add_argument("--cache-dir", help="keep remote shards on local disk after their first epoch")
    return ap.parse_args(argv)


def build_pipelines(args, train_source, val_source, device_id, resume_from=None):
    """Train and validation pipelines; building them starts their workers (before CUDA is touched)."""
    size = args.image_size
    common = dict(
        batch_size=args.batch_size,
        py_num_workers=args.workers,
        seed=args.seed,
        device_id=device_id,
        num_threads=args.threads,
        storage_options=json.loads(args.storage_options) if args.storage_options else None,
        cache_dir=args.cache_dir,
    )

    @sharded_pipeline(train_source, fields=("jpg;jpeg;png", "cls"), shuffle=True, **common)
    def train(jpg, cls):
        device = "mixed" if pipeline_has_gpu() else "cpu"
        images = fn.decoders.image_random_crop(
            jpg, device=device, output_type=types.RGB, random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3]
        )
        images = fn.resize(images, size=(size, size))
        images = fn.crop_mirror_normalize(
            images, mirror=fn.random.coin_flip(), mean=MEAN, std=STD, dtype=types.FLOAT, output_layout="CHW"
        )
        return images, cls

    @sharded_pipeline(val_source, fields=("jpg;jpeg;png", "cls"), shuffle=False, last_batch="pad", **common)
    def val(jpg, cls):
        device = "mixed" if pipeline_has_gpu() else "cpu"
        images = fn.decoders.image(jpg, device=device, output_type=types.RGB)
        images = fn.resize(images, resize_shorter=int(size * 256 / 224))
        images = fn.crop_mirror_normalize(
            images, crop=(size, size), mean=MEAN, std=STD, dtype=types.FLOAT, output_layout="CHW"
        )
        return images, cls

    train_pipe, val_pipe = train(resume_from=resume_from), val()
    train_pipe.build()
    val_pipe.build()
    return train_pipe, val_pipe


def main(argv=None) -> dict:
    args = parse_args(argv)
    world_size, rank = resolve_world()
    device_id = default_device_id()
    on_gpu = device_id is not None
    args.batch_size = args.batch_size or (256 if on_gpu else 8)
    args.image_size = args.image_size or (224 if on_gpu else 64)
    args.lr = args.lr or 0.1 * args.batch_size * world_size / 256
    tmp = None
    if args.data is None:  # the built-in photos, written into shards on every rank
        tmp = tempfile.TemporaryDirectory(prefix="dali-shards-train-")
        args.data = write_sample_shards(tmp.name, shard_sizes=(11, 0, 17, 3, 16), prefix="train")  # same names on every rank
        args.val_data = args.val_data or args.data
    if args.val_data is None:
        raise SystemExit("--val-data is required with --data")

    # 1. Data first: DALI's fork-started workers cannot start once CUDA is initialised. A resumed run
    #    reads the loader's state (plain JSON) now, and the model's tensors only after.
    loader_state = None
    if args.resume:
        with open(os.path.join(args.resume, "loader.json")) as f:
            loader_state = json.load(f)
    train_pipe, val_pipe = build_pipelines(args, args.data, args.val_data, device_id, loader_state)
    names = ["images", "labels"]
    train_loader = DALIShardedIterator(train_pipe, names)
    val_loader = DALIShardedIterator(val_pipe, names)

    # 2. Then the process group, the model and the GPU.
    if world_size > 1:
        dist.init_process_group("nccl" if on_gpu else "gloo")
    device = torch.device("cuda", device_id) if on_gpu else torch.device("cpu")
    torch.manual_seed(args.seed)
    model = torchvision.models.get_model(args.arch, num_classes=args.num_classes)
    memory_format = torch.channels_last if on_gpu else torch.contiguous_format
    model = model.to(device, memory_format=memory_format)
    if world_size > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device_id] if on_gpu else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    steps = min(len(train_loader), args.steps_per_epoch or len(train_loader))
    criterion = torch.nn.CrossEntropyLoss()
    if args.resume:
        saved = torch.load(os.path.join(args.resume, "model.pt"), map_location=device)
        (model.module if world_size > 1 else model).load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
    # The learning-rate schedule spans --epochs; a resumed run joins it where the loader's epoch starts
    # (so a run can be resumed with more --epochs than it was started with).
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer,
        max_lr=args.lr,
        total_steps=args.epochs * steps,
        pct_start=0.1,
        last_epoch=train_loader.epoch * steps - 1 if args.resume else -1,
    )
    val_info = pipeline_info(val_pipe)
    if rank == 0:
        info = pipeline_info(train_pipe)
        print(
            f"{args.arch} on {device}, {world_size} process(es) x {args.workers} workers, batch {args.batch_size} "
            f"per process, {info.spec.num_samples} training / {val_info.spec.num_samples} validation images, "
            f"{steps} steps per epoch"
        )
    log_path = args.log_json or os.path.join(args.out_dir, "train_log.jsonl")
    if rank == 0:
        os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    log = open(log_path, "a") if rank == 0 else None
    result = {}
    for epoch in range(train_loader.epoch, args.epochs):  # a resumed loader knows its epoch
        model.train()
        seen = torch.zeros(2, dtype=torch.float64, device=device)  # images, loss sum
        wait = first_wait = 0.0
        start = time.perf_counter()
        bar = tqdm(total=steps, desc=f"epoch {epoch}", disable=rank != 0, leave=False)
        batches = iter(train_loader)
        for step in range(steps):
            t0 = time.perf_counter()
            (batch,) = next(batches)
            waited = time.perf_counter() - t0
            wait += waited
            first_wait = waited if step == 0 else first_wait
            images = batch["images"].to(device, non_blocking=True).contiguous(memory_format=memory_format)
            labels = batch["labels"].to(device, non_blocking=True).view(-1).long()
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=on_gpu):
                loss = criterion(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            seen[0] += len(labels)
            seen[1] += loss.detach().double() * len(labels)  # stays on the device: no sync per step
            bar.update()
        bar.close()
        if steps < len(train_loader):
            train_loader.reset()  # leave the epoch: the workers stop a few batches on, in step with the plan
        elapsed = time.perf_counter() - start
        # validation: every image exactly once over all ranks (padding removed by the iterator)
        model.eval()
        correct = torch.zeros(2, dtype=torch.float64, device=device)  # correct, images
        with torch.no_grad(), torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=on_gpu):
            for (batch,) in val_loader:
                images = batch["images"].to(device).contiguous(memory_format=memory_format)
                labels = batch["labels"].to(device).view(-1).long()
                correct += torch.tensor(
                    [(model(images).argmax(1) == labels).sum().item(), len(labels)], dtype=torch.float64, device=device
                )
        rate = torch.tensor([seen[0].item() / elapsed, wait / elapsed], dtype=torch.float64, device=device)
        if world_size > 1:
            for t in (seen, correct, rate):
                dist.all_reduce(t)
            rate[1] /= world_size
        result = {
            "epoch": epoch,
            "train_loss": seen[1].item() / max(1.0, seen[0].item()),
            "top1": correct[0].item() / max(1.0, correct[1].item()),
            "val_images": int(correct[1].item()),
            "val_images_expected": val_info.spec.num_samples,
            "images_per_s": rate[0].item(),
            "data_wait_fraction": rate[1].item(),
            "first_step_wait_s": first_wait,  # rank 0's: the epoch's first batch (the pipeline refilling)
            "steps": steps,
            "seconds": elapsed,
        }
        if rank == 0:
            print(
                f"epoch {epoch}: loss {result['train_loss']:.3f}, top-1 {100 * result['top1']:.2f}% on "
                f"{result['val_images']}/{result['val_images_expected']} validation images, "
                f"{result['images_per_s']:.0f} images/s, waiting for data {100 * result['data_wait_fraction']:.0f}% "
                "of the time"
            )
            if log:
                log.write(json.dumps(result) + "\n")
                log.flush()
            if args.checkpoint:
                os.makedirs(args.checkpoint, exist_ok=True)
                torch.save(
                    {
                        "model": (model.module if world_size > 1 else model).state_dict(),
                        "optimizer": optimizer.state_dict(),
                    },
                    os.path.join(args.checkpoint, "model.pt"),
                )
                with open(os.path.join(args.checkpoint, "loader.json"), "w") as f:
                    json.dump(train_loader.state_dict(), f)  # the same on every rank: rank 0 saves it
    if log:
        log.close()
    if world_size > 1:
        dist.destroy_process_group()
    if tmp is not None:
        tmp.cleanup()
    return result


if __name__ == "__main__":
    main()
