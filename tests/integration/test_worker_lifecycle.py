"""Worker processes end with their main process; a stuck worker ends in a WorkerError; Ctrl-C and
SIGTERM always end the run. Each case runs in a subprocess under a hard time limit."""

import os
import signal
import textwrap
import time

import pytest

from dali_shards.testing.processes import children, end_job, gone, read_pids, start_script, wait_gone

HARD_LIMIT = 120  # seconds: no case may hang the test run

COMMON = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    from dali_shards.errors import WorkerError
    from dali_shards.pytorch import DALIShardedIterator
    from dali_shards.sample_data import write_sample_shards
    from dali_shards.testing.pipelines import identity_pipeline

    def make(paths, **kw):  # reads the jpg bytes, delivers the index
        return identity_pipeline(paths, ("jpg", "__index__"), returns="index", batch_size=4, py_num_workers=2,
                                 shuffle=True, shuffle_buffer=8, transfer=os.environ["TRANSFER"], **kw)

    def until_worker_error(it, *before):  # iterate until a WorkerError; print before, the time, the error
        start = time.monotonic()
        try:
            while True:
                for _ in it:
                    pass
        except WorkerError as exc:
            if before:
                print(*before)
            print(f"WorkerError after {time.monotonic() - start:.1f}s: {exc}", flush=True)
    """
)

ORPHAN_SCRIPT = COMMON + textwrap.dedent(
    """
    if __name__ == "__main__":
        method, where = sys.argv[2], sys.argv[3]
        paths = write_sample_shards(sys.argv[1], shard_sizes=(60, 60))
        made = {}

        def build():
            made["pipe"] = make(paths, py_start_method=method)()
            made["it"] = DALIShardedIterator(made["pipe"], ["index"])

        if where == "thread":  # built in a thread that ends before the workers are used
            t = threading.Thread(target=build)
            t.start()
            t.join()
        else:
            build()
        it = made["it"]
        for _ in range(3):
            next(it)  # the workers work (after the building thread ended, too)
        print("PIDS", *made["pipe"].dali_shards.transfer.pids(), flush=True)
        time.sleep(HARD_LIMIT)
    """
).replace("HARD_LIMIT", str(HARD_LIMIT))

# killed at a moment of the workers' lives; a spawned worker's start-up made long, as a main module
# importing torch makes it (spawned workers import the main module as __mp_main__)
MOMENT_SCRIPT = textwrap.dedent(
    """
    import sys, time
    if __name__ == "__mp_main__" and sys.argv[3] != "mid-epoch":
        time.sleep(HARD_LIMIT)
    """
).replace("HARD_LIMIT", str(HARD_LIMIT)) + COMMON + textwrap.dedent(
    """
    if __name__ == "__main__":
        paths = write_sample_shards(sys.argv[1], shard_sizes=(60, 60))
        pipe = make(paths, py_start_method=sys.argv[2])()
        it = DALIShardedIterator(pipe, ["index"])  # builds it: the workers start
        for _ in range(3):
            next(it)
        print("PIDS", *pipe.dali_shards.transfer.pids(), flush=True)
        time.sleep(HARD_LIMIT)
    """
).replace("HARD_LIMIT", str(HARD_LIMIT))

STUCK_SCRIPT = COMMON + textwrap.dedent(
    """
    paths = write_sample_shards(sys.argv[1], shard_sizes=(200, 200))
    options = {} if sys.argv[2] == "default" else {"worker_timeout": float(sys.argv[2])}
    pipe = make(paths, **options)()
    it = DALIShardedIterator(pipe, ["index"])
    if sys.argv[3] == "epoch-end":  # every batch of epoch 0 taken: the next call starts epoch 1
        for _ in range(len(it)):
            next(it)
    else:
        next(it)
    pids = pipe.dali_shards.transfer.pids()
    for pid in pids[: int(sys.argv[4]) if len(sys.argv) > 4 else 1]:
        os.kill(pid, signal.SIGSTOP)  # one worker hangs (as in a dead NFS mount or a deadlock), or more
    print("PIDS", *pids, flush=True)
    # which source that process runs, by its own stamp (DALI's process order is not the sources')
    stopped = [w.worker for w in pipe.dali_shards.control.snapshot() if w.pid == pids[0]]
    until_worker_error(it, "STOPPED", *stopped)
    """
)

LOCKED_SCRIPT = COMMON + textwrap.dedent(
    """
    import multiprocessing as mp

    def hold(lock):
        lock.acquire()
        time.sleep(600)

    def main():
        paths = write_sample_shards(sys.argv[1], shard_sizes=(200, 200))
        pipe = make(paths, worker_timeout=3.0)()
        it = DALIShardedIterator(pipe, ["index"])
        for _ in range(len(it)):
            next(it)
        pool = pipe._py_pool.pool
        worker, lock = pool._processes[0], pool._workers_contexts[0].dedicated_task_queue.lock
        holder = mp.get_context("fork").Process(target=hold, args=(lock,), daemon=True)
        holder.start()
        while lock._semlock._get_value():
            time.sleep(0.01)
        # as if the worker had stopped while taking a task: its queue's lock stays taken
        os.kill(worker.pid, signal.SIGSTOP)
        os.kill(holder.pid, signal.SIGKILL)
        print("PIDS", worker.pid, flush=True)
        until_worker_error(it)

    if __name__ == "__main__":
        main()
    """
)


def start(tmp_path, script, *args, transfer="ring"):
    """The job, its first argument the folder for its shards; SIGHUP, SIGINT and SIGTERM at their
    defaults in it (under nohup, or from a shell that ignores SIGINT, it would inherit them ignored)."""
    env = {"OMP_NUM_THREADS": "1", "TRANSFER": transfer}
    return start_script(tmp_path / "job.py", script, tmp_path, *args, env=env)


@pytest.mark.parametrize(
    "method, where, sig",
    [
        ("fork", "main", signal.SIGKILL),
        ("fork", "main", signal.SIGTERM),
        ("fork", "main", signal.SIGHUP),
        ("fork", "thread", signal.SIGKILL),  # forked by a thread: no parent-death signal, the fallback
        ("spawn", "main", signal.SIGKILL),  # spawned: the fallback
    ],
    ids=["fork-SIGKILL", "fork-SIGTERM", "fork-SIGHUP", "fork-from-thread-SIGKILL", "spawn-SIGKILL"],
)
def test_workers_exit_within_seconds_of_their_parents_death(tmp_path, method, where, sig, transfer):
    proc = start(tmp_path, ORPHAN_SCRIPT, method, where, transfer=transfer)
    pids = read_pids(proc, HARD_LIMIT)
    try:
        assert len(pids) == 2 and not any(gone(p) for p in pids)
        os.kill(proc.pid, sig)
        proc.wait(timeout=30)
        left = wait_gone(pids, 10)
        assert not left, f"workers {left} outlived their main process (killed by {sig.name})"
        if sig == signal.SIGTERM:  # handled like Ctrl-C: the main process cleaned up
            assert "KeyboardInterrupt" in proc.stderr.read()
    finally:
        end_job(proc, pids)


ENDED_WITHIN_S = 2.0  # the docs' "about a second", with room for a loaded machine


@pytest.mark.parametrize("method", ["fork", "spawn"])
@pytest.mark.parametrize("moment", ["starting", "start-up", "mid-epoch"])
def test_workers_end_within_a_second_or_two_of_their_main_process_killed_at_any_moment(
    tmp_path, method, moment, transfer
):
    """SIGKILL while the workers start (as soon as they exist; a second later, a spawned one still
    importing the main module), and mid-epoch. A spawned worker used to be watched only once its
    start-up was over: it outlived its main process by as long as that took. Counts only this
    job's children (other dali_shards runs may be on the host)."""
    proc = start(tmp_path, MOMENT_SCRIPT, method, moment, transfer=transfer)
    pids = []
    try:
        if moment == "mid-epoch":
            read_pids(proc, HARD_LIMIT)
        else:
            deadline = time.monotonic() + HARD_LIMIT
            while len(children(proc.pid)) < 2 and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(1.0 if moment == "start-up" else 0.0)
        pids = children(proc.pid)
        assert len(pids) == 2, f"the job's workers: {pids}" + ("" if proc.poll() is None else proc.stderr.read())
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        left = wait_gone(pids, ENDED_WITHIN_S)
        assert not left, f"workers {left} outlived their main process (killed {moment}) by over {ENDED_WITHIN_S} s"
    finally:
        end_job(proc, pids)


@pytest.mark.parametrize("when", ["mid-epoch", "epoch-end"])
def test_a_stopped_worker_raises_a_worker_error_after_worker_timeout(tmp_path, when, transfer):
    proc = start(tmp_path, STUCK_SCRIPT, 3, when, transfer=transfer)
    pids = read_pids(proc, HARD_LIMIT)
    try:
        out, err = proc.communicate(timeout=HARD_LIMIT)
        assert "WorkerError after" in out, out + err[-3000:]
        seconds = float(out.split("WorkerError after ")[1].split("s:")[0])
        assert 3 <= seconds < 30
        message = out.split("s: ", 1)[1]
        (worker,) = out.split("STOPPED ")[1].split("\n")[0].split()
        assert f"worker {worker} (virtual worker {worker}, pid {pids[0]}) of rank 0" in message
        assert "made no progress for" in message and "worker_timeout=3" in message
        assert "sample-00000" in message, "names the shard"
        assert not wait_gone(pids, 10), "no worker left behind"
    finally:
        end_job(proc, pids)


def test_every_worker_stopped_is_an_error_not_a_hang(tmp_path, transfer):
    """Killing the worker to blame may not release the main process (it waits on another stopped
    worker): then the others are killed too."""
    proc = start(tmp_path, STUCK_SCRIPT, 2, "mid-epoch", 2, transfer=transfer)
    pids = read_pids(proc, HARD_LIMIT)
    try:
        out, err = proc.communicate(timeout=HARD_LIMIT)
        assert "WorkerError after" in out, out + err[-3000:]
        assert float(out.split("WorkerError after ")[1].split("s:")[0]) < 30
        assert "made no progress for" in out and "worker_timeout=2" in out
        assert not wait_gone(pids, 10), "no worker left behind"
    finally:
        end_job(proc, pids)


def test_a_worker_that_ends_holding_its_task_queue_lock_is_an_error_not_a_hang(tmp_path):
    """DALI's pool (the merge transfer) shares a lock with each worker; the ring has none."""
    proc = start(tmp_path, LOCKED_SCRIPT, transfer="merge")
    pids = read_pids(proc, HARD_LIMIT)
    try:
        out, err = proc.communicate(timeout=HARD_LIMIT)
        assert "WorkerError after" in out, out + err[-3000:]
        assert float(out.split("WorkerError after ")[1].split("s:")[0]) < 30
        assert "ended holding its task queue's lock; released it" in err
        assert not wait_gone(pids, 10), "no worker left behind"
    finally:
        end_job(proc, pids)


def test_ctrl_c_ends_the_run_while_a_worker_is_stopped(tmp_path, transfer):
    proc = start(tmp_path, STUCK_SCRIPT, "default", "mid-epoch", transfer=transfer)  # the main process waits
    pids = read_pids(proc, HARD_LIMIT)
    try:
        time.sleep(3)  # the main process now waits for the stopped worker
        assert proc.poll() is None
        os.kill(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        assert "KeyboardInterrupt" in err and proc.returncode != 0
        assert not wait_gone(pids, 10), "no worker left behind"
    finally:
        end_job(proc, pids)
