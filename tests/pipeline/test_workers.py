"""Worker processes: a dead worker is reported within seconds, start methods, AutoGraph."""

import textwrap
import time

import pytest
from nvidia.dali import fn

from dali_shards import ConfigError, decode_image, sharded_pipeline
from dali_shards.pytorch import DALIShardedIterator
from dali_shards.sample_data import write_sample_shards
from dali_shards.supervise import stuck_worker
from dali_shards.testing.pipelines import identity_pipeline, run_epochs
from dali_shards.testing.processes import run_script

KILL_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    from nvidia.dali import fn
    from dali_shards import decode_image, sharded_pipeline
    from dali_shards.errors import WorkerError
    from dali_shards.pytorch import DALIShardedIterator
    from dali_shards.sample_data import write_sample_shards

    paths = write_sample_shards(sys.argv[1], shard_sizes=(200, 200))
    when = sys.argv[2]

    @sharded_pipeline(paths, fields=("jpg", "__index__"), batch_size=4, py_num_workers=2, shuffle=True,
                      shuffle_buffer=200, num_threads=1, device_id=None, transfer=sys.argv[3])
    def p(jpg, index):
        return fn.resize(decode_image(jpg), size=(16, 16)), index

    pipe = p()
    it = DALIShardedIterator(pipe, ["image", "index"])
    next(it)
    victim = pipe.dali_shards.transfer.pids()[0]
    start = time.perf_counter()
    if when == "between":  # killed while the training step runs
        os.kill(victim, signal.SIGKILL)
        time.sleep(0.5)
    else:  # killed while the iterator waits for data
        threading.Timer(0.05, os.kill, (victim, signal.SIGKILL)).start()
    try:
        for _ in range(1000):
            next(it)
        print("NO ERROR")
    except WorkerError as exc:
        print(f"WorkerError after {time.perf_counter() - start:.1f}s: {exc}")
    """
)


@pytest.mark.parametrize("when", ["between", "during"])
def test_a_killed_worker_is_reported_within_seconds(tmp_path, when, transfer):
    out = run_script(tmp_path / "kill.py", KILL_SCRIPT, tmp_path, when, transfer, timeout=120)
    assert "WorkerError after" in out.stdout, out.stdout + out.stderr[-2000:]
    assert "killed by SIGKILL" in out.stdout and "state_dict" in out.stdout
    seconds = float(out.stdout.split("WorkerError after ")[1].split("s:")[0])
    assert seconds < 10


def test_workers_waiting_for_the_main_process_are_never_blamed(tmp_path, transfer):
    """A worker that made its batches and waits (for DALI to ask, or for a free slot) is not stuck:
    the watchdog must blame only one that is (tests/integration/test_worker_lifecycle.py)."""
    paths = write_sample_shards(str(tmp_path), shard_sizes=(40, 40))
    pipe = identity_pipeline(paths, ("jpg", "__index__"), returns="index", batch_size=4, py_num_workers=2,
                             transfer=transfer, worker_timeout=1.0)()  # fmt: skip
    it = DALIShardedIterator(pipe, ["index"])
    seen = list(next(it)[0]["index"].tolist())
    time.sleep(2.5)  # the workers fill what they may ahead, then wait
    statuses = pipe.dali_shards.control.snapshot()
    assert all(s.pid for s in statuses) and all(s.produced for s in statuses), statuses
    assert stuck_worker(statuses, time.monotonic(), 1.0) is None, statuses
    seen += [i for (b,) in it for i in b["index"].tolist()]
    assert sorted(seen) == list(range(80))


def test_fork_after_cuda_merge_refuses_ring_forks(photo_shards, monkeypatch):
    """DALI's pool cannot fork once CUDA is initialised: the merge transfer says what to do. The
    ring's own workers never touch CUDA, so they fork then too (as DataLoader's workers do)."""
    import nvidia.dali.backend as backend

    monkeypatch.setattr(backend, "IsDriverInitialized", lambda: True)  # as if the GPU had been touched

    @sharded_pipeline(
        photo_shards["pattern"], fields=("__index__",), batch_size=2, py_num_workers=2, num_threads=1, device_id=None
    )
    def pipe(index):
        return index

    with pytest.raises(ConfigError, match="before touching the GPU.*py_start_method='spawn'"):
        pipe(transfer="merge")
    assert pipe(transfer="merge", py_start_method="spawn") is not None  # spawn is fine
    (epoch,) = run_epochs(pipe(transfer="ring"), 1)
    indices = [int(i) for (index,) in epoch for i in index]
    assert len(indices) == 48 and set(indices) == set(range(47))  # (one slot of padding)


def test_user_conditionals_next_to_unconverted_sources(photo_shards):
    """The function may use DALI conditionals (AutoGraph converts it); the worker sources are
    created outside AutoGraph -- DALI refuses converted parallel sources, so building proves it."""
    import numpy as np

    @sharded_pipeline(
        photo_shards["pattern"],
        fields=("jpg", "cls", "__index__"),
        batch_size=4,
        py_num_workers=2,
        num_threads=1,
        device_id=None,
    )
    def pipe(jpg, cls, index):
        image = fn.resize(decode_image(jpg), size=(8, 8))
        flipped = fn.flip(image, horizontal=1)
        if cls > 400:  # the user's own conditional
            out = flipped
        else:
            out = image
        return out, flipped, image, cls, index

    p = pipe()
    p.build()
    out, flipped, image, cls, _ = p.run()
    for i in range(4):
        want = flipped if int(np.array(cls[i])) > 400 else image
        assert np.array_equal(np.array(out[i]), np.array(want[i]))


REBUILD_SCRIPT = textwrap.dedent(
    """
    import gc, os, sys
    from dali_shards.sample_data import write_sample_shards
    from dali_shards.testing.pipelines import identity_pipeline, run_epochs

    def make(start):
        return identity_pipeline(paths, ("cls",), outputs="label", map=lambda s: {"label": s["cls"]}, batch_size=2,
                                 py_num_workers=2, py_start_method=start)()

    if __name__ == "__main__":
        paths = write_sample_shards(sys.argv[1], shard_sizes=(6, 6))
        gc.disable()  # dropped pipelines stay as garbage (in reference cycles) ...
        for start in ("spawn", "fork"):
            pipe = make(start)
            run_epochs(pipe, 1)
            pipe.cycle = pipe
            del pipe
        os.register_at_fork(after_in_child=gc.collect)  # ... that a forked worker would collect at once
        run_epochs(make("fork"), 1)
        print("done")
    """
)


def test_pipelines_dropped_before_the_next_one_starts_do_not_hang_its_workers(tmp_path):
    """A dropped pipeline must not be finalized in the next pipeline's freshly forked workers
    (DALI's shutdown never returns there): garbage is collected before workers start."""
    out = run_script(tmp_path / "rebuild.py", REBUILD_SCRIPT, tmp_path, timeout=90)
    assert out.returncode == 0 and "done" in out.stdout, out.stderr[-2000:]
