"""Remote byte ranges wanted in a known order, fetched ahead in large ranged requests within a
bounded window of memory.

A worker that reads pieces of many remote shards at once (the interleaved shuffle) knows, at the
start of an epoch, every sample span it will read and in which order. ``RangeFetcher`` groups
the spans that follow each other in a shard into requests of up to ``request_bytes`` (never one
request per sample, unless a sample is that large; an object's first requests are smaller, from
256 KiB up, so that the first samples of many shards arrive soon), issues the requests in the order their first
span is needed from ``FETCH_THREADS`` threads, and keeps fetching ahead while the bytes of the
requests in flight or not yet released stay within ``window``. The request the reader waits for is
always issued, so it never deadlocks. A request's bytes arrive in one buffer of its size, filled in
place; each span it holds is a view of that buffer (no copy), which the reader takes (:meth:`take`)
and releases once it has used it (:meth:`release`); the buffer is freed, and its bytes no longer
counted, when the last of its spans is released. Memory: ``window`` (the bytes counted), plus the
HTTP client's buffer of each request arriving (at most about 128 KiB each).

A fetcher made ahead of time (the next epoch's, see ``worker/pieces.py``) may share a smaller
window with the one before it (``after``): until that one closes, the two together hold at most
``shared_window`` bytes; then its own ``window`` applies.

A request that fails (after ``RangeReader``'s retries) fails every span it holds, and every later
span of the same shard without asking the server again: the shard is reported once, not once per
sample. A reader that gives up on a shard says so (``discard``): what is fetched of it is freed
(and no longer counted).
"""

from __future__ import annotations

import threading
from typing import Dict, List, NamedTuple, Optional, Sequence, Set, Tuple, Union

from dali_shards.errors import ShardError
from dali_shards.io.ranged import Cancelled, RangeReader
from dali_shards.options import StorageOptions

FETCH_THREADS = 8
MIN_REQUEST = 256 << 10
RAMP = 4
POLL_S = 0.02  # how often a fetcher waiting on the bytes of the one before it looks again


class Span(NamedTuple):
    """Bytes ``[lo, hi)`` of the object at ``url``, whose size is ``size`` (None: not known)."""

    url: str
    size: Optional[int]
    lo: int
    hi: int


class _Request(NamedTuple):
    url: str
    size: Optional[int]
    lo: int
    hi: int
    spans: List[int]  # indices of the spans it holds, in order


def plan_requests(spans: Sequence[Span], request_bytes: int, ramp_until: Optional[int] = None) -> List[_Request]:
    """Requests covering ``spans``, in the order their first span is needed: each span joins the
    last request of its object when it begins where that one ends and the request stays within
    its size, ``request_bytes``. Requests beginning before span ``ramp_until`` (all, by default)
    ramp up: an object's first is ``MIN_REQUEST`` (or ``request_bytes`` if smaller), each next one
    ``RAMP`` times larger, so that the first samples of many objects arrive soon."""
    ramp_until = len(spans) if ramp_until is None else ramp_until
    first = min(request_bytes, MIN_REQUEST)
    requests: List[_Request] = []
    last: Dict[str, Tuple[int, int]] = {}  # url -> (its last request, its requests so far)
    for i, span in enumerate(spans):
        r, made = last.get(span.url, (-1, 0))
        if r >= 0:
            req = requests[r]
            ramped = req.spans[0] < ramp_until and made < 16
            limit = min(request_bytes, first * RAMP ** (made - 1)) if ramped else request_bytes
            if req.hi == span.lo and span.hi - req.lo <= limit:
                requests[r] = req._replace(hi=span.hi)
                req.spans.append(i)
                continue
        last[span.url] = (len(requests), made + 1)
        requests.append(_Request(span.url, span.size, span.lo, span.hi, [i]))
    return requests


class RangeFetcher:
    """The bytes of ``spans``, taken in any order with :meth:`take` and released with :meth:`release`
    (see the module). ``close`` stops the fetching (threads end after their current request)."""

    def __init__(
        self,
        spans: Sequence[Span],
        config: StorageOptions,
        window: int,
        request_bytes: int,
        threads: Optional[int] = None,
        ramp_until: Optional[int] = None,
        after: Optional["RangeFetcher"] = None,
        shared_window: Optional[int] = None,
    ):
        self._spans = list(spans)
        self._after = after
        self._shared_window = window if shared_window is None else shared_window
        self._config = config
        self._window = window
        self._requests = plan_requests(self._spans, request_bytes, ramp_until)
        self._request_of = [0] * len(self._spans)
        for r, req in enumerate(self._requests):
            for i in req.spans:
                self._request_of[i] = r
        self._cond = threading.Condition()
        self._ready: Dict[int, memoryview] = {}  # span -> its bytes, a view of its request's buffer
        self._unreleased: Dict[int, int] = {}  # answered request -> its spans not released yet
        self._errors: Dict[int, BaseException] = {}
        self._failed: Dict[str, BaseException] = {}
        self._discarded: Set[str] = set()
        self._readers: Dict[str, RangeReader] = {}
        self._next = 0  # the next request to issue
        self._held = 0  # bytes of the requests in flight or not released
        self._in_flight = 0  # requests issued and not answered
        self._waiting = -1  # the request the reader waits for
        self._closed = False
        self.requests_made = 0
        for _ in range(min(threads or FETCH_THREADS, len(self._requests))):
            threading.Thread(target=self._run, daemon=True, name="dali_shards-ranges").start()

    @property
    def held(self) -> int:
        """Bytes of the requests in flight, or answered and holding spans not yet released."""
        return self._held

    @property
    def fetched_all(self) -> bool:
        """Every request has been answered (or has failed): nothing more will be asked."""
        return self._next >= len(self._requests) and not self._in_flight

    def take(self, i: int) -> memoryview:
        """The bytes of span ``i`` (waits for them; release them after use); the error of its
        request if it failed."""
        r = self._request_of[i]
        with self._cond:
            while i not in self._ready and r not in self._errors:
                if self._closed:
                    raise RuntimeError("dali_shards: RangeFetcher used after close()")
                self._waiting = r
                self._cond.notify_all()
                self._cond.wait()
            if i not in self._ready:
                raise self._errors[r]
            return self._ready.pop(i)

    def release(self, i: int) -> None:
        """The reader is done with the bytes of span ``i`` (taken): once every span of its request
        is, the request's buffer is freed and its room in the window given back."""
        r = self._request_of[i]
        with self._cond:
            left = self._unreleased.get(r)
            if left is None:  # failed, discarded or closed
                return
            if left > 1:
                self._unreleased[r] = left - 1
                return
            del self._unreleased[r]
            self._held -= self._requests[r].hi - self._requests[r].lo
            self._cond.notify_all()

    def discard(self, url: str) -> None:
        """The reader takes no more spans of ``url`` (it gave up on that shard): free what is
        fetched of it and ask for no more."""
        with self._cond:
            self._discarded.add(url)
            self._failed.setdefault(url, RuntimeError(f"dali_shards: {url} discarded by the reader"))
            for i in [i for i in self._ready if self._spans[i].url == url]:
                del self._ready[i]
            for r in [r for r in self._unreleased if self._requests[r].url == url]:
                del self._unreleased[r]
                self._held -= self._requests[r].hi - self._requests[r].lo
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._ready.clear()
            self._unreleased.clear()
            self._cond.notify_all()

    # -- fetching threads --------------------------------------------------------------------
    def _may_issue(self) -> bool:
        if self._next >= len(self._requests):
            return False
        req = self._requests[self._next]
        before = self._after
        if before is not None and before._closed:
            before = self._after = None
        if before is None:
            held, window = self._held, self._window
        else:
            held, window = self._held + before.held, self._shared_window
        return self._next <= self._waiting or held + (req.hi - req.lo) <= window

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and self._next < len(self._requests) and not self._may_issue():
                    self._cond.wait(POLL_S if self._after is not None else None)
                if self._closed or self._next >= len(self._requests):
                    return
                r, self._next = self._next, self._next + 1
                req = self._requests[r]
                self._held += req.hi - req.lo
                self._in_flight += 1
                self.requests_made += 1
                failed = self._failed.get(req.url)
            try:
                if failed is not None:
                    raise failed
                data = self._fetch(req)
            except Cancelled:
                return
            except BaseException as exc:  # noqa: BLE001 - handed to take()
                with self._cond:
                    self._in_flight -= 1
                    self._held -= req.hi - req.lo
                    self._errors[r] = exc
                    if isinstance(exc, (ShardError, OSError)):
                        self._failed.setdefault(req.url, exc)
                    self._cond.notify_all()
                continue
            with self._cond:
                self._in_flight -= 1
                if self._closed:
                    return
                if req.url in self._discarded:  # the reader gave up on this object meanwhile
                    self._held -= req.hi - req.lo
                    self._cond.notify_all()
                    continue
                view = memoryview(data)
                for i in req.spans:  # views of the request's buffer, which lives until they are released
                    span = self._spans[i]
                    self._ready[i] = view[span.lo - req.lo : span.hi - req.lo]
                self._unreleased[r] = len(req.spans)
                self._cond.notify_all()
            del data, view

    def _fetch(self, req: _Request) -> Union[bytes, bytearray]:
        with self._cond:
            reader = self._readers.get(req.url)
            if reader is None:
                reader = self._readers[req.url] = RangeReader(req.url, self._config, req.size)
        if not reader.http and reader.size is None and reader.expected is not None:
            reader.object_size()  # once per object and process: a changed object is a ShardFormatError
        return reader.read_buffer(req.lo, req.hi, cancelled=lambda: self._closed)

    def __enter__(self) -> "RangeFetcher":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def request_size(window: int, pieces: int, chunk_size: int, piece_bytes: Sequence[int] = ()) -> int:
    """Bytes per request when ``pieces`` pieces are read at once within ``window``: the largest size
    (at least ``MIN_REQUEST``, at most ``chunk_size``) that leaves room for two requests per piece
    (the one being read and the next) -- or for a whole piece, where a piece is smaller than two
    requests. ``piece_bytes``: the bytes of each piece read (any order; unknown: all large)."""
    largest = sorted((int(b) for b in piece_bytes), reverse=True)[:pieces]
    largest += [chunk_size * 2] * (pieces - len(largest))

    def held(r: int) -> int:
        return sum(min(b, 2 * r) for b in largest)

    lo, hi = MIN_REQUEST, max(MIN_REQUEST, chunk_size)
    if held(lo) > window:
        return lo
    while lo < hi:  # held() grows with r: the largest r whose pieces fit
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if held(mid) <= window else (lo, mid - 1)
    return lo
