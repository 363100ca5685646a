"""ShardWriter refuses, at write(), keys, fields and values a reader could not read back as written."""

import numpy as np
import pytest

from dali_shards import ShardWriter
from dali_shards.catalog.sources import resolve_source
from dali_shards.errors import ConfigError
from dali_shards.tar.format import TarReader
from dali_shards.tools.writer import TarShardFile


@pytest.mark.parametrize(
    "sample, message",
    [
        ({"__key__": "a\x00b", "txt": "x"}, r"sample 'a\\x00b': the key .*NUL"),
        ({"__key__": "a\udcffb", "txt": "x"}, r"sample 'a\\udcffb': the key is not valid UTF-8"),
        ({"__key__": "v1.2", "txt": "x"}, r"'__key__' string without dots"),
        ({"__key__": "__meta__/x", "txt": "x"}, r"sample '__meta__/x': .*metadata"),
        ({"__key__": "k", "t\x00xt": "x"}, r"sample 'k': field 't\\x00xt'.*NUL"),
        ({"__key__": "k", "t\udcffxt": "x"}, r"sample 'k': field 't\\udcffxt' is not valid UTF-8"),
        ({"__key__": "k", "a/b": "x"}, r"sample 'k': field 'a/b' .*'/'"),
        ({"__key__": "k", ".": "x"}, r"sample 'k': field '\.' .*no extension"),
        ({"__key__": "k", "txt": "x", ".txt": "y"}, r"sample 'k': fields 'txt' and '\.txt' both name member 'k\.txt'"),
        ({"__key__": "k", "jpg": b"x", "JPG": b"y"}, r"sample 'k': fields 'jpg' and 'JPG' both name member"),
        ({"__key__": "k", "txt": "a\udcffb"}, r"sample 'k': \.txt is not valid UTF-8 text"),
        ({"__key__": "k", "npy": np.array([object()], dtype=object)}, r"sample 'k': \.npy cannot be stored as \.npy"),
        ({"__key__": "k", "npy": [[1], [1, 2]]}, r"sample 'k': \.npy cannot be stored as \.npy"),
        ({"__key__": "k", "pyd": lambda: 1}, r"sample 'k': \.pyd cannot be pickled"),
    ],
)
def test_unreadable_names_and_values_are_refused_at_write(tmp_path, sample, message):
    with ShardWriter(str(tmp_path / "s-%d.tar")) as writer:
        with pytest.raises(ConfigError, match=message):
            writer.write(sample)
        writer.write({"__key__": "ok", "txt": "x"})  # the writer goes on
    assert [s.samples for s in resolve_source(str(tmp_path))] == [1]


def test_add_members_checks_names_too(tmp_path):
    with TarShardFile(str(tmp_path / "a.tar")) as shard:
        with pytest.raises(ConfigError, match="NUL"):
            shard.add_members("a\x00", {"txt": b"x"})
    assert shard.count == 0


def test_keys_a_reader_reads_back_are_kept(tmp_path):
    keys = ["dir/sub/x", "héllo wörld", "a b", "x-1_2", "__key_like"]
    with ShardWriter(str(tmp_path / "s-%d.tar")) as writer:
        for key in keys:
            writer.write({"__key__": key, "seg.png": b"p", "TXT": "t"})
    assert [s.samples for s in resolve_source(str(tmp_path))] == [len(keys)]
    with open(writer.paths[0], "rb") as f:
        read = [(key, ext) for _, key, ext, _ in TarReader(f, writer.paths[0]).scan()]
    assert read == [(key, ext) for key in keys for ext in ("seg.png", "txt")]


def test_a_list_under_npy_is_stored_as_npy():
    """The extension decides before the type: a list under .npy is an array, not JSON text."""
    import io

    from dali_shards.tools.encode import encode

    assert np.load(io.BytesIO(encode("npy", [[1, 2], [3, 4]]))).tolist() == [[1, 2], [3, 4]]
