"""The iterator's calls into DALI, their failures said in our words: a worker's error as the
dali_shards error it was, a dead or stuck worker as a ``WorkerError`` naming it, a DALI operator's failure as the samples it
failed on (``incidents.py``); and the workers killed first whenever anything but the end of the
epoch escapes a call, so that exit never waits on them."""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Tuple

from dali_shards.errors import DaliShardsError, WorkerError
from dali_shards.pids import describe_exit
from dali_shards.pytorch.incidents import dali_failure


def guarded(it: Any, call: Callable[[], Any]) -> Any:
    """Run a DALI call; turn worker failures into errors that say what happened, and kill the
    pipeline's workers when anything but the end of the epoch escapes it.

    A worker that died is looked for before the call too: DALI would block forever handing
    the dead worker its next task (its queue's lock dies with it)."""
    transfer = it.info.transfer
    if it.info.control is not None:
        it.info.control.unlink_once_attached()
    dead = transfer.dead()
    if dead:
        transfer.kill()
        raise worker_error(it, dead)
    if it._watchdog is not None:
        it._watchdog.begin()
    try:
        return call()
    except StopIteration:
        raise
    except DaliShardsError as exc:  # a worker's error, as it was raised there (the ring carries it whole)
        transfer.kill()
        if transfer.lost_worker(exc):  # said with the watchdog's verdict and every dead worker
            raise worker_error(it, transfer.dead()) from exc
        raise
    except Exception as exc:  # the merge transfer's DALI re-raises worker errors as plain exceptions
        dead = transfer.dead()
        transfer.kill()
        carried = transfer.translate(exc)  # the worker's own error object: DALI's text of it adds nothing
        if carried is not None:
            raise carried from None
        if dead or transfer.lost_worker(exc):
            raise worker_error(it, transfer.dead() or dead) from exc
        ahead = transfer.in_flight(it._pipeline) if it._pipeline is not None else 0  # steps DALI may have run on
        ours = dali_failure(exc, it.info, it.epoch, it._fetching_step(), it._last_good, ahead)  # samples it failed on
        if ours is not None:
            raise ours from exc
        raise
    except BaseException:  # Ctrl-C, SIGTERM (see supervise), SystemExit: exit must not wait on workers
        transfer.kill()
        raise
    finally:
        if it._watchdog is not None:
            it._watchdog.end()


def worker_error(it: Any, dead: Sequence[Tuple[int, Optional[int]]]) -> WorkerError:
    reason = it._watchdog.reason if it._watchdog is not None else None
    if reason is not None:
        return WorkerError(f"{reason}. Restart from the last state_dict() to continue the epoch")
    codes = ", ".join(f"pid {pid}: {describe_exit(code)}" for pid, code in dead) or "unknown"
    return WorkerError(
        f"a dali_shards worker process of rank {it.info.rank} stopped ({codes}). If it was killed for "
        "memory, lower shuffle_buffer or batch_size; otherwise see the worker's output above. Restart from "
        "the last state_dict() to continue the epoch"
    )
