"""Samples read by their byte span: the same samples as a sequential read, stale spans refused,
open files bounded."""

import io
import os

import numpy as np
import pytest

from dali_shards.errors import ShardAccessError, ShardFormatError
from dali_shards.io.positioned import LocalFiles, sample_in_span
from dali_shards.io.storage import open_shard
from dali_shards.tar.format import TarReader
from dali_shards.tar.scan import scan_tar


@pytest.fixture(scope="module")
def shards(make_shards):
    paths = make_shards((7, 0, 5, 9, 3))
    offsets = []
    for p in paths:
        with open_shard(p) as f:
            offsets.append(np.asarray(scan_tar(f, p).offsets))
    return paths, offsets


def sequential(path):
    with open(path, "rb") as f:
        return [(s.key, dict(s.data)) for s in TarReader(f, path).samples()]


def test_every_span_holds_the_sample_a_sequential_read_finds(shards):
    paths, offsets = shards
    files = LocalFiles()
    for path, offs in zip(paths, offsets):
        want = sequential(path)
        assert len(offs) == len(want) + 1 and offs[0] == 0
        assert offs[-1] <= os.path.getsize(path) and (np.diff(offs) % 512 == 0).all()
        for i in reversed(range(len(want))):  # any order: no state between reads
            span = (int(offs[i]), int(offs[i + 1]))
            sample = sample_in_span(files.read(path, path, span), path, span, i)
            assert (sample.key, sample.data, sample.position) == (*want[i], i)
    files.close()


def test_a_span_that_does_not_hold_one_sample_is_a_format_error_naming_the_shard(shards):
    paths, offsets = shards
    path, offs = paths[0], offsets[0]
    data = open(path, "rb").read()
    two = (int(offs[1]), int(offs[3]))
    with pytest.raises(ShardFormatError, match=r"hold 2 samples") as err:
        sample_in_span(data[two[0] : two[1]], path, two, 1)
    assert path in str(err.value) and "dali-shards index" in str(err.value)
    skewed = (int(offs[1]) + 512, int(offs[2]))  # a span that begins inside a sample
    with pytest.raises(ShardFormatError):
        sample_in_span(data[skewed[0] : skewed[1]], path, skewed, 1)
    span = (int(offs[1]), int(offs[2]))
    with pytest.raises(ShardFormatError, match="ends at byte"):
        sample_in_span(data[span[0] : span[1] - 1000], path, span, 1)


def test_open_files_are_bounded_and_reads_stay_right(shards):
    paths, offsets = shards
    files = LocalFiles(max_open=2)
    for _ in range(2):
        for path, offs in zip(paths, offsets):
            if len(offs) > 1:
                span = (int(offs[-2]), int(offs[-1]))
                assert sample_in_span(files.read(path, path, span), path, span, len(offs) - 2).position == len(offs) - 2
                assert len(files._files) <= 2
    files.close()
    assert not files._files


def test_a_changed_or_missing_file_is_named(shards, tmp_path):
    paths, offsets = shards
    files = LocalFiles()
    with pytest.raises(ShardFormatError, match="bytes"):
        files.read(paths[0], paths[0], (0, 512), size=os.path.getsize(paths[0]) + 1)
    missing = str(tmp_path / "gone.tar")
    with pytest.raises(ShardAccessError, match="gone.tar"):
        files.read(missing, missing, (0, 512))
    files.close()


def test_runs_land_where_asked_in_any_order_and_a_file_shorter_than_counted_is_no_whole_read(shards, tmp_path):
    paths, offsets = shards
    path, offs = paths[3], offsets[3]
    raw = np.fromfile(path, dtype=np.uint8)
    spans = [(int(offs[i]), int(offs[i + 1])) for i in (4, 0, 7, 1)]  # out of file order
    ats = np.cumsum([0] + [hi - lo + 100 for lo, hi in spans])[:-1].tolist()
    out = np.zeros(ats[-1] + spans[-1][1] - spans[-1][0], dtype=np.uint8)
    files = LocalFiles()
    assert files.read_runs(path, path, os.path.getsize(path), [(lo, hi, at) for (lo, hi), at in zip(spans, ats)], out)
    for (lo, hi), at in zip(spans, ats):
        assert (out[at : at + hi - lo] == raw[lo:hi]).all()
    assert files.read_runs(path, path, None, [], out)
    with pytest.raises(ShardFormatError, match="beyond the end"):
        files.read_runs(path, path, None, [(0, len(raw) + 512, 0)], np.zeros(len(raw) + 512, np.uint8))
    short = str(tmp_path / "short.tar")
    with open(short, "wb") as f:
        f.write(raw.tobytes())
    files.read_runs(short, short, None, [(0, 512, 0)], out)  # opened, its size noted
    os.truncate(short, int(offs[2]))  # then cut short
    assert not files.read_runs(short, short, None, [(int(offs[1]), int(offs[3]), 0)], out)
    files.close()


def test_the_writer_the_index_and_the_scan_agree_on_offsets(tmp_path):
    """Where each sample begins, as written (``TarShardFile``), indexed (``dali-shards index``) and
    scanned at start, long names (GNU headers before a member) and a metadata member included."""
    import tarfile

    from dali_shards.tools.dali_index import write_dali_index
    from dali_shards.tools.writer import TarShardFile

    path = str(tmp_path / "s.tar")
    with TarShardFile(path) as shard:
        for i in range(5):
            key = f"{i:03d}" + ("_" * 120 if i == 2 else "")
            shard.add({"__key__": key, "jpg": bytes([i]) * (700 * i + 1), "cls": i})
    written = list(shard.offsets)
    assert sample_in_span(open(path, "rb").read()[written[2] : written[3]], path, tuple(written[2:4]), 2).key.startswith("002_")
    with open_shard(path) as f:
        assert scan_tar(f, path).offsets == written
    assert write_dali_index(path).offsets.tolist() == written
    meta = str(tmp_path / "m.tar")  # a member of no sample (no extension) between samples
    with tarfile.open(path) as src, tarfile.open(meta, "w", format=tarfile.GNU_FORMAT) as dst:
        for k, member in enumerate(src.getmembers()):
            if k == 4:
                info = tarfile.TarInfo("__meta__")
                info.size = 2
                dst.addfile(info, io.BytesIO(b"{}"))
            dst.addfile(member, src.extractfile(member))
    with open_shard(meta) as f:
        offs = scan_tar(f, meta).offsets
    data = open(meta, "rb").read()
    keys = [sample_in_span(data[offs[i] : offs[i + 1]], meta, (offs[i], offs[i + 1]), i).key for i in range(len(offs) - 1)]
    assert keys == [s.key for s in TarReader(open(meta, "rb"), meta).samples()]
