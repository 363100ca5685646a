"""Counts and sizes a manifest gives are checked against what a shard can physically hold, when
the manifest is read (no I/O) or at the start (from the shard's size and first bytes), before
anything is planned for them (issue 31, item 5)."""

import json
import os
import time
import uuid

import fsspec
import pytest

from dali_shards.catalog.scan import scan_shards
from dali_shards.catalog.manifest import read_manifest, write_manifest
from dali_shards.catalog.sources import resolve_source
from dali_shards.errors import ConfigError
from dali_shards.tools.writer import write_shard

FORMAT = {"format": "dali-shards-manifest", "version": 2}


def samples(count, size=500):
    return [{"__key__": f"{i:06d}", "txt": "x" * size} for i in range(count)]


def manifest_with(path, shard, **changes):
    """A version-2 manifest (offsets inline, so that changed counts need no sample table to match)
    of ``shard`` (scanned), its entry changed (a value None drops the field)."""
    write_manifest(str(path), scan_shards([str(shard)]), version=2)
    doc = json.loads(path.read_text())
    entry = doc["shards"][0]
    for key, value in changes.items():
        if value is None:
            entry.pop(key, None)
        else:
            entry[key] = value
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.fixture
def shard(tmp_path):
    path = tmp_path / "s.tar"
    write_shard(str(path), samples(40))  # 40 samples, about 40 KB
    return path


@pytest.mark.parametrize("drop_bytes", [False, True])
def test_an_absurd_sample_count_is_refused_at_the_start(tmp_path, shard, drop_bytes):
    """The issue's case: 1e8 samples claimed for a 40-sample shard of some 40 KB (without
    ``bytes``, a local shard's size is its file's)."""
    changes = dict(samples=100_000_000, sample_blocks=None, key_crc32=None)
    if drop_bytes:
        changes["bytes"] = None
    manifest = manifest_with(tmp_path / "m.json", shard, **changes)
    started = time.monotonic()
    with pytest.raises(ConfigError) as err:
        resolve_source(manifest)
    assert time.monotonic() - started < 5
    text = str(err.value)
    assert manifest in text and "entry 0" in text and str(shard) in text and "100000000 samples" in text
    assert "512-byte" in text and "dali-shards index" in text


def test_a_plausible_count_still_reads(tmp_path, shard):
    size = os.path.getsize(shard)
    most = size // 512 - 1  # a plain tar: one header per sample at least, and the end-of-archive block
    unchecked = dict(sample_blocks=None, key_crc32=None, ext_bytes=None)
    manifest = manifest_with(tmp_path / "m.json", shard, samples=most, **unchecked)
    assert resolve_source(manifest)[0].samples == most  # wrong, but possible: found when read
    manifest = manifest_with(tmp_path / "m.json", shard, samples=most + 1, **unchecked)
    with pytest.raises(ConfigError, match=f"at most {most} samples"):
        resolve_source(manifest)


def test_member_bytes_beyond_the_shard_are_refused_at_the_start(tmp_path, shard):
    size = os.path.getsize(shard)
    manifest = manifest_with(tmp_path / "m.json", shard, sample_blocks=None, ext_bytes={"txt": 50 * size})
    with pytest.raises(ConfigError, match=r"entry 0.*ext_bytes|ext_bytes.*entry 0"):
        resolve_source(manifest)


def test_gzip_shards_of_tiny_samples_are_not_refused_but_bounded(tmp_path):
    gz = tmp_path / "tiny.tar.gz"
    write_shard(str(gz), samples(3000, size=1))
    size = os.path.getsize(gz)
    assert 3000 > size // 512, "more samples than a plain tar of this size could hold"
    manifest = manifest_with(tmp_path / "m.json", gz)
    assert resolve_source(manifest)[0].samples == 3000
    # a gzip stream inflates at most 1032-fold: no more than 1032 * size / 512 samples
    manifest = manifest_with(tmp_path / "m.json", gz, samples=3 * size, ext_bytes=None, key_crc32=None)
    with pytest.raises(ConfigError, match="gzip") as err:
        resolve_source(manifest)
    assert str(gz) in str(err.value)


def test_a_remote_shards_count_is_checked_from_its_first_bytes(tmp_path, shard):
    fs = fsspec.filesystem("memory")
    root = f"/t{uuid.uuid4().hex}"
    try:
        fs.pipe_file(f"{root}/s.tar", shard.read_bytes())
        doc = {**FORMAT, "shards": [{"url": "s.tar", "samples": 100_000_000, "bytes": os.path.getsize(shard)}]}
        fs.pipe_file(f"{root}/manifest.json", json.dumps(doc).encode())
        with pytest.raises(ConfigError, match="100000000 samples"):
            resolve_source(f"memory:/{root}/manifest.json")
    finally:
        fs.rm(root, recursive=True)


BIG = 1 << 62


@pytest.mark.parametrize(
    "entry, where",
    [
        ({"samples": 1 << 60}, '"samples"'),  # more than any shard could hold, whatever its size
        ({"samples": 3, "bytes": BIG + 1}, '"bytes"'),
        ({"samples": 3, "ext_bytes": {"txt": BIG + 1}}, '"ext_bytes"'),
        ({"samples": 3, "ext_bytes": {"a": BIG // 2 + 1, "b": BIG // 2 + 1}}, '"ext_bytes"'),
        ({"samples": 3, "bytes": 6144, "sample_blocks": "3 4 5"}, '"sample_blocks"'),  # no room for the end block
        ({"samples": 3, "bytes": 10240, "sample_blocks": "3 4 5", "ext_bytes": {"txt": 5000}}, '"ext_bytes"'),
        ({"samples": 2, "bytes": 1200, "sample_blocks": "1 1"}, '"sample_blocks"'),
    ],
)
def test_impossible_fields_are_refused_when_read(tmp_path, entry, where):
    entry = {"url": "a.tar", **entry}
    path = tmp_path / "m.json"
    path.write_text(json.dumps({**FORMAT, "shards": [entry]}))
    with pytest.raises(ConfigError, match=where) as err:
        read_manifest(str(path))
    assert str(path) in str(err.value) and "entry 0" in str(err.value)
