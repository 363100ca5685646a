"""Shard lists (patterns, globs, lists, manifests), the shard writer, and rank detection."""

import hashlib
import sys

import pytest

from dali_shards.world import resolve_world
from dali_shards.errors import ConfigError, ShardAccessError
from dali_shards.catalog.scan import scan_shards
from dali_shards.catalog.manifest import read_manifest, write_manifest
from dali_shards.sample_data import write_sample_shards
from dali_shards.catalog.sources import expand_pattern, resolve_source
from dali_shards.tools.writer import ShardWriter, write_shard


@pytest.fixture()
def shards(make_shards, tmp_path):
    return make_shards((3, 0, 5), folder=tmp_path)


def test_brace_glob_list_and_manifest_agree(tmp_path, shards):
    brace = resolve_source(str(tmp_path / "sample-{000000..000002}.tar"))
    glob = resolve_source(str(tmp_path / "sample-*.tar"))
    listed = resolve_source(shards)
    assert brace == glob == listed
    assert [s.samples for s in brace] == [3, 0, 5]
    manifest = str(tmp_path / "manifest.json")
    write_manifest(manifest, brace)
    assert resolve_source(manifest) == brace
    assert '"url": "sample-000000.tar"' in open(manifest).read(), "paths are stored relative"


def test_directory_source(tmp_path, shards):
    (tmp_path / "notes.txt").write_text("not a shard")
    assert resolve_source(str(tmp_path)) == resolve_source(shards)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="no tar shards"):
        resolve_source(str(empty))


def test_planning_and_reading_need_no_dali():
    import subprocess

    code = (
        "import sys, dali_shards\n"
        "from dali_shards import plan_epoch, resolve_source, ShardWriter\n"
        "import dali_shards.worker.planned, dali_shards.tar.format\n"
        "plan_epoch([3, 4], epoch=0, world_size=2, py_num_workers=1, batch_size=1)\n"
        "assert not any(m.startswith('nvidia.dali') for m in sys.modules), 'DALI imported'\n"
        "assert callable(dali_shards.sharded_pipeline) and 'nvidia.dali' in sys.modules\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_file_urls(shards):
    info = resolve_source(["file://" + shards[0]])
    assert info[0].samples == 3


def test_missing_shard_is_named(tmp_path):
    with pytest.raises(ShardAccessError, match="nope-000000.tar.*2 of the 2 shards.*nope-000001.tar") as err:
        resolve_source(str(tmp_path / "nope-{000000..000001}.tar"))
    assert "check the shard path" in str(err.value)


def test_glob_without_match(tmp_path):
    with pytest.raises(ConfigError, match="matches no files"):
        expand_pattern(str(tmp_path / "*.tar"))


def test_bad_manifests(tmp_path):
    bad = tmp_path / "m.json"
    bad.write_text('{"shards": []}')
    with pytest.raises(ConfigError, match="not a dali-shards manifest"):
        read_manifest(str(bad))
    bad.write_text('{"format": "dali-shards-manifest", "version": 1, "shards": [{"url": "a.tar"}]}')
    with pytest.raises(ConfigError, match="integer"):
        read_manifest(str(bad))


def test_scan_counts_match_writer(tmp_path):
    paths = []
    with ShardWriter(str(tmp_path / "w-%03d.tar"), max_count=4) as w:
        for i in range(10):
            w.write({"__key__": f"{i:04d}", "txt": f"sample {i}", "cls": i % 3})
        paths = w.paths
    assert w.counts == [4, 4, 2]
    assert [s.samples for s in scan_shards(paths)] == [4, 4, 2]


@pytest.mark.parametrize("name", ["d.tar", "d.tar.gz"])
def test_writer_is_deterministic(tmp_path, name):
    samples = [{"__key__": f"{i:03d}", "bin": bytes([i]) * 700, "cls": i} for i in range(5)]
    a, b = tmp_path / "a" / name, tmp_path / "b" / name
    write_shard(str(a), samples)
    write_shard(str(b), samples)
    assert hashlib.sha256(a.read_bytes()).digest() == hashlib.sha256(b.read_bytes()).digest()
    assert [s.samples for s in scan_shards([str(a)])] == [5]


def test_writer_refuses_keys_with_dots(tmp_path):
    with pytest.raises(ConfigError):
        write_shard(str(tmp_path / "x.tar"), [{"__key__": "a.b", "txt": "x"}])


def test_resolve_world_precedence(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    assert resolve_world() == (1, 0)
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    assert resolve_world() == (4, 3)
    assert resolve_world(2, 1) == (2, 1)
    assert resolve_world(rank=0) == (4, 0)
    with pytest.raises(ConfigError):
        resolve_world(2, 2)
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ConfigError, match="RANK"):
        resolve_world()


def test_a_brace_pattern_naming_missing_shards_warns_only_of_those_that_exist(tmp_path, caplog):
    """Issue 31, 11c: shards a brace pattern names but that do not exist are not 'read'; the
    warning about unlisted shards names only shards that are there, and the error the missing."""
    paths = write_sample_shards(str(tmp_path), shard_sizes=(3, 2, 4))
    write_manifest(str(tmp_path / "manifest.json"), scan_shards(paths[:2]))
    pattern = str(tmp_path / "sample-{000000..000009}.tar")
    with caplog.at_level("WARNING", logger="dali_shards"), pytest.raises(ShardAccessError) as err:
        resolve_source(pattern)
    assert "sample-000003.tar" in str(err.value) and "7 of the 10" in str(err.value)
    warned = [r.getMessage() for r in caplog.records if "does not list" in r.getMessage()]
    assert len(warned) == 1 and "sample-000002.tar" in warned[0]
    assert not any(f"sample-00000{i}.tar" in warned[0] for i in range(3, 10)), "missing shards are not read"
    caplog.clear()
    with caplog.at_level("WARNING", logger="dali_shards"), pytest.raises(ShardAccessError, match="3 of the 3"):
        resolve_source(str(tmp_path / "sample-{0..2}.tar"))  # mistyped: sample-0.tar ... do not exist
    assert "does not list" not in caplog.text and "are read" not in caplog.text


@pytest.mark.parametrize("pattern", ["sample-{000000..000002.tar", "sample-000000..000002}.tar"])
def test_unbalanced_braces_are_a_config_error_naming_the_pattern(tmp_path, shards, pattern):
    with pytest.raises(ConfigError, match="brace") as err:
        resolve_source(str(tmp_path / pattern))
    assert pattern in str(err.value)
