"""A manifest served over HTTP (issue 31, items 4 and 5): its entries stay on its server unless
``manifest_foreign_urls=True``, and its counts are checked against the served shards' sizes and
first bytes before anything is planned."""

import json
import os

import pytest

from dali_shards.catalog.scan import scan_shards
from dali_shards.catalog.manifest import write_manifest
from dali_shards.catalog.sources import resolve_source
from dali_shards.errors import ConfigError
from dali_shards.options import StorageOptions
from dali_shards.testing.servers import HTTPShardServer
from dali_shards.tools.writer import write_shard

pytest.importorskip("aiohttp")
FAST = dict(backoff=0.01, max_backoff=0.05, retries=1)


def samples(count):
    return [{"__key__": f"{i:06d}", "txt": "x" * 500} for i in range(count)]


@pytest.fixture
def served(tmp_path):
    """A served folder with one 40-sample shard, and a local shard outside it."""
    root = tmp_path / "served"
    root.mkdir()
    write_shard(str(root / "s.tar"), samples(40))
    local = tmp_path / "private" / "p.tar"
    local.parent.mkdir()
    write_shard(str(local), samples(5))
    with HTTPShardServer(str(root)) as server:
        yield server, root, str(local)


def serve_manifest(root, entries):
    (root / "manifest.json").write_text(json.dumps({"format": "dali-shards-manifest", "version": 2, "shards": entries}))


@pytest.mark.parametrize("spelling", ["path", "file_url"])
def test_an_http_manifest_cannot_make_the_loader_read_local_files(served, spelling):
    server, root, local = served
    entry = local if spelling == "path" else "file://" + local
    serve_manifest(root, [{"url": "s.tar", "samples": 40}, {"url": entry, "samples": 5}])
    manifest = f"{server.url}/manifest.json"
    with pytest.raises(ConfigError) as err:
        resolve_source(manifest, config=StorageOptions(**FAST))
    text = str(err.value)
    assert manifest in text and "entry 1" in text and entry in text and "manifest_foreign_urls=True" in text
    shards = resolve_source(manifest, config=StorageOptions(manifest_foreign_urls=True, **FAST))
    assert [s.samples for s in shards] == [40, 5] and shards[1].url == entry  # the explicit opt-in


def test_an_http_manifest_with_an_absurd_count_is_refused_at_the_start(served):
    server, root, _ = served
    size = os.path.getsize(root / "s.tar")
    serve_manifest(root, [{"url": "s.tar", "samples": 100_000_000, "bytes": size}])
    with pytest.raises(ConfigError, match=r"entry 0.*s\.tar.*100000000 samples"):
        resolve_source(f"{server.url}/manifest.json", config=StorageOptions(**FAST))
    write_manifest(str(root / "manifest.json"), scan_shards([str(root / "s.tar")]))  # the true one reads
    assert resolve_source(f"{server.url}/manifest.json", config=StorageOptions(**FAST))[0].samples == 40


def test_the_cli_refuses_foreign_entries_unless_told(served, capsys):
    from dali_shards.cli import main

    server, root, local = served
    serve_manifest(root, [{"url": "s.tar", "samples": 40}, {"url": local, "samples": 5}])
    manifest = f"{server.url}/manifest.json"
    assert main(["plan", manifest, "--workers", "1", "--batch-size", "5", "--json"]) == 2
    assert "manifest_foreign_urls" in capsys.readouterr().err
    assert main(["plan", manifest, "--workers", "1", "--batch-size", "5", "--json", "--manifest-foreign-urls"]) == 0
    assert json.loads(capsys.readouterr().out)["samples"] == 45


def test_a_remote_sample_table_is_read_one_record_per_shard_by_the_workers_that_read_it(tmp_path):
    """Version 3 over HTTP: the main process reads the manifest only; each worker fetches the record
    of each shard it reads, one small ranged request each, and the epoch is exactly once."""
    from dali_shards import sharded_pipeline
    from dali_shards.pytorch import DALIShardedIterator

    root = tmp_path / "served"
    root.mkdir()
    paths = [str(root / f"r-{i:02d}.tar") for i in range(12)]
    for i, path in enumerate(paths):
        write_shard(path, [{"__key__": f"{i:02d}-{j}", "cls": 10 * i + j} for j in range(5)])
    write_manifest(str(root / "manifest.json"), scan_shards(paths))
    with HTTPShardServer(str(root)) as server:

        @sharded_pipeline(f"{server.url}/manifest.json", fields=("cls",), batch_size=4, py_num_workers=2, shuffle=True,
                          seed=3, device_id=None, num_threads=1, retries=1)  # fmt: skip
        def pipe(cls):
            return cls

        pipeline = pipe()
        table = [r for p, r in server.faults.requests if p.endswith("manifest.samples")]
        assert table == [], "the main process reads no sample table"
        it = DALIShardedIterator(pipeline, ["cls"])
        seen = sorted(int(x) for (b,) in it for x in b["cls"].reshape(-1).tolist())
        table = [r for p, r in server.faults.requests if p.endswith("manifest.samples")]
    assert seen == sorted(10 * i + j for i in range(12) for j in range(5))
    info = pipeline.dali_shards
    reads = [{seg.shard for seg in info.plan(e).worker_reads(v)} for e in (0, 1) for v in range(2)]  # (epoch 1: read ahead)
    assert len(set(table)) == 12 and len(table) <= sum(map(len, reads)), "one record per shard a worker reads"
    assert all(r is not None and r.startswith("bytes=") for r in table)


@pytest.mark.parametrize("spelling", ["./s.tar", "sub/../s.tar", ".//s.tar", "{url}//s.tar", "HTTP://127.0.0.1:{port}/s.tar"])
def test_an_http_manifest_listing_one_shard_twice_however_spelled_is_refused(served, spelling):
    """Issue 43, item 5: ``s.tar`` and ``./s.tar`` (or ``sub/../s.tar``, ``.//s.tar``, its absolute
    URL in another case) are one shard on the server; delivered twice before."""
    server, root, _ = served
    entry = spelling.format(url=server.url, port=server.port)
    serve_manifest(root, [{"url": "s.tar", "samples": 40}, {"url": entry, "samples": 40}])
    manifest = f"{server.url}/manifest.json"
    with pytest.raises(ConfigError, match=r"twice: entry 0 \('s\.tar'\) and entry 1") as err:
        resolve_source(manifest, config=StorageOptions(**FAST))
    assert manifest in str(err.value) and repr(entry) in str(err.value)


def test_a_remote_shard_is_counted_by_its_manifest_and_refused_in_two_streams_however_spelled(served):
    """The manifest beside a remote pattern counts its shards however it spells them, and a mix
    that names one served shard in two streams, spelled differently, is refused."""
    from dali_shards import Stream
    from dali_shards.setup.mixing import resolve_mix

    server, root, _ = served
    serve_manifest(root, [{"url": "./s.tar", "samples": 40}])
    config = StorageOptions(**FAST)
    assert [s.samples for s in resolve_source(f"{server.url}/s.tar", config=config)] == [40]
    streams = [Stream(f"{server.url}/manifest.json"), Stream(f"{server.url}//sub/../s.tar")]
    with pytest.raises(ConfigError, match="stream 0 and stream 1") as err:
        resolve_mix(streams, None, "random", lambda source: resolve_source(source, config=config))
    assert f"{server.url}//sub/../s.tar" in str(err.value)
