"""Our tar reader against the webdataset library on the same archives (webdataset imports torch:
not a unit test)."""

import os
import tarfile

import pytest
import webdataset as wds

from dali_shards.io.storage import open_shard
from dali_shards.tar.scan import count_samples
from dali_shards.testing.tars import AWKWARD, make_tar, read_samples


def theirs(path):
    out = []
    for s in wds.WebDataset(path, shardshuffle=False):
        out.append((s["__key__"], {k: v for k, v in s.items() if not k.startswith("__")}))
    return out



@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
@pytest.mark.parametrize(
    "mode, suffix", [("w", ".tar"), ("w:gz", ".tar.gz"), ("w:bz2", ".tar.bz2"), ("w:xz", ".tar.xz")]
)
def test_samples_match_webdataset(tmp_path, fmt, mode, suffix):
    path = make_tar(tmp_path / f"shard{suffix}", AWKWARD, fmt=fmt, mode=mode)
    got = read_samples(path)
    assert got == theirs(path)
    assert [k for k, _ in got] == ["a/dir/000", "001", "x" * 120 + "/002", "003", "001", "empty"]
    assert got[0][1] == {"jpg": b"jpeg-0", "cls": b"3", "seg.png": b"mask-0"}
    with open_shard(path) as f:
        assert count_samples(f, path) == len(got)


def test_third_party_shard_matches_webdataset():
    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "wds-sample-mnist.tgz")
    got = read_samples(path)
    assert len(got) == 90
    assert got == theirs(path)
