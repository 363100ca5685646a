"""Defining a pipeline without DALI's AutoGraph unless the user's graph needs it.

Our merge calls DALI's conditional split/merge operators directly, so a pipeline is first defined
with ``enable_conditionals=False``: nothing is converted and nothing is written to ``$TMPDIR``.
Only if the user's function uses a DataNode as a condition (``if images_are_big:``) -- which DALI
reports as a TypeError -- is it defined again with conditionals (or at once, when the caller asks
for ``enable_conditionals=True``). AutoGraph writes each function it converts to a
``__autograph_generated_file*.py`` in ``$TMPDIR`` and removes them only at a clean exit; the
files this process loaded are removed right after the pipeline is defined.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Dict, Optional

from nvidia.dali.pipeline import Pipeline, pipeline_def

_GENERATED = "__autograph_generated_file"
_CONDITION_ERROR = "was used in conditional context"


def define_pipeline(graph: Callable[[], Any], kwargs: Dict[str, Any]) -> Pipeline:
    """``pipeline_def(graph, **kwargs)()``, with conditionals only where the graph needs them."""
    kwargs = dict(kwargs)
    wanted: Optional[bool] = kwargs.pop("enable_conditionals", None)
    try:
        if not wanted:
            try:
                return pipeline_def(  # type: ignore[call-overload]  # DALI's stubs lack pipeline_def(fn, **kwargs)
                    graph, enable_conditionals=False, **kwargs
                )()
            except TypeError as exc:
                if wanted is False or _CONDITION_ERROR not in str(exc):
                    raise
        return pipeline_def(  # type: ignore[call-overload]  # DALI's stubs lack pipeline_def(fn, **kwargs)
            graph, enable_conditionals=True, **kwargs
        )()
    finally:
        remove_generated_files()


def remove_generated_files() -> int:
    """Remove the AutoGraph files this process has loaded (their code stays in memory)."""
    removed = 0
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if name.startswith(_GENERATED) and path and os.path.basename(path).startswith(_GENERATED):
            try:
                os.remove(path)
                removed += 1
            except OSError:
                pass
    return removed
