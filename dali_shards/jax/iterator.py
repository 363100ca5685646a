"""JAX iterator for ``@sharded_pipeline`` pipelines: DALI's JAX iterator as the feed of a run session
(``dali_shards.session``), each process's batch placed on its devices and assembled into global
``jax.Array``s of static shapes (``sharding.py``)."""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Dict, Iterator, Mapping, Optional, Sequence, Union

import jax
from nvidia.dali.pipeline import Pipeline

from dali_shards.errors import ConfigError
from dali_shards.jax.feed import JaxFeed
from dali_shards.jax.outputs import SHAPE_SUFFIX, check_bounds
from dali_shards.jax.ranks import JaxRanks
from dali_shards.jax.sharding import GlobalBatch
from dali_shards.session import RunSession, check_output_map
from dali_shards.session.adapter import SessionAdapter
from dali_shards.session.run import info_of

__all__ = ["DALIShardedIterator"]


class DALIShardedIterator(SessionAdapter):
    """An iterator over one process's sharded pipeline for a JAX program: each ``next()`` is a dict
    from each name of ``output_map`` (one per output of the pipeline function, in order) to a global
    ``jax.Array`` of ``batch_size * world_size`` rows, split over the devices as ``sharding`` says
    (a ``NamedSharding`` over a ``Mesh`` of every process's devices, the batch along the first axis
    of its ``PartitionSpec``; by default every device's share along one axis ``"data"``), or a dict
    giving some outputs a sharding of their own (the others, and the mask, under the default). Each
    process feeds its own devices, from its own pipeline: one per JAX process, rank
    ``jax.process_index()`` of ``jax.process_count()`` (the pipeline's default after
    ``jax.distributed.initialize()``).

    - Shapes are static (JAX compiles anew for every shape): every batch keeps its full shape and
      comes with a bool array under ``mask_name`` (``"valid"``) saying which of its samples are real:
      the padding of the last steps (``last_batch="pad"``) and samples skipped with
      ``on_error="skip"`` are not. An output whose samples may differ in shape (``__key__``, bytes
      returned as they come, boxes) needs a bound, ``pad_to={name: shape}``: it comes zero-padded to
      that shape, each sample's true shape under ``<name>_shape``.
    - ``len(it)`` is the number of batches this iterator delivers in the current epoch from where it
      started it, the same on every process; epochs follow one another without ``reset()``; a new
      loop continues the current epoch where it stands, and ``reset()`` leaves it early.
    - ``state_dict()`` is a small JSON-able dict saying where the epoch stands (the same on every
      process); ``load_state_dict()`` restarts the pipeline there, also under another number of
      processes (the samples not yet delivered planned anew). ``dali_shards.jax.CheckpointSave`` /
      ``CheckpointRestore`` save and restore it with Orbax, beside the model.
    - Everything else is ``dali_shards.pytorch.DALIShardedIterator``'s: exactly once per epoch over
      all processes, the plan check before the first batch (one all-gather over JAX's processes),
      ``audit=True`` (``audits``), a worker's error said as it was, a sample a DALI operator fails on
      named (``on_error="raise"``) or skipped (``"skip"``, ``incidents``).

    Hand it a pipeline that is not built yet (it adds an output to see padding and skipped samples).
    64-bit integer outputs are narrowed to 32 bits unless ``jax_enable_x64`` is on (a ``ConfigError``
    where a value does not fit). ``prepare_first_batch`` is DALI's (the first batch fetched when the
    iterator is made)."""

    def __init__(
        self,
        pipeline: Pipeline,
        output_map: Sequence[str],
        *,
        sharding: Union[None, jax.sharding.Sharding, Mapping[str, jax.sharding.Sharding]] = None,
        pad_to: Optional[Mapping[str, Sequence[int]]] = None,
        mask_name: str = "valid",
        audit: bool = False,
        prepare_first_batch: bool = True,
    ) -> None:
        names, bounds = list(output_map), dict(pad_to or {})
        info = info_of(pipeline)
        check_output_map(names, len(info.outputs))
        check_bounds(names, [names[i] for i in (*info.key_outputs, *info.varying_outputs)], bounds)
        taken = {*names, *(n + SHAPE_SUFFIX for n in bounds)}
        if mask_name in taken:
            raise ConfigError(f"mask_name {mask_name!r} clashes with an output name; choose another")
        check_device(pipeline)
        self.mask_name = mask_name
        batch_names = [*names, *(n + SHAPE_SUFFIX for n in bounds), mask_name]
        self._global = GlobalBatch(sharding, info.spec.batch_size, info.spec.world_size, info.rank, batch_names)
        with quiet_fork():
            self._session = RunSession(pipeline, names, JaxFeed(bounds, prepare_first_batch), JaxRanks(), audit=audit)

    @property
    def sharding(self) -> jax.sharding.NamedSharding:
        """The sharding of the batch (of the outputs ``sharding`` gave none of their own; those with
        fewer axes than its spec: their first alone)."""
        return self._global.sharding

    def sharding_of(self, name: str, ndim: int) -> jax.sharding.NamedSharding:
        """The sharding of output ``name`` (of ``ndim`` axes) in every batch."""
        return self._global.sharding_for(name, ndim)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a ``state_dict()`` (of this run or one under another number of processes):
        the pipeline is rebuilt to resume there."""
        with quiet_fork():
            self._session.load_state_dict(state)

    def __next__(self) -> Dict[str, jax.Array]:
        with quiet_fork():  # (a skipped sample rebuilds the pipeline)
            batch, mask = self._session.next()
        batch[self.mask_name] = mask
        return self._global.assemble(batch)


@contextlib.contextmanager
def quiet_fork() -> Iterator[None]:
    """Without JAX's warning that a process forked (the pipeline's workers start by ``fork`` unless
    ``py_start_method="spawn"``): they run no JAX code, only the library's readers."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
        yield


def check_device(pipeline: Pipeline) -> None:
    """A ConfigError unless the pipeline's GPU (if any) is one of this JAX process's devices."""
    device_id = getattr(pipeline, "device_id", None)
    if device_id is None or device_id < 0:
        return
    local = [d for d in jax.local_devices() if d.platform == "gpu"]
    if not local:
        raise ConfigError(
            f"the pipeline runs on GPU {device_id}, but JAX has no GPU (jax.local_devices(): {jax.local_devices()}): "
            "install JAX for CUDA (pip install 'jax[cuda13]'), or make the pipeline with device_id=None"
        )
    ids = sorted(int(d.local_hardware_id) for d in local if d.local_hardware_id is not None)
    if ids and device_id not in ids:
        raise ConfigError(
            f"the pipeline runs on GPU {device_id}, which is not one of this JAX process's GPUs {ids}: make it with "
            "device_id=jax.local_devices()[0].local_hardware_id"
        )
