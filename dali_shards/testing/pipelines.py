"""Running a pipeline's epochs to the end, for tests and benchmarks (imports DALI when called)."""

from __future__ import annotations

from typing import Any, List

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
    for pid in pipe._py_pool.pids():
        with open(f"/proc/{pid}/status") as f:
            peaks += [int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM")]
    return max(peaks)
