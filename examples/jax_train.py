"""Train a small JAX classifier (plain JAX and optax) on WebDataset-style shards (<key>.jpg + <key>.cls), fed by dali_shards.jax.

One process per host under jax.distributed (each feeds its own devices; every batch is one global
jax.Array over a NamedSharding of all devices). The training pipeline decodes on the GPU (DALI's
mixed decoder) when JAX has one, on the CPU otherwise, then crops, flips and normalizes. Every batch
keeps its full shape, with a `valid` mask, so the last, padded batch of an epoch compiles nothing
new: the loss and top-1 count only valid samples. Each epoch's audit checks that training saw every
image exactly once; validation (unshuffled) counts every image exactly once.

    python examples/jax_train.py                 # the built-in photos, on the CPU (or your GPU)
    python examples/jax_train.py --data 'shards/train-{000000..000127}.tar' --val-data 'shards/val-{000000..000009}.tar'

With `--checkpoint DIR` each epoch saves the parameters, the optimizer's state and the loader's place
with Orbax (dali_shards.jax.CheckpointSave); `--resume` continues from the latest one, on the same or
another number of processes. Needs `pip install -e ".[jax]" optax`.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import optax
import orbax.checkpoint as ocp
from nvidia.dali import fn, types

from dali_shards import decode_image, sharded_pipeline
from dali_shards.jax import CheckpointRestore, CheckpointSave, DALIShardedIterator
from dali_shards.sample_data import write_sample_shards

MEAN = [0.485 * 255, 0.456 * 255, 0.406 * 255]
STD = [0.229 * 255, 0.224 * 255, 0.225 * 255]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--data", help="training shards (pattern, list or manifest); default: the built-in photos")
    ap.add_argument("--val-data", help="validation shards; default: the training shards when --data is not given")
    ap.add_argument("--num-classes", type=int, default=1000)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=None, help="per process (default 256 on GPU, 8 on CPU)")
    ap.add_argument("--image-size", type=int, default=None, help="training crop (default 128 on GPU, 32 on CPU)")
    ap.add_argument("--hidden", type=int, default=256, help="width of the hidden layer")
    ap.add_argument("--workers", type=int, default=2, help="dali_shards Python workers per process")
    ap.add_argument("--threads", type=int, default=2, help="DALI threads per pipeline")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--steps-per-epoch", type=int, default=None, help="stop each epoch early (smoke runs)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-dir", default=os.path.join("runs", "jax_train"), help="where logs go (default %(default)s)")
    ap.add_argument("--checkpoint", help="a folder to save the parameters, optimizer state and loader state in, each epoch")
    ap.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --checkpoint")
    ap.add_argument("--coordinator", help="jax.distributed's coordinator address (host:port) for a multi-process run")
    ap.add_argument("--num-processes", type=int, default=None)
    ap.add_argument("--process-id", type=int, default=None)
    return ap.parse_args(argv)


def build_pipelines(args, device_id):
    """The training and validation pipelines (rank and world size from jax.distributed)."""
    size = args.image_size
    common = dict(batch_size=args.batch_size, py_num_workers=args.workers, seed=args.seed, device_id=device_id,
                  num_threads=args.threads)  # fmt: skip

    @sharded_pipeline(args.data, fields=("jpg;jpeg;png", "cls"), shuffle=True, **common)
    def train(jpg, cls):
        images = fn.random_resized_crop(decode_image(jpg, output_type=types.RGB), size=(size, size))
        images = fn.crop_mirror_normalize(images, mirror=fn.random.coin_flip(), mean=MEAN, std=STD, dtype=types.FLOAT,
                                          output_layout="HWC")  # fmt: skip
        return images, cls

    @sharded_pipeline(args.val_data, fields=("jpg;jpeg;png", "cls"), shuffle=False, **common)
    def val(jpg, cls):
        images = fn.resize(decode_image(jpg, output_type=types.RGB), size=(size, size))
        return fn.crop_mirror_normalize(images, mean=MEAN, std=STD, dtype=types.FLOAT, output_layout="HWC"), cls

    return train(), val()


def init_params(key, inputs, hidden, classes):
    k1, k2 = jax.random.split(key)
    return {
        "w1": jax.random.normal(k1, (inputs, hidden)) * (2.0 / inputs) ** 0.5,
        "b1": jnp.zeros(hidden),
        "w2": jax.random.normal(k2, (hidden, classes)) * (1.0 / hidden) ** 0.5,
        "b2": jnp.zeros(classes),
    }


def forward(params, images):
    x = images.reshape(images.shape[0], -1)
    x = jax.nn.relu(x @ params["w1"] + params["b1"])
    return x @ params["w2"] + params["b2"]


def make_steps(optimizer):
    """The jitted training and evaluation steps: every sum over the valid samples alone."""

    def loss_fn(params, batch):
        logits = forward(params, batch["images"])
        losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"].reshape(-1))
        weight = batch["valid"].astype(jnp.float32)
        return (losses * weight).sum() / jnp.maximum(weight.sum(), 1.0), (losses * weight).sum()

    @jax.jit
    def train_step(params, opt_state, batch):
        (_, loss_sum), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss_sum, batch["valid"].sum()

    @jax.jit
    def eval_step(params, batch):
        hits = (forward(params, batch["images"]).argmax(-1) == batch["labels"].reshape(-1)) & batch["valid"]
        return hits.sum(), batch["valid"].sum()

    return train_step, eval_step


def train_epoch(loader, steps, state, train_step):
    """One epoch (or its first ``steps``): (params, opt_state, images, loss sum, seconds, seconds waiting)."""
    params, opt_state = state
    images = loss_sum = 0
    wait, start, batches = 0.0, time.perf_counter(), iter(loader)
    for _ in range(steps):
        t0 = time.perf_counter()
        batch = next(batches)
        wait += time.perf_counter() - t0
        params, opt_state, loss, count = train_step(params, opt_state, batch)
        loss_sum, images = loss_sum + loss, images + count  # kept on the device: no sync per step
    if steps < len(loader):
        loader.reset()  # leave the epoch early (--steps-per-epoch)
    else:
        assert next(batches, None) is None  # the epoch's end, where it is audited
    return params, opt_state, int(images), float(loss_sum), time.perf_counter() - start, wait


def evaluate(loader, params, eval_step, expected: int, epoch: int):
    """(correct, images) over the validation set: every image once, or SystemExit."""
    correct = seen = 0
    for batch in loader:
        hits, count = eval_step(params, batch)
        correct, seen = correct + int(hits), seen + int(count)
    if seen != expected:
        raise SystemExit(f"epoch {epoch}: validation saw {seen} images, not {expected}")
    return correct, seen


def report(args, result: dict) -> None:
    """The epoch's line, and its JSON line in OUT_DIR/train_log.jsonl (the first process's)."""
    once = "not audited (epoch cut short)" if result["exactly_once"] is None else "exactly once"
    print(f"epoch {result['epoch']}: loss {result['train_loss']:.3f}, top-1 {100 * result['top1']:.2f}% on "
          f"{result['val_images']}/{result['val_images_expected']} validation images, {result['train_images']} training "
          f"images {once}, {result['images_per_s']:.0f} images/s, waiting for data "
          f"{100 * result['data_wait_fraction']:.0f}% of the time")  # fmt: skip
    with open(os.path.join(args.out_dir, "train_log.jsonl"), "a") as log:
        log.write(json.dumps(result) + "\n")


def setup(args):
    """The data (the built-in photos by default), the loaders, the model's state (restored from the
    latest checkpoint with --resume) and the checkpoint manager."""
    if args.coordinator:
        jax.distributed.initialize(args.coordinator, args.num_processes, args.process_id)
    gpus = [d for d in jax.local_devices() if d.platform == "gpu"]
    device_id = gpus[0].local_hardware_id if gpus else None  # DALI decodes on the GPU JAX computes on
    args.batch_size = args.batch_size or (256 if gpus else 8)
    args.image_size = args.image_size or (128 if gpus else 32)
    if args.data is None:  # the built-in photos, written into shards in every process
        args.tmp = tempfile.TemporaryDirectory(prefix="dali-shards-jax-train-")
        args.data = write_sample_shards(args.tmp.name, shard_sizes=(11, 0, 17, 3, 16), prefix="train")
        args.val_data = args.val_data or args.data
    if args.val_data is None:
        raise SystemExit("--val-data is required with --data")
    train_pipe, val_pipe = build_pipelines(args, device_id)
    train_loader = DALIShardedIterator(train_pipe, ["images", "labels"], audit=True)  # global arrays + "valid"
    val_loader = DALIShardedIterator(val_pipe, ["images", "labels"])
    params = init_params(jax.random.PRNGKey(args.seed), args.image_size**2 * 3, args.hidden, args.num_classes)
    replicated = train_loader.sharding.update(spec=jax.sharding.PartitionSpec())  # on every device of the mesh
    state = jax.device_put((params, args.optimizer.init(params)), replicated)
    manager = ocp.CheckpointManager(os.path.abspath(args.checkpoint)) if args.checkpoint else None
    if args.resume and manager is not None and manager.latest_step() is not None:
        restored = manager.restore(manager.latest_step(), args=ocp.args.Composite(
            model=ocp.args.StandardRestore(state), loader=CheckpointRestore(train_loader)))  # fmt: skip
        state = restored["model"]
    return train_loader, val_loader, state, manager


def main(argv=None) -> dict:
    args = parse_args(argv)
    args.optimizer, args.tmp = optax.adam(args.lr), None
    train_loader, val_loader, state, manager = setup(args)
    train_step, eval_step = make_steps(args.optimizer)
    lead = jax.process_index() == 0
    info, val_info = train_loader.info, val_loader.info
    if lead:
        print(f"MLP on {jax.devices()[0].platform} ({jax.device_count()} device(s), {jax.process_count()} process(es) x "
              f"{args.workers} workers), global batch {args.batch_size * jax.process_count()}, {info.spec.num_samples} "
              f"training / {val_info.spec.num_samples} validation images, {len(train_loader)} steps per epoch")  # fmt: skip
        os.makedirs(args.out_dir, exist_ok=True)
    result: dict = {}
    for epoch in range(train_loader.epoch, args.epochs):  # a resumed loader knows its epoch
        steps = min(len(train_loader), args.steps_per_epoch or len(train_loader))
        *state, images, loss_sum, seconds, wait = train_epoch(train_loader, steps, state, train_step)
        audit = train_loader.audits[-1] if train_loader.audits and train_loader.audits[-1]["epoch"] == epoch else None
        if audit is not None and not audit["exactly_once"]:
            raise SystemExit(f"epoch {epoch}: training did not see every image exactly once: {audit}")
        correct, seen = evaluate(val_loader, state[0], eval_step, val_info.spec.num_samples, epoch)
        result = {"epoch": epoch, "train_loss": loss_sum / max(images, 1), "top1": correct / max(seen, 1),
                  "val_images": seen, "val_images_expected": val_info.spec.num_samples, "train_images": images,
                  "exactly_once": None if audit is None else bool(audit["exactly_once"]), "steps": steps,
                  "images_per_s": images / seconds, "data_wait_fraction": wait / seconds, "seconds": seconds}  # fmt: skip
        if lead:
            report(args, result)
        if manager is not None:  # every process saves its part (the loader's place: dali_shards.jax.CheckpointSave)
            manager.save(epoch, args=ocp.args.Composite(model=ocp.args.StandardSave(state), loader=CheckpointSave(train_loader)))
    if manager is not None:
        manager.wait_until_finished()
    if args.tmp is not None:
        args.tmp.cleanup()
    return result


if __name__ == "__main__":
    main()
