"""Re-running chosen samples through a pipeline's own definition, to find the ones DALI fails on.

When a DALI operator fails on a batch without naming the sample (nvJPEG, a crop window, a resize,
the user's ``fn.python_function``...), the iterator reads that step's samples again in its own
process and feeds them, a few at a time, to a pipeline built from the same function and DALI
settings (no worker processes: one external source in the single-array packing); the groups that
fail are split down to the samples that fail alone. A pipeline that failed is rebuilt before the
next run (DALI cannot go on after an error), so finding ``k`` bad samples among ``n`` costs about
``sqrt(n)`` group runs, ``sqrt(n)`` runs per bad group and ``k + 1`` builds.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from nvidia.dali import fn
from nvidia.dali.pipeline import Pipeline

from dali_shards.pipeline.conditionals import define_pipeline
from dali_shards.ipc.packed import Packed
from dali_shards.ipc.packing import Packing
from dali_shards.transfer.merge.graph import assemble_fields

Fails = Callable[[Sequence[Packed]], Optional[BaseException]]


class Probe:
    """Runs packed samples (``Packing.plain()`` form) through ``func``; ``fails(samples)`` is the
    exception DALI raised on them, or None."""

    def __init__(self, func: Callable[..., Any], packing: Packing, kwargs: Dict[str, Any], args=(), fn_kwargs=None):
        self.func, self.packing, self.args, self.fn_kwargs = func, packing, tuple(args), dict(fn_kwargs or {})
        self.kwargs = {k: v for k, v in kwargs.items() if not k.startswith("py_") and k != "prefetch_queue_depth"}
        self.pipe: Optional[Pipeline] = None
        self.feed: List[Any] = []
        self.builds = self.runs = 0

    def _build(self, capacity: int) -> Pipeline:
        packing, feed = self.packing, self.feed

        def graph():
            (blob,) = (fn.external_source(source=lambda: feed, batch=True, no_copy=False),)
            fields, _ = assemble_fields([blob], packing, capacity)
            return self.func(*fields, *self.args, **self.fn_kwargs)

        kwargs = {**self.kwargs, "batch_size": capacity, "prefetch_queue_depth": 1}
        pipe = define_pipeline(graph, kwargs)
        pipe.build()
        self.builds += 1
        return pipe

    def fails(self, samples: Sequence[Packed], capacity: int) -> Optional[BaseException]:
        if self.pipe is None:
            self.pipe = self._build(capacity)
        self.feed[:] = [self.packing.place_array(s) for s in samples]
        self.runs += 1
        try:
            self.pipe.run()
        except Exception as exc:  # noqa: BLE001 - any operator's failure is what is looked for
            self.pipe = None  # DALI's pipeline is no longer valid after an error
            return exc
        return None


def find_failing(probe: Probe, samples: Sequence[Tuple[int, Packed]]) -> Tuple[List[int], Optional[int]]:
    """The keys of the samples ``probe`` fails on alone (group testing: groups of about sqrt(n),
    then one by one within a failing group), and the key of one it does not fail on (None if none)."""
    capacity = max(1, len(samples))
    group = max(1, math.isqrt(len(samples)))
    bad: List[int] = []
    good: Optional[int] = None
    for lo in range(0, len(samples), group):
        part = samples[lo : lo + group]
        if probe.fails([s for _, s in part], capacity) is None:
            good = part[0][0] if good is None else good
            continue
        for key, sample in part:
            if probe.fails([sample], capacity) is not None:
                bad.append(key)
            elif good is None:
                good = key
    return bad, good
