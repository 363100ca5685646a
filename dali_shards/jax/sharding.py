"""The global batch of a JAX program: each process's batch (one rank's, from its pipeline) placed on
its own devices and assembled into one ``jax.Array`` per output with ``sharding`` (a
``NamedSharding`` over a ``Mesh`` of every process's devices; the batch along the first axis of its
``PartitionSpec``), with ``jax.make_array_from_process_local_data``. The checks that a sharding fits
the processes, their devices and the batch, each a ``ConfigError`` saying what to do. No DALI."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence, Set, Tuple, Union

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from dali_shards.errors import ConfigError


def default_sharding() -> NamedSharding:
    """The batch split over every device of every process (data parallelism): a one-axis
    ``Mesh("data")`` of ``jax.devices()`` and ``PartitionSpec("data")``."""
    return NamedSharding(Mesh(np.array(jax.devices()), ("data",)), PartitionSpec("data"))


def batch_axes(spec: PartitionSpec) -> Tuple[str, ...]:
    """The mesh axes the batch (an array's first axis) is split over."""
    first = spec[0] if len(spec) else None
    if first is None:
        return ()
    return tuple(first) if isinstance(first, (tuple, list)) else (first,)


Shardings = Union[None, jax.sharding.Sharding, Mapping[str, jax.sharding.Sharding]]  # NamedShardings: checked


class GlobalBatch:
    """How a rank's batch of ``batch_size`` samples becomes its part of the global batch of
    ``batch_size * world_size`` under ``sharding``: one ``NamedSharding`` for every output, or a
    dict from output names (of ``names``) to each one's, the others (the mask too) under the default
    (every device along one axis ``"data"``). Refuses (``ConfigError``) a sharding that is not a
    ``NamedSharding``, a name that is no output, a pipeline made for another rank or world than this
    JAX process's, a mesh that is not over the processes' devices, and a batch a mesh cannot split
    into a part per process of ``batch_size`` rows."""

    def __init__(self, sharding: Shardings, batch_size: int, world_size: int, rank: int, names: Sequence[str] = ()) -> None:
        processes, index = jax.process_count(), jax.process_index()
        if (world_size, rank) != (processes, index):
            raise ConfigError(
                f"the pipeline was made for rank {rank} of world_size {world_size}, but this is JAX process {index} of "
                f"{processes}: one pipeline per JAX process, made after jax.distributed.initialize() (its rank and "
                "world size then come from JAX), or with rank=jax.process_index(), world_size=jax.process_count()"
            )
        self.batch_size, self.world_size, self.rows = batch_size, world_size, batch_size * world_size
        given = dict(sharding) if isinstance(sharding, Mapping) else {}
        unknown = sorted(set(given) - set(names))
        if unknown:
            raise ConfigError(f"sharding names {unknown}, which are not outputs of the iterator ({list(names)})")
        default = default_sharding() if isinstance(sharding, Mapping) or sharding is None else sharding
        self.sharding = self._checked(default, "", processes)
        self.per_output = {name: self._checked(each, name, processes) for name, each in given.items()}
        self._made: Dict[Tuple[str, int], NamedSharding] = {}

    def _checked(self, sharding: Any, name: str, processes: int) -> NamedSharding:
        which = f"sharding[{name!r}]" if name else "sharding"
        if not isinstance(sharding, NamedSharding):
            raise ConfigError(
                f"{which} must be a jax.sharding.NamedSharding over a Mesh, got {type(sharding).__name__}: e.g. "
                "NamedSharding(Mesh(jax.devices(), ('data',)), PartitionSpec('data')) (the default)"
            )
        _check_mesh(sharding.mesh.devices, processes, which)
        _check_split(sharding, self.rows, self.batch_size, processes, which)
        return sharding

    def sharding_for(self, name: str, ndim: int) -> NamedSharding:
        """The sharding of output ``name`` of ``ndim`` axes: its own or the default; for an output of
        fewer axes than its ``PartitionSpec`` names (labels, the mask), the batch axis alone."""
        found = self._made.get((name, ndim))
        if found is None:
            given = self.per_output.get(name, self.sharding)
            spec = given.spec if ndim >= len(given.spec) else PartitionSpec(given.spec[0])
            found = self._made[(name, ndim)] = NamedSharding(given.mesh, spec)
        return found

    def assemble(self, local: Mapping[str, Any]) -> Dict[str, jax.Array]:
        """Each of this process's outputs (NumPy or JAX arrays of ``batch_size`` rows) as its part of
        the global array of ``batch_size * world_size`` rows."""
        out = {}
        for name, value in local.items():
            shape = (self.rows, *value.shape[1:])
            out[name] = jax.make_array_from_process_local_data(self.sharding_for(name, value.ndim), value, shape)
        return out


def _check_mesh(devices: Any, processes: int, which: str) -> None:
    owners = sorted({int(d.process_index) for d in np.asarray(devices).flat})
    if owners != list(range(processes)):
        raise ConfigError(
            f"{which}'s mesh holds devices of JAX processes {owners}, but every one of the {processes} processes "
            "feeds its part of the batch: build the mesh over jax.devices() (every process's devices), not "
            "jax.local_devices() or a subset"
        )


def _check_split(sharding: NamedSharding, rows: int, batch_size: int, processes: int, which: str) -> None:
    axes = batch_axes(sharding.spec)
    parts = int(np.prod([sharding.mesh.shape[a] for a in axes])) if axes else 1
    if rows % parts:
        raise ConfigError(
            f"the global batch of {rows} samples ({processes} process(es) x batch_size {batch_size}) cannot be split "
            f"into the {parts} parts the mesh axes {list(axes)} of {which} make: choose a batch_size whose total over the "
            f"processes is a multiple of {parts}"
        )
    held: Dict[int, Set[int]] = {}
    for device, index in sharding.devices_indices_map((rows,)).items():
        held.setdefault(_process_of(device), set()).update(range(rows)[index[0]])
    counts = {p: len(r) for p, r in sorted(held.items())}
    if any(n != batch_size for n in counts.values()) or sum(counts.values()) != rows:
        raise ConfigError(
            f"under {which} the processes hold {_described(counts)} of the {rows} rows of the global batch, but "
            f"each process's pipeline delivers {batch_size} distinct samples: split the batch axis (the first entry of "
            "the PartitionSpec) over mesh axes that separate the processes, e.g. a mesh over jax.devices() with "
            "PartitionSpec('data')"
        )


def _process_of(device: Any) -> int:
    """The JAX process a device belongs to."""
    return int(device.process_index)


def _described(counts: Mapping[int, int]) -> str:
    parts: List[str] = [f"process {p}: {n}" for p, n in counts.items()]
    return "(" + ", ".join(parts) + ")"
