"""One catalog per node (issue 47, item 2): the processes reading one manifest share one column file in
the node's catalog folder, keyed by the manifest's content; a changed manifest is never read from a
stale copy, a file cut short or left half-written by a builder that died is never used, builders
racing each other leave one consistent file, and a worker receives the mapped catalog as its path."""

import json
import multiprocessing
import os
import pickle
import signal

import numpy as np
import pytest

from dali_shards.catalog import manifest as manifest_module
from dali_shards.catalog import shared
from dali_shards.catalog.colfile import temp_name
from dali_shards.catalog.manifest import read_catalog
from dali_shards.options import ShardedOptions, StorageOptions
from dali_shards.setup.resolve import resolve
from dali_shards.tools.writer import ShardWriter


@pytest.fixture
def node(tmp_path, monkeypatch):
    """Every manifest shared, through the catalog folder of ``tmp_path/cache``."""
    monkeypatch.setattr(manifest_module, "SHARE_BYTES", 0)
    return StorageOptions(cache_dir=str(tmp_path / "cache"))


def write(path, counts):
    doc = {"format": "dali-shards-manifest", "version": 2,
           "shards": [{"url": f"s-{i:04d}.tar", "samples": n, "bytes": 1024 * (n + 2)} for i, n in enumerate(counts)]}  # fmt: skip
    with open(path, "w") as f:
        json.dump(doc, f)
    return str(path)


def files(config):
    folder = os.path.join(config.cache_dir, "catalogs")
    return sorted(n for n in os.listdir(folder) if not n.endswith(".lock"))


def test_a_manifest_is_mapped_from_one_file_keyed_by_its_content(tmp_path, node):
    path = write(tmp_path / "m.json", [3, 4, 5])
    first = read_catalog(path, node)
    again = read_catalog(path, node)
    assert first.path is not None and again.path == first.path and files(node) == [os.path.basename(first.path)]
    assert not again.samples.flags.writeable and again.samples.tolist() == [3, 4, 5]
    assert [s.url for s in again] == [str(tmp_path / f"s-{i:04d}.tar") for i in range(3)]
    write(tmp_path / "m.json", [3, 4, 6])  # changed: another key, never the stale copy
    changed = read_catalog(path, node)
    assert changed.path != first.path and changed.samples.tolist() == [3, 4, 6]
    (tmp_path / "elsewhere").mkdir()
    moved = write(tmp_path / "elsewhere" / "m.json", [3, 4, 6])  # the same text elsewhere: its own shards
    assert read_catalog(moved, node).url(0) == str(tmp_path / "elsewhere" / "s-0000.tar")


def test_a_file_cut_short_is_built_again(tmp_path, node, caplog):
    path = write(tmp_path / "m.json", [3, 4, 5])
    built = read_catalog(path, node).path
    with open(built, "r+b") as f:
        f.truncate(os.path.getsize(built) - 100)
    assert read_catalog(path, node).samples.tolist() == [3, 4, 5]
    assert "cannot be used" in caplog.text and os.path.getsize(built) > 0


def _die_building(path, cache):
    """A builder that takes the lock, writes part of the file, and is killed."""
    config = StorageOptions(cache_dir=cache)
    folder = shared.catalog_dir(config)
    known = manifest_module.identity(path, config, 0)
    target = os.path.join(folder, shared.key_of(*known.parts) + shared.SUFFIX)
    shared._lock(target + ".lock")
    with open(temp_name(target), "wb") as f:
        f.write(b"DSCOLS\x00\x01" + b"\x00" * 100)
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_builder_that_dies_leaves_nothing_used_and_the_next_one_builds(tmp_path, node):
    path = write(tmp_path / "m.json", [3, 4, 5])
    ctx = multiprocessing.get_context("fork")
    dying = ctx.Process(target=_die_building, args=(path, node.cache_dir))
    dying.start()
    dying.join(30)
    assert dying.exitcode == -signal.SIGKILL
    assert any(n.endswith(".tmp") for n in files(node))
    assert read_catalog(path, node).samples.tolist() == [3, 4, 5]  # its lock went with it; its temp file removed
    assert not any(n.endswith(".tmp") for n in files(node)) and len(files(node)) == 1


def _read(path, cache, out):
    catalog = read_catalog(path, StorageOptions(cache_dir=cache))
    out.put((catalog.path, catalog.samples.tolist(), [s.url for s in catalog][:2]))


def test_builders_racing_each_other_leave_one_consistent_file(tmp_path, node, monkeypatch):
    """4 processes read one manifest at once: one builds (under the lock), the others map its file."""
    counts = list(range(1, 2000))
    path = write(tmp_path / "m.json", counts)
    log = tmp_path / "builds"
    build = manifest_module.build

    def counted(*args, **kw):
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        return build(*args, **kw)

    monkeypatch.setattr(manifest_module, "build", counted)  # (forked: the processes have it)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_read, args=(path, node.cache_dir, out)) for _ in range(4)]
    for p in procs:
        p.start()
    got = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    assert all(p.exitcode == 0 for p in procs)
    assert len({g[0] for g in got}) == 1 and all(g[1] == counts for g in got) and len({str(g[2]) for g in got}) == 1
    assert files(node) == [os.path.basename(got[0][0])] and len(log.read_text().split()) == 1


def test_a_worker_receives_a_mapped_catalog_as_its_path(tmp_path, node):
    """What a worker receives does not grow with the shards: the mapped catalog's columns travel as
    its file's path (and its plan's sizes as that catalog's)."""
    sizes = {}
    for n in (40, 400):
        folder = tmp_path / f"d{n}"
        with ShardWriter(str(folder / "s-%04d.tar"), max_count=1) as writer:
            for i in range(n):
                writer.write({"__key__": f"{i:05d}", "txt": "x"})
        options = ShardedOptions(source=str(folder / "manifest.json"), fields=("txt",), batch_size=2, py_num_workers=1,
                                 world_size=1, rank=0, storage=node)  # fmt: skip
        worker = resolve(options).workers[0]
        assert worker.urls.catalog.path is not None
        data = pickle.dumps(worker)
        sizes[n] = len(data)
        back = pickle.loads(data)
        assert list(back.urls) == list(worker.urls) and back.counts == worker.counts and back.counts.array.base is not None
    assert sizes[400] - sizes[40] < 2000, sizes  # (10 times the shards: the same few bytes)


def test_no_folder_is_used_where_another_user_owns_it(tmp_path, monkeypatch):
    monkeypatch.setattr(shared.tempfile, "gettempdir", lambda: str(tmp_path))
    os.makedirs(tmp_path / f"dali_shards-{os.getuid()}", mode=0o777)
    os.chmod(tmp_path / f"dali_shards-{os.getuid()}", 0o777)  # writable by others: not trusted
    assert shared.catalog_dir(StorageOptions()) is None
    os.chmod(tmp_path / f"dali_shards-{os.getuid()}", 0o700)
    assert shared.catalog_dir(StorageOptions()) == str(tmp_path / f"dali_shards-{os.getuid()}" / "catalogs")
    assert np.array_equal(read_catalog(write(tmp_path / "m.json", [1, 2]), StorageOptions()).samples, [1, 2])


def test_a_remote_manifest_is_downloaded_once_per_node_and_again_when_it_changes(node, monkeypatch):
    import uuid

    import fsspec

    from dali_shards.catalog import document

    fs = fsspec.filesystem("memory")
    root = f"/r{uuid.uuid4().hex[:10]}"
    doc = {"format": "dali-shards-manifest", "version": 2, "shards": [{"url": f"s{i}.tar", "samples": i + 1} for i in range(3)]}
    fs.pipe_file(f"{root}/manifest.json", json.dumps(doc).encode())
    reads = []
    read_text = document.read_text
    monkeypatch.setattr(document, "read_text", lambda *a: reads.append(a[0]) or read_text(*a))
    try:
        for _ in range(3):  # three ranks of one node
            catalog = read_catalog(f"memory:/{root}/manifest.json", node)
            assert catalog.samples.tolist() == [1, 2, 3] and catalog.url(0) == f"memory:/{root}/s0.tar"
        assert len(reads) == 1 and catalog.path is not None
        doc["shards"][0]["samples"] = 7
        fs.pipe_file(f"{root}/manifest.json", json.dumps(doc).encode())  # a new version of the object
        assert read_catalog(f"memory:/{root}/manifest.json", node).samples.tolist() == [7, 2, 3] and len(reads) == 2
    finally:
        fs.rm(root, recursive=True)
