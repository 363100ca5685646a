"""Exceptions raised by dali_shards: each names the shard (and sample) at fault and what to do."""

from __future__ import annotations

import ast
import re
from typing import Optional


class DaliShardsError(Exception):
    """Base class of every error dali_shards raises on purpose."""


class ConfigError(DaliShardsError, ValueError):
    """The loader was configured in a way that cannot work (batch sizes, fields, world size...)."""


class UnknownOptionError(ConfigError, TypeError):
    """A keyword that is neither an option, a DALI pipeline parameter nor the function's own."""


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


_SHARD_MESSAGE = re.compile(
    r"shard ('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")(?:, sample ('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"))?: "
    r"(.*?)(?:\. What to do: (.*))?$",
    re.DOTALL,
)
_CLASSES = {
    "ShardError": ShardError,
    "ShardFormatError": ShardFormatError,
    "ShardAccessError": ShardAccessError,
    "ShardMapError": ShardMapError,
}


def from_worker(exc: BaseException) -> Optional[DaliShardsError]:
    """The dali_shards error a worker raised, rebuilt from the exception DALI re-raises in the
    main process (DALI sends only the text), or None if it is not one of ours."""
    text = ""
    for e in (exc, exc.__cause__, exc.__context__):
        if e is not None:
            text += "\n" + str(e)
    match = re.search(r"dali_shards\.errors\.(Shard\w*Error|ConfigError): ", text)
    if match is None:
        return None
    message = text[match.end() :].strip().splitlines()
    if match.group(1) == "ConfigError":  # a user callable that cannot be loaded in a worker
        return ConfigError(message[0]) if message else None
    body = _SHARD_MESSAGE.match("\n".join(message))
    if body is None:
        return None
    url = ast.literal_eval(body.group(1))
    key = ast.literal_eval(body.group(2)) if body.group(2) else None
    hint = (body.group(4) or "").split("\n", 1)[0]  # a hint is one line; DALI may repeat the message after it
    return _CLASSES.get(match.group(1), ShardError)(url, body.group(3), key=key, hint=hint)
