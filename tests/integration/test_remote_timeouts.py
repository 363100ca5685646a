"""Remote reads against slow, stalling, short and unreachable servers: timeouts mean inactivity,
progress survives retries, a range past the end is not retried, and an unreachable server is
named as such."""

import os
import time

import pytest

from dali_shards import ConfigError, ShardAccessError, ShardFormatError
from dali_shards.catalog.manifest import read_manifest
from dali_shards.options import StorageOptions
from dali_shards.io.ranged import RangeReader
from dali_shards.io.remote import RemoteStream
from dali_shards.catalog.sources import resolve_source
from dali_shards.io.storage import open_shard
from dali_shards.testing.servers import HTTPShardServer

pytest.importorskip("aiohttp")
FAST = dict(backoff=0.01, max_backoff=0.05)


@pytest.fixture
def blob_dir(tmp_path):
    rng = __import__("random").Random(7)
    (tmp_path / "blob.bin").write_bytes(bytes(rng.getrandbits(8) for _ in range(600_000)))
    (tmp_path / "even.bin").write_bytes(bytes(range(256)) * 512)  # exactly 2 chunks of 64 KiB
    return tmp_path


@pytest.fixture
def server(blob_dir):
    with HTTPShardServer(str(blob_dir)) as s:
        yield s


def ranges(server):
    return [r for _, r in server.faults.requests]


def test_a_slow_but_steady_server_is_not_timed_out(server, blob_dir):
    """~400 KB/s with a 0.5 s timeout: a 256 KiB request takes 0.65 s, but bytes keep coming."""
    want = (blob_dir / "blob.bin").read_bytes()
    server.faults.rate = 400_000
    cfg = StorageOptions(chunk_size=256 << 10, request_timeout=0.5, retries=1, **FAST)
    with RemoteStream(f"{server.url}/blob.bin", cfg) as s:
        assert s.read(400_000) == want[:400_000]
    assert all(not r.endswith("-") for r in ranges(server))


def test_a_stalled_body_resumes_at_the_first_missing_byte(server, blob_dir):
    want = (blob_dir / "blob.bin").read_bytes()
    server.faults.stall_body, server.faults.stall_after = 1, 100_000
    cfg = StorageOptions(chunk_size=256 << 10, request_timeout=0.5, retries=2, **FAST)
    t = time.monotonic()
    with RemoteStream(f"{server.url}/blob.bin", cfg) as s:
        assert s.read(256 << 10) == want[: 256 << 10]
        assert s.retried == 1
    assert time.monotonic() - t < 5
    got = ranges(server)
    assert got[0] == f"bytes=0-{(256 << 10) - 1}"
    assert got[1] == f"bytes=100000-{(256 << 10) - 1}", "the retry asks only for the missing bytes"


def test_the_object_end_is_never_asked_again(server, blob_dir):
    """Size learned from the first answer: no request past the end, so no 416 retried with backoff."""
    want = (blob_dir / "even.bin").read_bytes()
    cfg = StorageOptions(chunk_size=64 << 10, retries=3, backoff=1.0)
    t = time.monotonic()
    with RemoteStream(f"{server.url}/even.bin", cfg) as s:
        assert s.read() == want
    assert time.monotonic() - t < 1
    assert ranges(server) == ["bytes=0-65535", "bytes=65536-131071"]


def test_a_range_past_the_end_is_reported_at_once(server, blob_dir):
    """The caller expects more bytes than the server has (416 for the rest): an error at once,
    naming both sizes, not five retries with backoff."""
    size = os.path.getsize(blob_dir / "even.bin")
    cfg = StorageOptions(chunk_size=64 << 10, retries=5, backoff=1.0)
    reader = RangeReader(f"{server.url}/even.bin", cfg, size=size + 4096)
    t = time.monotonic()
    with pytest.raises(ShardFormatError, match=f"{size}.*{size + 4096}|{size + 4096}.*{size}") as err:
        reader.read(size, size + 4096)
    assert time.monotonic() - t < 1
    assert err.value.url.endswith("/even.bin") and "dali-shards index" in str(err.value)
    assert len(server.faults.requests) == 1


def test_an_unreachable_server_is_named(blob_dir):
    server = HTTPShardServer(str(blob_dir))
    url, port = server.url, server.port
    server.stop()
    cfg = StorageOptions(retries=1, **FAST)
    for call in (
        lambda: read_manifest(f"{url}/manifest.json", cfg),
        lambda: resolve_source(f"{url}/train-{{0..1}}.tar", config=cfg),
    ):
        with pytest.raises(ConfigError) as err:
            call()
        text = str(err.value)
        assert f"127.0.0.1:{port}" in text and "could not be reached" in text, text
        assert "not valid JSON" not in text
    with pytest.raises(ShardAccessError, match=rf"127\.0\.0\.1:{port} could not be reached.*server is up"):
        open_shard(f"{url}/blob.bin", cfg).read()


class SlowStore:
    """A non-HTTP store (no streaming range API) answering each ranged request only once all of
    it is ready, at ``rate`` bytes/s; logs the ranges asked."""

    def __init__(self, fs, rate):
        self.fs, self.rate, self.calls = fs, rate, []

    def cat_file(self, path, start, end):
        self.calls.append((start, end))
        time.sleep((end - start) / self.rate)
        return self.fs.cat_file(path, start=start, end=end)


def test_timed_out_ranges_are_split_for_a_slow_store():
    import fsspec

    data = bytes(range(256)) * 4096  # 1 MiB
    fsspec.filesystem("memory").pipe_file("/slow/obj.tar", data)
    reader = RangeReader("memory://slow/obj.tar", StorageOptions(request_timeout=0.4, retries=3, **FAST), size=len(data))
    reader.fs = SlowStore(reader.fs, rate=1_000_000)
    assert reader.read(0, len(data)) == data
    calls = reader.fs.calls
    assert calls[:2] == [(0, 1 << 20), (0, 1 << 19)], "a timed-out range is asked again in halves"
    done = [c for c in calls[2:]]
    assert all(e - s <= 1 << 18 for s, e in done) and sorted(done) == done, "then pieces that complete, in order"
    assert done[0][0] == 0 and done[-1][1] == len(data) and all(a[1] == b[0] for a, b in zip(done, done[1:]))
