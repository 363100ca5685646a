"""Planned ranged requests: spans grouped into large requests, fetched in the order needed within
a bounded window, failures reported per shard without asking again, no hang on close."""

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dali_shards.errors import ShardAccessError
from dali_shards.io import rangefetch
from dali_shards.io.rangefetch import RangeFetcher, Span, plan_requests, request_size
from dali_shards.options import StorageOptions

OBJECTS = {f"s3://b/{n}.tar": bytes((i * 7 + n) % 251 for i in range(40_000)) for n in range(6)}


class FakeReader:
    """Stands for ``RangeReader``: serves ``OBJECTS``, records requests, fails where told."""

    log = []
    failing = set()
    delay = 0.0
    fetcher = None
    peak = 0

    def __init__(self, url, config, size):
        self.url, self.http, self.size, self.expected = url, True, None, size

    def read(self, lo, hi, cancelled=lambda: False):
        FakeReader.log.append((self.url, lo, hi))
        if FakeReader.fetcher is not None:
            FakeReader.peak = max(FakeReader.peak, FakeReader.fetcher.held)
        time.sleep(FakeReader.delay)
        if self.url in FakeReader.failing:
            raise ShardAccessError(self.url, "read failed after 6 attempts")
        return OBJECTS[self.url][lo:hi]

    read_buffer = read


@pytest.fixture(autouse=True)
def fake(monkeypatch):
    monkeypatch.setattr(rangefetch, "RangeReader", FakeReader)
    FakeReader.log, FakeReader.failing, FakeReader.delay, FakeReader.fetcher, FakeReader.peak = [], set(), 0.0, None, 0
    yield FakeReader


def take(fetcher, i):
    """Span ``i``'s bytes, released once copied (as a reader releases a span once it is packed)."""
    data = bytes(fetcher.take(i))
    fetcher.release(i)
    return data


def interleaved_spans(urls, per_url, size):
    """Consecutive spans of each object, visited round-robin (as an interleaved worker reads)."""
    return [Span(u, len(OBJECTS[u]), k * size, (k + 1) * size) for k in range(per_url) for u in urls]


def test_consecutive_spans_of_an_object_share_requests_up_to_the_size():
    urls = list(OBJECTS)[:3]
    spans = interleaved_spans(urls, 10, 1000)
    reqs = plan_requests(spans, 4000)
    assert len(reqs) == 3 * 3  # 10 spans of 1000 per object in requests of at most 4000: 4 + 4 + 2
    for r in reqs:
        assert r.hi - r.lo <= 4000 and r.lo == spans[r.spans[0]].lo and r.hi == spans[r.spans[-1]].hi
        assert all(spans[a].hi == spans[b].lo for a, b in zip(r.spans, r.spans[1:]))
    assert [r.spans[0] for r in reqs] == sorted(r.spans[0] for r in reqs), "requests in the order first needed"
    gap = [Span(urls[0], None, 0, 100), Span(urls[0], None, 200, 300)]
    assert len(plan_requests(gap, 10_000)) == 2, "a gap starts a new request"
    assert len(plan_requests([Span(urls[0], None, 0, 9000)], 4000)) == 1, "a large span is one request"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 3000)), min_size=1, max_size=60), st.integers(1, 9000))
def test_requests_cover_every_span_once(visits, limit):
    cursor = dict.fromkeys(OBJECTS, 0)
    spans = []
    for n, size in visits:
        url = f"s3://b/{n}.tar"
        lo = cursor[url] if cursor[url] + size <= 40_000 else 0
        spans.append(Span(url, None, lo, lo + size))
        cursor[url] = lo + size
    reqs = plan_requests(spans, limit)
    covered = sorted(i for r in reqs for i in r.spans)
    assert covered == list(range(len(spans)))
    for r in reqs:
        assert all(spans[i].url == r.url and r.lo <= spans[i].lo < spans[i].hi <= r.hi for i in r.spans)


def test_bytes_arrive_right_and_memory_stays_within_the_window(fake):
    urls = list(OBJECTS)
    spans = interleaved_spans(urls, 20, 2000)
    window, request = 30_000, 6000
    with RangeFetcher(spans, StorageOptions(), window, request, threads=4) as fetcher:
        fake.fetcher = fetcher
        for i, s in enumerate(spans):
            assert take(fetcher, i) == OBJECTS[s.url][s.lo : s.hi]
            assert fetcher.held <= window + request
        assert fetcher.held == 0
    assert fake.peak <= window + request
    assert len(fake.log) == len(plan_requests(spans, request)) < len(spans) / 2


def test_a_window_smaller_than_one_request_still_progresses(fake):
    spans = interleaved_spans(list(OBJECTS), 5, 3000)
    with RangeFetcher(spans, StorageOptions(), 1, 9000, threads=2) as fetcher:
        assert [take(fetcher, i) for i in range(len(spans))] == [OBJECTS[s.url][s.lo : s.hi] for s in spans]


def test_a_failing_object_fails_its_spans_and_is_not_asked_again(fake):
    urls = list(OBJECTS)[:3]
    fake.failing = {urls[1]}
    spans = interleaved_spans(urls, 12, 1000)
    with RangeFetcher(spans, StorageOptions(), 10**6, 2000, threads=3) as fetcher:
        for i, s in enumerate(spans):
            if s.url == urls[1]:
                with pytest.raises(ShardAccessError, match="1.tar"):
                    take(fetcher, i)
            else:
                assert take(fetcher, i) == OBJECTS[s.url][s.lo : s.hi]
    assert len([r for r in fake.log if r[0] == urls[1]]) <= 3, "at most the requests already in flight"


def test_close_ends_the_threads_without_a_hang(fake):
    fake.delay = 0.05
    spans = interleaved_spans(list(OBJECTS), 30, 1000)
    fetcher = RangeFetcher(spans, StorageOptions(), 10**6, 1000, threads=4)
    take(fetcher, 0)
    fetcher.close()
    deadline = time.monotonic() + 5
    while any(t.name == "dali_shards-ranges" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not any(t.name == "dali_shards-ranges" for t in threading.enumerate())
    with pytest.raises(RuntimeError, match="after close"):
        take(fetcher, len(spans) - 1)


def test_a_fetcher_started_ahead_shares_the_window_with_the_one_before(fake):
    urls = list(OBJECTS)
    first, second = interleaved_spans(urls[:3], 20, 2000), interleaved_spans(urls[3:], 20, 2000)
    window, request = 30_000, 6000
    peak = []
    with RangeFetcher(first, StorageOptions(), window, request, threads=4) as now:
        while not now.fetched_all and now.held < window - request:  # the window fills with the first's bytes
            time.sleep(0.01)
        ahead = RangeFetcher(second, StorageOptions(), 10 * window, request, threads=4, after=now, shared_window=window)
        for i, s in enumerate(first):
            peak.append(now.held + ahead.held)
            assert take(now, i) == OBJECTS[s.url][s.lo : s.hi]
        time.sleep(0.1)
        assert ahead.requests_made, "it fetched while the one before was read"
        assert max(peak) <= window + request, "the two together within the window (+ one request)"
    time.sleep(0.1)
    assert ahead.held > window, "the one before closed: its own window applies"
    with ahead:
        assert [take(ahead, i) for i in range(len(second))] == [OBJECTS[s.url][s.lo : s.hi] for s in second]
    assert len(fake.log) == len(plan_requests(first, request)) + len(plan_requests(second, request))


def test_request_size_shares_the_window_between_the_pieces():
    assert request_size(128 << 20, 128, 8 << 20) == 512 << 10
    assert request_size(128 << 20, 4, 8 << 20) == 8 << 20, "never above chunk_size"
    assert request_size(1 << 20, 4096, 8 << 20) == rangefetch.MIN_REQUEST


def test_pieces_that_fit_in_the_window_are_fetched_whole():
    mb = 1 << 20
    piece = 3 * mb + (512 << 10)
    assert request_size(128 * mb, 32, 8 * mb, [piece] * 32) >= piece, "one request per piece"
    assert request_size(128 * mb, 16, 8 * mb, [14 * mb] * 16) == 4 * mb, "large pieces share the window"
    assert request_size(128 * mb, 32, 8 * mb, [mb] * 31 + [64 * mb]) == 8 * mb, "one large piece among small ones"


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1 << 20, 1 << 30),
    st.integers(1, 300),
    st.lists(st.integers(0, 1 << 26), max_size=300),
)
def test_the_request_size_keeps_the_pieces_read_at_once_within_the_window(window, at_once, pieces):
    chunk = 8 << 20
    r = request_size(window, at_once, chunk, pieces)
    assert rangefetch.MIN_REQUEST <= r <= chunk
    largest = sorted(pieces, reverse=True)[:at_once] + [2 * chunk] * max(0, at_once - len(pieces))
    if r > rangefetch.MIN_REQUEST:
        assert sum(min(b, 2 * r) for b in largest) <= window, "two requests (or the whole piece) per piece fit"
    if r < chunk:
        assert sum(min(b, 2 * (r + 1)) for b in largest) > window, "and no larger size would"


def test_an_objects_first_requests_are_small_then_grow(monkeypatch):
    monkeypatch.setattr(rangefetch, "MIN_REQUEST", 2000)
    url = list(OBJECTS)[0]
    spans = [Span(url, None, k * 1000, (k + 1) * 1000) for k in range(40)]
    sizes = [r.hi - r.lo for r in plan_requests(spans, 16_000)]
    assert sizes == [2000, 8000, 16000, 14000], "ramped from MIN_REQUEST, RAMP times larger each time"
    sizes = [r.hi - r.lo for r in plan_requests(spans, 16_000, ramp_until=2)]
    assert sizes == [2000, 8000, 16000, 14000][:1] + [16000, 16000, 6000], "no ramp after the first spans"


def test_discarding_an_object_frees_what_was_fetched_of_it(fake):
    urls = list(OBJECTS)[:2]
    spans = interleaved_spans(urls, 10, 1000)
    with RangeFetcher(spans, StorageOptions(), 10**6, 2000, threads=2) as fetcher:
        assert take(fetcher, 0) == OBJECTS[urls[0]][0:1000]
        deadline = time.monotonic() + 5
        while fetcher.held < 15_000 and time.monotonic() < deadline:  # everything fetched ahead
            time.sleep(0.01)
        fetcher.discard(urls[0])
        assert fetcher.held <= 10_000, "only the other object's bytes are left"
        for i, s in enumerate(spans):
            if s.url == urls[1]:
                assert take(fetcher, i) == OBJECTS[s.url][s.lo : s.hi]
        assert fetcher.held == 0


def test_spans_are_views_of_their_request_counted_until_the_last_is_released(fake):
    url = list(OBJECTS)[0]
    spans = [Span(url, None, k * 1000, (k + 1) * 1000) for k in range(6)]
    with RangeFetcher(spans, StorageOptions(), 10**6, 3000, threads=1, ramp_until=0) as fetcher:
        first, second = fetcher.take(0), fetcher.take(1)
        assert isinstance(first, memoryview) and first.obj is second.obj, "views of one buffer, not copies"
        deadline = time.monotonic() + 5
        while not fetcher.fetched_all and time.monotonic() < deadline:
            time.sleep(0.01)
        assert fetcher.held == 6000, "two requests of 3000, nothing released yet"
        fetcher.release(0)
        fetcher.release(1)
        assert fetcher.held == 6000, "a span of the first request is still out"
        take(fetcher, 2)
        assert fetcher.held == 3000, "its last span released: the first request's room is given back"
        assert [take(fetcher, i) for i in range(3, 6)] == [OBJECTS[url][k * 1000 : (k + 1) * 1000] for k in range(3, 6)]
        assert fetcher.held == 0
        fetcher.release(5)  # twice, or after close: nothing
        assert fetcher.held == 0
