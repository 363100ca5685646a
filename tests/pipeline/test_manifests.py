"""Manifests: a shard rewritten after indexing is refused (or counted again), every field is
type-checked, and a shard listed twice is refused."""

import json
import os
from collections import Counter

import pytest

from dali_shards.pytorch import DALIShardedIterator
from dali_shards.testing.pipelines import run_epochs
from dali_shards import ConfigError, ShardFormatError, sharded_pipeline
from dali_shards.catalog.scan import scan_shards
from dali_shards.catalog.manifest import load_index, read_manifest, write_manifest
from dali_shards.options import StorageOptions
from dali_shards.io.remote import RemoteStream
from dali_shards.catalog.sources import resolve_source
from dali_shards.io.storage import open_shard
from dali_shards.tools.writer import write_shard

FAST = dict(backoff=0.01, max_backoff=0.05)


def samples(start, count):
    return [{"__key__": f"{i:06d}", "txt": f"sample {i}"} for i in range(start, start + count)]


@pytest.fixture
def indexed(tmp_path):
    """Three shards of 4, 20 and 6 samples with their manifest."""
    paths = [str(tmp_path / f"d-{i}.tar") for i in range(3)]
    for i, (path, n) in enumerate(zip(paths, (4, 20, 6))):
        write_shard(path, samples(100 * i, n))
    manifest = str(tmp_path / "manifest.json")
    write_manifest(manifest, scan_shards(paths))
    return paths, manifest


def rewrite(path, start, count):
    old = os.path.getsize(path)
    write_shard(path, samples(start, count))
    assert os.path.getsize(path) != old
    return old, os.path.getsize(path)


# -- 10.6: stale manifests -------------------------------------------------------------------------
def test_a_shard_rewritten_after_indexing_is_refused_naming_it(indexed):
    paths, manifest = indexed
    old, new = rewrite(paths[1], 100, 35)
    with pytest.raises(ShardFormatError) as err:
        resolve_source(manifest)
    assert err.value.url == paths[1]
    text = str(err.value)
    assert str(old) in text and str(new) in text and "dali-shards index" in text and "stale_manifest" in text


def test_rescan_counts_a_rewritten_shard_again(indexed, caplog):
    paths, manifest = indexed
    rewrite(paths[1], 100, 35)
    with caplog.at_level("WARNING", logger="dali_shards"):
        shards = resolve_source(manifest, stale_manifest="rescan")
    assert [s.samples for s in shards] == [4, 35, 6]
    assert shards[1].bytes == os.path.getsize(paths[1])
    assert paths[1] in caplog.text
    with pytest.raises(ConfigError, match="stale_manifest"):
        resolve_source(manifest, stale_manifest="ignore")


def txt_pipeline(source, **kw):
    @sharded_pipeline(
        source, fields=("__index__", "__valid__"), batch_size=2, py_num_workers=1, num_threads=1, device_id=None, **kw
    )
    def pipe(index, valid):
        return index, valid

    return pipe


def test_pipeline_option_rescan_delivers_every_sample_of_the_rewritten_shard(indexed):
    """The issue's case: 35 samples where the manifest says 20 -- all 35 arrive, exactly once."""
    paths, manifest = indexed
    rewrite(paths[1], 100, 35)
    with pytest.raises(ShardFormatError, match="d-1.tar"):
        txt_pipeline(manifest)()
    (epoch,) = run_epochs(txt_pipeline(manifest, stale_manifest="rescan")(), 1)
    seen = Counter(int(i) for index, valid in epoch for i, v in zip(index, valid) if v)
    assert sorted(seen) == list(range(4 + 35 + 6)) and max(seen.values()) == 1


def test_a_shard_rewritten_after_start_fails_when_opened(indexed):
    paths, manifest = indexed
    info = resolve_source(manifest)[1]
    old, new = rewrite(paths[1], 100, 35)
    with pytest.raises(ShardFormatError) as err:
        open_shard(info.url, size=info.bytes)
    assert err.value.url == paths[1] and str(old) in str(err.value) and str(new) in str(err.value)
    assert "dali-shards index" in str(err.value)


def test_a_remote_shard_of_another_size_than_its_manifest_fails_when_opened(tmp_path):
    pytest.importorskip("aiohttp")
    from dali_shards.testing.servers import HTTPShardServer

    path = str(tmp_path / "d-0.tar")
    write_shard(path, samples(0, 20))
    indexed_size = os.path.getsize(path)
    rewrite(path, 0, 35)
    real = os.path.getsize(path)
    with HTTPShardServer(str(tmp_path)) as server:
        url = f"{server.url}/d-0.tar"
        with pytest.raises(ShardFormatError) as err:
            open_shard(url, StorageOptions(**FAST), size=indexed_size).read()
    assert err.value.url == url and f"{real}" in str(err.value) and f"{indexed_size}" in str(err.value)
    # a store without ranged streaming (the size comes from a metadata request when opened)
    import fsspec

    fsspec.filesystem("memory").pipe_file("/stale/d-0.tar", open(path, "rb").read())
    with pytest.raises(ShardFormatError, match=f"{real}.*{indexed_size}|{indexed_size}.*{real}"):
        with RemoteStream("memory://stale/d-0.tar", StorageOptions(**FAST), size=indexed_size) as s:
            s.read()


# -- 22.2: a folder reads what its manifest lists -----------------------------------------------------
@pytest.fixture
def folder_with_leftovers(tmp_path):
    """A folder written twice: 5 shards of 8 samples, then 2 shards of 8 (new content) and their
    manifest, the 3 older shards left over."""
    out = tmp_path / "out"
    out.mkdir()
    for i in range(5):
        write_shard(str(out / f"s-{i:06d}.tar"), samples(100 + 8 * i, 8))
    fresh = [str(out / f"s-{i:06d}.tar") for i in range(2)]
    for i, path in enumerate(fresh):
        write_shard(path, samples(8 * i, 8))
    write_manifest(str(out / "manifest.json"), scan_shards(fresh))
    return out


def test_a_folder_reads_exactly_what_its_manifest_lists(folder_with_leftovers, caplog):
    out = folder_with_leftovers
    with caplog.at_level("WARNING", logger="dali_shards"):
        shards = resolve_source(str(out))
    assert [os.path.basename(s.url) for s in shards] == ["s-000000.tar", "s-000001.tar"]
    warnings = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(warnings) == 1 and all(f"s-00000{i}.tar" in warnings[0] for i in (2, 3, 4))
    (epoch,) = run_epochs(txt_pipeline(str(out))(), 1)
    seen = Counter(int(i) for index, valid in epoch for i, v in zip(index, valid) if v)
    assert sorted(seen) == list(range(16)) and max(seen.values()) == 1


def test_a_folder_with_another_tools_manifest_json_reads_its_tars(tmp_path, caplog):
    for i in range(2):
        write_shard(str(tmp_path / f"s-{i}.tar"), samples(8 * i, 8))
    (tmp_path / "manifest.json").write_text('{"name": "not ours"}')
    with caplog.at_level("WARNING", logger="dali_shards"):
        shards = resolve_source(str(tmp_path))
    assert [s.samples for s in shards] == [8, 8] and "not a usable dali-shards manifest" in caplog.text


def test_a_glob_that_matches_shards_its_manifest_does_not_list_warns_naming_them(folder_with_leftovers, caplog):
    out = folder_with_leftovers
    with caplog.at_level("WARNING", logger="dali_shards"):
        shards = resolve_source(str(out / "*.tar"))
    assert len(shards) == 5  # a pattern reads what it matches...
    text = caplog.text  # ...and says which of them the manifest beside them does not list
    assert "does not list" in text and all(f"s-00000{i}.tar" in text for i in (2, 3, 4))
    assert "s-000000.tar" not in text.split("does not list")[1]
    caplog.clear()
    with caplog.at_level("WARNING", logger="dali_shards"):
        resolve_source(str(out / "s-{000000..000001}.tar"))
    assert "does not list" not in caplog.text


# -- 10.13: manifest fields and duplicate shards ---------------------------------------------------
GOOD = {"url": "a.tar", "samples": 3, "bytes": 10240, "ext_bytes": {"txt": 30}}


@pytest.mark.parametrize(
    "doc, where",
    [
        ({"version": "x", "shards": [GOOD]}, '"version"'),
        ({"version": 1.5, "shards": [GOOD]}, '"version"'),
        ({"version": 1, "shards": {"a": GOOD}}, '"shards"'),
        ({"version": 1, "shards": ["a.tar"]}, "entry 0"),
        ({"version": 1, "shards": [GOOD, {**GOOD, "url": 7}]}, 'entry 1.*"url"'),
        ({"version": 1, "shards": [{**GOOD, "samples": "12"}]}, 'entry 0.*"samples"'),
        ({"version": 1, "shards": [{**GOOD, "samples": 2.5}]}, 'entry 0.*"samples"'),
        ({"version": 1, "shards": [{**GOOD, "samples": True}]}, 'entry 0.*"samples"'),
        ({"version": 1, "shards": [{**GOOD, "samples": -1}]}, 'entry 0.*"samples"'),
        ({"version": 1, "shards": [{**GOOD, "bytes": "10k"}]}, 'entry 0.*"bytes"'),
        ({"version": 1, "shards": [{**GOOD, "bytes": -5}]}, 'entry 0.*"bytes"'),
        ({"version": 1, "shards": [{**GOOD, "ext_bytes": "txt"}]}, 'entry 0.*"ext_bytes"'),
        ({"version": 1, "shards": [{**GOOD, "ext_bytes": [["txt", 3]]}]}, 'entry 0.*"ext_bytes"'),
        ({"version": 1, "shards": [{**GOOD, "ext_bytes": {"txt": "30"}}]}, 'entry 0.*"ext_bytes"'),
        ({"version": 1, "shards": [{**GOOD, "ext_bytes": {"txt": -3}}]}, 'entry 0.*"ext_bytes"'),
        ({"version": 2, "shards": [{**GOOD, "sample_blocks": [3, 4, 5]}]}, 'entry 0.*"sample_blocks"'),
        ({"version": 2, "shards": [{**GOOD, "sample_blocks": "3 4"}]}, 'entry 0.*"sample_blocks"'),  # one per sample
        ({"version": 2, "shards": [{**GOOD, "sample_blocks": "3 0 5"}]}, 'entry 0.*"sample_blocks"'),
        ({"version": 2, "shards": [{**GOOD, "sample_blocks": "3 x 5"}]}, 'entry 0.*"sample_blocks"'),
        ({"version": 2, "shards": [{**GOOD, "sample_blocks": "9 9 9"}]}, 'entry 0.*"sample_blocks"'),  # past bytes
        ({"version": 2, "shards": [{**GOOD, "sample_blocks": "3 4 99999999999999999999"}]}, '"sample_blocks"'),
    ],
)
def test_every_manifest_field_is_checked(tmp_path, doc, where):
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"format": "dali-shards-manifest", **doc}))
    with pytest.raises(ConfigError, match=where) as err:
        read_manifest(str(path))
    assert str(path) in str(err.value)


def test_a_valid_manifest_still_reads(tmp_path):
    path = tmp_path / "m.json"
    doc = {"format": "dali-shards-manifest", "version": 1, "shards": [GOOD, {"url": "b.tar", "samples": 0}]}
    path.write_text(json.dumps(doc))
    a, b = read_manifest(str(path))
    assert (a.samples, a.bytes, a.ext_bytes) == (3, 10240, {"txt": 30}) and (b.bytes, b.ext_bytes) == (None, None)
    assert a.offsets is None, "a version-1 manifest has no sample offsets"
    doc["version"], doc["shards"][0] = 2, {**GOOD, "sample_blocks": "3 4 5"}
    path.write_text(json.dumps(doc))
    a, _ = read_manifest(str(path))
    assert a.offsets.tolist() == [0, 1536, 3584, 6144]
    write_manifest(str(tmp_path / "again.json"), [a], version=2)
    assert json.loads((tmp_path / "again.json").read_text())["shards"][0]["sample_blocks"] == "3 4 5"
    write_manifest(str(tmp_path / "v3.json"), [a])  # this release's: the offsets in the sample table
    assert load_index(read_manifest(str(tmp_path / "v3.json"))[0]).offsets.tolist() == [0, 1536, 3584, 6144]


def test_a_shard_listed_twice_is_refused(indexed, tmp_path):
    paths, manifest = indexed
    with pytest.raises(ConfigError, match=r"d-1\.tar.*twice.*item 1.*item 2") as err:
        resolve_source([paths[0], paths[1], os.path.relpath(paths[1])])
    with pytest.raises(ConfigError, match=r"d-0\.tar.*twice.*manifest.*pattern"):
        resolve_source([manifest, str(tmp_path / "d-{0..1}.tar")])
    doc = json.load(open(manifest))
    doc["shards"].append(doc["shards"][0])
    json.dump(doc, open(manifest, "w"))
    with pytest.raises(ConfigError, match=r"d-0\.tar.*twice.*entr(y|ies) 0.*3") as err:
        read_manifest(manifest)
    assert manifest in str(err.value)


# -- 22.10: a shard rewritten with the same size ------------------------------------------------------
def equal_samples(start, count):
    return [{"__key__": f"k{i:04d}", "txt": f"sample {i:04d}".encode()} for i in range(start, start + count)]


@pytest.fixture
def equal_sized(tmp_path):
    """12 shards of 20 equal-size samples and their manifest; then shard 3 rewritten with its samples
    in reverse order: the same byte size, every sample somewhere else."""
    paths = [str(tmp_path / f"e-{i:02d}.tar") for i in range(12)]
    for i, path in enumerate(paths):
        write_shard(path, equal_samples(20 * i, 20))
    manifest = str(tmp_path / "manifest.json")
    write_manifest(manifest, scan_shards(paths))
    size = os.path.getsize(paths[3])
    write_shard(paths[3], equal_samples(60, 20)[::-1])
    assert os.path.getsize(paths[3]) == size
    return paths, manifest


def keyed_pipeline(source, **kw):
    @sharded_pipeline(source, fields=("__index__", "__key__"), batch_size=4, py_num_workers=2, shuffle=True,
                      num_threads=1, device_id=None, **kw)  # fmt: skip
    def pipe(index, key):
        return index, key

    return pipe


@pytest.mark.parametrize("block", [256, 0])  # interleaved (each sample at its span) and contiguous runs
def test_a_shard_rewritten_with_the_same_size_is_caught_sample_by_sample(equal_sized, block):
    paths, manifest = equal_sized
    pipe = keyed_pipeline(manifest, shuffle_block=block)
    assert pipe().dali_shards.plan(0).interleaving == bool(block)
    with pytest.raises(ShardFormatError, match=r"e-03\.tar.*not the key the shard's index recorded there"):
        list(DALIShardedIterator(pipe(), ["index", "key"]))
    it = DALIShardedIterator(pipe(on_error="skip"), ["index", "key"], audit=True)
    for (b,) in it:  # what arrives is what it says it is
        for index, key in zip(b["index"].tolist(), b["key"]):
            assert key == f"k{index:04d}"  # the __key__ field comes as str
    assert it.audits[0]["skipped"] == list(range(60, 80)) and it.audits[0]["exactly_once"]


def test_a_scanned_shard_rewritten_after_the_start_is_caught(tmp_path):
    paths = [str(tmp_path / f"e-{i:02d}.tar") for i in range(12)]
    for i, path in enumerate(paths):
        write_shard(path, equal_samples(20 * i, 20))
    pipe = keyed_pipeline(paths)()  # scanned here
    write_shard(paths[3], equal_samples(60, 20)[::-1])
    with pytest.raises(ShardFormatError, match=r"e-03\.tar.*not the key the shard's index recorded there"):
        list(DALIShardedIterator(pipe, ["index", "key"]))


def test_key_fingerprints_round_trip_through_the_manifest(equal_sized, tmp_path):
    paths, manifest = equal_sized
    (info,) = [load_index(s) for s in read_manifest(manifest) if s.url.endswith("e-00.tar")]
    assert list(info.key_crc) == list(scan_shards([paths[0]])[0].key_crc)
    inline = str(tmp_path / "v2.json")
    write_manifest(inline, scan_shards(paths), version=2)  # the fingerprints inline, to damage
    doc = json.load(open(inline))
    doc["shards"][0]["key_crc32"] = "not base64!"
    bad = str(tmp_path / "bad.json")
    json.dump(doc, open(bad, "w"))
    with pytest.raises(ConfigError, match='entry 0: "key_crc32" must be'):
        read_manifest(bad)
