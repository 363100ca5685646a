"""User callables that run in the worker processes (``map``, ``decoders``, ``bucket_by``): carried
to them under ``fork`` and ``spawn`` alike, and their failures reported with the sample they
failed on. Imports no DALI.

A :class:`Portable` is serialized with ``dill`` (``recurse=True``) when it is made, in the main
process, so that lambdas, closures and bound methods of objects with state reach spawned workers
and a callable that cannot be pickled is refused when the pipeline is built, not in a worker. A
forked worker uses the callable it inherited; an unpickled copy loads it once per process.

Before user code runs on a sample, :func:`seed_user_rngs` seeds Python's ``random``, NumPy's
global RNG and torch's CPU generator from ``(seed, epoch, sample index)``: random augmentations
are then the same under any packing, after a resume, and in the main process when it needs a
sample's length (bucketing), and differ from epoch to epoch.
"""

from __future__ import annotations

import os
import random
import sys
import traceback
from typing import Any, Callable, Optional

import dill
import numpy as np

from dali_shards.errors import ConfigError, ShardMapError
from dali_shards.worker.process import entered_pid

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


class Portable:
    """A user callable (option ``what``) that travels to worker processes (see the module)."""

    def __init__(self, func: Callable[..., Any], what: str):
        if not callable(func):
            raise ConfigError(f"{what} must be callable, got {func!r}")
        try:
            self._blob = dill.dumps(func, recurse=True)
        except Exception as exc:  # noqa: BLE001 - anything dill cannot handle
            raise ConfigError(
                f"{what}={func!r} cannot be pickled for the worker processes ({type(exc).__name__}: {exc}); "
                "make what it uses picklable (open files, locks, sockets and generators are not), or open "
                "them lazily inside it"
            ) from None
        self._func: Optional[Callable[..., Any]] = func
        self.what = what
        self.name = getattr(func, "__qualname__", None) or type(func).__name__

    def __getstate__(self):
        return {"blob": self._blob, "what": self.what, "name": self.name}

    def __setstate__(self, state):
        self._blob, self.what, self.name = state["blob"], state["what"], state["name"]
        self._func = None

    def __eq__(self, other: object) -> bool:
        """The same callable as it travels (the one loaded is each process's own)."""
        return isinstance(other, Portable) and self.__getstate__() == other.__getstate__()

    def __hash__(self) -> int:
        return hash(self._blob)

    def __call__(self, *args: Any) -> Any:
        if self._func is None:
            self._func = self._load()
        return self._func(*args)

    def load(self) -> None:
        """Load the callable in this process now (what it imports is then imported)."""
        if self._func is None:
            self._func = self._load()

    def _load(self) -> Callable[..., Any]:
        try:
            return dill.loads(self._blob)
        except Exception as exc:  # noqa: BLE001 - whatever its unpickling runs
            raise ConfigError(
                f"{self.what}={self.name} was pickled but cannot be loaded in a worker process (pid {os.getpid()}): "
                f"{type(exc).__name__}: {exc}. Make it loadable (its __setstate__ and what it imports must work in "
                "a fresh process), or use py_start_method='fork'"
            ) from None

    def __repr__(self) -> str:
        return f"Portable({self.what}={self.name})"


_MASK = (1 << 64) - 1


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """A 64-bit seed for one sample in one epoch (splitmix64 over the three)."""
    x = (seed * 0x9E3779B97F4A7C15 + (epoch + 1) * 0xBF58476D1CE4E5B9 + (index + 1) * 0x94D049BB133111EB) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def seed_user_rngs(seed: int, epoch: int, index: int) -> None:
    """Seed the global RNGs user code draws from for this sample (see the module): about 8 us."""
    value = sample_seed(seed, epoch, index)
    random.seed(value)
    np.random.seed(value & 0xFFFFFFFF)
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "default_generator"):
        torch.default_generator.manual_seed(value)


class KeptRngs:
    """A context that gives back the global RNGs' states on exit: user code run in the main
    process (with seeded RNGs) leaves the user's own random streams as they were."""

    def __enter__(self) -> "KeptRngs":
        torch = sys.modules.get("torch")
        self._states = (random.getstate(), np.random.get_state(), torch.get_rng_state() if torch is not None else None)
        return self

    def __exit__(self, *exc: object) -> None:
        py, npy, tch = self._states
        random.setstate(py)
        np.random.set_state(npy)
        if tch is not None:
            sys.modules["torch"].set_rng_state(tch)


def interrupted(exc: BaseException) -> None:
    """Re-raise ``exc`` if it is a Ctrl-C of the process that builds the pipeline (in a worker
    process, which ignores SIGINT, a ``KeyboardInterrupt`` can only come from the user's code);
    any other exception of user code, ``SystemExit`` and ``GeneratorExit`` included, is the
    sample's failure."""
    if isinstance(exc, KeyboardInterrupt) and not in_worker_process():
        raise exc


def in_worker_process() -> bool:
    """True in a pipeline's worker process (once a source ran in it)."""
    return entered_pid() == os.getpid()


def failure(url: str, key: str, where: str, exc: BaseException, hint: str = "") -> ShardMapError:
    """The error for user code that raised ``exc`` on a sample: the original exception and its
    traceback in the message (it crosses process boundaries as text)."""
    frames = traceback.extract_tb(exc.__traceback__)
    while len(frames) > 1 and os.path.abspath(frames[0].filename).startswith(_PACKAGE):
        frames = traceback.StackSummary.from_list(frames[1:])  # ours: the user's frames start after
    text = "".join(traceback.format_list(frames) + traceback.format_exception_only(type(exc), exc)).rstrip()
    return ShardMapError(
        url,
        f"{where} raised {type(exc).__name__}: {exc}\nOriginal traceback (most recent call last):\n{text}",
        key=key,
        hint=hint or "fix the code, or pass on_error='skip' to skip (and count) such samples",
    )
