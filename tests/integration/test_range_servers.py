"""Servers that do not honour HTTP ``Range``: one that ignores it (200 and the whole file, as
``python -m http.server`` answers) is detected, warned about once, and read whole shard by whole
shard in one GET each; one that answers a range with 200 and only the range's bytes is reported as
breaking the Range protocol, not as a shard that changed after it was indexed."""

import logging
import os

import pytest

from dali_shards import ShardAccessError, ShardFormatError, pipeline_info
from dali_shards.io.remote import RemoteStream
from dali_shards.io.storage import open_shard
from dali_shards.options import StorageOptions
from dali_shards.testing.pipelines import assert_exactly_once, epochs_by_rank, index_pipeline, run_epochs
from dali_shards.testing.servers import HTTPShardServer

pytest.importorskip("aiohttp")
SIZES = (6, 9, 4, 8, 7, 5, 10, 3, 8, 6)
PATTERN = "r-{000000..000009}.tar"
FAST = dict(backoff=0.01, max_backoff=0.05)


@pytest.fixture(autouse=True)
def forget_servers():
    """What this process learned of a server (its port may be reused by the next test's)."""
    yield
    from dali_shards.io import rangesupport

    rangesupport.forget()


def shard_gets(server):
    return [r for p, r in server.faults.requests if p.endswith(".tar")]


def warnings_about(caplog, server):
    return [r for r in caplog.records if r.levelno == logging.WARNING and server.url in r.getMessage()]


def test_a_server_ignoring_range_is_read_shard_by_shard_in_one_get_each(shard_dir, caplog):
    """The issue's case: a shuffled 2-epoch run (interleaving by default) against a server that
    answers every ranged GET with the whole shard used to make one whole-shard request per piece a
    worker read (each worker a piece of every shard, the next epoch's fetched ahead too)."""
    with HTTPShardServer(str(shard_dir)) as http, caplog.at_level(logging.WARNING, logger="dali_shards"):
        http.faults.ignore_range = True
        make = index_pipeline(f"{http.url}/{PATTERN}", batch_size=4, py_num_workers=2, shuffle=True, seed=7)
        seen, _, _, pipes = epochs_by_rank(make, 1, epochs=2)
        gets = shard_gets(http)
    assert_exactly_once(seen, sum(SIZES))
    info = pipeline_info(pipes[0])
    # (the ring's workers begin the next epoch while the last one is taken: its first reads count too)
    reads = sum(len([s for s in info.plan(e).worker_reads(v) if s.stop > s.first]) for e in range(3) for v in range(2))
    assert len(gets) <= reads + 1, f"{len(gets)} GETs for {reads} shard reads (+ the probe's)"
    assert not info.plan(0).interleaving, "contiguous runs: whole shards streamed"
    (warning,) = warnings_about(caplog, http)
    assert "ignores" in warning.getMessage() and "whole" in warning.getMessage()


def test_a_whole_shard_is_streamed_in_one_get_not_one_per_chunk(shard_dir, caplog):
    """``RemoteStream`` used to ask for ``chunk_size`` bytes at a time, each answered with the whole
    shard: quadratic in the shard's size. Now one GET, delivered chunk by chunk."""
    path = shard_dir / "r-000006.tar"
    want = path.read_bytes()
    cfg = StorageOptions(chunk_size=16 << 10, chunks_ahead=2, **FAST)
    with HTTPShardServer(str(shard_dir)) as http, caplog.at_level(logging.WARNING, logger="dali_shards"):
        http.faults.ignore_range = True
        url = f"{http.url}/{path.name}"
        with open_shard(url, cfg, size=len(want)) as f:
            assert f.read() == want
        assert len(shard_gets(http)) == 1, shard_gets(http)
        with RemoteStream(url, cfg, size=len(want)) as s:  # known to ignore Range: streamed from the start
            assert s.read(1000) == want[:1000]
            s.seek(100_000)  # a seek ahead: one new GET, dropping what lies before
            assert s.read(50_000) == want[100_000:150_000]
            assert shard_gets(http) == [f"bytes=0-{(16 << 10) - 1}", "bytes=0-", "bytes=100000-"]
        with open_shard(f"{http.url}/r-000001.tar", cfg) as f:  # no size known beforehand
            assert f.read() == (shard_dir / "r-000001.tar").read_bytes()
        assert [p for p, _ in http.faults.requests if p.endswith("r-000001.tar")] == ["/r-000001.tar"]
    (warning,) = warnings_about(caplog, http)
    assert "whole" in warning.getMessage()


def test_a_server_ignoring_range_mid_stream_resumes_after_a_cut(shard_dir):
    path = shard_dir / "r-000001.tar"
    want = path.read_bytes()
    cfg = StorageOptions(chunk_size=16 << 10, **FAST)
    with HTTPShardServer(str(shard_dir)) as http:
        http.faults.ignore_range = True
        http.faults.cut, http.faults.cut_after = 1, 70_000
        with open_shard(f"{http.url}/{path.name}", cfg, size=len(want)) as f:
            assert f.read() == want
        assert len(shard_gets(http)) == 2, "the cut GET and one more, from its first missing byte"


def test_a_range_answered_with_only_its_bytes_and_200_breaks_the_protocol(shard_dir):
    path = shard_dir / "r-000001.tar"
    size = os.path.getsize(path)
    with HTTPShardServer(str(shard_dir)) as http:
        http.faults.range_200 = True
        url = f"{http.url}/{path.name}"
        for read in (
            lambda: open_shard(url, StorageOptions(chunk_size=16 << 10, **FAST), size=size).read(),
            lambda: open_shard(url, StorageOptions(chunk_size=16 << 10, **FAST)).read(),  # the size unknown
        ):
            with pytest.raises(ShardAccessError, match="breaks HTTP's Range protocol") as err:
                read()
            assert err.value.url == url and "changed after it was indexed" not in str(err.value)
            assert not isinstance(err.value, ShardFormatError)


def test_a_range_200_server_fails_the_pipeline_naming_the_protocol(shard_dir):
    with HTTPShardServer(str(shard_dir)) as http:
        http.faults.range_200 = True
        pipe = index_pipeline(f"{http.url}/{PATTERN}", batch_size=4, py_num_workers=2, shuffle=True, retries=1)()
        with pytest.raises(Exception, match="breaks HTTP's Range protocol") as err:
            run_epochs(pipe, 1)
        assert "changed after it was indexed" not in str(err.value)
        assert len(shard_gets(http)) < 20, "not retried: the server's answers will not change"
