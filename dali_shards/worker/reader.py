"""The reading core both worker sources share: a worker's shards opened ahead, their samples read
and packed, and the ``on_error`` policy applied in one place.

A bad sample (an unreadable member, a bad ``.cls``...) becomes a :class:`Skipped` under
``on_error="skip"`` and raises its ``ShardError`` under ``"raise"``. A shard that cannot be read
on (missing, truncated, corrupt compression, a failing server) raises its ``ShardError`` under
``"raise"``; under ``"skip"`` its reading ends with one :class:`ShardFailed`, and the caller
decides what the unread samples become. A cached copy that fails is read again from the server
once, starting after the samples already passed on. Imports no DALI.
"""

from __future__ import annotations

import logging
import lzma
import zlib
from typing import Any, Callable, Iterator, NamedTuple, Optional, Sequence, Tuple, Union

from dali_shards.errors import ShardAccessError, ShardError, ShardFormatError
from dali_shards.io.positioned import sample_in_span
from dali_shards.tar.spans import fast_sample
from dali_shards.io.storage import READ_ERRORS, open_shard, read_ahead, read_attempts
from dali_shards.tar.format import TarReader
from dali_shards.tar.header import printable
from dali_shards.tar.scan import key_fingerprint
from dali_shards.worker.config import WorkerConfig
from dali_shards.ipc.packed import Packed

log = logging.getLogger("dali_shards")
_CHANGED_HINT = "the shard changed after it was counted; rebuild its manifest (dali-shards index) or restart so it is scanned again"


def fewer_than_planned(url: str, found: int, planned: int) -> ShardFormatError:
    """The error of a shard that holds fewer samples than the plan counted."""
    return ShardFormatError(url, f"holds {found} samples, fewer than the {planned} planned", hint=_CHANGED_HINT)


def shard_failed(config: WorkerConfig, url: str, exc: BaseException) -> str:
    """A read error of shard ``url`` under ``on_error``: raised as the shard's ``ShardError`` under
    ``"raise"``; under ``"skip"`` logged, and its detail returned (the rest of the shard is skipped).
    Call it where the error is caught."""
    error = shard_error(url, exc)
    if not config.skips:
        raise error from (None if error is exc else exc)
    log.warning("dali_shards: skipping the rest of shard %s: %s", url, error.detail)
    return error.detail


class Skipped(NamedTuple):
    """A sample that could not be used (``on_error="skip"``): its index, shard, key and why."""

    index: int  # type: ignore[assignment]  # a field named like tuple.index (a public name)
    url: str
    key: Optional[str]
    reason: str


def skipped_again(index: int, url: str, key: Optional[str]) -> Skipped:
    """A sample DALI's operators failed on earlier in the run, skipped again (not logged again)."""
    return Skipped(index, url, key, "DALI's operators failed on it earlier in this run")


class ShardFailed(NamedTuple):
    """The end of a shard that could not be read on (``on_error="skip"``)."""

    url: str
    reason: str


Item = Union[Packed, Skipped]


def shard_error(url: str, exc: BaseException) -> ShardError:
    """A reading failure as an error naming the shard."""
    if isinstance(exc, ShardError):
        return exc
    if isinstance(exc, EOFError):
        return ShardFormatError(url, f"compressed data ends early ({exc})", hint="the shard was cut short; re-create it")
    if isinstance(exc, (zlib.error, lzma.LZMAError)) or "gzip" in str(exc).lower() or "compressed" in str(exc).lower():
        return ShardFormatError(url, f"corrupt compressed data ({exc})", hint="re-create or re-download the shard")
    return ShardAccessError(url, f"read error: {exc}", hint="check the storage holding the shard")


class ShardReader:
    """Reads one worker's shards (``config``); ``progress(shard)`` is called as a shard is opened
    and ``progress()`` for every sample read, so that the watchdog sees the worker move."""

    def __init__(self, config: WorkerConfig, progress: Callable[..., None] = lambda shard=None: None, epoch: int = 0):
        self.config = config
        self.progress = progress
        self.epoch = epoch  # the epoch (streaming: the cycle) user code runs in, for its seeds

    def open_ahead(self, shards: Sequence[int]):
        """Openers of these shards, in order, the next ones opened ahead (close it when done)."""
        cfg = self.config
        return read_ahead([cfg.urls[s] for s in shards], cfg.storage, [cfg.byte_sizes[s] for s in shards])

    def samples(
        self,
        shard: int,
        opener,
        index: Callable[[int], int],
        start: int = 0,
        stop: Optional[int] = None,
        select: Optional[Callable[[int], bool]] = None,
    ) -> Iterator[Union[tuple, ShardFailed]]:
        """``(position in shard, Packed | Skipped)`` of the shard's samples ``[start, stop)`` that
        ``select`` (by position) keeps, in order; ``index(position)`` is a sample's ``__index__``.
        With ``stop`` given, a shard holding fewer samples is a ``ShardFormatError``. Under
        ``on_error="skip"`` a shard that fails ends with a ``ShardFailed``."""
        url = self.config.urls[shard]
        self.progress(shard)
        first = start  # a second attempt (from the server) starts after the samples passed on
        try:
            for attempt in read_attempts(opener):
                with attempt as stream:
                    for position, item in self._read(shard, stream, index, first, stop, select):
                        first = position + 1
                        yield position, item
                    return
        except READ_ERRORS as exc:
            yield ShardFailed(url, shard_failed(self.config, url, exc))

    def sample_at(self, shard: int, position: int, data: Any, span: Tuple[int, int], index: int) -> Item:
        """The shard's sample at ``position`` from the bytes of its ``span``, packed as
        ``__index__`` ``index``; under ``on_error="skip"`` a ``Skipped`` if it is bad."""
        self.progress()
        cfg, url = self.config, self.config.urls[shard]
        if index in cfg.excluded:
            return skipped_again(index, url, None)
        try:
            sample = fast_sample(data, url, position, cfg.codec.extensions) if len(data) == span[1] - span[0] else None
            if sample is None:  # anything out of the ordinary: the general reader accepts or names it
                sample = sample_in_span(data, url, span, position, cfg.codec.extensions, cfg.packing.destination)
        except ShardFormatError as exc:
            if not self.config.skips:
                raise
            log.warning("dali_shards: skipping sample %d of shard %s: %s", position, url, exc.detail)
            return Skipped(index, url, None, exc.detail)
        return self._pack(sample, url, index, shard)

    def read_one(self, shard: int, position: int, index: int) -> Item:
        """The shard's sample at ``position``, packed as ``__index__`` ``index`` (or ``Skipped``)."""
        cfg = self.config
        with open_shard(cfg.urls[shard], cfg.storage, cfg.byte_sizes[shard]) as stream:
            for _, item in self._read(shard, stream, lambda _: index, position, position + 1, None):
                return item
        raise fewer_than_planned(cfg.urls[shard], position, cfg.counts[shard])

    def _pack(self, sample, url: str, index: int, shard: int) -> Item:
        if index in self.config.excluded:
            return skipped_again(index, url, sample.key)
        try:
            self._check_key(sample, shard)
            assert self.config.stage is not None  # WorkerConfig sets it
            return self.config.stage.pack(sample, index, self.epoch)
        except ShardError as exc:
            if not self.config.skips:
                raise
            log.warning("dali_shards: skipping sample %r of shard %s: %s", sample.key, url, exc.detail)
            return Skipped(index, url, sample.key, exc.detail)

    def _check_key(self, sample, shard: int) -> None:
        """A ``ShardFormatError`` if the sample's key is not the one the shard's index recorded at
        its position (the shard was rewritten since, its size unchanged)."""
        recorded = self.config.sample_keys(shard)
        if recorded is None or sample.position >= len(recorded) or key_fingerprint(sample.key) == recorded[sample.position]:
            return
        raise ShardFormatError(
            self.config.urls[shard],
            f"sample {sample.position} has key {printable(sample.key)!r}, not the key the shard's index recorded there: "
            "the shard was rewritten after it was indexed (with the same size)",
            key=sample.key,
            hint="rebuild its manifest (dali-shards index), or restart so that it is scanned again",
        )

    def _read(self, shard, stream, index, start, stop, select):
        cfg, url = self.config, self.config.urls[shard]
        reader = TarReader(stream, url)
        for sample in reader.samples(cfg.codec.extensions, start=start, stop=stop, into=cfg.packing.destination, select=select):
            self.progress()
            yield sample.position, self._pack(sample, url, index(sample.position), shard)
        if stop is not None and reader.samples_seen < stop:
            raise fewer_than_planned(url, reader.samples_seen, self.config.counts[shard])  # planned reads: counted
