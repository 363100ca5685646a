"""One notion of a shard's identity for every duplicate check (issue 43, items 4 and 5): a local
shard's real path however it is spelled (a symlinked folder, a relative path, ``file://``,
doubled slashes), a remote URL normalised; and a shard given twice under two spellings refused,
naming both, by a source, a manifest and a mix of streams."""

import json
import os

import pytest

from dali_shards import Stream
from dali_shards.catalog.identity import Seen, ShardIdentity, shard_identity, spelled
from dali_shards.catalog.manifest import read_manifest
from dali_shards.catalog.sources import resolve_source
from dali_shards.errors import ConfigError
from dali_shards.options import ShardedOptions
from dali_shards.setup.resolve import resolve


@pytest.fixture()
def folder(make_shards, tmp_path):
    """Two shards in ``real/``, a symlink ``link`` to that folder; the working directory ``tmp_path``."""
    paths = make_shards((3, 2), folder=tmp_path / "real")
    os.symlink(tmp_path / "real", tmp_path / "link")
    return tmp_path, paths


SPELLINGS = {
    "symlinked folder": lambda root, path: os.path.join(root, "link", os.path.basename(path)),
    "relative path": lambda root, path: os.path.relpath(path),
    "file URL": lambda root, path: "file://" + path,
    "leading //": lambda root, path: "/" + path,
    "doubled slashes": lambda root, path: path.replace(os.sep, "//"),
    "dot segments": lambda root, path: os.path.join(root, "real", ".", "..", "real", os.path.basename(path)),
}


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_a_local_shard_is_its_real_path_however_spelled(folder, spelling, monkeypatch):
    root, paths = folder
    monkeypatch.chdir(root)
    other = SPELLINGS[spelling](str(root), paths[0])
    assert other != paths[0]
    assert shard_identity(other) == shard_identity(paths[0]) == os.path.realpath(paths[0])
    assert shard_identity(other) != shard_identity(paths[1])


def test_a_symlinked_file_is_the_file_it_points_at(folder):
    root, paths = folder
    os.symlink(paths[0], root / "alias.tar")
    identity = ShardIdentity()  # the folder's real path remembered: the link itself still resolved
    assert [identity(p) for p in (paths[0], str(root / "alias.tar"), paths[1])] == [os.path.realpath(p) for p in (paths[0], paths[0], paths[1])]


@pytest.mark.parametrize("one, other", [
    ("HTTP://Host.Example:80/d/x.tar", "http://host.example/d/x.tar"),
    ("https://h:443/d/x.tar", "https://h/d/x.tar"),
    ("http://h/d/./x.tar", "http://h/d/x.tar"),
    ("http://h/d/sub/../x.tar", "http://h/d/x.tar"),
    ("http://h/d/.//x.tar", "http://h/d/x.tar"),
    ("http://h//d///x.tar", "http://h/d/x.tar"),
    ("http://h/../d/x.tar", "http://h/d/x.tar"),
    ("http://h/d/%7Ex%2f.tar", "http://h/d/~x%2F.tar"),
    ("S3://Bucket/d/./x.tar", "s3://bucket/d/x.tar"),
    ("http://h/d/x.tar?v=1&w=./a", "http://h/./d/x.tar?v=1&w=./a"),
])  # fmt: skip
def test_remote_urls_are_normalised(one, other):
    assert shard_identity(one) == shard_identity(other)


@pytest.mark.parametrize("one, other", [
    ("http://h/d/x.tar", "http://h/d/y.tar"),
    ("http://h/d/x.tar", "http://h:8080/d/x.tar"),
    ("http://h/d/x.tar", "https://h/d/x.tar"),
    ("http://h/d/x.tar", "http://g/d/x.tar"),
    ("http://h/d/x.tar?v=1", "http://h/d/x.tar?v=2"),
    ("http://h/d/x.tar?w=./a", "http://h/d/x.tar?w=a"),
    ("http://h/d/x.tar", "http://h/d/x.tar/.."),
    ("s3://b/d/x.tar", "gs://b/d/x.tar"),
])  # fmt: skip
def test_different_remote_shards_stay_different(one, other):
    assert shard_identity(one) != shard_identity(other)


def test_seen_gives_the_first_spelling_and_spelled_names_both(folder):
    root, paths = folder
    seen: Seen[int] = Seen()
    assert seen.before(paths[0], 0) is None and seen.before(paths[1], 1) is None
    link = SPELLINGS["symlinked folder"](str(root), paths[0])
    assert seen.before(link, 2) == (paths[0], 0)
    text = spelled(paths[0], link)
    assert repr(paths[0]) in text and repr(link) in text and repr(os.path.realpath(paths[0])) in text
    assert spelled(paths[0], paths[0]) == repr(paths[0])


def mix_options(streams):
    return ShardedOptions.from_keywords(source=streams, fields=("jpg", "cls"), batch_size=2, py_num_workers=1,
                                        world_size=1, rank=0)  # fmt: skip


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_a_mix_refuses_one_folder_in_two_streams_however_spelled(folder, spelling, monkeypatch):
    root, paths = folder
    monkeypatch.chdir(root)
    other = [SPELLINGS[spelling](str(root), p) for p in paths]
    with pytest.raises(ConfigError) as err:
        resolve(mix_options([Stream(paths), Stream(other, proportion=1)]))
    text = str(err.value)
    assert "stream 0 and stream 1" in text and repr(paths[0]) in text and repr(other[0]) in text
    assert len(resolve(mix_options([Stream(paths[:1]), Stream(other[1:])])).shards) == 2  # distinct shards mix


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_a_source_list_refuses_one_shard_twice_naming_both_spellings(folder, spelling, monkeypatch):
    root, paths = folder
    monkeypatch.chdir(root)
    other = SPELLINGS[spelling](str(root), paths[1])
    with pytest.raises(ConfigError, match="listed twice.*item 1 of the source list.*item 2 of the source list") as err:
        resolve_source([paths[0], paths[1], other])
    assert repr(other) in str(err.value)


@pytest.mark.parametrize("entry", ["./sample-000000.tar", "sub/../sample-000000.tar", ".//sample-000000.tar"])
def test_a_local_manifest_refuses_one_shard_listed_twice_however_spelled(folder, entry):
    root, _ = folder
    (root / "real" / "sub").mkdir()
    manifest = root / "real" / "list.json"
    shards = [{"url": "sample-000000.tar", "samples": 3}, {"url": "sample-000001.tar", "samples": 2},
              {"url": entry, "samples": 3}]  # fmt: skip
    manifest.write_text(json.dumps({"format": "dali-shards-manifest", "version": 2, "shards": shards}))
    with pytest.raises(ConfigError, match=r"twice: entry 0 \('sample-000000.tar'\) and entry 2") as err:
        read_manifest(str(manifest))
    assert repr(entry) in str(err.value) and str(manifest) in str(err.value)
