"""ShardWriter: values encoded as webdataset encodes them, and the manifest written on close."""

import io
import json
import os
import pydoc
import tarfile

import numpy as np
import pytest

from dali_shards import ShardWriter
from dali_shards.catalog.scan import scan_shards
from dali_shards.catalog.manifest import load_index, read_manifest
from dali_shards.errors import ConfigError
from dali_shards.tools.encode import encode


def members(path):
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


def test_values_are_encoded_by_type_and_extension(tmp_path):
    boxes = np.arange(8, dtype=np.float32).reshape(2, 4)
    with ShardWriter(str(tmp_path / "s-%03d.tar")) as writer:
        writer.write({"__key__": "a", "json": {"boxes": boxes, "n": np.int64(2)}, "npy": boxes, "cls": 7,
                      "txt": "héllo", "bin": b"\x00\x01", "meta": [1, 2], "score": 0.5, "flag": True})  # fmt: skip
    got = members(writer.paths[0])
    assert json.loads(got["a.json"]) == {"boxes": boxes.tolist(), "n": 2}
    assert np.array_equal(np.load(io.BytesIO(got["a.npy"])), boxes) and np.load(io.BytesIO(got["a.npy"])).dtype == np.float32
    assert got["a.cls"] == b"7" and got["a.txt"] == "héllo".encode() and got["a.bin"] == b"\x00\x01"
    assert json.loads(got["a.meta"]) == [1, 2] and float(got["a.score"]) == 0.5 and got["a.flag"] == b"1"


def test_text_and_bytes_are_kept_whatever_the_extension():
    assert encode("json", '{"a": 1}') == b'{"a": 1}' and encode("npy", b"\x93NUMPY") == b"\x93NUMPY"


def test_pickle_extensions_and_unencodable_values():
    assert encode("pyd", {1, 2}) == __import__("pickle").dumps({1, 2})
    with pytest.raises(ConfigError, match=r"sample 'k': cannot store a set as \.foo"):
        encode("foo", {1, 2}, "k")
    with pytest.raises(ConfigError, match=r"sample 'k': \.json cannot be stored as JSON"):
        encode("json", {"x": object()}, "k")


def test_the_manifest_is_written_on_close_with_sample_offsets(tmp_path):
    writer = ShardWriter(str(tmp_path / "out" / "s-%03d.tar"), max_count=3)
    for i in range(7):
        writer.write({"__key__": f"k{i}", "txt": "x" * i, "cls": i})
    assert writer.manifest_path is None and not (tmp_path / "out" / "manifest.json").exists()
    writer.close()
    assert writer.counts == [3, 3, 1] and len(writer.paths) == 3
    assert writer.manifest_path == str(tmp_path / "out" / "manifest.json")
    listed, scanned = read_manifest(writer.manifest_path), scan_shards(writer.paths)
    assert [s.samples for s in listed] == [3, 3, 1]
    assert [load_index(s).offsets.tolist() for s in listed] == [s.offsets.tolist() for s in scanned]
    assert [load_index(s).key_crc.tolist() for s in listed] == [s.key_crc.tolist() for s in scanned]
    assert [os.path.abspath(s.url) for s in listed] == [os.path.abspath(p) for p in writer.paths]
    with pytest.raises(ConfigError, match="closed"):
        writer.write({"__key__": "late", "txt": "x"})


def test_manifest_false_or_a_path(tmp_path):
    with ShardWriter(str(tmp_path / "a-%d.tar"), manifest=False) as writer:
        writer.write({"__key__": "k", "txt": "x"})
    assert writer.manifest_path is None and not (tmp_path / "manifest.json").exists()
    with ShardWriter(str(tmp_path / "b-%d.tar.gz"), manifest=str(tmp_path / "m.json")) as writer:
        writer.write({"__key__": "k", "txt": "x"})
    assert [s.samples for s in read_manifest(str(tmp_path / "m.json"))] == [1]


def test_webdataset_names_of_the_same_options_are_taken(tmp_path):
    """``ShardWriter(pattern, maxcount=...)`` as webdataset spells it, not a raw TypeError."""
    with ShardWriter(str(tmp_path / "s-%03d.tar"), maxcount=2, maxsize=1e6, start_shard=3) as writer:
        for i in range(5):
            writer.write({"__key__": f"k{i}", "txt": "x"})
    assert writer.counts == [2, 2, 1] and writer.max_size == 1_000_000
    assert [os.path.basename(p) for p in writer.paths] == ["s-003.tar", "s-004.tar", "s-005.tar"]


@pytest.mark.parametrize("kw, words", [
    (dict(maxcount=2, max_count=3), "both max_count= and maxcount="),
    (dict(verbose=0), r"unknown keyword 'verbose': its options are max_count \(webdataset's maxcount\), max_size"),
    (dict(maxcount=2.5), "max_count must be an integer >= 1, got 2.5"),
    (dict(max_count=0), "max_count must be an integer >= 1, got 0"),
    (dict(start="3"), "start must be an integer >= 0"),
])  # fmt: skip
def test_bad_writer_options_are_config_errors_naming_ours(tmp_path, kw, words):
    with pytest.raises(ConfigError, match=words):
        ShardWriter(str(tmp_path / "s-%03d.tar"), **kw)


def test_help_documents_write_paths_and_counts():
    text = pydoc.render_doc(ShardWriter, renderer=pydoc.plaintext)
    for word in ("write(sample)", "paths", "counts", "manifest", "np.ndarray"):
        assert word in text


def test_a_second_writer_in_the_folder_keeps_the_shards_it_did_not_write(tmp_path, caplog):
    with ShardWriter(str(tmp_path / "s-%03d.tar"), max_count=2) as first:
        for i in range(4):
            first.write({"__key__": f"a{i}", "txt": "x"})
    with ShardWriter(str(tmp_path / "s-%03d.tar"), max_count=2, start=2) as second:
        for i in range(3):
            second.write({"__key__": f"b{i}", "txt": "x"})
    listed = read_manifest(str(tmp_path / "manifest.json"))
    assert [os.path.basename(s.url) for s in listed] == ["s-000.tar", "s-001.tar", "s-002.tar", "s-003.tar"]
    assert [s.samples for s in listed] == [2, 2, 2, 1]
    assert "lists 2 shards this writer did not write" in caplog.text


def test_no_manifest_when_the_with_block_raises(tmp_path, caplog):
    with pytest.raises(RuntimeError):
        with ShardWriter(str(tmp_path / "s-%d.tar")) as writer:
            writer.write({"__key__": "k", "txt": "x"})
            raise RuntimeError("the source failed")
    assert os.path.exists(writer.paths[0]) and not (tmp_path / "manifest.json").exists()
    assert "no manifest written" in caplog.text


def test_an_array_under_an_image_extension_is_refused():
    with pytest.raises(ConfigError, match=r"sample 'k': a numpy array under \.jpg .*encode the image yourself"):
        encode("jpg", np.zeros((4, 4, 3), np.uint8), "k")
