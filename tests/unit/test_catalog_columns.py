"""The catalog in columns (issue 47, item 1): a manifest read into arrays gives what reading it entry by
entry gave (every field, URL, and error, word for word), from the JSON and from the binary columns
beside it; string tables, numbered names and repeats found at array speed as Python finds them."""

import json
import os
import posixpath
import uuid

import fsspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dali_shards.catalog import document, manifest as manifest_module
from dali_shards.catalog.binary import columns_path, write_binary
from dali_shards.catalog.entries import check_entry
from dali_shards.catalog.identity import Seen
from dali_shards.catalog.origins import check_entry_origin
from dali_shards.catalog.strings import StringTable, numbered
from dali_shards.catalog.table import record_starts
from dali_shards.errors import ConfigError
from dali_shards.io.filesystems import is_remote
from dali_shards.options import StorageOptions
from dali_shards.plan.sizes import ShardSizes

FOREIGN = StorageOptions(manifest_foreign_urls=True)


def entry_by_entry(path, entries, version, config):
    """What reading a manifest's entries one at a time gave (the release before: ``_listed``):
    (url, samples, bytes, ext_bytes) per entry, or the error's text."""
    remote = is_remote(path)
    base = path.rsplit("/", 1)[0] if remote else os.path.dirname(os.path.abspath(path))
    out, seen = [], Seen()
    try:
        for i, entry in enumerate(entries):
            checked = check_entry(path, i, entry, version)
            url = checked.url
            if "://" not in url and not url.startswith("/"):
                url = posixpath.join(base, url) if remote else os.path.join(base, url)
            check_entry_origin(path, i, checked.url, url, config)
            before = seen.before(url, (i, checked.url))
            if before is not None:
                first, (j, written) = before
                raise ConfigError(
                    f"manifest {path!r} lists shard {first!r} twice: entry {j} ({written!r}) and entry {i} "
                    f"({checked.url!r}); each shard may appear once: remove one of them"
                )
            out.append((url, checked.samples, checked.bytes, checked.ext_bytes))
    except ConfigError as exc:
        return str(exc)
    return out


def in_columns(path, config):
    try:
        return [(s.url, s.samples, s.bytes, s.ext_bytes) for s in manifest_module.read_manifest(path, config)]
    except ConfigError as exc:
        return str(exc)


NAMES = st.sampled_from(["a.tar", "b.tar", "./a.tar", "sub/c.tar", "sub/../a.tar", "/abs/d.tar", "file:///abs/d.tar",
                         "http://elsewhere/e.tar", "x%2e.tar", ".", "..", "", "s-000001.tar", "s-000002.tar"])  # fmt: skip
COUNTS = st.one_of(st.integers(0, 40), st.sampled_from([-1, 1 << 60, True, "3"]))
EXT = st.one_of(st.none(), st.dictionaries(st.sampled_from(["jpg", "cls", "txt"]), st.one_of(st.integers(0, 99), st.just(-5)),
                                           max_size=3))  # fmt: skip
ENTRY = st.builds(lambda url, n, size, ext: {k: v for k, v in {"url": url, "samples": n, "bytes": size, "ext_bytes": ext}.items()
                                             if v is not None},
                  NAMES, COUNTS, st.one_of(st.none(), st.integers(0, 1 << 20), st.just(-2)), EXT)  # fmt: skip


def write_v2(path, entries):
    with open(path, "w") as f:
        json.dump({"format": "dali-shards-manifest", "version": 2, "shards": entries}, f)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entries=st.lists(ENTRY, max_size=8), remote=st.booleans(), foreign=st.booleans())
def test_columns_read_a_manifest_as_entry_by_entry_reading_did(tmp_path, entries, remote, foreign):
    config = FOREIGN if foreign else StorageOptions()
    if remote:
        path = f"memory://m{uuid.uuid4().hex[:10]}/d/manifest.json"
        fs = fsspec.filesystem("memory")
        fs.pipe_file(path.split("://", 1)[1], json.dumps({"format": "dali-shards-manifest", "version": 2,
                                                          "shards": entries}).encode())  # fmt: skip
    else:
        path = str(tmp_path / f"m{uuid.uuid4().hex[:10]}.json")
        write_v2(path, entries)
    try:
        assert in_columns(path, config) == entry_by_entry(path, entries, 2, config)
    finally:
        if remote:
            fs.rm(path.split("://", 1)[1].rsplit("/", 2)[0], recursive=True)


def write_v3(path, entries, columns):
    """A version-3 manifest of ``entries`` (its table the size their counts make), with or without its columns."""
    doc = {"format": "dali-shards-manifest", "version": 3, "shards": entries, "sample_table": "m.samples"}
    text = (json.dumps(doc, indent=1) + "\n").encode()
    counts = [e["samples"] if isinstance(e.get("samples"), int) and 0 <= e["samples"] < 1000 else 0 for e in entries]
    with open(os.path.join(os.path.dirname(path), "m.samples"), "wb") as f:
        f.truncate(int(record_starts(counts)[-1]))
    if columns:
        good = [e for e in entries if isinstance(e.get("url"), str) and type(e.get("samples")) is int
                and type(e.get("bytes", 0)) is int and all(type(v) is int for v in (e.get("ext_bytes") or {}).values())]
        if len(good) == len(entries):
            write_binary(path, text, entries, "m.samples", StorageOptions())
    with open(path, "wb") as f:
        f.write(text)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entries=st.lists(ENTRY.filter(lambda e: type(e["samples"]) is int and 0 <= e["samples"] < 1000), max_size=8))
def test_the_binary_columns_read_as_their_json(tmp_path, entries, monkeypatch):
    """Columns written beside the JSON (and read without it: the parse is never reached) give the
    same shards and the same first error, word for word."""
    monkeypatch.setattr(document, "BINARY_AT_LEAST", 0)
    folder = tmp_path / uuid.uuid4().hex[:8]
    folder.mkdir()
    path = str(folder / "m.json")
    write_v3(path, entries, columns=False)
    want = in_columns(path, StorageOptions())
    write_v3(path, entries, columns=True)
    assert os.path.exists(columns_path(path))
    with monkeypatch.context() as patched:
        patched.setattr(document, "from_json", lambda *a: pytest.fail("the JSON was parsed"))
        assert in_columns(path, StorageOptions()) == want


def test_columns_that_do_not_match_their_json_are_not_used(tmp_path, monkeypatch):
    monkeypatch.setattr(document, "BINARY_AT_LEAST", 0)
    path = str(tmp_path / "m.json")
    write_v3(path, [{"url": "a.tar", "samples": 3}, {"url": "b.tar", "samples": 4}], columns=True)
    doc = json.loads(open(path).read())
    doc["shards"][1]["samples"] = 5  # edited by hand: the columns are stale
    write_v3(path, doc["shards"], columns=False)
    assert os.path.exists(columns_path(path))
    assert [s.samples for s in manifest_module.read_manifest(path)] == [3, 5]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text("ab.é/", max_size=4), max_size=20))
def test_a_string_table_holds_its_strings_and_finds_the_first_repeat(strings):
    table = StringTable.of(strings)
    assert list(table) == strings and [table[i] for i in range(len(strings))] == strings
    first = {}
    want = None
    for i, s in enumerate(strings):
        if s in first:
            want = (first[s], i)
            break
        first[s] = i
    assert table.first_repeat() == want
    prefix = "pre/"
    assert (table.digests(prefix.encode()) == StringTable.of(prefix + s for s in strings).digests()).all()


def test_numbered_names_are_recognised_and_nothing_else():
    names = [f"train-{i:06d}.tar" for i in range(95, 205)]
    found = numbered(StringTable.of(names))
    assert found is not None and [f"{found.head}{found.start + i:0{found.width}d}{found.tail}" for i in range(len(names))] == names
    assert numbered(StringTable.of(names[:50] + names[51:])) is None  # a gap
    assert numbered(StringTable.of(names[:3] + [names[1]])) is None
    assert numbered(StringTable.of(["a1.tar", "b2.tar"])) is None
    assert StringTable.of(names + [names[7]]).first_repeat() == (7, len(names))


def test_shard_sizes_hold_one_array_and_compare_as_a_tuple():
    import pickle

    sizes = ShardSizes([3, 0, 5])
    assert sizes == (3, 0, 5) and sizes == [3, 0, 5] and sizes != (3, 0) and list(sizes) == [3, 0, 5]
    assert hash(sizes) == hash(ShardSizes(np.array([3, 0, 5]))) and pickle.loads(pickle.dumps(sizes)) == sizes
    assert not sizes.array.flags.writeable and sizes[2] == 5 and sizes[:2] == (3, 0)
