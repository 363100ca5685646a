"""Exceptions raised by dali_shards: each names the shard (and sample) at fault and what to do."""

from __future__ import annotations

import base64
import pickle
import re
from typing import Optional


class DaliShardsError(Exception):
    """Base class of every error dali_shards raises on purpose."""


class ConfigError(DaliShardsError, ValueError):
    """The loader was configured in a way that cannot work (batch sizes, fields, world size...)."""


class UnknownOptionError(ConfigError, TypeError):
    """A keyword that is neither an option, a DALI pipeline parameter nor the function's own."""


class ManifestNotFound(ConfigError):
    """The manifest file does not exist."""


class EmptyDatasetError(ConfigError):
    """The shards hold no samples (or too few for even one batch with ``last_batch="drop"``)."""


class ShardError(DaliShardsError):
    """A shard, or a sample in it, cannot be used as asked.

    ``url`` names the shard, ``key`` the sample when known, ``hint`` what to do.
    """

    def __init__(self, url: str, message: str, *, key: Optional[str] = None, hint: str = ""):
        self.url = url
        self.key = key
        self.detail = message
        self.hint = hint
        where = f"shard {url!r}" + (f", sample {key!r}" if key is not None else "")
        text = f"{where}: {message.rstrip('.')}"
        if hint:
            text += f". What to do: {hint}"
        super().__init__(text)

    def __reduce__(self):  # keep the attributes when crossing a process boundary
        return (_rebuild, (type(self), self.url, self.detail, self.key, self.hint))


def _rebuild(cls, url, message, key, hint):
    return cls(url, message, key=key, hint=hint)


class ShardFormatError(ShardError, ValueError):
    """A shard is not a valid (WebDataset-style) tar archive, or a sample lacks what was asked."""


class ShardAccessError(ShardError, OSError):
    """A shard cannot be opened or read (missing file, permissions, I/O failure)."""


class ShardMapError(ShardError):
    """User code (``map``, a field decoder, ``bucket_by``) failed on a sample, or returned what
    cannot go to DALI; names the shard, the sample and the field or output, with the original
    traceback in the message."""


class WorkerError(DaliShardsError, RuntimeError):
    """A worker process of a sharded pipeline failed or died; says which and what to do."""


_CARRIED = re.compile(r"\[dali_shards error object: ([A-Za-z0-9+/=]+)\]")


class CarriedError(RuntimeError):
    """A worker's dali_shards error on its way through DALI's worker pool (the merge transfer),
    which passes only the text of an exception on: the error, pickled, rides in the text, and the
    main process takes the object back out (``from_worker``)."""

    def __init__(self, exc: BaseException, pickled: bytes):
        payload = base64.b64encode(pickled).decode("ascii")
        super().__init__(f"{type(exc).__name__}: {exc}\n[dali_shards error object: {payload}]")


def carry(exc: BaseException) -> BaseException:
    """``exc`` made fit to cross DALI's worker pool (a ``CarriedError``); as it is if it cannot be
    pickled (the main process then sees DALI's text of it)."""
    try:
        pickled = pickle.dumps(exc)
        pickle.loads(pickled)
    except Exception:  # noqa: BLE001 - an unpicklable error goes as it is
        return exc
    return CarriedError(exc, pickled)


def from_worker(exc: BaseException) -> Optional[BaseException]:
    """The dali_shards error a worker raised (see ``carry``), out of the exception DALI re-raises
    in the main process; None if it carries none."""
    for e in (exc, exc.__cause__, exc.__context__):
        match = _CARRIED.search(str(e)) if e is not None else None
        if match is not None:
            try:
                return pickle.loads(base64.b64decode(match.group(1)))
            except Exception:  # noqa: BLE001 - a damaged text: DALI's own error stands
                return None
    return None
