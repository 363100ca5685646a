"""Running a pipeline's epochs to the end, for tests and benchmarks (imports DALI when called)."""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

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


def parameter_name(field: str) -> str:
    """A field's name as a Python parameter: ``__index__`` -> ``index``, ``jpg;png`` -> ``jpg_png``."""
    name = "".join(c if c.isalnum() or c == "_" else "_" for c in field.strip("_"))
    return name if name.isidentifier() else f"f_{name}"


def identity_pipeline(
    source: Any,
    fields: Sequence[str],
    *,
    outputs: Union[str, Sequence[str], None] = None,
    returns: Union[str, Sequence[str], None] = None,
    body: Optional[Callable[..., Any]] = None,
    **options: Any,
) -> Any:
    """A ``@sharded_pipeline`` factory over ``fields`` (on the CPU with one thread, unless
    ``options`` say otherwise). Its function, ``pipe``, takes ``outputs`` (names, as a sequence or a
    space-separated string; by default one per field, ``parameter_name(field)``; with ``map=``, the
    map's outputs) and returns those named in ``returns`` (by default all, as given), or, with
    ``body``, ``body(*outputs)`` (a DALI graph on them)."""
    from dali_shards import sharded_pipeline

    names = outputs.split() if isinstance(outputs, str) else list(outputs or map(parameter_name, fields))
    returned = returns.split() if isinstance(returns, str) else list(returns or names)
    assert set(returned) <= set(names), f"returns {returned} not among the outputs {names}"
    scope: Dict[str, Any] = {"body": body}
    result = f"body({', '.join(names)})" if body is not None else ", ".join(returned) + ","
    exec(f"def pipe({', '.join(names)}):\n    return {result}\n", scope)
    options = {"fields": tuple(fields), "num_threads": 1, "device_id": None, **options}
    return sharded_pipeline(source, **options)(scope["pipe"])


def index_pipeline(source: Any, **options: Any) -> Any:
    """A sharded pipeline factory delivering ``__index__``, ``__valid__`` and the ``jpg`` bytes (CPU)."""
    return identity_pipeline(source, ("__index__", "__valid__", "jpg"), **options)


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


def assert_exactly_once(seen: Sequence[Counter], total: int) -> None:
    """Every epoch in ``seen`` (a Counter of valid indices per epoch, as ``epochs_by_rank`` gives)
    holds each index of ``range(total)`` once."""
    for epoch in seen:
        assert sorted(epoch) == list(range(total)) and max(epoch.values()) == 1


def jpg_bytes(source: Any) -> Dict[int, bytes]:
    """``{__index__: jpg bytes}`` of one epoch of ``source`` read by one rank and one worker (the
    reference a remote or interleaved read is compared with)."""
    return epochs_by_rank(index_pipeline(source, batch_size=4, py_num_workers=1), 1, epochs=1)[1]
