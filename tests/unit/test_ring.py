"""The ring transfer without DALI: mini-batches through shared memory, slots grown on demand,
slots given back, errors carried whole, a dead worker seen, fields assembled in plan order."""

import multiprocessing as mp
import os
import signal

import numpy as np
import pytest

from dali_shards.errors import ShardFormatError
from dali_shards.transfer.ring.assemble import assemble, output_types
from dali_shards.transfer.ring.consumer import EpochEnd, MiniBatch, RingConsumer, WorkerGone
from dali_shards.transfer.ring.producer import MIN_SLOT, RingProducer
from dali_shards.ipc.packing import Packing
from dali_shards.worker.outputs import OutputSpec

PACKING = Packing(("bin", "cls", "__key__", "__index__", "__valid__"), table=True)


def packed(index, size):
    """A sample of ``size`` bytes whose every byte is ``index % 251``."""
    return PACKING.pack_values({"bin": np.full(size, index % 251, np.uint8), "cls": index * 10}, index, f"k{index}")


def produce(conn, sizes, depth, fail_at=None):
    """A worker: one mini-batch of two samples per size, epoch 0, then its end (or an error)."""
    producer = RingProducer(conn, depth, PACKING, first_slot_bytes=1)
    for step, size in enumerate(sizes):
        if step == fail_at:
            producer.fail(ShardFormatError("s.tar", "bad sample", key=f"k{step}", hint="fix it"))
            producer.wait_for_stop()
            return
        producer.put(0, step, [packed(2 * step, size), packed(2 * step + 1, size)])
    producer.end(0, len(sizes))
    producer.wait_for_stop()


def start(sizes, depth=2, fail_at=None, method="fork"):
    ctx = mp.get_context(method)
    here, there = ctx.Pipe(duplex=True)
    proc = ctx.Process(target=produce, args=(there, sizes, depth, fail_at))
    proc.start()
    there.close()
    return RingConsumer(here, proc, depth, PACKING.header_columns), proc


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_mini_batches_arrive_whole_through_slots_that_grow(method):
    """A 3 MB sample between small ones: its slot grows (beyond the 1 MiB first size); every byte
    arrives; a slot is written again only once given back."""
    sizes = [10, 3 << 20, 7, 100, 5 << 10]
    consumer, proc = start(sizes, method=method)
    try:
        for step, size in enumerate(sizes):
            got = consumer.next()
            assert isinstance(got, MiniBatch) and (got.epoch, got.step) == (0, step)
            for row, index in zip(got.rows, (2 * step, 2 * step + 1)):
                assert row[0] == index and row[1] == 1
                off, n = int(row[PACKING.fields[0].column]), int(row[PACKING.fields[0].column + 1])
                assert n == size and (got.table[off : off + n] == index % 251).all()
            consumer.release(got.slot)
        assert consumer.next() == EpochEnd(0, len(sizes))
        assert max(s.size for s in consumer.segments if s is not None) >= 3 << 20 > MIN_SLOT
    finally:
        consumer.stop()
        proc.join(10)
    assert proc.exitcode == 0


def test_a_worker_ahead_by_its_depth_waits_for_a_slot():
    consumer, proc = start([10] * 6, depth=2)
    try:
        first, _ = consumer.next(), consumer.next()
        assert not consumer.conn.poll(0.5), "no third mini-batch before a slot is given back"
        consumer.release(first.slot)
        assert consumer.next().step == 2
    finally:
        consumer.stop()
        proc.join(10)


def test_a_workers_error_arrives_as_it_was_raised():
    consumer, proc = start([10, 10, 10], fail_at=1)
    try:
        consumer.release(consumer.next().slot)
        with pytest.raises(ShardFormatError) as err:
            consumer.next()
        assert (err.value.url, err.value.key, err.value.hint) == ("s.tar", "k1", "fix it")
        assert proc.exitcode is None, "the worker waits until the main process has read its error"
    finally:
        consumer.stop()
        proc.join(10)


def test_a_dead_worker_is_seen_with_its_exit_code():
    consumer, proc = start([10] * 10, depth=1)
    consumer.next()  # the worker now waits for its only slot
    os.kill(proc.pid, signal.SIGKILL)
    with pytest.raises(WorkerGone):
        consumer.next()
    assert proc.exitcode == -signal.SIGKILL


def test_fields_are_assembled_in_plan_order():
    """Sample i of the batch: sample i % m of worker i // m; ints and flags dense, bytes as views."""
    minis = []
    for w in range(3):
        samples = [packed(10 * w + k, k + 1) for k in range(2)]
        samples[1] = samples[1].as_padding()
        table = PACKING.table_array(samples)
        rows = table[: 2 * PACKING.header_bytes].view(np.int64).reshape(2, -1)
        minis.append(MiniBatch(0, 0, 0, rows, table))
    data, cls, key, index, valid, status = assemble(PACKING, minis)
    assert index.tolist() == [0, 1, 10, 11, 20, 21] and cls.tolist() == [0, 10, 100, 110, 200, 210]
    assert valid.tolist() == [True, False] * 3 and status[:, 1].tolist() == [1, 0] * 3
    assert [len(d) for d in data] == [1, 2] * 3 and bytes(key[2]) == b"k10"
    assert all(d.base is not None for d in data), "views of the slots, not copies"
    assert [t.dtype for t in output_types(PACKING)] == ["uint8", "int64", "uint8", "int64", "bool", "int64"]


def test_array_outputs_keep_their_dtype_and_shape():
    specs = [OutputSpec("grid", "array", "float32", 2), OutputSpec("n", "int", "int64", 0)]
    packing = Packing(("jpg",), table=True, outputs=specs)
    samples = [packing.pack_values({"grid": np.full((k + 1, 3), k, np.float32), "n": k}, k, "x") for k in range(3)]
    table = packing.table_array(samples)
    rows = table[: 3 * packing.header_bytes].view(np.int64).reshape(3, -1)
    grid, n, _ = assemble(packing, [MiniBatch(0, 0, 0, rows, table)])
    assert [g.shape for g in grid] == [(1, 3), (2, 3), (3, 3)] and grid[2].dtype == np.float32
    assert (grid[2] == 2).all() and n.tolist() == [0, 1, 2]


@pytest.mark.parametrize("n", [0, 8, 300, 9000])
@pytest.mark.parametrize("shape", [(), (1,), (2, 3)])
def test_equal_size_fields_are_gathered_into_one_dense_array(n, shape):
    """Keys and fixed-size arrays of one size: one (batch, ...) array, whichever way it is gathered
    (small ones by one gather, larger by a copy per sample, above DENSE_BYTES as views)."""
    dims = len(shape) + 1
    specs = [OutputSpec("raw", "bytes"), OutputSpec("a", "array", "float32", dims)]
    packing = Packing(("x",), table=True, outputs=specs)
    minis = []
    for w in range(2):
        samples = [packing.pack_values({"raw": bytes([w * 3 + k]) * n,
                                       "a": np.full((max(1, n // 400), *shape), w * 3 + k, np.float32)}, w * 3 + k, "k")
                   for k in range(3)]  # fmt: skip
        table = packing.table_array(samples)
        minis.append(MiniBatch(0, 0, 0, table[: 3 * packing.header_bytes].view(np.int64).reshape(3, -1), table))
    raw, arrays, _ = assemble(packing, minis)
    values = [int(i) for i in range(6)]
    if n <= 8 << 10:
        assert isinstance(raw, np.ndarray) and raw.shape == (6, n)
    assert [bytes(np.asarray(r)) for r in raw] == [bytes([v]) * n for v in values]
    assert [np.asarray(a).shape for a in arrays] == [(max(1, n // 400), *shape)] * 6
    assert [float(np.asarray(a).ravel()[0]) for a in arrays] == [float(v) for v in values]
