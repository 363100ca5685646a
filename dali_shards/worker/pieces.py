"""How a worker reads the samples the plan gives it: contiguous stretches of shards (``read_segments``)
or, when the plan interleaves shards, each sample at its byte span (``read_interleaved``).

Interleaved reading takes every sample by one positioned read of its span (local shards) or from
ranged requests fetched ahead in reading order (remote shards, see ``io.rangefetch``), so a worker
reads parts of hundreds of shards at once without holding a buffer per shard. Memory per worker:
one sample at a time for local shards (plus up to ``MAX_OPEN`` open files); for remote shards
``read_window`` (requests in flight included; a request's buffer is freed once its last sample is
packed, see ``io.rangefetch``) plus one sample being parsed, whatever the dataset's size: requests of
``read_window / 2k`` bytes (at least 256 KiB, at most ``chunk_size``), ``k`` the shards a worker
reads at once (``block / py_num_workers``, or fewer) -- or of a whole piece where the pieces read at
once fit in the window (one request per piece, as many as whole-shard reads make); smaller ones
first for the shards needed in its first ``STARTUP_STEPS`` steps, so that its first batches come
soon. Once every remote request of an epoch is answered, the worker starts the next epoch's reading
(``Interleaved(..., ahead_of=...)``, full-size requests), which fetches while the two together hold
at most ``read_window / AHEAD_SHARE``, so that an epoch's start does not wait on the network (after
the last epoch, up to that much is fetched in vain). A shard whose spans are unknown (compressed, or
not indexed) is read through a cursor of its own from its start, passing over the samples before
this worker's.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any, Callable, Dict, Generator, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from dali_shards.io.positioned import LocalFiles
from dali_shards.io.rangefetch import RangeFetcher, Span, request_size
from dali_shards.io.filesystems import is_remote
from dali_shards.catalog.scan import scan_shard
from dali_shards.errors import WorkerError
from dali_shards.io.storage import local_path
from dali_shards.plan.resume import Plan
from dali_shards.plan.geometry import Stretch
from dali_shards.io.storage import READ_ERRORS
from dali_shards.worker.reader import Item, ShardFailed, ShardReader, Skipped, fewer_than_planned, shard_failed

STARTUP_STEPS = 2  # a shard first needed in a worker's first steps is fetched in growing requests
AHEAD_SHARE = 2  # the next epoch's reading fetches while both hold at most read_window / AHEAD_SHARE
log = logging.getLogger("dali_shards")


def read_segments(
    plan: Plan, segments: List[Stretch], needed: Callable[[int], bool], reader: ShardReader
) -> Generator[Tuple[int, Item], None, None]:
    """(epoch position, packed sample) of the ``needed`` samples in ``segments``, in reading order;
    the others are passed over by their headers. Under ``on_error="skip"`` every needed sample
    left in a shard that cannot be read on comes as a ``Skipped``."""
    openers = reader.open_ahead([seg.shard for seg in segments])
    try:
        for seg, opener in zip(segments, openers):
            yield from _read_segment(plan, seg, opener, needed, reader)
    finally:
        openers.close()


def _read_segment(
    plan: Plan, seg: Stretch, opener: Any, needed: Callable[[int], bool], reader: ShardReader
) -> Generator[Tuple[int, Item], None, None]:
    """``read_segments`` for one segment."""
    offset = int(plan.canonical_starts[seg.shard])
    base = seg.position - seg.first  # sequence position of the shard's sample 0
    done = seg.first

    def index(local: int) -> int:
        return offset + local

    def select(local: int) -> bool:
        return needed(base + local)

    for got in reader.samples(seg.shard, opener, index=index, start=seg.first, stop=seg.stop, select=select):
        if isinstance(got, ShardFailed):  # the rest of the segment's needed samples, skipped
            yield from ((base + local, Skipped(offset + local, got.url, None, got.reason))
                        for local in range(done, seg.stop) if needed(base + local))  # fmt: skip
            return
        local, item = got
        done = local + 1
        yield base + local, item


def positioned(cfg, shard: int) -> bool:
    """Whether a worker reads ``shard``'s samples by their spans with positioned reads: a local
    shard whose sample offsets are known (uncompressed, indexed). Contiguous runs of such shards
    are read so too, in order: one read per sample, no header walk through the samples between."""
    return cfg.spans_known(shard) and not is_remote(cfg.urls[shard])


def local_offsets(reader: ShardReader, shard: int) -> Optional[np.ndarray]:
    """A shard's sample offsets: known from the catalog (loaded from its sample table where it is in
    one), else, for a local shard, from a scan of its headers (once per process; None for a
    compressed shard). Errors opening it are the shard's."""
    cfg = reader.config
    if cfg.spans_known(shard) or is_remote(cfg.urls[shard]):
        return cfg.sample_offsets(shard)
    return scan_shard(cfg.urls[shard], config=cfg.storage).offsets


def stretches(order: np.ndarray, shards: np.ndarray, local: np.ndarray) -> Dict[int, Stretch]:
    """Per shard, the stretch from the first to the last of its samples in ``order``."""
    out = {}
    by_shard = np.lexsort((local, shards))
    cuts = np.flatnonzero(np.diff(shards[by_shard])) + 1
    for group in np.split(by_shard, cuts):
        if len(group):
            first, last = group[0], group[-1]
            out[int(shards[first])] = Stretch(int(shards[first]), int(local[first]), int(local[last]) + 1, int(order[first]))
    return out


class Interleaved:
    """One epoch's interleaved reading (see ``read_interleaved``); its remote spans are fetched
    from the start. ``ahead_of``: the reading of the epoch before, still going on (this one then
    shares its window and makes full-size requests)."""

    def __init__(
        self,
        plan: Plan,
        order: Sequence[int],
        needed,
        reader: ShardReader,
        ahead_of: Optional["Interleaved"] = None,
    ):
        self.plan, self.needed, self.reader = plan, needed, reader
        self.cfg = cfg = reader.config
        self.order = np.asarray(order, dtype=np.int64)
        shards, local = plan.locate(self.order)
        self.shards, self.local = shards.tolist(), local.tolist()
        self.offsets: Dict[int, Optional[np.ndarray]] = {}
        self.failed: Dict[int, str] = {}
        self.cursors: Dict[int, Generator[Tuple[int, Item], None, None]] = {}
        self.held: Dict[int, Dict[int, Item]] = {}  # per shard read through a cursor: samples read ahead of their turn
        self.stretches: Optional[Dict[int, Stretch]] = None
        self.left = Counter(self.shards)
        self.files = LocalFiles()
        self.remote: Dict[int, int] = {}  # position in the order -> span index of the fetcher
        spans: List[Span] = []
        remote = sorted({s for s in self.shards if is_remote(cfg.urls[s]) and cfg.spans_known(s)})
        cfg.tables.prefetch(remote, cfg.urls, cfg.counts, cfg.byte_sizes)  # one request each, at once
        for k, (s, i) in enumerate(zip(self.shards, self.local)):
            offs = cfg.sample_offsets(s) if s in remote or cfg.offsets[s] is not None else None
            if offs is not None and is_remote(cfg.urls[s]):
                self.remote[k] = len(spans)
                spans.append(Span(cfg.urls[s], cfg.byte_sizes[s], int(offs[i]), int(offs[i + 1])))
        self.fetcher: Optional[RangeFetcher] = None
        if spans:  # a worker reads about block / py_num_workers shards at once (see plan.legacy_interleave)
            window = cfg.storage.read_window
            at_once = min(len(set(self.shards)), -(-plan.block // cfg.spec.py_num_workers) + 1)
            per_shard: Counter[str] = Counter()
            for sp in spans:
                per_shard[sp.url] += sp.hi - sp.lo
            request = request_size(window, at_once, cfg.storage.chunk_size, list(per_shard.values()))
            ramp = sum(1 for k in self.remote if k < STARTUP_STEPS * cfg.spec.mini_batch)
            before = ahead_of.fetcher if ahead_of is not None else None  # then full-size requests
            self.fetcher = RangeFetcher(spans, cfg.storage, window, request, ramp_until=0 if before else ramp,
                                        after=before, shared_window=window // AHEAD_SHARE)  # fmt: skip

    def index_of(self, k: int) -> int:
        """``__index__`` of the sample at place ``k`` of the order."""
        return int(self.plan.canonical_starts[self.shards[k]]) + self.local[k]

    def item(self, k: int) -> Item:
        """The sample at place ``k`` of the order, read on its own (local shards)."""
        return self._sample(k, int(self.order[k]), self.shards[k], self.local[k])

    def __iter__(self) -> Iterator[Tuple[int, Item]]:
        for k, (pos, s, i) in enumerate(zip(self.order.tolist(), self.shards, self.local)):
            self.left[s] -= 1
            yield pos, self._sample(k, pos, s, i)
            if not self.left[s] and s in self.cursors:
                self.cursors.pop(s).close()
                self.held.pop(s, None)

    def _sample(self, k: int, pos: int, s: int, i: int) -> Item:
        cfg, reader = self.cfg, self.reader
        index = int(self.plan.canonical_starts[s]) + i
        if s in self.failed:
            return Skipped(index, cfg.urls[s], None, self.failed[s])
        try:
            reader.progress(s)  # the shard of the sample at hand: what the watchdog names if it stops here
            if s not in self.offsets:
                self.offsets[s] = self._offsets(s)
            offs = self.offsets[s]
            if offs is None:
                return self._from_cursor(pos, s)
            span = (int(offs[i]), int(offs[i + 1]))
            if k in self.remote:
                assert self.fetcher is not None  # there are remote spans
                data: Union[memoryview, np.ndarray] = self.fetcher.take(self.remote[k])
            else:
                path = local_path(cfg.urls[s])
                assert path is not None  # not remote: a local shard
                data = self.files.read(cfg.urls[s], path, span, cfg.byte_sizes[s])
        except READ_ERRORS as exc:
            self.failed[s] = shard_failed(cfg, cfg.urls[s], exc)
            if self.fetcher is not None:
                self.fetcher.discard(cfg.urls[s])
            return Skipped(index, cfg.urls[s], None, self.failed[s])
        try:
            return reader.sample_at(s, i, data, span, index)
        finally:
            if k in self.remote:  # packed (or failed): its request's buffer is freed with its last span
                del data
                assert self.fetcher is not None
                self.fetcher.release(self.remote[k])

    def _offsets(self, s: int) -> Optional[np.ndarray]:
        cfg = self.cfg
        offs = local_offsets(self.reader, s)
        if offs is not None and len(offs) - 1 < cfg.counts[s]:
            raise fewer_than_planned(cfg.urls[s], len(offs) - 1, cfg.counts[s])
        return offs

    def _from_cursor(self, pos: int, s: int) -> Item:
        """The shard's next sample for this worker, read by a cursor over the stretch it reads."""
        held = self.held.setdefault(s, {})
        if pos in held:
            return held.pop(pos)
        for fresh in (False, True):  # the cursor has passed ``pos`` (drawn again, or read out of order): a new one
            cursor = self.cursors.get(s)
            if cursor is None or fresh:
                if self.stretches is None:
                    self.stretches = stretches(self.order, np.asarray(self.shards), np.asarray(self.local))
                if cursor is not None:
                    cursor.close()
                cursor = self.cursors[s] = read_segments(self.plan, [self.stretches[s]], self.needed, self.reader)
            for got, item in cursor:
                if got == pos:
                    return item
                held[got] = item  # read ahead of its turn: kept for it
        raise WorkerError(f"dali_shards internal error: position {pos} is not in its shard's stretch; please report it")

    def close(self) -> None:
        for cursor in self.cursors.values():
            cursor.close()
        self.files.close()
        if self.fetcher is not None:
            self.fetcher.close()


def read_interleaved(reading: Interleaved) -> Generator[Tuple[int, Item], None, None]:
    """(epoch position, packed sample) of the positions in a worker's reading order under an
    interleaving plan, in that order (see the module), and the reading closed at the end. Under
    ``on_error="skip"`` a shard that cannot be read makes its samples ``Skipped``, as does a bad
    sample itself."""
    try:
        yield from reading
    finally:
        reading.close()
