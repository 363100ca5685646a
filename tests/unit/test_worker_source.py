"""The per-worker source, without DALI: batches follow the plan; lazy; epochs counted per process."""

import multiprocessing as mp
import pickle

import numpy as np
import pytest

from dali_shards.plan.mode import Planned
from dali_shards.errors import ShardAccessError, ShardFormatError
from dali_shards.ipc.packing import Packing
from dali_shards.transfer.merge.layout import table_place
from dali_shards.catalog.scan import scan_shards
from dali_shards.plan.epoch import PlanSpec
from dali_shards.sample_data import write_sample_shards
from dali_shards.worker.config import WorkerConfig
from dali_shards.transfer.merge.source import MergeSource

PACKING = Packing(("cls", "__index__"))


def make_source(spec, urls, packing, rank, worker, **kw):
    config = WorkerConfig(mode=Planned(spec), urls=tuple(urls), byte_sizes=(), packing=packing, rank=rank, worker=worker, **kw)
    return MergeSource(config)


@pytest.fixture(scope="module")
def shards(make_shards):
    paths = make_shards((9, 0, 14, 1, 6))
    return paths, tuple(s.samples for s in scan_shards(paths))


def decode(batch, worker, m, py_num_workers, packing=PACKING):
    """(index, valid) of the worker's slice; asserts every other slot is an empty dummy, but for
    the table slot in the table packing."""
    if packing.table:
        table_at = table_place(worker, py_num_workers, m)
        rows = batch[table_at][: m * packing.header_bytes].view(np.int64).reshape(m, -1)
        for slot, array in enumerate(batch):
            if slot != table_at and not worker * m <= slot < (worker + 1) * m:
                assert array.size == 0
        return [(int(r[0]), bool(r[1])) for r in rows]
    out = []
    for slot, blob in enumerate(batch):
        if worker * m <= slot < (worker + 1) * m:
            header = blob[: packing.header_bytes].view(np.int64)
            out.append((int(header[0]), bool(header[1])))
        else:
            assert blob.size == 0
    return out


@pytest.mark.parametrize("table", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
def test_batches_follow_the_plan(shards, shuffle, table):
    paths, sizes = shards
    spec = PlanSpec(sizes, world_size=2, py_num_workers=3, batch_size=6, seed=5, shuffle=shuffle, shuffle_buffer=4)
    packing = Packing(("jpg", "cls", "__index__"), table=table, payload="jpg")
    for rank in range(2):
        for worker in range(3):
            src = make_source(spec, paths, packing, rank, worker)
            for epoch in range(2):
                batches = list(iter(src))
                assert len(batches) == spec.steps_per_epoch
                assert all(len(b) == spec.batch_size for b in batches)
                got = [x for b in batches for x in decode(b, worker, spec.mini_batch, 3, packing)]
                pos, valid = spec.epoch(epoch).worker_order(rank * 3 + worker)
                expected = spec.epoch(epoch).canonical_index(pos)
                assert got == list(zip(expected.tolist(), valid.tolist()))


def test_labels_follow_the_photos(shards):
    from dali_shards.sample_data import sample_images

    paths, sizes = shards
    labels = [img.label for img in sample_images()]
    spec = PlanSpec(sizes, py_num_workers=2, batch_size=10, shuffle=True, seed=1)
    packing = Packing(("jpg", "cls", "__index__"), table=True, payload="jpg")
    photos = [open(img.path, "rb").read() for img in sample_images()]
    for worker in range(2):
        for batch in iter(make_source(spec, paths, packing, 0, worker)):
            rows = batch[table_place(worker, 2, 5)][: 5 * packing.header_bytes].view(np.int64).reshape(5, -1)
            for payload, row in zip(batch[worker * 5 : worker * 5 + 5], rows):
                index, cls = int(row[0]), int(row[2])
                assert cls == labels[index % len(labels)]
                assert payload.tobytes() == photos[index % len(labels)]


def test_shuffle_buffer_bounds_memory(shards):
    paths, sizes = shards
    spec = PlanSpec(sizes, batch_size=2, shuffle=True, shuffle_buffer=3, shuffle_block=0)
    it = iter(make_source(spec, paths, PACKING, 0, 0))
    peak = 0
    for _ in it:
        peak = max(peak, len(it.mini._pending))
    assert 0 < peak <= 3


def test_interleaving_holds_a_batch_share_and_one_cursor_per_piece(tmp_path):
    """Interleaving: pending samples stay under one batch's share; batches follow the plan."""
    sizes = (3, 5, 0, 4, 6, 2, 7, 1, 4, 5, 3)
    paths = write_sample_shards(str(tmp_path), shard_sizes=sizes)
    spec = PlanSpec(sizes, batch_size=4, py_num_workers=2, shuffle=True, shuffle_block=2, seed=3)
    assert spec.epoch(0).interleaving
    for worker in range(2):
        it = iter(make_source(spec, paths, PACKING, 0, worker))
        peak = 0
        batches = []
        for batch in it:
            peak = max(peak, len(it.mini._pending))
            batches.append(batch)
        assert peak <= spec.mini_batch
        got = [x for b in batches for x in decode(b, worker, spec.mini_batch, 2)]
        pos, valid = spec.epoch(0).worker_order(worker)
        assert [i for i, _ in got] == spec.epoch(0).canonical_index(pos).tolist()


def test_iter_is_lazy_and_errors_name_the_shard(tmp_path):
    spec = PlanSpec((4,), batch_size=2)
    src = make_source(spec, [str(tmp_path / "missing.tar")], PACKING, 0, 0)
    it = iter(src)  # what DALI does in the main process: must not touch the shard
    with pytest.raises(ShardAccessError, match="missing.tar"):
        next(it)


def test_shard_shorter_than_planned(shards):
    paths, sizes = shards
    spec = PlanSpec((sizes[0] + 2,), batch_size=1)  # plan claims more samples than the shard has
    with pytest.raises(ShardFormatError, match="holds 9 samples, fewer than the 11 planned"):
        list(iter(make_source(spec, paths[:1], PACKING, 0, 0)))


def _child_epochs(src, queue):
    first, second = iter(src), iter(src)
    queue.put((first.epoch, second.epoch))


def test_epochs_are_counted_per_process(shards):
    paths, sizes = shards
    src = make_source(PlanSpec(sizes, batch_size=2), paths, PACKING, 0, 0, start_epoch=7)
    assert iter(src).epoch == 7  # the main process's call, made at pipeline definition
    assert iter(src).epoch == 8
    # a forked worker starts counting afresh, as does an unpickled (spawned) copy
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child_epochs, args=(src, queue))
    proc.start()
    assert queue.get(timeout=30) == (7, 8)
    proc.join()
    assert iter(pickle.loads(pickle.dumps(src))).epoch == 7


def test_more_workers_than_samples(shards):
    paths, sizes = shards
    spec = PlanSpec((0, 0, 0, 1, 0), world_size=2, py_num_workers=2, batch_size=2)
    seen = []
    for rank in range(2):
        for worker in range(2):
            for b in iter(make_source(spec, paths, PACKING, rank, worker)):
                seen += decode(b, worker, 1, 2)
    assert sorted(seen, key=lambda x: not x[1]) == [(0, True), (0, False), (0, False), (0, False)]
