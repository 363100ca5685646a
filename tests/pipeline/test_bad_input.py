"""Bad input, one case each: a clear error naming the shard and sample, or (on_error="skip") a
consistent epoch without the bad samples. Never a hang."""

import io
import os
import signal
import tarfile
from collections import Counter
from contextlib import contextmanager
from dataclasses import replace

import pytest
from nvidia.dali import fn

from dali_shards import ShardAccessError, ShardError, ShardFormatError, decode_image, sharded_pipeline
from dali_shards.catalog.scan import scan_shards
from dali_shards.catalog.manifest import write_manifest
from dali_shards.pytorch import DALIShardedIterator
from dali_shards.sample_data import sample_images
from dali_shards.tools.writer import write_shard

PHOTOS = [open(p.path, "rb").read() for p in sample_images()]
LABELS = [p.label for p in sample_images()]


@contextmanager
def deadline(seconds=60):
    def stop(*_):
        raise TimeoutError(f"no result within {seconds} s: a hang")

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def good_samples(start, count):
    return [
        {"__key__": f"{i:06d}", "jpg": PHOTOS[i % len(PHOTOS)], "cls": LABELS[i % len(PHOTOS)]}
        for i in range(start, start + count)
    ]


def dataset(tmp_path, bad_shard=None):
    """Three good shards (6 + 5 + 7 samples) and, in the middle, the bad one a test writes."""
    write_shard(str(tmp_path / "s-0.tar"), good_samples(0, 6))
    if bad_shard is not None:
        bad_shard(str(tmp_path / "s-1.tar"))
    write_shard(str(tmp_path / "s-2.tar"), good_samples(100, 5))
    write_shard(str(tmp_path / "s-3.tar"), good_samples(200, 7))
    return [str(tmp_path / f"s-{i}.tar") for i in range(4) if (tmp_path / f"s-{i}.tar").exists() or i == 1]


def tar_with(path, members):
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def run(source, on_error, world=2, transfer="ring"):
    """Every rank's epoch: (valid indices per rank, steps per rank, audits)."""

    @sharded_pipeline(
        source,
        fields=("jpg", "cls", "__index__"),
        batch_size=4,
        py_num_workers=2,
        world_size=world,
        shuffle=True,
        seed=1,
        on_error=on_error,
        num_threads=1,
        device_id=None,
        transfer=transfer,
    )
    def pipe(jpg, cls, index):
        return fn.resize(decode_image(jpg), size=(16, 16)), cls, index

    seen, steps, audits = [], [], []
    with deadline():
        for rank in range(world):
            it = DALIShardedIterator(pipe(rank=rank), ["image", "label", "index"], audit=True)
            got = [b["index"].tolist() for (b,) in it]
            seen.append([i for step in got for i in step])
            steps.append(len(got))
            audits.append(it.audits[-1])
    return seen, steps, audits


def check_skip(source, lost, damaged=(), transfer="ring"):
    """on_error="skip": everything but ``lost`` exactly once, equal steps, ``lost`` in the audits,
    and the shards counted short at the start (``damaged``: (name, samples read, lost at least))
    listed by every rank's audit."""
    seen, steps, audits = run(source, "skip", transfer=transfer)
    counts = Counter(i for rank in seen for i in rank)
    assert max(counts.values()) == 1 and len(set(steps)) == 1
    skipped = sorted({i for a in audits for i in a["skipped"]})
    assert skipped == sorted(lost)
    for audit in audits:
        listed = [(os.path.basename(e["shard"]), e["samples_read"], e["lost_at_least"]) for e in audit["lost_shards"]]
        assert listed == list(damaged) and audit["lost"] == sum(n for _, _, n in damaged)
        assert all(e["damage"] for e in audit["lost_shards"])
    return counts


def check_raise(source, error_type, *needles, transfer="ring"):
    with pytest.raises(error_type) as err:
        run(source, "raise", transfer=transfer)
    text = str(err.value)
    for needle in needles:
        assert needle in text, text
    assert "What to do" in text
    return err.value


# -- one sample wrong -------------------------------------------------------------------
def missing_field(path):
    samples = good_samples(50, 4)
    del samples[2]["cls"]
    write_shard(path, samples)


def bad_label(path):
    samples = good_samples(50, 4)
    samples[1]["cls"] = "dog"
    write_shard(path, samples)


def not_an_image(path):
    samples = good_samples(50, 4)
    samples[3]["jpg"] = b"<html>404 not found</html>"
    write_shard(path, samples)


def duplicate_member(path):
    tar_with(
        path,
        [
            ("000050.jpg", PHOTOS[0]),
            ("000050.cls", b"1"),
            ("000051.jpg", PHOTOS[1]),
            ("000051.jpg", PHOTOS[2]),
            ("000051.cls", b"2"),
            ("000052.jpg", PHOTOS[3]),
            ("000052.cls", b"3"),
        ],
    )


def repeated_key(path):  # a key that comes back later: webdataset makes two samples of it, one lacking jpg
    tar_with(path, [("000050.jpg", PHOTOS[0]), ("000051.jpg", PHOTOS[1]), ("000051.cls", b"2"), ("000050.cls", b"1")])


@pytest.mark.parametrize(
    "bad, error_type, key, lost_positions",
    [
        (missing_field, ShardFormatError, "000052", [2]),
        (bad_label, ShardFormatError, "000051", [1]),
        (not_an_image, ShardFormatError, "000053", [3]),
        (duplicate_member, ShardFormatError, "000051", [1]),
        (repeated_key, ShardFormatError, "000050", [0, 2]),
    ],
    ids=["sample missing a field", "non-integer .cls", "undecodable image bytes", "duplicate member", "duplicate key"],
)
def test_a_bad_sample(tmp_path, bad, error_type, key, lost_positions, transfer):
    source = dataset(tmp_path, bad)
    error = check_raise(source, error_type, "s-1.tar", f"sample '{key}'", transfer=transfer)
    assert error.url.endswith("s-1.tar") and error.key == key
    check_skip(source, [6 + p for p in lost_positions], transfer=transfer)  # s-1 starts at __index__ 6


# -- a whole shard (or its rest) unreadable ----------------------------------------------
def truncated(path):
    write_shard(path, good_samples(50, 4))
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) * 5 // 8])


def corrupt_header(path):
    write_shard(path, good_samples(50, 4))
    data = bytearray(open(path, "rb").read())
    offsets = [m.offset for m in tarfile.open(path)]
    data[offsets[4] + 10] ^= 0x5A  # the header of sample 2's first member
    open(path, "wb").write(bytes(data))


@pytest.mark.parametrize(
    "bad, message, prefix",
    [
        (truncated, "truncated", 2),  # sample 2's header was read: samples 0 and 1 are complete
        (corrupt_header, "corrupt tar header", 1),  # the damaged header could have been sample 1's
    ],
)
def test_a_damaged_shard(tmp_path, bad, message, prefix):
    """Damage found by the scan at start (raise: error; skip: the complete samples before it are
    the shard), and damage met by a worker (a manifest counted the shard before it was damaged)."""
    source = dataset(tmp_path, bad)
    # scanned at start: the error names the shard before any worker starts
    error = check_raise(source, ShardFormatError, "s-1.tar", message)
    assert error.url.endswith("s-1.tar")
    # skip: the complete samples before the damage are used, the rest were never part of the epoch;
    # the audit lists the shard and counts the sample seen in part before the damage (those after it
    # cannot be counted)
    assert [s.samples for s in scan_shards(source, on_error="skip")] == [6, prefix, 5, 7]
    counts = check_skip(source, [], [("s-1.tar", prefix, 1)])
    assert sorted(counts) == list(range(6 + prefix + 5 + 7))
    # with a manifest written before the damage, the workers meet it: the lost samples are listed
    healthy = tmp_path / "healthy"
    healthy.mkdir()
    paths = dataset(healthy, lambda p: write_shard(p, good_samples(50, 4)))
    manifest = str(tmp_path / "manifest.json")
    write_manifest(manifest, [replace(s, url=str(tmp_path / os.path.basename(s.url))) for s in scan_shards(paths)])
    check_raise(manifest, ShardFormatError, "s-1.tar", message)
    # s-1 holds __index__ 6..9. Its size is not the manifest's when truncated: refused at start, or
    # (skip) skipped whole when opened. A corrupt header: each sample is read by its own span (the
    # manifest's offsets), so only the sample whose header is damaged (__index__ 8) is lost
    lost = list(range(6, 10)) if bad is truncated else [8]
    counts = check_skip(manifest, lost)
    assert sorted(counts) == [i for i in range(6 + 4 + 5 + 7) if i not in lost]


def with_manifest(tmp_path, replace_s1):
    """A manifest counting a healthy s-1 (4 samples), then s-1 replaced by something unreadable."""
    paths = dataset(tmp_path, lambda p: write_shard(p, good_samples(50, 4)))
    manifest = str(tmp_path / "manifest.json")
    write_manifest(manifest, scan_shards(paths))
    os.remove(paths[1])
    replace_s1(paths[1])
    return manifest


def test_a_missing_shard(tmp_path, transfer):
    source = dataset(tmp_path, lambda p: None)
    check_raise(source, ShardAccessError, "s-1.tar", "file not found", transfer=transfer)
    # skip: counted as empty at start, with a warning and in the audit
    check_skip(source, [], [("s-1.tar", 0, 0)], transfer=transfer)
    manifest = with_manifest(tmp_path / "m", lambda p: None)  # a worker meets it
    check_raise(manifest, ShardAccessError, "s-1.tar", "file not found", transfer=transfer)
    check_skip(manifest, [6, 7, 8, 9], transfer=transfer)


def test_an_unreadable_shard(tmp_path):
    manifest = with_manifest(tmp_path, os.mkdir)  # a directory where the shard was
    check_raise(manifest, ShardAccessError, "s-1.tar", "directory")
    check_skip(manifest, [6, 7, 8, 9])


def test_unreadable_file_permission(tmp_path, monkeypatch):
    import builtins

    from dali_shards.io import storage

    real_open = builtins.open
    target = str(tmp_path / "locked.tar")
    write_shard(target, good_samples(0, 2))

    def fake_open(path, *args, **kwargs):
        if os.fspath(path) == target:
            raise PermissionError(13, "Permission denied", target)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", fake_open)
    with pytest.raises(ShardAccessError, match="permission denied") as err:
        storage.open_shard(target)
    assert err.value.url == target and "readable" in str(err.value)


def test_an_empty_shard(tmp_path):
    source = dataset(tmp_path, lambda p: write_shard(p, []))
    seen, steps, audits = run(source, "raise")
    assert sorted(i for r in seen for i in r) == list(range(6)) + list(range(6, 11)) + list(range(11, 18))
    assert len(set(steps)) == 1 and all(a["skipped"] == [] for a in audits)


def test_errors_are_shard_errors():
    assert issubclass(ShardFormatError, ShardError) and issubclass(ShardAccessError, OSError)
