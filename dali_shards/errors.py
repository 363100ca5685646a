"""Exceptions raised by dali_shards: each names the shard (and sample) at fault and what to do."""

from __future__ import annotations

import json
from typing import Any, Dict, Optional, Type


class DaliShardsError(Exception):
    """Base class of every error dali_shards raises on purpose."""


class ConfigError(DaliShardsError, ValueError):
    """The loader was configured in a way that cannot work (batch sizes, fields, world size...)."""


class UnknownOptionError(ConfigError, TypeError):
    """A keyword that is neither an option, a DALI pipeline parameter nor the function's own."""


class NotAPipelineError(ConfigError, TypeError):
    """Something other than a pipeline made by a ``@sharded_pipeline`` function where one is
    expected (such as the decorated function itself, not called)."""


class ManifestNotFound(ConfigError):
    """The manifest file does not exist."""


class EmptyDatasetError(ConfigError):
    """The shards hold no samples (or too few for even one batch with ``last_batch="drop"``)."""


class RaggedOutputError(ConfigError):
    """An output taken as one dense tensor per batch has samples of different shapes (declare it
    in ``DALIShardedIterator(ragged_outputs=...)``)."""


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


_MARK = "[dali_shards error: "


class CarriedError(RuntimeError):
    """A worker's dali_shards error on its way through DALI's worker pool (the merge transfer),
    which passes only the text of an exception on: its ``carried_fields`` ride at the end of the
    text as one line of JSON, and the main process rebuilds the error from the last such line
    (``from_worker``)."""

    def __init__(self, exc: BaseException, fields: Dict[str, Any]):
        payload = json.dumps(fields).replace("[", "\\u005b")  # no "[" in it: the mark cannot occur inside
        super().__init__(f"{type(exc).__name__}: {exc}\n{_MARK}{payload}]")


def _carried_classes() -> Dict[str, Type[DaliShardsError]]:
    """The errors that may cross from a worker to the main process, by name."""
    return {c.__name__: c for c in (ShardError, ShardFormatError, ShardAccessError, ShardMapError, ConfigError,
                                     UnknownOptionError, EmptyDatasetError, ManifestNotFound, WorkerError)}  # fmt: skip


def carried_fields(exc: BaseException) -> Optional[Dict[str, Any]]:
    """How a worker's error crosses to the main process, whichever the transfer: its class name and
    fields as JSON-able data (data, never code: a shard's keys and a map's traceback are in it);
    None where it is not one of the errors ``rebuilt`` makes again."""
    name = type(exc).__name__
    if _carried_classes().get(name) is not type(exc):
        return None
    if isinstance(exc, ShardError):
        return {"class": name, "url": exc.url, "detail": exc.detail, "key": exc.key, "hint": exc.hint}
    return {"class": name, "message": str(exc)}


def rebuilt(fields: Any) -> Optional[DaliShardsError]:
    """The error ``carried_fields`` describe (a class of the allowlist only); None if they are not
    such fields."""
    try:
        cls = _carried_classes()[fields["class"]]
        if issubclass(cls, ShardError):
            return cls(str(fields["url"]), str(fields["detail"]), key=fields["key"], hint=str(fields["hint"]))
        return cls(str(fields["message"]))
    except (KeyError, TypeError):
        return None


def carry(exc: BaseException) -> BaseException:
    """``exc`` made fit to cross DALI's worker pool (a ``CarriedError``); as it is if it is not one
    of the errors ``rebuilt`` makes again (the main process then sees DALI's text of it)."""
    fields = carried_fields(exc)
    return exc if fields is None else CarriedError(exc, fields)


def from_worker(exc: BaseException) -> Optional[BaseException]:
    """The dali_shards error a worker raised (see ``carry``), rebuilt from the exception DALI
    re-raises in the main process; None if it carries none."""
    for e in (exc, exc.__cause__, exc.__context__):
        text = str(e) if e is not None else ""
        at = text.rfind(_MARK)  # the last: ours ends the message, whatever the message holds before it
        if at < 0:
            continue
        try:
            fields, _ = json.JSONDecoder().raw_decode(text, at + len(_MARK))
        except ValueError:  # a damaged text: DALI's own error stands
            return None
        return rebuilt(fields)
    return None
