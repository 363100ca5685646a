"""The ring's fast path (``worker/direct.py``) gives, step for step, exactly what the general way
gives -- the same samples, bytes, labels, keys, padding and stand-ins -- and leaves every step out
of the ordinary (long names, pax headers, damaged images, missing or duplicate members, a shard
rewritten since it was indexed) to the general way, which raises or skips as it always does."""

import io
import json
import os
import tarfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dali_shards.catalog.scan import scan_shards
from dali_shards.catalog.manifest import write_manifest
from dali_shards.errors import ShardFormatError
from dali_shards.tar.blocks import walk_members
from dali_shards.options import ShardedOptions
from dali_shards.setup.resolve import resolve
from dali_shards.sample_data import sample_images
from dali_shards.transfer.ring.assemble import assemble
from dali_shards.transfer.ring.consumer import MiniBatch
from dali_shards.worker import direct, grouped
from dali_shards.worker.direct import DirectBatches, DirectStep
from dali_shards.worker.grouped import GroupedStep
from dali_shards.worker.sources import make_source
from dali_shards.ipc.tables import as_table

PHOTOS = [open(p.path, "rb").read() for p in sample_images()]
FIELDS = ("jpg;png", "cls", "__key__", "__index__", "__valid__")


def write_tar(path, members, fmt=tarfile.GNU_FORMAT):
    with tarfile.open(path, "w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def sample_members(start, count, ext="jpg", key=lambda i: f"{i:06d}"):
    out = []
    for i in range(start, start + count):
        out += [(f"{key(i)}.{ext}", PHOTOS[i % len(PHOTOS)]), (f"{key(i)}.cls", str(i).encode()), (f"{key(i)}.json", b"{}")]
    return out


def dataset(tmp_path, odd=None):
    """Ten shards of 6 samples (enough to interleave), shard 4 as ``odd`` writes it if given."""
    paths = []
    for s in range(10):
        path = str(tmp_path / f"d-{s}.tar")
        members = sample_members(6 * s, 6)
        if s == 4 and odd is not None:
            members = odd(members)
        write_tar(path, members)
        paths.append(path)
    return paths


FALLBACKS = []  # fast-path steps that went the general way
GROUPED = []  # fast-path steps read and located with the next ones (``StepGroup``)


def steps(config, epoch, fast):
    """Every step of one epoch as the ring's consumer would see it: its fields, assembled."""
    source = make_source(config, direct=fast)
    batches = source.epoch(epoch)
    assert isinstance(batches, DirectBatches) == fast
    out, buf = [], np.zeros(64 << 20, dtype=np.uint8)
    for batch in batches:
        table = as_table(config.packing, batch)
        used = table.write(buf)
        if isinstance(table, DirectStep) and table._packed is not None:
            FALLBACKS.append(table)
        if isinstance(table, GroupedStep):
            GROUPED.append(table)
        rows = buf[: len(table) * config.packing.header_bytes].view(np.int64).reshape(len(table), -1).copy()
        mini = MiniBatch(epoch, 0, 0, rows, buf[:used].copy())
        out.append([[bytes(np.asarray(x)) for x in f] if isinstance(f, list) else np.asarray(f).tolist()
                    for f in assemble(config.packing, [mini])])  # fmt: skip
    return out


def config_of(paths, **kw):
    opts = dict(fields=FIELDS, batch_size=4, py_num_workers=1, shuffle=True, seed=3, transfer="ring")
    opts.update(kw)
    return resolve(ShardedOptions.from_keywords(source=paths, **opts)).workers[0]


@pytest.mark.parametrize("batch", [4, 7])
@pytest.mark.parametrize("group", [256, 9, 1])
@pytest.mark.parametrize("block", [256, 0])
def test_the_fast_path_gives_what_the_general_way_gives(tmp_path, block, group, batch, monkeypatch):
    """Whole epochs in one group of steps, groups of two or three steps (the last one shorter), one
    step at a time; full steps, and a last step padded (60 samples in steps of 7): the same as the
    general way, step for step."""
    monkeypatch.setattr(grouped, "GROUP_SAMPLES", group)
    config = config_of(dataset(tmp_path), shuffle_block=block, batch_size=batch)
    FALLBACKS.clear()
    GROUPED.clear()
    for epoch in (0, 1):
        assert steps(config, epoch, True) == steps(config, epoch, False)
    assert not FALLBACKS, "regular shards take the fast path all the way"
    assert bool(GROUPED) == (group > batch), "steps are grouped up to GROUP_SAMPLES"


def long_names(members):  # GNU long names: the general way reads them
    return [(f"{'x' * 120}/{name}", data) for name, data in members]


def pax_names(members):
    return [(f"dir/{'é' * 60}_{name}", data) for name, data in members]


def damaged_image(members):
    members[3] = (members[3][0], members[3][1][:1000])  # sample 1's JPEG cut short
    return members


def missing_field(members):
    return [m for m in members if m[0] != "000026.cls"]


def duplicate_member(members):
    return members[:2] + [members[1]] + members[2:]


def upper_case(members):  # (extensions are lower-cased, as webdataset does: still the fast path)
    return [(n.replace(".jpg", ".JPG"), d) for n, d in members]


@pytest.mark.parametrize("odd", [long_names, upper_case, damaged_image, missing_field, duplicate_member])
@pytest.mark.parametrize("on_error", ["skip", "raise"])
def test_steps_out_of_the_ordinary_go_the_general_way(tmp_path, odd, on_error):
    paths = dataset(tmp_path, odd)
    config = config_of(paths, on_error=on_error)
    if on_error == "skip" or odd in (long_names, upper_case):
        assert steps(config, 0, True) == steps(config, 0, False)
        return
    with pytest.raises(ShardFormatError) as fast:
        steps(config, 0, True)
    with pytest.raises(ShardFormatError) as general:
        steps(config, 0, False)
    assert str(fast.value) == str(general.value)


def test_pax_names_too(tmp_path):
    paths = []
    for s in range(10):
        path = str(tmp_path / f"p-{s}.tar")
        write_tar(path, pax_names(sample_members(6 * s, 6)), fmt=tarfile.PAX_FORMAT)
        paths.append(path)
    config = config_of(paths)
    assert steps(config, 0, True) == steps(config, 0, False)


def test_a_shard_rewritten_after_indexing_is_caught_by_the_fast_path_too(tmp_path):
    paths = dataset(tmp_path)
    config = config_of(paths)
    members = sample_members(24, 6)
    samples = [members[i : i + 3] for i in range(0, len(members), 3)]
    write_tar(paths[4], [m for sample in reversed(samples) for m in sample])  # the same size, keys moved
    assert os.path.getsize(paths[4]) == scan_shards([paths[4]])[0].bytes
    with pytest.raises(ShardFormatError, match=r"d-4\.tar"):  # a moved key, or a span that holds no sample
        steps(config, 0, True)


def test_the_walk_finds_what_tar_finds(tmp_path):
    path = str(tmp_path / "w.tar")
    write_tar(path, sample_members(0, 5))
    raw = np.frombuffer(open(path, "rb").read(), dtype=np.uint8)
    info = scan_shards([path])[0]
    walk = walk_members(raw, info.offsets[:-1], info.offsets[1:])
    assert not walk.irregular.any() and len(walk.rounds) == 3
    with tarfile.open(path) as tar:
        members = tar.getmembers()
    found = sorted((int(h), int(z)) for m in walk.rounds for h, z in zip(m.header, m.size))
    assert found == [(m.offset, m.size) for m in members]


def test_a_step_grows_its_slot_when_the_general_way_needs_more(tmp_path):
    paths = dataset(tmp_path, damaged_image)
    config = config_of(paths, on_error="skip", batch_size=6)
    step = next(iter(make_source(config, direct=True).epoch(0)))
    assert isinstance(step, DirectStep)
    buf = np.zeros(step.capacity, dtype=np.uint8)  # exactly what the fast path would need
    try:
        step.write(buf)
    except direct.Grow as more:  # (a skipped sample's stand-in can take more than the spans)
        assert more.size > len(buf)
        step.write(np.zeros(more.size, dtype=np.uint8))


def test_a_span_beyond_its_shard_is_never_allocated_by_the_fast_path(tmp_path):
    """An index whose last sample of a shard claims 500 GB: the general way's error, not a slot of that size."""
    paths = dataset(tmp_path)
    manifest = str(tmp_path / "m.json")
    write_manifest(manifest, scan_shards(paths), version=2)  # offsets inline, to edit
    doc = json.load(open(manifest))
    blocks = doc["shards"][4]["sample_blocks"].split()
    doc["shards"][4]["sample_blocks"] = " ".join(blocks[:-1] + [str(10**9)])
    doc["shards"][4].pop("bytes")  # nothing to check the claim against until the shard is read
    json.dump(doc, open(manifest, "w"))
    config = config_of(manifest, on_error="raise")
    with pytest.raises(ShardFormatError, match=r"d-4\.tar.*lies beyond the end of the file"):
        steps(config, 0, True)


def label_text(text):
    """Shard 4's sample 000026 with ``text`` as its .cls member."""

    def odd(members):
        return [(n, text if n == "000026.cls" else d) for n, d in members]

    return odd


@pytest.mark.parametrize("text", [b"7" + b" " * 63 + b"8", b"0" * 64 + b"5", b"1_000", b"5" * 100_000],
                         ids=["7-spaces-8", "65-digits", "underscore", "100k-digits"])  # fmt: skip
@pytest.mark.parametrize("on_error", ["skip", "raise"])
def test_a_label_that_is_not_one_whole_integer_takes_the_general_way(tmp_path, text, on_error):
    """The fast path parses the whole member as the general way does: not its first 64 bytes."""
    config = config_of(dataset(tmp_path, label_text(text)), on_error=on_error)
    if on_error == "skip":
        fast = steps(config, 0, True)
        assert fast == steps(config, 0, False)
        labels = [c for step in fast for c, ok in zip(step[1], step[-1]) if ok[1] == 1]
        assert sorted(labels) == [i for i in range(60) if i != 26], "sample 000026 skipped, no other label"
        return
    with pytest.raises(ShardFormatError, match="'cls' must hold") as fast:
        steps(config, 0, True)
    with pytest.raises(ShardFormatError) as general:
        steps(config, 0, False)
    assert str(fast.value) == str(general.value)
    assert fast.value.key == "000026" and fast.value.url.endswith("d-4.tar")


@pytest.mark.parametrize("text, value", [(b" +26\n", 26), (b"\t0026 ", 26), (b"26" + b" " * 62, 26)])
def test_labels_with_signs_zeros_and_whitespace_take_the_fast_path(tmp_path, text, value):
    config = config_of(dataset(tmp_path, label_text(text)))
    FALLBACKS.clear()
    fast = steps(config, 0, True)
    assert fast == steps(config, 0, False) and not FALLBACKS
    assert sorted(c for step in fast for c in step[1]) == list(range(60))


def test_large_samples_are_read_straight_into_their_slots(tmp_path, monkeypatch):
    """Grouping pays for small samples only: above GROUPED_SAMPLE_BYTES a worker holds no group."""
    monkeypatch.setattr(grouped, "GROUPED_SAMPLE_BYTES", 1)
    config = config_of(dataset(tmp_path))
    GROUPED.clear()
    assert steps(config, 0, True) == steps(config, 0, False)
    assert not GROUPED


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6).flatmap(lambda m: st.lists(st.lists(st.integers(0, 9), min_size=m, max_size=m), min_size=1, max_size=8)))
def test_each_steps_samples_in_the_order_they_first_occur(rows):
    """``first_seen`` works out for a whole group what ``dict.fromkeys`` gives step by step."""
    unique, counts, which = grouped.first_seen(np.array(rows, dtype=np.int64))
    per_step = [list(dict.fromkeys(row)) for row in rows]
    assert unique.tolist() == [p for step in per_step for p in step]
    assert counts.tolist() == [len(step) for step in per_step]
    assert unique[which].tolist() == [p for row in rows for p in row]
    starts = np.cumsum(counts) - counts
    assert all(starts[j] <= w < starts[j] + counts[j] for j, row in enumerate(rows) for w in which[j * len(row) : (j + 1) * len(row)])
