"""The ring transfer in real pipelines: nothing left in /dev/shm however the run ends, slots that
grow for a sample 10x the others, a worker lost while DALI holds its slot, DALI's stock iterator."""

import hashlib
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from nvidia.dali.plugin.pytorch import DALIGenericIterator

from dali_shards import WorkerError, sharded_pipeline
from dali_shards.pytorch import DALIShardedIterator
from dali_shards.testing.pipelines import run_epochs
from dali_shards.testing.processes import wait_gone
from dali_shards.tools.writer import ShardWriter

SHM = "/dev/shm"


def photo_byte_sums():
    """The sum of each built-in photo's bytes, in order (sample ``i`` is photo ``i % len``)."""
    from dali_shards.sample_data import sample_images

    return [int(np.frombuffer(open(p.path, "rb").read(), np.uint8).sum(dtype=np.int64)) for p in sample_images()]

ENDINGS = textwrap.dedent(
    """
    import os, signal, sys, time
    from dali_shards import sharded_pipeline
    from dali_shards.pytorch import DALIShardedIterator
    from dali_shards.sample_data import write_sample_shards

    paths = write_sample_shards(sys.argv[1], shard_sizes=(40, 40))
    how = sys.argv[2]

    @sharded_pipeline(paths, fields=("jpg", "cls"), batch_size=4, py_num_workers=2, shuffle=True, num_threads=1,
                      device_id=None)
    def p(jpg, cls):
        return cls

    pipe = p()
    if how == "main-killed-before-start":  # e.g. a timeout's SIGKILL while the workers were starting
        os.kill(os.getpid(), signal.SIGKILL)
    it = DALIShardedIterator(pipe, ["cls"])
    next(it)
    pids = pipe.dali_shards.transfer.pids()
    print("PIDS", os.getpid(), *pids, flush=True)
    if how == "exception":
        raise RuntimeError("the user's training step failed")
    if how == "worker-killed":
        os.kill(pids[0], signal.SIGKILL)
        try:
            for _ in it:
                pass
        except Exception as exc:
            print("ERROR", type(exc).__name__, flush=True)
    if how == "main-killed":
        os.kill(os.getpid(), signal.SIGKILL)
    for _ in it:
        pass
    print("DONE", flush=True)
    """
)


def ours(pid):
    """Files in /dev/shm that a run of process ``pid`` made: its control block would be
    ``dali-shards-<pid>-*.ctl`` (the ring's slots are memfds, which leave nothing)."""
    return sorted(n for n in os.listdir(SHM) if n.startswith(f"dali-shards-{pid}-")) if os.path.isdir(SHM) else []


@pytest.mark.skipif(not os.path.isdir(SHM), reason="needs /dev/shm")
@pytest.mark.parametrize("how", ["normal", "exception", "worker-killed", "main-killed", "main-killed-before-start"])
def test_nothing_is_left_in_dev_shm_however_the_run_ends(tmp_path, how):
    """Counts only what this run's processes made: other dali_shards runs on the host may come and go."""
    script = tmp_path / "job.py"
    script.write_text(ENDINGS)
    run = subprocess.Popen([sys.executable, str(script), str(tmp_path), how], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)  # fmt: skip
    stdout, stderr = run.communicate(timeout=120)
    line = next((l for l in stdout.splitlines() if l.startswith("PIDS")), f"PIDS {run.pid}")
    main, *workers = [int(p) for p in line.split()[1:]]
    assert not wait_gone(workers, 5), "no worker outlives the run"  # orphans end within about a second
    assert ours(main) == [] and not any(ours(w) for w in workers), f"left in /dev/shm after a {how} ending"
    if how == "worker-killed":
        assert "ERROR WorkerError" in stdout, stdout + stderr[-2000:]


def test_a_slot_grows_for_a_sample_ten_times_the_others(tmp_path):
    rng = np.random.default_rng(3)
    sizes = [200_000] * 23 + [2_000_000]  # one sample 10x the others, 8 MB in a mini-batch of 4 with it
    rng.shuffle(sizes)
    digests = {}
    with ShardWriter(str(tmp_path / "g-%d.tar"), max_count=12) as w:
        for i, size in enumerate(sizes):
            data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
            w.write({"__key__": f"{i:04d}", "bin": data})
            digests[i] = hashlib.sha1(data).hexdigest()

    @sharded_pipeline(w.paths, fields=("bin", "__index__"), batch_size=8, py_num_workers=2, num_threads=1,
                      device_id=None)  # fmt: skip
    def pipe(data, index):
        return data, index

    p = pipe()
    seen = {}
    for data, index in run_epochs(p, 1)[0]:
        for d, i in zip(data, index):
            seen[int(i)] = hashlib.sha1(d.tobytes()).hexdigest()
    assert seen == digests
    slots = [s.size for c in p.dali_shards.transfer.workers.consumers for s in c.segments if s is not None]
    assert max(slots) >= 2_000_000 + 3 * 200_000, "the slot that took the big sample grew to hold its mini-batch"


def test_a_worker_lost_while_dali_holds_its_slot_is_an_error_not_a_hang(photo_shards):
    @sharded_pipeline(photo_shards["paths"], fields=("cls",), batch_size=2, py_num_workers=2, num_threads=1,
                      device_id=None, prefetch_queue_depth=1)  # fmt: skip
    def pipe(cls):
        return cls

    p = pipe()
    it = DALIShardedIterator(p, ["cls"])
    first = next(it)[0]["cls"].clone()  # the pipeline took the workers' slots of steps 0 and 1
    os.kill(p.dali_shards.transfer.pids()[1], signal.SIGKILL)
    with pytest.raises(WorkerError, match="killed by SIGKILL"):
        for _ in range(100):
            next(it)
    assert len(first) == 2, "what was returned before stays whole"


def test_dalis_stock_iterator_reads_a_ring_pipeline(photo_shards):
    """DALIGenericIterator over a ring pipeline: epochs end and restart (padding kept, as DALI's
    iterators keep it)."""

    @sharded_pipeline(photo_shards["paths"], fields=("__index__",), batch_size=4, py_num_workers=2, shuffle=True,
                      num_threads=1, device_id=None)  # fmt: skip
    def pipe(index):
        return index

    it = DALIGenericIterator(pipe(), ["index"], auto_reset=True)
    for _ in range(2):
        got = [i for (b,) in it for i in b["index"].tolist()]
        assert len(got) == 48 and set(got) == set(range(47))


EXIT_AFTER_EARLY_FINALIZER = textwrap.dedent(
    """
    import tempfile
    early = tempfile.TemporaryDirectory()  # a weakref.finalize made before multiprocessing is imported
    import sys
    from dali_shards import sharded_pipeline
    from dali_shards.pytorch import DALIShardedIterator
    from dali_shards.sample_data import write_sample_shards

    paths = write_sample_shards(sys.argv[1], shard_sizes=(40, 40))

    @sharded_pipeline(paths, fields=("cls",), batch_size=4, py_num_workers=2, num_threads=1, device_id=None)
    def p(cls):
        return cls

    it = DALIShardedIterator(p(), ["cls"])
    next(it)
    print("EXITING", flush=True)
    """
)


def test_the_process_exits_whatever_was_finalized_first(tmp_path):
    """The workers are stopped before multiprocessing joins its children at exit."""
    script = tmp_path / "job.py"
    script.write_text(EXIT_AFTER_EARLY_FINALIZER)
    out = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "EXITING" in out.stdout, out.stderr[-2000:]


def test_a_pipeline_called_again_after_a_workers_error_says_so_at_once(tmp_path):
    from dali_shards import ShardFormatError

    write_shard_path = str(tmp_path / "bad.tar")
    from dali_shards.tools.writer import write_shard

    write_shard(write_shard_path, [{"__key__": f"k{i}", "cls": "x" if i == 5 else i} for i in range(12)])

    @sharded_pipeline(write_shard_path, fields=("cls",), batch_size=4, py_num_workers=2, num_threads=1,
                      device_id=None)  # fmt: skip
    def pipe(cls):
        return cls

    p = pipe()
    p.build()
    with pytest.raises(ShardFormatError):
        for _ in range(10):
            p.run()
    with pytest.raises(WorkerError, match="stopped .* after a worker's error"):
        p.run()  # not a hang waiting for the failed worker


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_the_fast_path_in_real_pipelines_delivers_every_sample_whole(tmp_path, start):
    """Mini-batches of 32 or more: each step read straight into the slot (worker/direct.py)."""
    from collections import Counter

    from dali_shards.sample_data import sample_images, write_sample_shards

    photos = sample_images()
    originals = [hashlib.sha1(open(p.path, "rb").read()).hexdigest() for p in photos]
    paths = write_sample_shards(str(tmp_path), shard_sizes=(60, 0, 45, 90, 25, 80, 30, 70, 50, 40))

    @sharded_pipeline(paths, fields=("jpg", "cls", "__index__", "__valid__"), batch_size=64, py_num_workers=2,
                      shuffle=True, num_threads=1, device_id=None, py_start_method=start)  # fmt: skip
    def pipe(jpg, cls, index, valid):
        return jpg, cls, index, valid

    for epoch in run_epochs(pipe(), 2):
        seen = Counter()
        for jpg, cls, index, valid in epoch:
            for j, c, i, v in zip(jpg, cls, index, valid):
                photo = int(i) % len(photos)
                assert hashlib.sha1(j.tobytes()).hexdigest() == originals[photo] and int(c) == photos[photo].label
                seen[int(i)] += bool(v)
        assert sorted(seen) == list(range(490)) and set(seen.values()) == {1}


@pytest.mark.parametrize("queue_depth, worker_prefetch", [(1, 1), (2, 2), (3, 1)])
def test_dali_reads_each_slot_in_place_only_while_it_holds_the_step(tmp_path, queue_depth, worker_prefetch):
    """The ring hands DALI its slots without a copy: a slot is written again only once DALI is done
    with the step it held (``prefetch_queue_depth`` calls later). An operator reading the bytes
    (a sum over them, in DALI) sees each sample's own, at every queue depth."""
    from nvidia.dali import fn, types

    from dali_shards.sample_data import write_sample_shards

    sums = photo_byte_sums()
    paths = write_sample_shards(str(tmp_path), shard_sizes=(60, 45, 90, 25))

    @sharded_pipeline(paths, fields=("jpg", "__index__", "__valid__"), batch_size=8, py_num_workers=2, shuffle=True,
                      num_threads=2, device_id=None, prefetch_queue_depth=queue_depth,
                      worker_prefetch=worker_prefetch)  # fmt: skip
    def pipe(jpg, index, valid):
        return fn.reductions.sum(fn.cast(jpg, dtype=types.INT64)), index, valid

    for epoch in run_epochs(pipe(), 2):
        seen = []
        for total, index, valid in epoch:
            for t, i, v in zip(total, index, valid):
                assert int(t) == sums[int(i) % len(sums)], f"sample {int(i)} read after its slot was written again"
                seen += [int(i)] * bool(v)
        assert sorted(seen) == list(range(220))


def test_fields_returned_as_they_are_are_copied_the_others_read_in_place(tmp_path):
    from nvidia.dali import fn, types

    from dali_shards.sample_data import write_sample_shards

    paths = write_sample_shards(str(tmp_path), shard_sizes=(20, 20))

    @sharded_pipeline(paths, fields=("jpg", "cls", "__key__"), batch_size=4, py_num_workers=2, num_threads=1,
                      device_id=None)  # fmt: skip
    def pipe(jpg, cls, key):
        return fn.reductions.sum(fn.cast(jpg, dtype=types.INT64)), cls, fn.cast(key, dtype=types.INT32)

    p = pipe()
    p.build()
    assert p.dali_shards.transfer.in_place == [True, False, True, False]  # jpg, cls, key, then the slot status
    assert len(run_epochs(p, 1)[0]) == 10


def test_a_pipeline_scheduled_ahead_of_its_outputs_reads_every_step_whole_or_says_it_went_too_far(tmp_path):
    """``schedule_run()`` called more often than outputs are taken: a step read in place stays held
    until its output is taken (not only ``prefetch_queue_depth`` calls); beyond the workers' slots
    (``worker_prefetch + prefetch_queue_depth``) a ConfigError says so instead of waiting forever."""
    from nvidia.dali import fn, types

    from dali_shards import ConfigError
    from dali_shards.sample_data import write_sample_shards

    sums = photo_byte_sums()
    paths = write_sample_shards(str(tmp_path), shard_sizes=(37, 0, 23, 44))

    @sharded_pipeline(paths, fields=("jpg", "__index__", "__valid__"), batch_size=4, py_num_workers=2, shuffle=True,
                      num_threads=2, device_id=None, prefetch_queue_depth=1, worker_prefetch=3)  # fmt: skip
    def pipe(jpg, index, valid):
        return fn.reductions.sum(fn.cast(jpg, dtype=types.INT64)), index, valid

    p = pipe()
    p.build()
    for ahead in (2, 4):  # 4: every slot of the workers (3 + 1)
        seen = []
        for _ in range(ahead):
            p.schedule_run()
        while True:
            try:
                total, index, valid = p.outputs()
            except StopIteration:
                break
            for t, i, v in zip(total, index, valid):
                assert int(np.array(t)) == sums[int(np.array(i)) % len(sums)]
                seen += [int(np.array(i))] * bool(np.array(v))
            p.schedule_run()
        p.reset()
        assert sorted(seen) == list(range(104))
    for _ in range(4):
        p.schedule_run()
    with pytest.raises(ConfigError, match="scheduled 4 steps ahead of its outputs"):
        p.schedule_run()
