"""PyTorch trainers' own checkpointing: ``DALIShardedIterator`` is a ``Stateful`` of
``torch.distributed.checkpoint``, and ``DALIShardedDataModule``'s place is saved in a checkpoint
Lightning's ``Trainer`` takes in the middle of an epoch, and restored by it: exactly the rest of
that epoch, then whole epochs (the sanity check's and the epochs' validation whole every time)."""


import pytest
import torch
from nvidia.dali import fn, types

from dali_shards import ConfigError, sharded_pipeline
from dali_shards.pytorch import DALIShardedIterator

pl = pytest.importorskip("pytorch_lightning")

from dali_shards.pytorch.lightning import DALIShardedDataModule  # noqa: E402

TOTAL = 47  # the photos


def factories(shards):
    keywords = dict(batch_size=8, py_num_workers=2, device_id=None, num_threads=1, seed=11)

    @sharded_pipeline(shards, fields=("jpg", "__index__"), shuffle=True, **keywords)
    def train(jpg, index):
        return fn.resize(fn.decoders.image(jpg, device="cpu", output_type=types.RGB), size=(4, 4)), index

    @sharded_pipeline(shards, fields=("jpg", "__index__"), shuffle=False, **keywords)
    def val(jpg, index):
        return fn.resize(fn.decoders.image(jpg, device="cpu", output_type=types.RGB), size=(4, 4)), index

    return train, val


class Tiny(pl.LightningModule):
    """A linear model on 4x4 images that records the samples each step and validation took."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(48, 1)
        self.trained, self.validated = [], []

    def training_step(self, batch, batch_idx):
        self.trained.append((self.current_epoch, batch_idx, batch["index"].view(-1).tolist()))
        return self.layer(batch["image"].float().view(len(batch["image"]), -1)).mean()

    def validation_step(self, batch, batch_idx):
        self.validated[-1].extend(batch["index"].view(-1).tolist())

    def on_validation_epoch_start(self):
        self.validated.append([])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def trainer(folder, epochs, **kw):
    return pl.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=str(folder), **kw)  # fmt: skip


def test_the_iterator_is_a_stateful_of_torch_distributed_checkpoint(photo_shards):
    from torch.distributed.checkpoint.stateful import Stateful

    train, _ = factories(photo_shards["pattern"])
    it = DALIShardedIterator(train(), ["image", "index"])
    assert isinstance(it, Stateful)
    next(it)
    again = DALIShardedIterator(train(), ["image", "index"])
    again.load_state_dict(it.state_dict())
    assert again.step == it.step == 1 and [b["index"].tolist() for (b,) in again] == [b["index"].tolist() for (b,) in it]


def test_a_checkpoint_lightning_takes_mid_epoch_gives_exactly_the_rest_of_the_epoch(photo_shards, tmp_path):
    train, val = factories(photo_shards["pattern"])
    every = pl.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1, filename="{step}")
    first, data = Tiny(), DALIShardedDataModule(train, ["image", "index"], val=val, iterator_options={"audit": True})
    trainer(tmp_path, 2, callbacks=[every], num_sanity_val_steps=1).fit(first, datamodule=data)
    assert [(e, i) for e, i, _ in first.trained] == [(e, i) for e in range(2) for i in range(6)]  # 47 in batches of 8
    for epoch in range(2):
        assert sorted(i for e, _, b in first.trained if e == epoch for i in b) == list(range(TOTAL))
    sanity, *validated = first.validated  # the sanity check: 1 batch, then each epoch's validation whole
    assert len(set(sanity)) == 8 and [sorted(v) for v in validated] == [list(range(TOTAL))] * 2
    assert data.train_loader is None and data.state_dict()["epoch"] == 2  # let go at the end, its place kept

    resumed, again = Tiny(), DALIShardedDataModule(train, ["image", "index"], val=val)
    trainer(tmp_path / "again", 2).fit(resumed, datamodule=again, ckpt_path=str(tmp_path / "step=8.ckpt"))
    assert resumed.trained == first.trained[8:]  # epoch 1 from its third batch: the same batches, in order
    assert [sorted(v) for v in resumed.validated] == [list(range(TOTAL))]


def test_the_data_module_wants_the_decorated_function():
    with pytest.raises(ConfigError, match="the function @sharded_pipeline decorated"):
        DALIShardedDataModule(object(), ["image"])
