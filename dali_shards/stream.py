"""A mix's stream: one dataset of a mix, as users give it (``sharded_pipeline(source=[Stream(...), ...])``).

Defined below the options, which tell a mix by it; what a mix draws per epoch is ``plan.mixture``."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Optional

from dali_shards.errors import ConfigError


@dataclass(frozen=True)
class Stream:
    """One dataset of a mix (see the module): ``source`` as ``sharded_pipeline`` takes it, and at
    most one of ``proportion`` (a share of what ``epoch_size`` leaves), ``repeat`` (draws per epoch
    as a multiple of its size) or ``choose`` (draws per epoch)."""

    source: Any
    proportion: Optional[float] = None
    repeat: Optional[float] = None
    choose: Optional[int] = None

    def __post_init__(self) -> None:
        if _holds_stream(self.source):
            raise ConfigError(f"Stream({self.source!r}): a stream's source is shards (a pattern, manifest, directory "
                              "or list of them), not a Stream: give the weight to one Stream, and list the streams "
                              "side by side as the mix ([Stream(a, ...), Stream(b, ...)])")  # fmt: skip
        given = [n for n in ("proportion", "repeat", "choose") if getattr(self, n) is not None]
        if len(given) > 1:
            raise ConfigError(f"Stream({self.source!r}) gives {' and '.join(given)}: give at most one of them")
        for name, least in (("proportion", "> 0"), ("repeat", ">= 0")):
            value = getattr(self, name)
            if value is None:
                continue
            if not _real(value) or not math.isfinite(value) or value < 0 or (name == "proportion" and value == 0):
                raise ConfigError(f"Stream({self.source!r}): {name} must be a finite number {least}, got {value!r}")
        if self.choose is not None and (not isinstance(self.choose, numbers.Integral) or isinstance(self.choose, bool) or self.choose < 0):
            raise ConfigError(f"Stream({self.source!r}): choose must be an integer >= 0, got {self.choose!r}")


def _holds_stream(source: Any) -> bool:
    """Whether ``source`` is a ``Stream``, or a list of sources with one among them."""
    if isinstance(source, (list, tuple)):
        return any(isinstance(s, Stream) for s in source)
    return isinstance(source, Stream)


def _real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
