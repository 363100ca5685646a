"""The control block between a pipeline's main process and its workers; the rules that use it."""

import ctypes
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from dali_shards import ConfigError
from dali_shards.ipc.control import ControlBlock, WorkerStamps, WorkerStatus, remove_stale
from dali_shards.supervise import stuck_worker


def test_workers_stamp_and_the_main_process_reads(tmp_path):
    block = ControlBlock.create(2, directory=str(tmp_path))
    try:
        slot = WorkerStamps(block.path, 1)
        slot.progress(shard=3)
        slot.begin(epoch=4, step=7)
        busy = block.snapshot()[1]
        assert busy.pid == os.getpid() and busy.busy and (busy.epoch, busy.step, busy.shard) == (4, 7, 3)
        slot.end(4, 8)
        slot.end(4, 8, produced=False)
        done = block.snapshot()[1]
        assert not done.busy and done.step == 8 and done.produced == 1
        assert block.snapshot()[0].pid == 0, "an untouched slot"
        assert slot.cut_step(4) is None
        block.cut(4, 9)
        assert slot.cut_step(4) == 9 and slot.cut_step(5) is None and slot.cut_step(3) is None
    finally:
        block.remove()
    assert not os.path.exists(block.path)


def test_blocks_of_dead_processes_are_removed_and_live_ones_kept(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f"dali-shards-{int(dead.stdout)}-abc.ctl"
    stale.write_bytes(b"\0" * 64)
    live = ControlBlock.create(1, directory=str(tmp_path))  # cleans up first
    assert not stale.exists() and os.path.exists(live.path)
    assert remove_stale(str(tmp_path)) == []
    path = live.path
    del live  # garbage collected: removed too
    assert not os.path.exists(path)


def test_worker_timeout_is_checked_with_the_options():
    from dali_shards.options import ShardedOptions

    for bad in (0, -1, "60", True):
        with pytest.raises(ConfigError, match="worker_timeout"):
            ShardedOptions(source="x.tar", fields=("cls",), batch_size=1, py_num_workers=1, worker_timeout=bad)
    block = ControlBlock.create(1, worker_timeout=None)
    assert block.worker_timeout is None
    block.remove()


def status(worker, alive, progress, busy):
    return WorkerStatus(worker, 100 + worker, alive, progress, busy, 0, 3, 3, 1)


def test_which_worker_is_stuck():
    now, timeout = 1000.0, 10.0
    idle = status(0, now - 0.5, now - 500, False)  # alive, waiting for work: never blamed
    reading = status(1, now - 0.5, now - 2, True)  # producing, reading samples
    assert stuck_worker([idle, reading], now, timeout) is None
    blocked = status(1, now - 0.5, now - 30, True)  # alive, but no sample for 30 s in a batch
    assert stuck_worker([idle, blocked], now, timeout) == blocked
    stopped = status(0, now - 40, now - 45, False)  # no heartbeat: stopped or frozen
    assert stuck_worker([stopped, reading], now, timeout) == stopped
    assert stuck_worker([stopped, blocked], now, timeout) == stopped, "the one silent longest"
    # a stopped process is blamed before a live one, even one silent a moment longer (it holds the others up)
    stopped_later = status(0, now - 20.5, now - 20.0, True)
    blocked_longer = status(1, now - 0.5, now - 20.005, True)
    assert stuck_worker([blocked_longer, stopped_later], now, timeout) == stopped_later


def test_a_worker_that_waits_for_its_consumer_is_not_busy(tmp_path):
    block = ControlBlock.create(1, directory=str(tmp_path))
    try:
        slot = WorkerStamps(block.path, 0)
        slot.begin(epoch=0, step=2)
        slot.waiting()  # its batch made, handed on
        (waiting,) = block.snapshot()
        assert not waiting.busy and waiting.step == 2
        later = time.monotonic() + 100  # long after its last progress, its heartbeat going on
        assert stuck_worker([waiting._replace(alive=later)], later, 10.0) is None, "alive: never blamed"
    finally:
        block.remove()


def _report_death_signal(queue):
    from dali_shards.worker.process import entered_process

    entered_process(os.getppid())
    sig = ctypes.c_int(-1)
    ctypes.CDLL(None).prctl(2, ctypes.byref(sig), 0, 0, 0)  # PR_GET_PDEATHSIG
    queue.put(sig.value)


def _fork_and_report(queue, results):
    proc = mp.get_context("fork").Process(target=_report_death_signal, args=(queue,))
    proc.start()
    results.append(queue.get(timeout=30))
    proc.join(30)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_parent_death_signal_only_for_workers_forked_by_the_main_thread():
    """The signal fires when the forking *thread* ends: a worker forked by another thread must not
    get it (it would die with that thread); the heartbeat thread covers it."""
    queue = mp.get_context("fork").Queue()
    results = []
    _fork_and_report(queue, results)
    thread = threading.Thread(target=_fork_and_report, args=(queue, results))
    thread.start()
    thread.join(60)
    assert results == [signal.SIGKILL, 0]


ORPHAN = """
import os, threading, time
from dali_shards.ipc.control import ControlBlock
from dali_shards.worker.process import attach_stamps, entered_process

block = ControlBlock.create(1)
owner = os.getpid()

def work():  # forked by a thread: no parent-death signal, only the heartbeat
    if os.fork() == 0:
        entered_process(owner)
        attach_stamps(block.path, 0)
        print(os.getpid(), block.path, flush=True)
        time.sleep(60)
        os._exit(0)

t = threading.Thread(target=work)
t.start()
t.join()
time.sleep(60)
"""


def test_an_orphaned_worker_ends_by_its_heartbeat(tmp_path):
    """Without the parent-death signal, the heartbeat thread ends a worker within about a second
    of its parent's death, and removes the dead parent's control block."""
    script = tmp_path / "orphan.py"
    script.write_text(ORPHAN)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    pid = None
    try:
        pid, path = proc.stdout.readline().split()
        pid = int(pid)
        assert os.path.exists(path) and _state(pid) not in "ZX"
        proc.kill()
        proc.wait(30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _state(pid) not in "ZX":
            time.sleep(0.05)
        assert _state(pid) in "ZX", "the orphan lives on"
        assert not os.path.exists(path), "the dead parent's control block is removed"
    finally:
        if proc.poll() is None:
            proc.kill()
        if pid is not None and _state(pid) not in "ZX":
            os.kill(pid, signal.SIGKILL)


def _state(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "X"


STARTED = """
import multiprocessing as mp, sys, threading, time
if __name__ == "__mp_main__":
    time.sleep(60)  # a spawned child's long start-up: the main module's imports (torch, say)
from dali_shards.worker.parent import watched_children

def start():
    with watched_children():
        child = mp.get_context(sys.argv[1]).Process(target=time.sleep, args=(60,))
        child.start()
    print(child.pid, flush=True)

if __name__ == "__main__":
    if sys.argv[2] == "thread":  # started by a thread: no parent-death signal, only the heartbeat
        t = threading.Thread(target=start)
        t.start()
        t.join()
    else:
        start()
    time.sleep(60)
"""


@pytest.mark.parametrize("method, by", [("spawn", "main"), ("spawn", "thread"), ("fork", "main"), ("fork", "thread")])
def test_a_child_started_in_watched_children_ends_with_its_parent_from_its_first_moment(tmp_path, method, by):
    """Watched before anything of its own runs: a spawned child still importing the main module, a
    forked one that never enters a source (a plain target), end within about a second of their
    parent's SIGKILL."""
    script = tmp_path / "started.py"
    script.write_text(STARTED)
    proc = subprocess.Popen([sys.executable, str(script), method, by], stdout=subprocess.PIPE, text=True)
    pid = None
    try:
        pid = int(proc.stdout.readline())
        time.sleep(0.5)  # a spawned child is in its start-up now
        assert _state(pid) not in "ZX"
        proc.kill()
        proc.wait(30)
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline and _state(pid) not in "ZX":
            time.sleep(0.05)
        assert _state(pid) in "ZX", "the child outlived its parent"
    finally:
        if proc.poll() is None:
            proc.kill()
        if pid is not None and _state(pid) not in "ZX":
            os.kill(pid, signal.SIGKILL)


def test_only_the_processes_started_in_watched_children_are_watched():
    """A spawn outside it (or by another thread) gets multiprocessing's preparation data unchanged."""
    import multiprocessing.spawn
    import pickle

    from dali_shards.worker.parent import watched_children

    with watched_children():
        inside = multiprocessing.spawn.get_preparation_data("w")
        other = []
        thread = threading.Thread(target=lambda: other.append(multiprocessing.spawn.get_preparation_data("w")))
        thread.start()
        thread.join()
    outside = multiprocessing.spawn.get_preparation_data("w")
    assert "dali_shards_watch" in inside and "dali_shards_watch" not in other[0] | outside
    pickle.loads(pickle.dumps(inside["dali_shards_watch"]))  # unpickled in its owner: nothing to watch
