"""The data loaders the benchmarks compare, each configured as its documentation recommends.

Modes (the same work for every loader):

- ``bytes``: the encoded JPEG and its label reach Python (no decoding);
- ``peek``: DALI reads each JPEG's header (``fn.peek_image_shape``) and its shape reaches Python: the
  CPU side of a pipeline that decodes on the GPU, without the GPU (DALI loaders only);
- ``decode``: decode, resize to 224x224 (uint8 HWC);
- ``augment``: the ImageNet training transform: random-resized-crop 224, horizontal flip,
  normalize to float CHW (DALI decodes only the crop; torchvision decodes the whole image);
- ``augment16``: the same with FP16 output, as mixed-precision training takes it (DALI loaders only).

``open_loader(name, cfg)`` returns a loader whose ``epoch()`` yields, per batch, the ids of the samples
it delivers (for the exactly-once audit); in ``bytes`` mode DALI loaders report padding-free counts
without ids. Loaders: ``dali_shards``, ``native_webdataset`` (``fn.readers.webdataset``, sharded by
rank), ``plain_4892`` (the workaround as posted), ``webdataset_dataloader`` (webdataset +
``torch.utils.data.DataLoader``, PIL + torchvision) and ``dali_proxy`` (DataLoader workers feeding a
DALI pipeline through ``nvidia.dali.plugin.pytorch.experimental.proxy``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional

import numpy as np

LOADERS = ("dali_shards", "native_webdataset", "plain_4892", "webdataset_dataloader", "dali_proxy")
MODES = ("bytes", "peek", "decode", "augment", "augment16")
MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


@dataclass
class Config:
    shards: List[str]
    mode: str = "augment"
    batch_size: int = 256
    workers: int = 2
    threads: int = 2
    world_size: int = 1
    rank: int = 0
    seed: int = 0
    device_id: Optional[int] = None
    options: Dict[str, Any] = field(default_factory=dict)  # more sharded_pipeline options (dali_shards)


# -- DALI processing shared by the DALI-based loaders --------------------------------------
def dali_post(mode: str, jpg, device_id):
    from nvidia.dali import fn, types

    device = "cpu" if device_id is None else "mixed"
    if mode == "bytes":
        return jpg
    if mode == "peek":
        return fn.peek_image_shape(jpg)
    if mode == "decode":
        return fn.resize(fn.decoders.image(jpg, device=device, output_type=types.RGB), size=(224, 224))
    images = fn.decoders.image_random_crop(
        jpg, device=device, output_type=types.RGB, random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3]
    )
    images = fn.resize(images, size=(224, 224))
    return fn.crop_mirror_normalize(
        images,
        mirror=fn.random.coin_flip(),
        mean=[m * 255 for m in MEAN],
        std=[s * 255 for s in STD],
        dtype=types.FLOAT16 if mode == "augment16" else types.FLOAT,
        output_layout="CHW",
    )


def _ids(tensor) -> np.ndarray:
    return np.asarray(tensor.cpu() if hasattr(tensor, "cpu") else tensor).reshape(-1).astype(np.int64)


def _dali_ids(iterator) -> Iterator[np.ndarray]:
    """The "id" output of each batch of a DALI iterator."""
    for (batch,) in iterator:
        yield _ids(batch["id"])


def _loader_ids(loader) -> Iterator[np.ndarray]:
    """The ids of each (data, ids) batch of a torch DataLoader."""
    for _, ids in loader:
        yield _ids(ids)


class DaliShardsLoader:
    def __init__(self, cfg: Config):
        from nvidia.dali import fn, types

        from dali_shards import sharded_pipeline

        # bytes mode runs the pipeline directly and needs the padding mask as an output; the
        # iterator derives it from the plan
        fields = ("jpg", "id", "__valid__") if cfg.mode == "bytes" else ("jpg", "id")

        @sharded_pipeline(
            cfg.shards,
            fields=fields,
            batch_size=cfg.batch_size,
            py_num_workers=cfg.workers,
            shuffle=True,
            seed=cfg.seed,
            world_size=cfg.world_size,
            rank=cfg.rank,
            num_threads=cfg.threads,
            device_id=cfg.device_id,
            **cfg.options,
        )
        def pipe(jpg, ids, *valid):
            return (dali_post(cfg.mode, jpg, cfg.device_id), fn.reinterpret(ids, dtype=types.INT64), *valid)

        self.cfg = cfg
        self.pipe = pipe()
        if cfg.mode == "bytes":
            self.pipe.build()
            self.it = None
        else:
            self.it = self.iterator(self.pipe)

    def iterator(self, pipe):
        """The framework's iterator over the pipeline (PyTorch's; ``jax_throughput.py``: JAX's)."""
        from dali_shards.pytorch import DALIShardedIterator

        return DALIShardedIterator(pipe, ["data", "id"])

    def epoch(self) -> Iterator[np.ndarray]:
        if self.it is not None:
            yield from _dali_ids(self.it)
            return
        while True:
            try:
                _, ids, valid = self.pipe.run()
            except StopIteration:
                self.pipe.reset()
                return
            yield np.asarray(ids.as_tensor()).reshape(-1)[np.asarray(valid.as_tensor()).reshape(-1)]


def identity_map(sample):
    """The map benchmark's identity map: the fields the bytes-only pipeline delivers, as they are."""
    return {"jpg": sample["jpg"], "ids": sample["id"]}


def json_map(sample):
    """The map benchmark's JSON map: the sample's objects as float32 (n, 4) boxes and int64 labels."""
    objects = sample["json"]["objects"]
    return {"jpg": sample["jpg"], "ids": sample["id"],
            "boxes": np.array([o["box"] for o in objects], dtype=np.float32).reshape(-1, 4),
            "labels": np.array([o["label"] for o in objects], dtype=np.int64)}  # fmt: skip


class DaliShardsMapLoader(DaliShardsLoader):
    """dali_shards with a ``map`` (bytes mode only): ``options["map"]`` is ``"identity"`` (the same
    outputs as without a map) or ``"json"`` (also parses ``.json`` into box and label arrays)."""

    def __init__(self, cfg: Config):
        from nvidia.dali import fn, types

        from dali_shards import sharded_pipeline

        if cfg.mode != "bytes":
            raise NotImplementedError("the map benchmark measures bytes only")
        options = dict(cfg.options)
        kind = options.pop("map")
        common = dict(batch_size=cfg.batch_size, py_num_workers=cfg.workers, shuffle=True, seed=cfg.seed,
                      world_size=cfg.world_size, rank=cfg.rank, num_threads=cfg.threads, device_id=cfg.device_id, **options)  # fmt: skip
        if kind == "identity":

            @sharded_pipeline(cfg.shards, fields=("jpg", "id"), map=identity_map, **common)
            def pipe(jpg, ids, __valid__):
                return jpg, fn.reinterpret(ids, dtype=types.INT64), __valid__

        else:

            @sharded_pipeline(cfg.shards, fields=("jpg", "id", "json"), map=json_map, **common)
            def pipe(jpg, ids, boxes, labels, __valid__):
                return jpg, fn.reinterpret(ids, dtype=types.INT64), __valid__

        self.cfg, self.it = cfg, None
        self.pipe = pipe()
        self.pipe.build()


class NativeLoader:
    """DALI's ``fn.readers.webdataset``, sharded by rank, last batch padded and trimmed by the
    iterator (``reader_name`` + ``LastBatchPolicy.PARTIAL``), as DALI recommends for training.
    ``missing_component_behavior="skip"``: DALI counts an empty shard as one sample with no members,
    which would otherwise reach the decoder and fail."""

    def __init__(self, cfg: Config):
        from nvidia.dali import fn, pipeline_def, types
        from nvidia.dali.plugin.base_iterator import LastBatchPolicy
        from nvidia.dali.plugin.pytorch import DALIGenericIterator

        @pipeline_def(batch_size=cfg.batch_size, num_threads=cfg.threads, device_id=cfg.device_id, seed=cfg.seed + 1)
        def pipe():
            jpg, ids = fn.readers.webdataset(
                paths=cfg.shards,
                ext=["jpg", "id"],
                dtypes=[types.UINT8, types.INT64],
                random_shuffle=True,
                initial_fill=1024,
                seed=cfg.seed + 1,
                shard_id=cfg.rank,
                num_shards=cfg.world_size,
                pad_last_batch=True,
                missing_component_behavior="skip",
                name="reader",
            )
            return dali_post(cfg.mode, jpg, cfg.device_id), ids

        self.cfg = cfg
        self.pipe = pipe()
        self.pipe.build()
        if cfg.mode == "bytes":
            self.it = None
            meta = self.pipe.reader_meta("reader")
            self.epoch_size = meta["epoch_size"]
            self.count = 0
        else:
            self.it = DALIGenericIterator(
                self.pipe,
                ["data", "id"],
                reader_name="reader",
                last_batch_policy=LastBatchPolicy.PARTIAL,
                auto_reset=True,
            )

    def epoch(self) -> Iterator[np.ndarray]:
        if self.it is not None:
            yield from _dali_ids(self.it)
            return
        # bytes: the rank's shard (it moves to the next shard every epoch), padded to whole batches
        k, r = self.cfg.world_size, (self.cfg.rank + self.count) % self.cfg.world_size
        shard = (r + 1) * self.epoch_size // k - r * self.epoch_size // k
        self.count += 1
        for step in range(math.ceil(shard / self.cfg.batch_size)):
            _, ids = self.pipe.run()
            valid = min(self.cfg.batch_size, shard - step * self.cfg.batch_size)
            yield np.array([np.array(ids[i]).item() for i in range(valid)], dtype=np.int64)


class PlainLoader:
    def __init__(self, cfg: Config):
        from nvidia.dali.plugin.pytorch import DALIGenericIterator

        from plain_workaround import plain_pipeline

        self.pipe = plain_pipeline(
            cfg.shards,
            cfg.batch_size,
            cfg.workers,
            lambda jpg, ids: (dali_post(cfg.mode, jpg, cfg.device_id), ids),
            fields=("jpg", "id"),
            rank=cfg.rank,
            world_size=cfg.world_size,
            num_threads=cfg.threads,
            device_id=cfg.device_id,
        )
        if cfg.mode == "bytes":
            self.pipe.build()
            self.it = None
        else:
            self.it = DALIGenericIterator(self.pipe, ["data", "id"], auto_reset=True)

    def epoch(self) -> Iterator[np.ndarray]:
        if self.it is not None:
            yield from _dali_ids(self.it)
            return
        while True:
            try:
                _, ids = self.pipe.run()
            except StopIteration:
                self.pipe.reset()
                return
            yield np.concatenate([np.asarray(ids[i]).reshape(-1) for i in range(len(ids))])


# -- webdataset + DataLoader (and the DALI proxy, which reads through it) -------------------
def _webdataset(cfg: Config, shuffle_buffer: int = 1024):
    import webdataset as wds

    def by_rank(urls):
        return list(urls)[cfg.rank :: cfg.world_size]

    # the recommended multi-node setup: the same shard shuffle everywhere (fixed seed), split by
    # node, then by DataLoader worker; a sample buffer shuffle in each worker
    return wds.WebDataset(cfg.shards, shardshuffle=100, nodesplitter=by_rank, seed=cfg.seed, empty_check=False).shuffle(
        shuffle_buffer
    )


def _torch_transform(mode: str):
    import torchvision.transforms as T
    from PIL import Image

    if mode == "decode":
        tf = T.Compose([T.Resize((224, 224)), T.PILToTensor()])
    else:
        tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])

    def apply(sample):
        import io

        image = Image.open(io.BytesIO(sample["jpg"])).convert("RGB")
        return tf(image), int(np.frombuffer(sample["id"], dtype=np.int64)[0])

    return apply


def _keep_bytes(sample):
    return sample["jpg"], int(np.frombuffer(sample["id"], dtype=np.int64)[0])


def _collate_bytes(batch):
    return [b[0] for b in batch], np.array([b[1] for b in batch], dtype=np.int64)


class WebdatasetLoader:
    def __init__(self, cfg: Config):
        import torch

        dataset = _webdataset(cfg).map(_keep_bytes if cfg.mode == "bytes" else _torch_transform(cfg.mode))
        collate = _collate_bytes if cfg.mode == "bytes" else None
        kwargs = dict(batch_size=cfg.batch_size, num_workers=cfg.workers, persistent_workers=cfg.workers > 0)
        if collate is not None:
            kwargs["collate_fn"] = collate
        self.loader = torch.utils.data.DataLoader(dataset, **kwargs)

    def epoch(self) -> Iterator[np.ndarray]:
        yield from _loader_ids(self.loader)


class _ProxyItem:
    """DataLoader transform: the encoded JPEG goes to the DALI server, the id stays."""

    def __init__(self, proxy):
        self.proxy = proxy

    def __call__(self, sample):
        jpg = np.frombuffer(sample["jpg"], dtype=np.uint8)
        return self.proxy(jpg), int(np.frombuffer(sample["id"], dtype=np.int64)[0])


class ProxyLoader:
    def __init__(self, cfg: Config):
        from nvidia.dali import fn, pipeline_def
        from nvidia.dali.plugin.pytorch.experimental import proxy as dali_proxy

        if cfg.mode == "bytes":
            raise NotImplementedError("DALI Proxy feeds a DALI pipeline: without decoding it has nothing to do")

        @pipeline_def(
            batch_size=cfg.batch_size,
            num_threads=cfg.threads,
            device_id=cfg.device_id,
            seed=cfg.seed + 2,
            prefetch_queue_depth=2 * max(1, cfg.workers),
        )
        def pipe():
            jpg = fn.external_source(name="jpg", no_copy=True)
            return dali_post(cfg.mode, jpg, cfg.device_id)

        self.server = dali_proxy.DALIServer(pipe())
        self.server.__enter__()
        dataset = _webdataset(cfg).map(_ProxyItem(self.server.proxy))
        self.loader = dali_proxy.DataLoader(
            self.server, dataset, batch_size=cfg.batch_size, num_workers=cfg.workers, persistent_workers=cfg.workers > 0
        )

    def epoch(self) -> Iterator[np.ndarray]:
        yield from _loader_ids(self.loader)

    def close(self):
        self.server.__exit__(None, None, None)


_CLASSES = {
    "dali_shards": DaliShardsLoader,
    "dali_shards_map": DaliShardsMapLoader,
    "native_webdataset": NativeLoader,
    "plain_4892": PlainLoader,
    "webdataset_dataloader": WebdatasetLoader,
    "dali_proxy": ProxyLoader,
}


def open_loader(name: str, cfg: Config):
    return _CLASSES[name](cfg)
