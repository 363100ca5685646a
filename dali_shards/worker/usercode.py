"""User callables that run in the worker processes (``map``, ``decoders``, ``bucket_by``): carried
to them under ``fork`` and ``spawn`` alike, and their failures reported with the sample they
failed on. Imports no DALI.

A :class:`Portable` is serialized with ``dill`` (``recurse=True``) when it is made, in the main
process, so that lambdas, closures and bound methods of objects with state reach spawned workers
and a callable that cannot be pickled is refused when the pipeline is built, not in a worker. A
forked worker uses the callable it inherited; an unpickled copy loads it once per process.
"""

from __future__ import annotations

import os
import traceback
from typing import Any, Callable, Optional

import dill

from dali_shards.errors import ConfigError, ShardMapError

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

    def __call__(self, *args: Any) -> Any:
        if self._func is None:
            self._func = dill.loads(self._blob)
        return self._func(*args)

    def __repr__(self) -> str:
        return f"Portable({self.what}={self.name})"


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
