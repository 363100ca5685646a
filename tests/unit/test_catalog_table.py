"""Version-3 manifests: per-shard entries in the JSON, per-sample offsets and key fingerprints in the
sample table beside it, read one shard's record at a time by the worker that reads the shard."""

import dataclasses
import json
import logging
import os
import pickle

import numpy as np
import pytest

from dali_shards.catalog import manifest as manifest_module
from dali_shards.catalog import table as table_module
from dali_shards.catalog.manifest import load_index, read_manifest, write_manifest
from dali_shards.catalog.scan import scan_shards
from dali_shards.catalog.sources import resolve_source
from dali_shards.catalog.table import SampleTables, record_starts
from dali_shards.errors import ConfigError, ShardFormatError
from dali_shards.options import ShardedOptions, StorageOptions
from dali_shards.setup.resolve import resolve
from dali_shards.tools.writer import write_shard


@pytest.fixture
def shards(make_shards, tmp_path):
    def text(index, shard, position):
        return {"__key__": f"k{shard}-{position:03d}", "txt": b"x" * (100 + position)}

    return make_shards([3 + 5 * i for i in range(4)], text, name="s-{shard}.tar", folder=tmp_path)


def test_the_manifest_holds_no_per_sample_data_and_the_table_holds_it_exactly(tmp_path, shards):
    scanned = scan_shards(shards)
    manifest = str(tmp_path / "manifest.json")
    write_manifest(manifest, scanned)
    doc = json.load(open(manifest))
    assert doc["version"] == 3 and doc["sample_table"] == "manifest.samples"
    assert all(set(e) <= {"url", "samples", "bytes", "ext_bytes"} for e in doc["shards"])
    assert os.path.getsize(tmp_path / "manifest.samples") == record_starts([s.samples for s in scanned])[-1]
    listed = read_manifest(manifest)
    assert all(s.offsets is None and s.key_crc is None and s.has_spans for s in listed)
    for got, want in zip(map(load_index, listed), scanned):
        assert got.offsets.tolist() == want.offsets.tolist() and got.key_crc.tolist() == want.key_crc.tolist()


def test_a_worker_loads_only_the_records_of_the_shards_it_reads(tmp_path, shards):
    manifest = str(tmp_path / "manifest.json")
    write_manifest(manifest, scan_shards(shards))
    resolved = resolve(ShardedOptions(source=manifest, fields=("txt",), batch_size=2, py_num_workers=1, world_size=1, rank=0))
    cfg = pickle.loads(pickle.dumps(resolved.workers[0]))  # as a spawned worker gets it
    assert cfg.offsets == (None,) * 4 and not cfg.tables._loaded
    want = scan_shards([shards[2]])[0]
    assert cfg.sample_offsets(2).tolist() == want.offsets.tolist()
    assert cfg.sample_keys(2).tolist() == want.key_crc.tolist()
    assert list(cfg.tables._loaded) == [2]


def test_records_beyond_the_cache_are_dropped_least_recent_first(tmp_path, shards, monkeypatch):
    manifest = str(tmp_path / "manifest.json")
    write_manifest(manifest, scan_shards(shards))
    listed = read_manifest(manifest)
    tables = SampleTables.of(listed, StorageOptions())
    monkeypatch.setattr(table_module, "CACHE_BYTES", 300)
    for s in range(4):
        tables.load(s, listed[s].url, listed[s].samples, listed[s].bytes)
    assert len(tables._loaded) < 4 and 3 in tables._loaded and tables._bytes <= 300 + 400


@pytest.mark.parametrize("cut", [8, "half"])
def test_a_missing_or_short_table_is_refused_at_the_start(tmp_path, shards, cut):
    """A truncated table (a partial copy) is said to be short, whatever it lacks: not blamed on a
    changed count."""
    manifest = str(tmp_path / "manifest.json")
    write_manifest(manifest, scan_shards(shards))
    table = tmp_path / "manifest.samples"
    raw = table.read_bytes()
    table.write_bytes(raw[: -8 if cut == 8 else len(raw) // 2])
    with pytest.raises(ConfigError, match=r"sample table .*manifest\.samples.* holds \d+ bytes, fewer than"):
        resolve_source(manifest)
    table.unlink()
    with pytest.raises(ConfigError, match=r"sample table .*manifest\.samples.* is missing"):
        resolve_source(manifest)


def test_a_damaged_record_names_its_shard_when_read(tmp_path, shards):
    manifest = str(tmp_path / "manifest.json")
    write_manifest(manifest, scan_shards(shards))
    listed = read_manifest(manifest)
    table = tmp_path / "manifest.samples"
    raw = bytearray(table.read_bytes())
    raw[listed[1].table_at + 8 : listed[1].table_at + 16] = np.int64(7).tobytes()  # sample 1 of shard 1 at byte 7
    table.write_bytes(bytes(raw))
    assert load_index(listed[0]).offsets is not None
    with pytest.raises(ShardFormatError, match=r"s-1\.tar.*sample table is damaged"):
        load_index(listed[1])


@pytest.mark.parametrize("entry, change", [(0, -1), (1, -1), (2, +1), (3, -1), (3, +1)])
def test_an_entry_counting_other_samples_than_its_record_is_named(tmp_path, shards, entry, change):
    """A count changed by hand after indexing: the entry is named when the manifest is read (the
    records after it out of place), not another shard's record when a worker reads it."""
    manifest = str(tmp_path / "manifest.json")
    write_manifest(manifest, scan_shards(shards))
    doc = json.load(open(manifest))
    doc["shards"][entry]["samples"] += change
    json.dump(doc, open(manifest, "w"))
    if entry < 3:
        words = rf"entry {entry} \('[^']*s-{entry}\.tar'\) counts \d+ samples, not the samples of its record"
    elif change < 0:
        words = r"make \d+ bytes of sample table, but .*manifest\.samples' holds \d+: its last entry counts fewer"
    else:  # the last entry counts more: the table is short (check_tables)
        words = r"holds \d+ bytes, fewer than"
    with pytest.raises(ConfigError, match=words):
        resolve_source(manifest)


def test_a_record_out_of_place_says_that_a_count_changed(tmp_path, shards):
    """Where the entries were not checked against the table (a remote one), the worker that reads a
    record out of its place says a count was changed, not that its shard's record is damaged."""
    manifest = str(tmp_path / "manifest.json")
    write_manifest(manifest, scan_shards(shards))
    moved = dataclasses.replace(read_manifest(manifest)[2], table_at=read_manifest(manifest)[2].table_at - 8)
    with pytest.raises(ShardFormatError, match=r"s-2\.tar.*does not begin where the sample counts of the manifest's"):
        load_index(moved)


@pytest.mark.parametrize("name", ["../x.samples", "/etc/passwd", "http://elsewhere/x.samples", ""])
def test_the_table_must_sit_beside_its_manifest(tmp_path, shards, name):
    manifest = str(tmp_path / "manifest.json")
    write_manifest(manifest, scan_shards(shards))
    doc = json.load(open(manifest))
    doc["sample_table"] = name
    json.dump(doc, open(manifest, "w"))
    with pytest.raises(ConfigError, match='"sample_table" must be the name of a file beside it'):
        read_manifest(manifest)


def test_compressed_shards_and_unknown_keys_say_so(tmp_path, shards):
    gz = str(tmp_path / "c.tar.gz")
    write_shard(gz, [{"__key__": f"z{j}", "txt": b"y"} for j in range(4)])
    manifest = str(tmp_path / "manifest.json")
    write_manifest(manifest, scan_shards([shards[0], gz]))
    doc = json.load(open(manifest))
    assert doc["shards"][1]["spans"] is False and "keys" not in doc["shards"][1]
    listed = read_manifest(manifest)
    assert listed[0].has_spans and not listed[1].has_spans
    assert load_index(listed[1]).offsets is None and len(load_index(listed[1]).key_crc) == 4


def test_version_2_manifests_still_read_with_a_warning_where_large(tmp_path, shards, monkeypatch, caplog):
    manifest = str(tmp_path / "old.json")
    write_manifest(manifest, scan_shards(shards), version=2)
    assert "sample_blocks" in json.load(open(manifest))["shards"][0]
    monkeypatch.setattr(manifest_module, "INLINE_WARN_SAMPLES", 10)
    with caplog.at_level(logging.WARNING, logger="dali_shards"):
        listed = read_manifest(manifest)
    assert all(s.offsets is not None for s in listed)
    assert "rewrite it with `dali-shards index`" in caplog.text


def test_rewriting_a_manifest_keeps_the_records_of_shards_it_lists(tmp_path, shards):
    """A manifest rewritten from its own entries (as ShardWriter does for shards it keeps) carries
    their records over from the table it replaces."""
    manifest = str(tmp_path / "manifest.json")
    write_manifest(manifest, scan_shards(shards))
    write_manifest(manifest, read_manifest(manifest)[::-1])
    for got, want in zip(map(load_index, read_manifest(manifest)), scan_shards(shards)[::-1]):
        assert got.offsets.tolist() == want.offsets.tolist()
