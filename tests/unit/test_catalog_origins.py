"""Where a manifest's entries may point (issue 31, item 4): a remote manifest's stay on its own
server or bucket unless ``manifest_foreign_urls=True``; a folder's ``manifest.json`` that names
shards outside the folder is read, with a warning naming it and an entry. Remote manifests here
live in fsspec's in-memory filesystem (see tests/integration/test_catalog_remote_manifests.py for
HTTP)."""

import json
import os
import uuid

import fsspec
import pytest

from dali_shards.catalog.manifest import read_manifest
from dali_shards.catalog.sources import resolve_source
from dali_shards.errors import ConfigError
from dali_shards.options import ShardedOptions, StorageOptions
from dali_shards.tools.writer import write_shard

FORMAT = {"format": "dali-shards-manifest", "version": 2}


def samples(count):
    return [{"__key__": f"{i:06d}", "txt": f"sample {i}"} for i in range(count)]


def doc(*urls):
    return json.dumps({**FORMAT, "shards": [{"url": u, "samples": 3} for u in urls]})


@pytest.fixture
def local_shard(tmp_path):
    path = tmp_path / "secret" / "s.tar"
    path.parent.mkdir()
    write_shard(str(path), samples(3))
    return str(path)


@pytest.fixture
def bucket():
    """A fresh bucket of the in-memory filesystem: its ``memory://`` root, removed afterwards."""
    name = f"b{uuid.uuid4().hex[:12]}"
    fs = fsspec.filesystem("memory")
    yield fs, f"memory://{name}"
    if fs.exists(f"/{name}"):
        fs.rm(f"/{name}", recursive=True)


@pytest.mark.parametrize("spelling", ["path", "file_url"])
def test_a_remote_manifest_may_not_point_at_local_files(bucket, local_shard, spelling):
    fs, root = bucket
    entry = local_shard if spelling == "path" else "file://" + local_shard
    fs.pipe_file(f"{root}/d/manifest.json", doc("a.tar", entry).encode())
    manifest = f"{root}/d/manifest.json"
    for call in (lambda: resolve_source(manifest), lambda: read_manifest(manifest)):
        with pytest.raises(ConfigError) as err:
            call()
        text = str(err.value)
        assert manifest in text and "entry 1" in text and entry in text and "manifest_foreign_urls=True" in text


@pytest.mark.parametrize(
    "entry",
    ["memory://other-bucket/x.tar", "http://127.0.0.1:9/x.tar", "s3://{name}/x.tar", "MEMORY://elsewhere/x.tar"],
)
def test_a_remote_manifest_may_not_point_at_another_server_or_bucket(bucket, entry):
    fs, root = bucket
    entry = entry.format(name=root.split("://")[1])
    fs.pipe_file(f"{root}/manifest.json", doc(entry).encode())
    with pytest.raises(ConfigError, match="entry 0.*manifest_foreign_urls"):
        read_manifest(f"{root}/manifest.json")


def test_entries_on_the_manifests_own_bucket_are_read(bucket):
    fs, root = bucket
    fs.pipe_file(f"{root}/d/manifest.json", doc("a.tar", "../e/b.tar", f"{root}/f/c.tar", "sub/d.tar").encode())
    urls = [s.url for s in read_manifest(f"{root}/d/manifest.json")]
    assert urls[0] == f"{root}/d/a.tar" and urls[2] == f"{root}/f/c.tar" and urls[3] == f"{root}/d/sub/d.tar"
    assert urls[1].startswith(root + "/")


def test_foreign_entries_are_read_with_the_opt_in(bucket, local_shard):
    fs, root = bucket
    fs.pipe_file(f"{root}/manifest.json", doc(local_shard, "memory://other-bucket/x.tar").encode())
    infos = read_manifest(f"{root}/manifest.json", StorageOptions(manifest_foreign_urls=True))
    assert [s.url for s in infos] == [local_shard, "memory://other-bucket/x.tar"]
    options = ShardedOptions.from_keywords(
        source=f"{root}/manifest.json", fields=("txt",), batch_size=1, py_num_workers=1, manifest_foreign_urls=True
    )
    assert options.storage.manifest_foreign_urls is True
    assert options.keywords()["manifest_foreign_urls"] is True
    with pytest.raises(ConfigError, match="manifest_foreign_urls must be True or False"):
        StorageOptions(manifest_foreign_urls="yes")


def test_a_folder_manifest_naming_shards_outside_the_folder_warns(tmp_path, local_shard, caplog):
    folder = tmp_path / "data"
    folder.mkdir()
    write_shard(str(folder / "own.tar"), samples(3))
    (folder / "manifest.json").write_text(doc("own.tar", "../secret/s.tar"))
    manifest = str(folder / "manifest.json")
    for source in (str(folder), manifest):
        caplog.clear()
        with caplog.at_level("WARNING", logger="dali_shards"):
            shards = resolve_source(source)
        assert [os.path.basename(s.url) for s in shards] == ["own.tar", "s.tar"]  # read, as listed
        warned = [r.getMessage() for r in caplog.records if "outside" in r.getMessage()]
        assert len(warned) == 1 and manifest in warned[0] and "entry 1" in warned[0] and "../secret/s.tar" in warned[0]
    (folder / "manifest.json").write_text(doc("own.tar", local_shard))
    with caplog.at_level("WARNING", logger="dali_shards"):
        resolve_source(str(folder))
    assert local_shard in caplog.text and "outside" in caplog.text


def test_a_folder_manifest_listing_only_its_own_shards_does_not_warn(tmp_path, caplog):
    write_shard(str(tmp_path / "own.tar"), samples(3))
    (tmp_path / "manifest.json").write_text(doc("own.tar"))
    with caplog.at_level("WARNING", logger="dali_shards"):
        resolve_source(str(tmp_path))
    assert "outside" not in caplog.text
