"""Running a pipeline's epochs to the end, for tests and benchmarks (imports DALI when called)."""

from __future__ import annotations

from collections import Counter
from typing import Any, Dict, List, Tuple

import numpy as np


def as_numpy(tensor_list: Any) -> List[np.ndarray]:
    """A DALI TensorList (CPU or GPU) as a list of numpy arrays."""
    if hasattr(tensor_list, "as_cpu"):
        tensor_list = tensor_list.as_cpu()
    return [np.array(tensor_list[i]) for i in range(len(tensor_list))]


def run_epochs(pipe: Any, epochs: int) -> List[List[tuple]]:
    """Per epoch, the list of steps; each step a tuple of outputs as lists of numpy arrays."""
    pipe.build()
    result = []
    for _ in range(epochs):
        steps = []
        while True:
            try:
                outs = pipe.run()
            except StopIteration:
                break
            steps.append(tuple(as_numpy(o) for o in outs))
        pipe.reset()
        result.append(steps)
    return result


def worker_peak_rss(pipe: Any) -> float:
    """The largest peak resident memory (``VmHWM``) of a built pipeline's Python workers, in MB
    (Linux)."""
    peaks = []
    for pid in pipe.dali_shards.transfer.pids():
        with open(f"/proc/{pid}/status") as f:
            peaks += [int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM")]
    return max(peaks)


def index_pipeline(source: Any, **options: Any) -> Any:
    """A sharded pipeline factory delivering ``__index__``, ``__valid__`` and the ``jpg`` bytes (CPU)."""
    from dali_shards import sharded_pipeline

    @sharded_pipeline(source, fields=("__index__", "__valid__", "jpg"), num_threads=1, device_id=None, **options)
    def pipe(index, valid, jpg):
        return index, valid, jpg

    return pipe


def epochs_by_rank(make: Any, world: int, epochs: int = 2) -> Tuple[List[Counter], Dict[int, bytes], List[List[int]], list]:
    """Run ``make(rank=r)`` (an ``index_pipeline``) for every rank: per epoch a Counter of the valid
    indices of all ranks; ``{index: jpg bytes}``; the steps of each rank per epoch; the pipelines."""
    seen: List[Counter] = [Counter() for _ in range(epochs)]
    data: Dict[int, bytes] = {}
    steps, pipes = [], []
    for rank in range(world):
        pipe = make(rank=rank)
        pipes.append(pipe)
        out = run_epochs(pipe, epochs)
        steps.append([len(e) for e in out])
        for e, batches in enumerate(out):
            for index, valid, jpg in batches:
                for i, v, b in zip(index, valid, jpg):
                    if v:
                        seen[e][int(i)] += 1
                        data[int(i)] = b.tobytes()
    return seen, data, steps, pipes
