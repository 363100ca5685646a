"""Reading tar shards: the samples webdataset reads (see also test_tarformat_webdataset.py), clear errors on damaged shards."""


import pytest

from dali_shards.errors import ShardFormatError
from dali_shards.io.storage import open_shard
from dali_shards.tar.format import TarReader
from dali_shards.tar.members import split_key
from dali_shards.tar.scan import count_samples
from dali_shards.testing.tars import AWKWARD, make_tar, read_samples


def test_awkward_members_are_read_as_webdataset_reads_them(tmp_path):
    """(The same archives against the webdataset library itself: tests/pipeline/test_tarformat_webdataset.py.)"""
    path = make_tar(tmp_path / "shard.tar", AWKWARD)
    got = read_samples(path)
    assert [k for k, _ in got] == ["a/dir/000", "001", "x" * 120 + "/002", "003", "001", "empty"]
    assert got[0][1] == {"jpg": b"jpeg-0", "cls": b"3", "seg.png": b"mask-0"}
    with open_shard(path) as f:
        assert count_samples(f, path) == len(got)


def test_window_of_samples_and_selected_members(tmp_path):
    members = []
    for i in range(10):
        members += [(f"{i:03d}.jpg", b"j%d" % i), (f"{i:03d}.cls", b"%d" % i)]
    path = make_tar(tmp_path / "s.tar", members)
    got = read_samples(path, want={"cls"}, start=3, stop=6)
    assert got == [("003", {"cls": b"3"}), ("004", {"cls": b"4"}), ("005", {"cls": b"5"})]
    with open_shard(path) as f:
        positions = [s.position for s in TarReader(f, path).samples(start=8)]
    assert positions == [8, 9]


def test_empty_archive_has_no_samples(tmp_path):
    path = make_tar(tmp_path / "empty.tar", [])
    assert read_samples(path) == []


def test_truncated_shard_is_named(tmp_path):
    path = make_tar(tmp_path / "t.tar", [("000.jpg", b"x" * 5000), ("000.cls", b"1")])
    data = open(path, "rb").read()
    cut = tmp_path / "cut.tar"
    cut.write_bytes(data[:3000])
    with pytest.raises(ShardFormatError, match="truncated") as err:
        read_samples(str(cut))
    assert err.value.url == str(cut) and "re-create" in str(err.value)


def test_corrupt_header_is_named(tmp_path):
    path = make_tar(tmp_path / "c.tar", [("000.jpg", b"x" * 600), ("000.cls", b"1")])
    data = bytearray(open(path, "rb").read())
    data[1536 + 3] ^= 0xFF  # inside the second header (the first member: 512-byte header + 1024 data)
    bad = tmp_path / "bad.tar"
    bad.write_bytes(bytes(data))
    with pytest.raises(ShardFormatError, match="checksum"):
        read_samples(str(bad))


def test_signed_checksums_of_old_tars_are_accepted(tmp_path):
    path = make_tar(tmp_path / "s.tar", [("caf\u00e9.txt", b"x"), ("caf\u00e9.cls", b"2")])
    data = bytearray(open(path, "rb").read())
    for offset in (0, 1024):  # rewrite both headers' checksums as signed byte sums
        hdr = data[offset : offset + 512]
        hdr[148:156] = b" " * 8
        signed = sum(b - 256 if b > 127 else b for b in hdr)
        assert signed != sum(hdr)
        data[offset + 148 : offset + 156] = b"%06o\0 " % signed
    old = tmp_path / "old.tar"
    old.write_bytes(bytes(data))
    assert read_samples(str(old)) == [("caf\u00e9", {"txt": b"x", "cls": b"2"})]


def test_not_a_tar_file(tmp_path):
    bad = tmp_path / "notes.tar"
    bad.write_bytes(b"this is not a tar archive at all\n" * 40)
    with pytest.raises(ShardFormatError, match=r"notes\.tar"):
        read_samples(str(bad))


def test_duplicate_member_in_a_sample(tmp_path):
    path = make_tar(tmp_path / "d.tar", [("000.jpg", b"a"), ("000.jpg", b"b"), ("001.jpg", b"c")])
    with open_shard(path) as f:
        first, second = TarReader(f, path).samples()
    assert first.key == "000" and "duplicate member '000.jpg'" in first.error and first.data == {"jpg": b"a"}
    assert second.error is None and second.data == {"jpg": b"c"}, "reading goes on after the bad sample"


@pytest.mark.parametrize(
    "name, expected",
    [
        ("a/b.c.d", ("a/b", "c.d")),
        ("x.JPG", ("x", "jpg")),
        ("noext", (None, None)),
        ("d.ir/file.txt", ("d.ir/file", "txt")),
    ],
)
def test_split_key(name, expected):
    assert split_key(name) == expected


@pytest.mark.parametrize(
    "content", [b"hello, world\n", b"<html>not found</html>\n" * 10, b"\x89PNG\r\n\x1a\n" + b"\0" * 40]
)
def test_a_small_file_that_is_not_a_tar_is_not_called_truncated(tmp_path, content):
    bad = tmp_path / "small.tar"
    bad.write_bytes(content)
    with pytest.raises(ShardFormatError) as err:
        read_samples(str(bad))
    text = str(err.value)
    assert err.value.url == str(bad) and "not a tar archive" in text and "no valid tar header at byte 0" in text
    assert "truncated" not in text and "cut short" not in err.value.detail
    assert f"{len(content)} bytes" in text


def test_a_tar_cut_inside_its_first_header_is_still_truncated(tmp_path):
    path = make_tar(tmp_path / "t.tar", [("000.jpg", b"x" * 600)])
    cut = tmp_path / "cut.tar"
    cut.write_bytes(open(path, "rb").read()[:300])
    with pytest.raises(ShardFormatError, match="truncated tar archive.*first header") as err:
        read_samples(str(cut))
    assert "re-create" in str(err.value)
