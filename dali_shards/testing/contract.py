"""The loader's contract on one configuration (see ``matrix``): two epochs on every rank, then a
mid-epoch resume under the same layout and under another world size, every delivered sample checked
against its tar (key, label, bytes, ``__stream__``, ``__index__``, read with Python's ``tarfile``),
each draw of an epoch delivered exactly once (a sample drawn twice, twice), every rank the same
steps, and the audit agreeing. Imports DALI when called."""

from __future__ import annotations

import hashlib
import os
import tarfile
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np


def sample(index: int) -> Dict[str, Any]:
    """The sample ``index`` of every test dataset: its key, bytes (``dat``, 8 to 47 bytes) and label."""
    data = hashlib.sha256(str(index).encode()).digest() * 2
    return {"__key__": f"k{index:05d}", "dat": data[: 8 + index % 40], "cls": str(index % 7)}


def write_dataset(folder: str, sizes: Sequence[int], first: int, gz: bool = False) -> List[str]:
    """Shards of ``sizes`` samples (``sample(first)`` on), with a manifest; their paths."""
    from dali_shards.catalog.manifest import write_manifest
    from dali_shards.catalog.scan import scan_shards
    from dali_shards.tools.writer import write_shard

    os.makedirs(folder, exist_ok=True)
    paths, index = [], first
    for n, size in enumerate(sizes):
        paths.append(os.path.join(folder, f"part-{n:06d}.tar" + (".gz" if gz else "")))
        write_shard(paths[-1], [sample(i) for i in range(index, index + size)])
        index += size
    write_manifest(os.path.join(folder, "manifest.json"), scan_shards(paths))
    return paths


def read_tars(paths: Sequence[str]) -> List[Dict[str, Any]]:
    """Every sample of the shards in order, as ``tarfile`` reads them (``__index__`` is the place)."""
    out: List[Dict[str, Any]] = []
    for path in paths:
        with tarfile.open(path, "r:*") as tar:
            by_key: Dict[str, Dict[str, Any]] = {}
            for member in tar.getmembers():
                key, ext = member.name.split(".", 1)
                data = tar.extractfile(member)
                by_key.setdefault(key, {"__key__": key})[ext] = data.read() if data is not None else b""
            out += list(by_key.values())
    return out


@dataclass
class Delivered:
    """What one rank's iterator delivered in one epoch: per step, the samples (dicts)."""

    steps: List[List[Dict[str, Any]]]

    @property
    def samples(self) -> List[Dict[str, Any]]:
        return [s for step in self.steps for s in step]


def samples_of(batch: Dict[str, Any], stream: bool) -> List[Dict[str, Any]]:
    """The samples of a batch the iterator returned (padding already dropped)."""
    out = []
    for i, index in enumerate(batch["index"].reshape(-1).tolist()):
        got = {"index": int(index), "cls": int(batch["cls"].reshape(-1)[i]), "dat": bytes(batch["dat"][i].numpy())}
        if "key" in batch:
            got["key"] = batch["key"][i]
        if stream:
            got["stream"] = int(batch["stream"].reshape(-1)[i])
        out.append(got)
    return out


def check_samples(got: Sequence[Dict[str, Any]], reference: Sequence[Dict[str, Any]], bounds: Sequence[int]) -> None:
    """Each delivered sample is the one its ``__index__`` names in the tars, in the right stream."""
    for s in got:
        want = reference[s["index"]]
        assert s["dat"] == want["dat"] and str(s["cls"]) == want["cls"].decode(), f"sample {s['index']}: wrong data"
        assert s.get("key", want["__key__"]) == want["__key__"], f"sample {s['index']}: key {s.get('key')!r}"
        if "stream" in s:
            stream = int(np.searchsorted(bounds, s["index"], side="right")) - 1
            assert s["stream"] == stream, f"sample {s['index']}: __stream__ {s['stream']}, not {stream}"


def check_draws(got: Counter, expected: Optional[Counter], bounds: Sequence[int], counts: Sequence[int]) -> None:
    """An epoch's draws: ``expected`` exactly (one dataset: each sample once), or, for a mix
    (``counts`` per stream), each stream's count and each sample ``floor`` or ``ceil`` times."""
    if expected is not None:
        assert got == expected, f"draws: missing {dict(expected - got)}, extra {dict(got - expected)}"
        return
    for i, count in enumerate(counts):
        lo, hi = bounds[i], bounds[i + 1]
        times = [got.get(j, 0) for j in range(lo, hi)]
        assert sum(times) == count, f"stream {i}: {sum(times)} draws, not {count}"
        least = count // (hi - lo)
        assert min(times) >= least and max(times) <= -(-count // (hi - lo)), f"stream {i}: draws {times}"


def canonical(runs: Sequence[Sequence[Delivered]], shard_starts: Sequence[int]) -> None:
    """The streaming mode's ``__index__`` (``shard << 32 | position``) as the position in canonical order."""
    for rank in runs:
        for delivered in rank:
            for s in delivered.samples:
                s["index"] = shard_starts[s["index"] >> 32] + (s["index"] & 0xFFFFFFFF)


def run_world(factory: Callable[..., Any], names: Sequence[str], world: int, epochs: int, stream: bool,
              audit: bool, stop: Optional[int] = None) -> Tuple[List[List[Delivered]], List[Any], List[Any]]:  # fmt: skip
    """Per rank, per epoch, what it delivered; each rank's state after ``stop`` batches; its iterator."""
    from dali_shards.pytorch import DALIShardedIterator

    runs, states, its = [], [], []
    for rank in range(world):
        it = DALIShardedIterator(factory(rank=rank), list(names), audit=audit)
        epochs_of: List[Delivered] = []
        state = None
        while it.epoch < epochs:
            steps: List[List[Dict[str, Any]]] = []
            for (batch,) in it:
                steps.append(samples_of(batch, stream))
                if stop is not None and it.epoch == 0 and len(steps) == stop:
                    state = it.state_dict()
            epochs_of.append(Delivered(steps))
        runs.append(epochs_of)
        states.append(state)
        its.append(it)
    return runs, states, its


def rest_of_epoch(factory: Callable[..., Any], names: Sequence[str], world: int, state: Any, stream: bool,
                  audit: bool) -> List[Delivered]:  # fmt: skip
    """Per rank, what a pipeline resumed from ``state`` delivers until its epoch ends (``audit``:
    asserting that each rank's audit of it says exactly once)."""
    from dali_shards.pytorch import DALIShardedIterator

    out = []
    for rank in range(world):
        it = DALIShardedIterator(factory(rank=rank, resume_from=state), list(names), audit=audit)
        out.append(Delivered([samples_of(batch, stream) for (batch,) in it]))
        assert not audit or it.audits[0]["exactly_once"], f"rank {rank} of {world}, resumed: the audit says {it.audits[0]}"
    return out


def index_batches(run: Sequence[Delivered]) -> List[List[int]]:
    return [[s["index"] for s in step] for d in run for step in d.steps]

