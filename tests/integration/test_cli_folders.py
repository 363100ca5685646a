"""The dali-shards command over folders: hidden files in a source tree, and a shard folder read as
the pipeline reads it (its manifest.json, when it has one)."""

import json
import logging

from dali_shards.catalog.manifest import read_manifest
from dali_shards.catalog.sources import resolve_source
from dali_shards.cli import main
from dali_shards.tar.format import TarReader
from dali_shards.sample_data import sample_images, write_sample_shards


def cli(*args):
    return main([str(a) for a in args])


def members_of(path):
    with open(path, "rb") as f:
        return [(key, ext) for _, key, ext, _ in TarReader(f, str(path)).scan()]


def test_write_skips_hidden_files_of_a_tree_with_a_counted_warning(tmp_path, caplog):
    data = open(sample_images()[0].path, "rb").read()
    for rel in ("cat/a.jpg", "cat/.jpg", "cat/._a.jpg", "dog/b.jpg", "dog/sub/.hidden.JPEG"):
        (tmp_path / "src" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / rel).write_bytes(data)
    caplog.set_level(logging.WARNING, "dali_shards")
    assert cli("write", tmp_path / "src", tmp_path / "o" / "t-%02d.tar", "--quiet", "--no-shuffle") == 0
    assert members_of(tmp_path / "o" / "t-00.tar") == [("a", "jpg"), ("a", "cls"), ("b", "jpg"), ("b", "cls")]
    assert "skipped 3 hidden files (names starting with '.')" in caplog.text and "cat/.jpg" in caplog.text
    assert [s.samples for s in resolve_source(str(tmp_path / "o"))] == [2]


def test_write_skips_hidden_files_of_a_list_the_same_way(tmp_path, caplog):
    data = open(sample_images()[0].path, "rb").read()
    for name in ("a.jpg", ".jpg", ".b.png"):
        (tmp_path / name).write_bytes(data)
    (tmp_path / "list.txt").write_text("a.jpg 1\n.jpg 2\n.b.png 3\n")
    caplog.set_level(logging.WARNING, "dali_shards")
    assert cli("write", tmp_path / "list.txt", tmp_path / "o" / "t-%02d.tar", "--quiet") == 0
    assert members_of(tmp_path / "o" / "t-00.tar") == [("a", "jpg"), ("a", "cls")]
    assert "skipped 2 hidden files (names starting with '.')" in caplog.text and "list.txt:2" in caplog.text


def _folder_with_a_stale_shard(tmp_path):
    """Two shards its manifest.json lists, and a tar file it does not (whose keys repeat theirs)."""
    listed = write_sample_shards(str(tmp_path), shard_sizes=(3, 4))
    assert cli("index", *listed, "--quiet", "--no-idx") == 0
    write_sample_shards(str(tmp_path), shard_sizes=(5,), prefix="old")
    return listed


def test_inspect_reads_a_folder_as_the_pipeline_does(tmp_path, capsys):
    listed = _folder_with_a_stale_shard(tmp_path)
    capsys.readouterr()
    assert cli("inspect", tmp_path, "--json", "--quiet") == 0
    report = json.loads(capsys.readouterr().out)
    assert [s["url"] for s in report["per_shard"]] == [s.url for s in resolve_source(str(tmp_path))] == listed
    assert report["shards"] == 2 and report["samples"] == 7 and report["duplicate_keys"] == 0


def test_index_reads_a_folder_as_the_pipeline_does(tmp_path, caplog):
    listed = _folder_with_a_stale_shard(tmp_path)
    caplog.set_level(logging.WARNING, "dali_shards")
    assert cli("index", tmp_path, "--quiet") == 0
    assert [s.url for s in read_manifest(str(tmp_path / "manifest.json"))] == listed
    assert "old-000000.tar" in caplog.text and "not listed" in caplog.text
