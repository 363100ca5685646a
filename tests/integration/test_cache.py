"""The local shard cache: only complete, size-confirmed copies are published; a copy that fails
to read is evicted and the shard read from its server again (once); temporary files of dead
processes are removed, those of live ones counted."""

import os
import select
import signal
import subprocess
import sys
import tarfile
import textwrap

import pytest

import dali_shards
from dali_shards.testing.pipelines import run_epochs
from dali_shards import ShardFormatError, sharded_pipeline
from dali_shards.io.cache import ShardCache
from dali_shards.options import StorageOptions
from dali_shards.sample_data import write_sample_shards
from dali_shards.io.storage import open_shard, read_ahead
from dali_shards.io.tarformat import TarReader
from dali_shards.testing.servers import HTTPShardServer

pytest.importorskip("aiohttp")
FAST = dict(backoff=0.01, max_backoff=0.05)
SIZES = (5, 7, 6)


@pytest.fixture
def served(tmp_path):
    """Shards without a manifest (the streaming mode's case), served over HTTP."""
    d = tmp_path / "served"
    d.mkdir()
    paths = write_sample_shards(str(d), shard_sizes=SIZES)
    with HTTPShardServer(str(d)) as server:
        yield server, paths


def cfg(tmp_path, **kw):
    return StorageOptions(cache_dir=str(tmp_path / "cache"), chunk_size=16 << 10, **FAST, **kw)


def cached_files(tmp_path):
    return sorted(os.listdir(tmp_path / "cache")) if (tmp_path / "cache").exists() else []


# -- 10.5: publish only complete, confirmed copies ----------------------------------------------
def test_a_body_cut_short_is_neither_delivered_nor_cached_as_complete(served, tmp_path):
    """A response that ends early without an error (no Content-Length, connection closed) used to
    end the shard there, and the cut copy was cached for good."""
    server, paths = served
    want = open(paths[1], "rb").read()
    server.faults.short, server.faults.short_after = 1, 5000
    url = f"{server.url}/sample-000001.tar"
    config = cfg(tmp_path)
    with open_shard(url, config) as f:
        assert f.read() == want
    cache = ShardCache(config.cache_dir)
    assert open(cache.path_for(url), "rb").read() == want
    with open_shard(url, config) as f:  # from the cache now
        assert f.read() == want


def test_a_copy_of_unconfirmed_size_is_not_published(served, tmp_path):
    server, paths = served
    server.faults.sizeless = True  # no Content-Length, no Content-Range, HEAD without a size
    url = f"{server.url}/sample-000002.tar"
    config = cfg(tmp_path)
    with open_shard(url, config) as f:
        assert f.read() == open(paths[2], "rb").read()
    assert [f for f in cached_files(tmp_path) if f != ".lock"] == []


def read_keys(opener, url):
    from dali_shards.io.storage import read_attempts

    keys = []
    for attempt in read_attempts(opener):
        with attempt as stream:
            for sample in TarReader(stream, url).samples(start=len(keys)):
                keys.append(sample.key)
    return keys


def test_a_damaged_cached_copy_is_evicted_and_read_from_the_server_once(served, tmp_path, caplog):
    server, paths = served
    url = f"{server.url}/sample-000001.tar"
    config = StorageOptions(cache_dir=str(tmp_path / "cache"), **FAST)  # one chunk: the re-read skips within it
    want = open(paths[1], "rb").read()
    cache = ShardCache(config.cache_dir)
    copy = cache.path_for(url)
    damaged = bytearray(want)
    with tarfile.open(paths[1]) as tar:
        third = tar.getmembers()[2].offset  # the header of the second sample's first member
    damaged[third + 10] ^= 0xFF  # its checksum fails
    open(copy, "wb").write(bytes(damaged))
    (opener,) = list(read_ahead([url], config, [len(want)]))
    with caplog.at_level("WARNING", logger="dali_shards"):
        keys = read_keys(opener, url)
    assert keys == [f"{i:06d}" for i in range(5, 12)], "every sample once, none twice"
    assert [r for r in server.faults.requests if r[0].endswith("000001.tar")], "read from the server"
    assert open(copy, "rb").read() == want, "the copy was replaced by the server's"
    text = caplog.text
    assert copy in text and url in text and "evicted" in text


def test_a_server_copy_that_fails_to_read_is_not_kept(served, tmp_path):
    """A shard the server itself serves truncated fails with an error naming its URL, and leaves
    no cached copy behind: once the server has it whole, it is read whole."""
    server, paths = served
    url = f"{server.url}/sample-000002.tar"
    config = cfg(tmp_path)
    whole = open(paths[2], "rb").read()
    open(paths[2], "wb").write(whole[: len(whole) // 2])
    (opener,) = list(read_ahead([url], config))
    with pytest.raises(ShardFormatError) as err:
        read_keys(opener, url)
    assert err.value.url == url
    assert not [f for f in cached_files(tmp_path) if f.endswith(".shard")]
    open(paths[2], "wb").write(whole)
    (opener,) = list(read_ahead([url], config))
    assert len(read_keys(opener, url)) == SIZES[2]


def stream_pipeline(source, cache_dir):
    @sharded_pipeline(
        source,
        fields=("__index__", "jpg"),
        batch_size=2,
        py_num_workers=1,
        samples_per_epoch=sum(SIZES),
        cache_dir=cache_dir,
        num_threads=1,
        device_id=None,
    )
    def pipe(index, jpg):
        return index, jpg

    return pipe


def test_streaming_mode_recovers_from_a_truncated_cached_copy(served, tmp_path):
    """The issue's case: streaming mode, no manifest, a cache holding a cut copy (as older
    versions stored it): the copy is evicted and read again from the server (with a warning naming
    it: see the test above) instead of failing every run."""
    server, paths = served
    cache = ShardCache(str(tmp_path / "cache"))
    url = f"{server.url}/sample-000000.tar"
    open(cache.path_for(url), "wb").write(open(paths[0], "rb").read()[:2500])
    pipe = stream_pipeline(f"{server.url}/sample-{{000000..000002}}.tar", str(tmp_path / "cache"))()
    (epoch,) = run_epochs(pipe, 1)
    assert sum(len(b[0]) for b in epoch) >= sum(SIZES)
    assert open(cache.path_for(url), "rb").read() == open(paths[0], "rb").read(), "read again and cached whole"


def test_planned_mode_recovers_from_a_damaged_cached_copy(served, tmp_path):
    """With a manifest (sizes known): a cached copy of the right size but a damaged header is
    evicted and read from the server; every sample arrives exactly once."""
    from collections import Counter

    from dali_shards.catalog.manifest import scan_shards, write_manifest

    server, paths = served
    write_manifest(os.path.join(os.path.dirname(paths[0]), "manifest.json"), scan_shards(paths))
    cache = ShardCache(str(tmp_path / "cache"))
    url = f"{server.url}/sample-000002.tar"
    damaged = bytearray(open(paths[2], "rb").read())
    with tarfile.open(paths[2]) as tar:
        damaged[tar.getmembers()[4].offset + 20] ^= 0xFF
    open(cache.path_for(url), "wb").write(bytes(damaged))

    @sharded_pipeline(
        f"{server.url}/sample-{{000000..000002}}.tar",
        fields=("__index__", "__valid__"),
        batch_size=2,
        py_num_workers=2,
        cache_dir=str(tmp_path / "cache"),
        num_threads=1,
        device_id=None,
    )
    def pipe(index, valid):
        return index, valid

    (epoch,) = run_epochs(pipe(), 1)
    seen = Counter(int(i) for index, valid in epoch for i, v in zip(index, valid) if v)
    assert sorted(seen) == list(range(sum(SIZES))) and max(seen.values()) == 1
    assert open(cache.path_for(url), "rb").read() == open(paths[2], "rb").read()


# -- 10.12: temporary files ---------------------------------------------------------------------
WRITER = textwrap.dedent(
    """
    import sys, time
    from dali_shards.io.cache import ShardCache
    w = ShardCache(sys.argv[1]).writer("s3://b/killed.tar", 300_000)
    w.write(0, b"k" * 100_000)
    w._file.flush()
    print("ready", flush=True)
    time.sleep(60)
    """
)


def test_temp_files_of_killed_workers_are_removed_and_live_ones_counted(tmp_path):
    d = str(tmp_path / "cache")
    os.makedirs(d)
    root = os.path.dirname(os.path.dirname(os.path.abspath(dali_shards.__file__)))
    env = dict(os.environ, PYTHONPATH=root)
    proc = subprocess.Popen([sys.executable, "-c", WRITER, d], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert select.select([proc.stdout], [], [], 60)[0], "the writer did not start within 60 s"
        assert proc.stdout.readline().strip() == "ready"
        live = ShardCache(d)
        assert live.usage() == 100_000, "a live writer's temporary file counts"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    temps = [f for f in os.listdir(d) if f.endswith(".tmp")]
    assert len(temps) == 1, "the killed writer left its temporary file"
    cache = ShardCache(d)  # a new start cleans it
    assert not [f for f in os.listdir(d) if f.endswith(".tmp")]
    assert cache.usage() == 0


def test_live_temp_files_count_towards_the_limit(tmp_path):
    cache = ShardCache(str(tmp_path), limit=250)
    writing = cache.writer("s3://b/big.tar", 120)
    writing.write(0, b"w" * 120)
    for i, url in enumerate(["s3://b/a.tar", "s3://b/b.tar"]):
        w = cache.writer(url, 100)
        w.write(0, b"x" * 100)
        w.complete(100)
        os.utime(cache.path_for(url), (1000 + i, 1000 + i))
    assert cache.usage() <= 250, "a copy was evicted to leave room for the one being written"
    assert cache.lookup("s3://b/a.tar") is None and cache.lookup("s3://b/b.tar", 100)
    writing.abandon()
    assert cache.usage() == 100
