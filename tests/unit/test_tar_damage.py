"""Damaged and unusual tar shards: every one a ShardFormatError naming the shard (and member),
never a raw exception, never an allocation beyond the bytes present; names as tarfile keeps them."""

import io
import shutil
import subprocess
import tarfile

import pytest

from dali_shards.errors import ShardFormatError
from dali_shards.io.storage import open_shard
from dali_shards.tar.format import TarReader
from dali_shards.tar.scan import count_samples
from dali_shards.tools.inspect import inspect_shards


def write(path, members, fmt=tarfile.PAX_FORMAT, pax=None):
    with tarfile.open(path, "w", format=fmt, pax_headers=pax or {}) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return str(path)


def read_all(path):
    with open_shard(path) as f:
        return [(s.key, sorted(s.data)) for s in TarReader(f, path).samples()]


def test_zero_byte_shard_is_truncated(tmp_path):
    path = tmp_path / "zero.tar"
    path.write_bytes(b"")
    with pytest.raises(ShardFormatError, match="the shard is empty") as err:
        read_all(str(path))
    assert err.value.url == str(path)


def test_shard_cut_at_a_member_boundary_is_truncated(tmp_path):
    path = write(tmp_path / "t.tar", [("a.jpg", b"x" * 1000), ("a.cls", b"1"), ("b.jpg", b"y" * 600)])
    data = open(path, "rb").read()
    with tarfile.open(path) as tar:
        members = tar.getmembers()
    boundary = members[-1].offset_data + 1024  # after b.jpg's data and padding: no end blocks
    cut = tmp_path / "cut.tar"
    cut.write_bytes(data[:boundary])
    with pytest.raises(ShardFormatError, match="without the end-of-archive marker"):
        read_all(str(cut))
    with pytest.raises(ShardFormatError, match="end-of-archive"):
        with open(cut, "rb") as f:
            count_samples(f, str(cut))


def test_one_zero_block_or_record_padding_ends_an_archive(tmp_path):
    path = write(tmp_path / "t.tar", [("a.jpg", b"x" * 10)])
    data = open(path, "rb").read().rstrip(b"\0")
    one_block = tmp_path / "one.tar"
    one_block.write_bytes(data + b"\0" * (-len(data) % 512) + b"\0" * 512)
    assert read_all(str(one_block)) == [("a", ["jpg"])]


def test_inspect_reports_a_truncated_shard(tmp_path):
    good = write(tmp_path / "good.tar", [("a.jpg", b"x")])
    empty = tmp_path / "empty.tar"
    empty.write_bytes(b"")
    report = inspect_shards([good, str(empty)])
    assert [b["url"] for b in report["unreadable_shards"]] == [str(empty)]
    assert "the shard is empty" in report["unreadable_shards"][0]["error"]


def test_pax_size_that_is_not_a_number_names_shard_and_member(tmp_path):
    path = tmp_path / "pax.tar"
    raw = bytearray(open(write(tmp_path / "ok.tar", [("s.jpg", b"z" * 20)], pax={"comment": "x"}), "rb").read())
    # make a pax header by hand: "size=abc" for the member s.jpg
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("s.jpg")
        info.size = 20
        info.pax_headers = {"size": "abc"}
        tar.addfile(info, io.BytesIO(b"z" * 20))
    path.write_bytes(buf.getvalue())
    assert raw  # the plain one reads
    with pytest.raises(ShardFormatError, match=r"size='abc' is not a number") as err:
        read_all(str(path))
    assert "s.jpg" in str(err.value) and err.value.url == str(path)


def test_huge_size_field_allocates_nothing_and_names_the_member(tmp_path):
    path = write(tmp_path / "big.tar", [("s.jpg", b"z" * 20), ("s.cls", b"1")], fmt=tarfile.GNU_FORMAT)
    data = bytearray(open(path, "rb").read())
    size_field = b"\x80" + (1 << 40).to_bytes(11, "big")  # GNU base-256: 1 TiB
    data[124:136] = size_field
    data[148:156] = b" " * 8
    data[148:155] = ("%06o\0" % sum(data[:512])).encode()
    bad = tmp_path / "bad.tar"
    bad.write_bytes(bytes(data))
    with pytest.raises(ShardFormatError, match="truncated") as err:
        read_all(str(bad))
    assert "s.jpg" in str(err.value)
    # through a non-seekable (gzip) stream too: read in chunks, never 1 TiB at once
    import gzip

    gz = tmp_path / "bad.tar.gz"
    gz.write_bytes(gzip.compress(bytes(data)))
    with pytest.raises(ShardFormatError, match="truncated"):
        read_all(str(gz))


def test_non_utf8_names_stay_distinct_as_in_tarfile(tmp_path):
    path = tmp_path / "names.tar"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT, encoding="latin-1") as tar:
        for name in ("caf\xe9.jpg", "caf\xe8.jpg"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    path.write_bytes(buf.getvalue())
    keys = [k for k, _ in read_all(str(path))]
    with tarfile.open(path, encoding="utf-8", errors="surrogateescape") as tar:
        want = [m.name.rsplit(".", 1)[0] for m in tar.getmembers()]
    assert keys == want and len(set(keys)) == 2


@pytest.mark.skipif(shutil.which("tar") is None, reason="needs GNU tar")
@pytest.mark.parametrize("fmt", ["posix", "gnu"])
def test_sparse_members_are_refused_clearly(tmp_path, fmt):
    src = tmp_path / "src"
    src.mkdir()
    with open(src / "hole.bin", "wb") as f:
        f.seek(1 << 20)
        f.write(b"end")
    out = tmp_path / f"sparse-{fmt}.tar"
    subprocess.run(["tar", f"--format={fmt}", "--sparse", "-cf", str(out), "-C", str(src), "hole.bin"], check=True)
    with pytest.raises(ShardFormatError, match="sparse file, which is not supported") as err:
        read_all(str(out))
    assert "hole.bin" in str(err.value) and "--sparse" in str(err.value)
