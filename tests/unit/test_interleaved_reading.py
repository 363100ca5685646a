"""A worker reading an interleaving plan: each sample at its span (offsets given or scanned), a
cursor for compressed shards, and bad samples or shards skipped exactly where they are."""

import gzip
import logging
import os
import shutil

import numpy as np
import pytest

from dali_shards.plan.mode import Planned
from dali_shards.catalog.scan import scan_shards
from dali_shards.errors import ShardAccessError, ShardFormatError
from dali_shards.plan.epoch import PlanSpec
from dali_shards.worker.config import WorkerConfig
from dali_shards.ipc.packed import STATUS_SKIPPED
from dali_shards.ipc.packing import Packing
from dali_shards.transfer.merge.layout import table_place
from dali_shards.transfer.merge.source import MergeSource

SIZES = (3, 5, 0, 4, 6, 2, 7, 1, 4, 5, 3, 8)
PACKING = Packing(("jpg", "cls", "__index__"), table=True, payload="jpg")


def rows(spec, paths, rank, worker, **kw):
    """(index, status, cls) of every slot worker ``worker`` of ``rank`` fills, epoch 0."""
    config = WorkerConfig(mode=Planned(spec), urls=tuple(paths), byte_sizes=(), packing=PACKING, rank=rank, worker=worker, **kw)
    out, m = [], spec.mini_batch
    for batch in iter(MergeSource(config)):
        table = batch[table_place(worker, spec.py_num_workers, m)]
        header = table[: m * PACKING.header_bytes].view(np.int64).reshape(m, -1)
        out += [(int(r[0]), int(r[1]), int(r[2])) for r in header]
    return out


def planned(spec, rank, worker):
    pos, valid = spec.epoch(0).worker_order(rank * spec.py_num_workers + worker)
    return list(zip(spec.epoch(0).canonical_index(pos).tolist(), valid.astype(int).tolist()))


@pytest.fixture
def shards(make_shards, tmp_path):
    return make_shards(SIZES, folder=tmp_path)  # changed by some tests: one copy per test


SPEC = PlanSpec(SIZES, world_size=2, batch_size=4, py_num_workers=2, shuffle=True, shuffle_block=4, seed=3)


@pytest.mark.parametrize("offsets", ["given", "scanned", "compressed"])
def test_workers_deliver_the_plan(shards, offsets):
    assert SPEC.epoch(0).interleaving
    kw = {}
    if offsets == "given":
        kw["offsets"] = tuple(s.offsets for s in scan_shards(shards))
    if offsets == "compressed":  # no offsets: each shard read by a cursor from its start
        for p in shards:
            with open(p, "rb") as f, gzip.open(p + ".tmp", "wb") as g:
                shutil.copyfileobj(f, g)
            os.replace(p + ".tmp", p)
        assert all(s.offsets is None for s in scan_shards(shards))
    for rank in range(2):
        for worker in range(2):
            got = rows(SPEC, shards, rank, worker, **kw)
            assert [(i, v) for i, v, _ in got] == planned(SPEC, rank, worker)


def damage_sample(path, k):
    """Corrupt the header checksum of sample ``k``'s first member."""
    offs = scan_shards([path])[0].offsets
    data = bytearray(open(path, "rb").read())
    data[int(offs[k]) + 150] ^= 0x11
    open(path, "wb").write(bytes(data))


def test_a_damaged_sample_is_skipped_alone(shards, caplog):
    shard = SIZES.index(8)
    first = sum(SIZES[:shard])
    offsets = tuple(s.offsets for s in scan_shards(shards))  # indexed before the damage
    damage_sample(shards[shard], 4)
    every = []
    with caplog.at_level(logging.WARNING, logger="dali_shards"):
        for rank in range(2):
            for worker in range(2):
                every += rows(SPEC, shards, rank, worker, offsets=offsets, on_error="skip")
    valid = sorted(i for i, v, _ in every if v == 1)
    assert valid == [i for i in range(sum(SIZES)) if i != first + 4], "only the damaged sample is missing"
    assert [i for i, v, _ in every if v == STATUS_SKIPPED] == [first + 4]
    assert "sample 4 of shard" in caplog.text
    with pytest.raises(ShardFormatError, match=os.path.basename(shards[shard])):
        for rank in range(2):
            for worker in range(2):
                rows(SPEC, shards, rank, worker, offsets=offsets)


def test_a_missing_shard_is_skipped_with_one_warning(shards, caplog):
    shard = SIZES.index(7)
    first = sum(SIZES[:shard])
    offsets = tuple(s.offsets for s in scan_shards(shards))
    os.remove(shards[shard])
    every = []
    with caplog.at_level(logging.WARNING, logger="dali_shards"):
        for rank in range(2):
            for worker in range(2):
                every += rows(SPEC, shards, rank, worker, offsets=offsets, on_error="skip")
    lost = set(range(first, first + 7))
    assert sorted(i for i, v, _ in every if v == 1) == [i for i in range(sum(SIZES)) if i not in lost]
    assert sorted(i for i, v, _ in every if v == STATUS_SKIPPED) == sorted(lost)
    warnings = [r for r in caplog.records if "skipping the rest of shard" in r.getMessage()]
    assert 1 <= len(warnings) <= 4, "one warning per worker that reads the shard, not one per sample"
    with pytest.raises(ShardAccessError, match="file not found"):
        for worker in range(2):
            rows(SPEC, shards, 0, worker, offsets=offsets)
            rows(SPEC, shards, 1, worker, offsets=offsets)


def test_a_shard_with_fewer_samples_than_planned_is_named(shards):
    sizes = tuple(n + 2 if n == 8 else n for n in SIZES)  # the plan says 10 where the shard holds 8
    spec = PlanSpec(sizes, world_size=2, batch_size=4, py_num_workers=2, shuffle=True, shuffle_block=4, seed=3)
    with pytest.raises(ShardFormatError, match="fewer than the 10 planned") as err:
        for rank in range(2):
            for worker in range(2):
                rows(spec, shards, rank, worker)
    assert os.path.basename(shards[SIZES.index(8)]) in str(err.value)
