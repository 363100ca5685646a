"""Remote shards against real servers on localhost: an HTTP server with range requests and fault
injection, and moto's standalone S3 server (behind a TCP proxy that can cut it off)."""

import gzip
import json
import os
import shutil
import time

import pytest

from dali_shards.testing.pipelines import (
    assert_exactly_once,
    epochs_by_rank,
    identity_pipeline,
    index_pipeline,
    jpg_bytes,
    run_epochs,
)
from dali_shards import ConfigError, ShardAccessError, pipeline_info
from dali_shards.io.cache import ShardCache
from dali_shards.cli import main as cli_main
from dali_shards.catalog.manifest import read_manifest
from dali_shards.options import StorageOptions
from dali_shards.io.remote import RemoteStream
from dali_shards.catalog.sources import resolve_source
from dali_shards.io.storage import open_shard, read_ahead
from dali_shards.testing.servers import DelayProxy, HTTPShardServer, S3Server

pytest.importorskip("aiohttp")
SIZES = (11, 0, 17, 3, 16)
PATTERN = "sample-{000000..000004}.tar"
FAST = dict(backoff=0.01, max_backoff=0.05)


@pytest.fixture
def http(shard_dir):
    with HTTPShardServer(str(shard_dir)) as server:
        yield server


@pytest.fixture(scope="module")
def s3(shard_dir):
    pytest.importorskip("s3fs")
    pytest.importorskip("moto")
    server = S3Server()
    server.upload("train", sorted(str(p) for p in shard_dir.iterdir()))
    yield server
    server.stop()


def local_bytes(shard_dir):
    """{canonical index: jpg bytes} read from the local shards."""
    return jpg_bytes(str(shard_dir / PATTERN))


# -- the stream itself ---------------------------------------------------------------------
def test_remote_stream_reads_and_seeks_like_the_file(http, shard_dir):
    path = shard_dir / "sample-000002.tar"
    want = path.read_bytes()
    url = f"{http.url}/sample-000002.tar"
    cfg = StorageOptions(chunk_size=10_000, chunks_ahead=2, **FAST)
    with RemoteStream(url, cfg, size=len(want)) as s:
        assert s.read(5000) == want[:5000]
        s.seek(150_000)  # far ahead: fetching restarts there
        assert s.read(20_000) == want[150_000:170_000]
        early = [r for _, r in http.faults.requests]
        s.seek(1_000)  # back
        assert s.read(3_000) == want[1_000:4_000]
        s.seek(0)
        assert s.read() == want
    assert all(r is not None for _, r in http.faults.requests), "only ranged requests"
    starts = {int(r.split("=")[1].split("-")[0]) for r in early}
    assert 150_000 in starts
    assert not [s for s in starts if 50_000 < s < 150_000], "the bytes seeked over were not fetched"


def test_retries_resume_after_5xx_and_cut_connections(http, shard_dir):
    want = (shard_dir / "sample-000004.tar").read_bytes()
    http.faults.fail, http.faults.cut, http.faults.cut_after = 3, 2, 7000
    cfg = StorageOptions(chunk_size=64 << 10, **FAST)
    stream = RemoteStream(f"{http.url}/sample-000004.tar", cfg)
    with stream:
        assert stream.read() == want
    assert stream.retried == 5
    starts = [int(r.split("=")[1].split("-")[0]) for _, r in http.faults.requests]
    # the failed requests are repeated; a cut one resumes after the bytes read before the cut (all
    # 7000, or fewer when the cut arrived with unread bytes, which aiohttp then drops); the rest are not
    assert starts[:4] == [0, 0, 0, 0] and 0 <= starts[4] <= 7000 and starts[4] <= starts[5] <= 14000
    assert len([s for s in starts if s < 65536]) == 6


def test_gives_up_with_an_error_naming_the_url(http):
    http.faults.fail = 100
    url = f"{http.url}/sample-000000.tar"
    t = time.monotonic()
    with pytest.raises(ShardAccessError, match=r"failed after 3 attempts.*503") as err:
        open_shard(url, StorageOptions(retries=2, **FAST)).read()
    assert err.value.url == url and "server is up" in str(err.value)
    assert time.monotonic() - t < 5


def test_missing_object_is_not_retried(http):
    t = time.monotonic()
    with pytest.raises(ShardAccessError, match="not found"):
        open_shard(f"{http.url}/nope.tar", StorageOptions(retries=5, backoff=1.0)).read()
    assert time.monotonic() - t < 1, "404 is permanent"


def test_stalled_and_stopped_servers_give_errors_not_hangs(http, shard_dir):
    http.faults.stall = 10
    url = f"{http.url}/sample-000000.tar"
    t = time.monotonic()
    with pytest.raises(ShardAccessError, match="TimeoutError"):
        open_shard(url, StorageOptions(retries=1, request_timeout=0.5, **FAST)).read()
    assert time.monotonic() - t < 5
    http.stop()
    t = time.monotonic()
    with pytest.raises(ShardAccessError, match="failed after 2 attempts"):
        open_shard(url, StorageOptions(retries=1, request_timeout=5, **FAST)).read()
    assert time.monotonic() - t < 5


def test_compressed_remote_shard(http, shard_dir, tmp_path):
    raw = (shard_dir / "sample-000000.tar").read_bytes()
    (shard_dir / "zipped.tar.gz").write_bytes(gzip.compress(raw))
    with open_shard(f"{http.url}/zipped.tar.gz", StorageOptions(chunk_size=4096, **FAST)) as f:
        assert f.read() == raw


def test_read_ahead_opens_the_next_shards_early(http):
    urls = [f"{http.url}/sample-{i:06d}.tar" for i in range(5)]
    openers = read_ahead(urls, StorageOptions(read_ahead=2, **FAST))
    with next(openers)():
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            asked = {p for p, _ in http.faults.requests}
            if {"/sample-000001.tar", "/sample-000002.tar"} <= asked:
                break
            time.sleep(0.02)
        assert {"/sample-000001.tar", "/sample-000002.tar"} <= asked, asked
        assert "/sample-000003.tar" not in asked
    openers.close()


# -- counts: manifests beside remote shards ---------------------------------------------------
def test_remote_counts_come_from_the_manifest_beside_the_shards(http):
    shards = resolve_source(f"{http.url}/{PATTERN}")
    assert [s.samples for s in shards] == list(SIZES)
    assert shards[0].url == f"{http.url}/sample-000000.tar" and shards[0].bytes
    with pytest.raises(ConfigError, match=r"dali-shards index .*samples_per_epoch=") as err:
        resolve_source(f"{http.url}/other-{{0..1}}.tar")
    text = str(err.value)  # a read-only server first: a local manifest passed as the source
    assert text.index("--manifest local.json") < text.index("puts manifest.json there")


def test_index_command_on_remote_urls(http, tmp_path, capsys):
    out = tmp_path / "m.json"
    assert cli_main(["index", f"{http.url}/{PATTERN}", "--manifest", str(out), "--quiet"]) == 0
    got = read_manifest(str(out))
    assert [s.samples for s in got] == list(SIZES)
    assert got[0].url == f"{http.url}/sample-000000.tar"
    assert "no .idx files for remote shards" in capsys.readouterr().out
    assert cli_main(["inspect", f"{http.url}/{PATTERN}", "--quiet", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["samples"] == sum(SIZES) and report["bytes"] == sum(s.bytes for s in got)
    assert cli_main(["index", f"{http.url}/{PATTERN}", "--quiet"]) != 0  # HTTP is read-only
    assert "write it locally with --manifest local.json and pass local.json as the source" in capsys.readouterr().err


# -- whole pipelines ------------------------------------------------------------------------------
def test_http_pipeline_with_faults_is_exactly_once(http, shard_dir):
    want = local_bytes(shard_dir)
    http.faults.fail, http.faults.cut, http.faults.cut_after = 4, 3, 3000
    make = index_pipeline(f"{http.url}/{PATTERN}", batch_size=4, py_num_workers=2, world_size=2, shuffle=True, seed=3)
    seen, data, steps, _ = epochs_by_rank(make, world=2)
    assert_exactly_once(seen, sum(SIZES))
    assert data == want
    assert steps[0] == steps[1]
    assert http.faults.fail == 0 and http.faults.cut == 0, "the faults happened and were retried"


def test_s3_pipeline_with_storage_options_and_environment(s3, shard_dir, monkeypatch):
    want = local_bytes(shard_dir)
    make = index_pipeline(f"s3://train/{PATTERN}", batch_size=6, py_num_workers=3, storage_options=s3.storage_options())
    seen, data, _, _ = epochs_by_rank(make, world=1)
    assert_exactly_once(seen, sum(SIZES))
    assert data == want
    for name, value in {
        "AWS_ENDPOINT_URL": s3.endpoint_url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    shards = resolve_source(f"s3://train/{PATTERN}")  # no storage_options: the environment
    assert [s.samples for s in shards] == list(SIZES)


def test_s3_index_writes_the_manifest_beside_the_shards(s3, shard_dir):
    s3.upload("fresh", [str(shard_dir / f"sample-{i:06d}.tar") for i in range(5)])
    opts = s3.storage_options()
    with pytest.raises(ConfigError, match="dali-shards index"):
        resolve_source(f"s3://fresh/{PATTERN}", config=StorageOptions(storage_options=opts))
    assert cli_main(["index", f"s3://fresh/{PATTERN}", "--quiet", "--storage-options", json.dumps(opts)]) == 0
    shards = resolve_source(f"s3://fresh/{PATTERN}", config=StorageOptions(storage_options=opts))
    assert [s.samples for s in shards] == list(SIZES)


def test_s3_cut_off_mid_epoch_is_an_error_not_a_hang(s3):
    from dali_shards.pytorch import DALIShardedIterator

    proxy = DelayProxy(("127.0.0.1", s3.port))
    opts = s3.storage_options(f"http://127.0.0.1:{proxy.port}")
    opts["config_kwargs"] = {"retries": {"max_attempts": 1}, "connect_timeout": 2, "read_timeout": 2}

    make = identity_pipeline(f"s3://train/{PATTERN}", ("__index__", "jpg"), body=lambda i, jpg: (i, jpg.shape()),
                             batch_size=2, py_num_workers=2, storage_options=opts, retries=2, worker_prefetch=1,
                             read_ahead=0, prefetch_queue_depth=1)  # fmt: skip

    it = DALIShardedIterator(make(), ["index", "size"])
    t = time.monotonic()
    with pytest.raises(Exception, match=r"s3://train/sample-0000") as err:
        for n, _ in enumerate(it):
            if n == 1:
                proxy.set_down()
    assert time.monotonic() - t < 60
    assert "server is up" in str(err.value)
    proxy.close()


def test_cache_serves_later_epochs_and_stays_within_its_limit(http, shard_dir, tmp_path):
    cache_dir = tmp_path / "cache"
    make = index_pipeline(
        f"{http.url}/{PATTERN}", batch_size=4, py_num_workers=2, cache_dir=str(cache_dir), read_ahead=1
    )
    pipe = make()
    info = pipeline_info(pipe)
    out = run_epochs(pipe, 1)
    assert sum(len(b[0]) for b in out[0]) >= sum(SIZES)
    cached = sorted(os.listdir(cache_dir))
    # every shard with samples (the empty one is never opened), no leftovers
    assert len([c for c in cached if c.endswith(".shard")]) == 4 and not [c for c in cached if c.endswith(".tmp")]
    shard_requests = lambda: [p for p, _ in http.faults.requests if p.endswith(".tar")]  # noqa: E731
    before = len(shard_requests())
    seen, _, _, _ = epochs_by_rank(make, world=1, epochs=2)
    assert_exactly_once(seen, sum(SIZES))
    assert len(shard_requests()) == before, "later runs read the cache, not the server"
    assert info.spec.shard_sizes == SIZES

    # an LRU bound below the data set: within the limit (what stays depends on the reads the ring's
    # workers began ahead, into the next epoch, and abandoned when the pipeline went: each reserved its
    # room, evicting older entries; test_cache.py checks the limit at every moment)
    small = tmp_path / "small"
    limit = 400_000
    seen, _, _, _ = epochs_by_rank(
        index_pipeline(
            f"{http.url}/{PATTERN}", batch_size=4, py_num_workers=1, cache_dir=str(small), cache_limit=limit
        ),
        world=1,
    )
    assert_exactly_once(seen, sum(SIZES))
    assert ShardCache(str(small)).usage() <= limit


def test_cache_evicts_least_recently_used(tmp_path):
    cache = ShardCache(str(tmp_path), limit=250)
    for i, url in enumerate(["s3://b/a.tar", "s3://b/b.tar", "s3://b/c.tar"]):
        w = cache.writer(url, 100)
        w.write(0, b"x" * 100)
        w.complete()
        os.utime(cache.path_for(url), (1000 + i, 1000 + i))
        if i == 1:
            assert cache.lookup("s3://b/a.tar", 100)  # a is used again: b is now the oldest
    assert cache.lookup("s3://b/b.tar") is None
    assert cache.lookup("s3://b/a.tar", 100) and cache.lookup("s3://b/c.tar", 100)
    assert cache.usage() == 200
    partial = cache.writer("s3://b/d.tar", 100)
    partial.write(0, b"y" * 50)
    partial.abandon()
    assert cache.lookup("s3://b/d.tar") is None and not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]
    assert cache.writer("s3://b/huge.tar", 1000) is None, "larger than the cache: not cached"


def test_file_urls_and_local_paths_mix(shard_dir, tmp_path):
    for name in ("sample-000000.tar", "sample-000001.tar"):
        shutil.copy(shard_dir / name, tmp_path / name)
    shards = resolve_source([f"file://{tmp_path}/sample-000000.tar", str(tmp_path / "sample-000001.tar")])
    assert [s.samples for s in shards] == [11, 0]


def test_a_short_body_is_resumed_at_the_first_missing_byte():
    import fsspec

    from dali_shards.io.ranged import RangeReader

    data = bytes(range(256)) * 400
    fsspec.filesystem("memory").pipe_file("/short/obj.tar", data)

    class Cutting:
        """Answers the first two requests with only part of the body (no error)."""

        def __init__(self, fs):
            self.fs, self.calls = fs, []

        def cat_file(self, path, start, end):
            self.calls.append((start, end))
            got = self.fs.cat_file(path, start=start, end=end)
            return got[: len(got) // 3] if len(self.calls) <= 2 else got

        def size(self, path):  # asked once, when a body comes short of the size expected
            return self.fs.size(path)

    reader = RangeReader("memory://short/obj.tar", StorageOptions(**FAST), size=len(data))
    reader.fs = Cutting(reader.fs)
    assert reader.read(1000, 61000) == data[1000:61000]
    assert reader.fs.calls == [(1000, 61000), (21000, 61000), (34333, 61000)]
    assert reader.retried == 2
