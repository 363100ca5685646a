"""``DALIShardedDataModule``: a PyTorch Lightning data module over ``@sharded_pipeline`` pipelines.

Its ``state_dict()`` is the training loader's place after the last batch Lightning took, and
Lightning saves it in its own checkpoint; ``Trainer.fit(..., ckpt_path=...)`` gives it back through
``load_state_dict()`` before asking for the loader, which then starts there: a checkpoint taken in
the middle of an epoch gives exactly the rest of that epoch, and every guarantee of
``DALIShardedIterator`` holds (exactly once, the same steps on every rank, elastic resume).

Lightning counts an epoch's batches when it first asks for the loader: the loader says the whole
epoch (the batches taken before the checkpoint and the rest), as Lightning's own count of the
epoch's batches goes on from the checkpoint. After a resume under another number of processes,
the next epochs have another length: give the ``Trainer`` ``reload_dataloaders_every_n_epochs=1``
then. Needs ``pytorch_lightning`` (or ``lightning``)."""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Sequence

from dali_shards.errors import ConfigError
from dali_shards.pytorch.iterator import DALIShardedIterator

try:
    import pytorch_lightning as pl
except ImportError:  # pragma: no cover - the unified package instead
    try:
        import lightning.pytorch as pl  # type: ignore[no-redef]
    except ImportError as _missing:
        raise ImportError(
            "dali_shards.pytorch.lightning needs PyTorch Lightning: pip install pytorch-lightning", name="pytorch_lightning"
        ) from _missing

__all__ = ["DALIShardedDataModule", "TrainBatches", "ValBatches"]


class TrainBatches:
    """The training loader as Lightning sees it: each batch the dict of ``DALIShardedIterator``'s
    outputs; ``len()`` the whole current epoch (the steps before this iterator started it
    included: Lightning counts them from its checkpoint); each loop goes on with the epoch where it
    stands. Its ``state_dict()`` is the iterator's (Lightning also saves it with its loops; loading
    the state the iterator stands at does nothing)."""

    def __init__(self, loader: DALIShardedIterator) -> None:
        self.loader = loader
        self._epoch, self._taken = loader.epoch, 0  # batches this object gave out in ``_epoch``

    def __len__(self) -> int:
        taken = self._taken if self._epoch == self.loader.epoch else 0
        return self.loader.step - taken + len(self.loader)

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        iter(self.loader)  # the next epoch where this one was taken whole
        if self.loader.epoch != self._epoch:
            self._epoch, self._taken = self.loader.epoch, 0
        return self._batches()

    def _batches(self) -> Iterator[Dict[str, Any]]:
        for (batch,) in self.loader:
            self._taken += 1
            yield batch

    def state_dict(self) -> Dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if dict(state) != self.loader.state_dict():
            self.loader.load_state_dict(state)


class ValBatches:
    """A validation (or test, predict) loader: every loop a whole epoch, from its start (a loop
    Lightning left early, its sanity check's, is left: ``reset()``)."""

    def __init__(self, loader: DALIShardedIterator) -> None:
        self.loader = loader

    def __len__(self) -> int:
        return len(self.loader)  # (the whole epoch: each loop starts one)

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        self.loader.reset()  # (nothing to do at an epoch's start)
        return (batch for (batch,) in self.loader)


PipelineFactory = Callable[..., Any]


class DALIShardedDataModule(pl.LightningDataModule):
    """A ``LightningDataModule`` over sharded pipelines: ``train`` (and ``val``, ``test``) are
    functions decorated with ``@sharded_pipeline`` (called with no arguments, the training one with
    ``resume_from=`` a state), ``output_map`` the names of their outputs, ``iterator_options`` the
    keywords of ``dali_shards.pytorch.DALIShardedIterator`` (``audit``, ``ragged``...). Each loader
    is made when Lightning first asks for it (after ``torch.distributed`` is set up, so that the
    pipelines take their rank from it) and kept for the run; ``train_loader`` is the training
    ``DALIShardedIterator`` (None before). ``state_dict()`` / ``load_state_dict()``: the training
    loader's place, saved in and restored from Lightning's checkpoints."""

    def __init__(
        self,
        train: PipelineFactory,
        output_map: Sequence[str],
        *,
        val: Optional[PipelineFactory] = None,
        test: Optional[PipelineFactory] = None,
        iterator_options: Optional[Mapping[str, Any]] = None,
    ) -> None:
        super().__init__()
        for name, factory in (("train", train), ("val", val), ("test", test)):
            if factory is not None and not callable(factory):
                raise ConfigError(
                    f"{name} must be the function @sharded_pipeline decorated (called to make a pipeline), got "
                    f"{type(factory).__name__}: pass the function itself, not a pipeline it made"
                )
        self.factories = {"train": train, "val": val, "test": test}
        self.output_map = list(output_map)
        self.iterator_options = dict(iterator_options or {})
        self.train_loader: Optional[DALIShardedIterator] = None
        self._resume: Optional[Dict[str, Any]] = None  # a state loaded before the training loader was made
        self._loaders: Dict[str, Any] = {}

    def _iterator(self, name: str, **pipeline_args: Any) -> DALIShardedIterator:
        factory = self.factories[name]
        if factory is None:
            raise ConfigError(f"this DALIShardedDataModule has no {name} pipeline: pass {name}= when making it")
        return DALIShardedIterator(factory(**pipeline_args), self.output_map, **self.iterator_options)

    def train_dataloader(self) -> TrainBatches:
        if "train" not in self._loaders:
            self.train_loader = self._iterator("train", **({"resume_from": self._resume} if self._resume else {}))
            self._loaders["train"], self._resume = TrainBatches(self.train_loader), None
        batches: TrainBatches = self._loaders["train"]
        return batches

    def val_dataloader(self) -> ValBatches:
        return self._evaluation("val")

    def test_dataloader(self) -> ValBatches:
        return self._evaluation("test")

    def _evaluation(self, name: str) -> ValBatches:
        if name not in self._loaders:
            self._loaders[name] = ValBatches(self._iterator(name))
        batches: ValBatches = self._loaders[name]
        return batches

    def state_dict(self) -> Dict[str, Any]:
        """The training loader's place after the last batch Lightning took from it (a state loaded
        before the loader was made, where it was not made yet; empty before either)."""
        if self.train_loader is not None:
            return self.train_loader.state_dict()
        return dict(self._resume or {})

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Resume the training loader at ``state_dict`` (made there, or moved there if it is made)."""
        if not state_dict:
            return
        if self.train_loader is not None:
            self._loaders["train"].load_state_dict(state_dict)
        else:
            self._resume = dict(state_dict)

    def teardown(self, stage: str) -> None:
        """Let the pipelines and their workers go at the end of a run (the training loader's place
        kept: ``state_dict()``, and where a later ``fit`` starts)."""
        if self.train_loader is not None:
            self._resume = self.train_loader.state_dict()
        self.train_loader = None
        self._loaders.clear()
