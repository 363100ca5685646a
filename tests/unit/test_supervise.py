"""Freeing a task queue's lock that a dead worker held: only then, never one this process holds."""

import multiprocessing as mp
import os
import signal
import time

from dali_shards.transfer.merge import pool as supervise
from dali_shards.transfer.merge.pool import free_lock_of_the_dead


def _hold(lock):
    lock.acquire()
    time.sleep(600)


def test_a_lock_a_dead_process_held_is_released(monkeypatch):
    monkeypatch.setattr(supervise, "LOOK_S", 0.01)
    lock = mp.get_context("fork").Lock()
    holder = mp.get_context("fork").Process(target=_hold, args=(lock,), daemon=True)
    holder.start()
    while lock._semlock._get_value():
        time.sleep(0.01)
    os.kill(holder.pid, signal.SIGKILL)
    holder.join()
    assert not lock.acquire(timeout=0.05), "the dead process still holds it"
    assert free_lock_of_the_dead(lock)
    assert lock.acquire(timeout=1), "free again"
    assert lock._semlock._is_mine(), "and this process's count of it is right"
    lock.release()


def test_a_free_lock_or_one_this_process_holds_is_left_alone(monkeypatch):
    monkeypatch.setattr(supervise, "LOOK_S", 0.01)
    lock = mp.get_context("fork").Lock()
    assert not free_lock_of_the_dead(lock)
    assert lock.acquire(timeout=1)
    assert not free_lock_of_the_dead(lock), "held here: not the dead worker's"
    assert lock._semlock._is_mine()
    lock.release()
    assert not free_lock_of_the_dead(object())
