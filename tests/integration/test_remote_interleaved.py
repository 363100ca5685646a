"""Interleaved shuffling over remote shards: pieces of many shards fetched in ranged requests by
the offsets of a version-2 manifest, exactly once, through faults, on HTTP and S3."""

import json
import logging
import os
import shutil
import time

import pytest

from dali_shards import pipeline_info, sharded_pipeline
from dali_shards.catalog.scan import scan_shards
from dali_shards.catalog.manifest import write_manifest
from dali_shards.testing.pipelines import (
    assert_exactly_once,
    epochs_by_rank,
    index_pipeline,
    jpg_bytes,
    run_epochs,
    worker_peak_rss,
)
from dali_shards.testing.shards import write_shards
from dali_shards.tools.writer import ShardWriter
from dali_shards.testing.servers import HTTPShardServer, S3Server

pytest.importorskip("aiohttp")
SIZES = (5, 0, 9, 3, 8, 6, 4, 7, 2, 10, 6, 5)
PATTERN = "many-{000000..000011}.tar"


def make_dir(d):
    """The shards of ``shard_dir`` (see conftest.py) in ``d``, for a test that changes them."""
    write_shards(d, SIZES, prefix="many", manifest=True)
    return d


@pytest.fixture(scope="module")
def local(shard_dir):
    return jpg_bytes(str(shard_dir / PATTERN))


def test_http_pieces_come_in_ranged_requests_exactly_once_through_faults(shard_dir, local):
    with HTTPShardServer(str(shard_dir)) as http:
        http.faults.fail, http.faults.cut, http.faults.cut_after = 3, 2, 3000
        make = index_pipeline(
            f"{http.url}/{PATTERN}", batch_size=4, py_num_workers=2, world_size=2, shuffle=True, seed=3
        )
        seen, data, _, pipes = epochs_by_rank(make, world=2)
        assert pipeline_info(pipes[0]).plan(0).interleaving
        assert_exactly_once(seen, sum(SIZES))
        assert data == local
        assert http.faults.fail == 0 and http.faults.cut == 0, "the faults happened and were retried"
        gets = [r for p, r in http.faults.requests if p.endswith(".tar") and r != "bytes=0-0"]  # (not the probes)
        assert gets and all(r and r.startswith("bytes=") for r in gets), "ranged requests only"
        info = pipeline_info(pipes[0])
        # epochs 2 and 3 may be read ahead: the ring's workers begin epoch 2 while epoch 1 is taken, and
        # fetch the next epoch's pieces once the current epoch's are all fetched
        pieces = sum(len(info.plan(e).worker_pieces(v)) for e in range(4) for v in range(4))
        assert len(gets) <= pieces + 2 < 3 * sum(SIZES), "one request per piece (+ 2 cut off), not one per sample"


def test_the_next_epoch_is_fetched_while_this_one_is_read(shard_dir):
    from dali_shards.options import ShardedOptions
    from dali_shards.setup.resolve import resolve
    from dali_shards.worker.planned import PlannedWorkerSource

    def samples(source, epoch):
        """One epoch of a worker source, every sample's table bytes (padding included)."""
        packing = source.config.packing
        return [bytes(packing.table_array(batch)) for batch in source.epoch(epoch)]

    with HTTPShardServer(str(shard_dir)) as http:
        options = ShardedOptions.from_keywords(source=f"{http.url}/{PATTERN}", fields=("__index__", "jpg"),
                                               batch_size=4, py_num_workers=2, shuffle=True, seed=5)  # fmt: skip
        config = resolve(options).workers[1]
        source = PlannedWorkerSource(config, config.mode)
        assert samples(source, 0)
        ahead = source.ahead
        assert ahead is not None and ahead.plan.epoch == 1, "epoch 1 started before it was asked for"
        deadline = time.monotonic() + 10
        while not ahead.reading.fetcher.fetched_all and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ahead.reading.fetcher.requests_made == len(ahead.reading.fetcher._requests) > 0
        second = samples(source, 1)
        assert source.ahead is not None and source.ahead.plan.epoch == 2, "and epoch 2 while epoch 1 was read"

        plain = PlannedWorkerSource(config, config.mode)
        samples(plain, 0)
        plain.take_ahead(-1)  # dropped: epoch 1 read from scratch
        assert plain.ahead is None and samples(plain, 1) == second, "the same batches with or without a head start"


def test_s3_pieces_exactly_once(shard_dir, local):
    pytest.importorskip("s3fs")
    pytest.importorskip("moto")
    server = S3Server()
    try:
        server.upload("many", sorted(str(p) for p in shard_dir.iterdir()))
        make = index_pipeline(
            f"s3://many/{PATTERN}", batch_size=6, py_num_workers=3, shuffle=True, storage_options=server.storage_options()
        )
        seen, data, _, pipes = epochs_by_rank(make, world=1)
        assert pipeline_info(pipes[0]).plan(0).interleaving
        assert_exactly_once(seen, sum(SIZES))
        assert data == local
    finally:
        server.stop()


def test_a_version_1_manifest_reads_contiguous_runs_and_says_why(tmp_path, caplog, local):
    d = make_dir(tmp_path)
    doc = json.loads((d / "manifest.json").read_text())
    doc["version"] = 1
    for entry in doc["shards"]:
        entry.pop("sample_blocks", None)
    (d / "manifest.json").write_text(json.dumps(doc))
    with HTTPShardServer(str(d)) as http, caplog.at_level(logging.WARNING, logger="dali_shards"):
        make = index_pipeline(f"{http.url}/{PATTERN}", batch_size=4, py_num_workers=2, shuffle=True)
        seen, data, _, pipes = epochs_by_rank(make, world=1)
    assert not pipeline_info(pipes[0]).plan(0).interleaving
    assert "have no sample offsets" in caplog.text and "dali-shards index" in caplog.text
    assert_exactly_once(seen, sum(SIZES))
    assert data == local


def test_cache_dir_with_interleaving_says_pieces_are_not_cached(shard_dir, tmp_path, caplog, local):
    with HTTPShardServer(str(shard_dir)) as http, caplog.at_level(logging.WARNING, logger="dali_shards"):
        make = index_pipeline(f"{http.url}/{PATTERN}", batch_size=4, py_num_workers=2, shuffle=True,
                              cache_dir=str(tmp_path / "cache"))  # fmt: skip
        seen, data, _, _ = epochs_by_rank(make, world=1, epochs=1)
    assert "are not cached; shuffle_block=0 streams and caches whole shards" in caplog.text
    assert_exactly_once(seen, sum(SIZES))
    assert data == local
    cache = tmp_path / "cache"
    assert not cache.exists() or not [f for f in os.listdir(cache) if f.endswith(".shard")]


def test_a_missing_remote_shard_is_skipped_once_per_worker(tmp_path, caplog):
    d = make_dir(tmp_path)
    gone = SIZES.index(9)
    os.remove(d / f"many-{gone:06d}.tar")
    shutil.rmtree(d / "unused", ignore_errors=True)
    first = sum(SIZES[:gone])
    with HTTPShardServer(str(d)) as http, caplog.at_level(logging.WARNING, logger="dali_shards"):
        make = index_pipeline(
            f"{http.url}/{PATTERN}", batch_size=4, py_num_workers=2, shuffle=True, on_error="skip", retries=1
        )
        seen, _, _, _ = epochs_by_rank(make, world=1, epochs=1)
        requests = [p for p, _ in http.faults.requests if p.endswith(f"many-{gone:06d}.tar")]
    assert sorted(seen[0]) == [i for i in range(sum(SIZES)) if not first <= i < first + 9]
    assert len(requests) <= 2 * 8, "each worker asks at most its requests in flight, not once per sample"


def write_big(d, per_shard):
    """16 shards of ``per_shard`` random 1 MB samples, and their manifest."""
    import numpy as np

    rng = np.random.default_rng(per_shard)
    with ShardWriter(str(d / "big-%d.tar"), max_count=per_shard) as w:
        for i in range(16 * per_shard):
            w.write({"__key__": f"{i:06d}", "bin": rng.integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()})
    write_manifest(str(d / "manifest.json"), scan_shards(w.paths))


def remote_peak(d, **options):
    with HTTPShardServer(str(d)) as http:
        @sharded_pipeline(f"{http.url}/manifest.json", fields=("bin",), batch_size=4, py_num_workers=2, shuffle=True,
                          num_threads=1, device_id=None, **options)  # fmt: skip
        def pipe(data):
            return data.shape()

        p = pipe()
        assert pipeline_info(p).plan(0).interleaving
        run_epochs(p, 1)
        return worker_peak_rss(p)


def test_remote_worker_memory_stays_within_the_read_window(tmp_path):
    """16 remote shards of 1 or 6 MB samples (16 or 96 MB): with read_window=8 MB a worker holds the
    window and its 8 threads' requests in flight more for the big set (1 MB each here: one sample),
    not its 48 MB share of it."""
    (tmp_path / "small").mkdir()
    (tmp_path / "big").mkdir()
    write_big(tmp_path / "small", 1)
    write_big(tmp_path / "big", 6)
    small = remote_peak(tmp_path / "small", read_window=8 << 20)
    bounded = remote_peak(tmp_path / "big", read_window=8 << 20)
    unbounded = remote_peak(tmp_path / "big", read_window=1 << 30)
    assert bounded - small < 8 + 8 * 2 + 8, (small, bounded)  # the window, the threads' requests, a batch
    assert unbounded - bounded > 15, ("the measure tells a bounded window from an unbounded one", bounded, unbounded)
