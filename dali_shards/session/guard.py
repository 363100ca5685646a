"""A run session's calls into DALI, their failures said in our words: a worker's error as the
dali_shards error it was, a dead or stuck worker as a ``WorkerError`` naming it (the watchdog's
verdict), a DALI operator's failure as the samples it failed on (``incidents.py``); and the workers
killed first whenever anything but the end of the epoch escapes a call, so that exit never waits
on them."""

from __future__ import annotations

import weakref
from typing import Any, Callable, Optional, Sequence, Tuple, TypeVar

from dali_shards.errors import DaliShardsError, WorkerError
from dali_shards.pids import describe_exit
from dali_shards.session.incidents import dali_failure
from dali_shards.supervise import Watchdog

T = TypeVar("T")


class Guard:
    """The calls into one pipeline (``info`` its ``ShardedPipelineInfo``), watched: its transfer's
    workers looked at before each call, and (``watch()``, once they started) timed by a
    ``Watchdog`` during it. ``stop()`` ends the watchdog, before a rebuilt pipeline's guard
    takes over."""

    def __init__(self, info: Any, pipeline: Any) -> None:
        self.info, self.pipeline = info, pipeline
        self.watchdog: Optional[Watchdog] = None

    def watch(self, owner: object) -> None:
        """Watch the started workers: for death, and (with a control block) for a stop in progress,
        until ``stop()`` or ``owner`` goes."""
        self.info.transfer.watch()
        control = self.info.control
        if control is not None:
            urls = self.info.shards.urls  # (a view: a URL made when a stuck worker is named)
            self.watchdog = Watchdog(control, self.info.transfer.pids(), urls, self.info.rank)
            weakref.finalize(owner, self.watchdog.stop)  # (the watchdog holds no pipeline: this keeps none alive)

    def stop(self) -> None:
        """End the watchdog and let go of the pipeline (a rebuilt one follows)."""
        if self.watchdog is not None:
            self.watchdog.stop()
        self.pipeline = None

    def call(self, call: Callable[[], T], epoch: int, step: int, good: Optional[int]) -> T:
        """Run a DALI call that fetches ``step`` of ``epoch`` (``good``: a sample DALI took in the run,
        None if none is known); turn worker failures into errors that say what happened, and kill the
        pipeline's workers when anything but the end of the epoch escapes it.

        A worker that died is looked for before the call too: DALI would block forever handing
        the dead worker its next task (its queue's lock dies with it)."""
        transfer = self.info.transfer
        if self.info.control is not None:
            self.info.control.unlink_once_attached()
        dead = transfer.dead()
        if dead:
            transfer.kill()
            raise self.worker_error(dead)
        if self.watchdog is not None:
            self.watchdog.begin()
        try:
            return call()
        except StopIteration:
            raise
        except DaliShardsError as exc:  # a worker's error, as it was raised there (the ring carries it whole)
            transfer.kill()
            if transfer.lost_worker(exc):  # said with the watchdog's verdict and every dead worker
                raise self.worker_error(transfer.dead()) from exc
            raise
        except Exception as exc:  # the merge transfer's DALI re-raises worker errors as plain exceptions
            self._raise_ours(exc, epoch, step, good)
            raise
        except BaseException:  # Ctrl-C, SIGTERM (see supervise), SystemExit: exit must not wait on workers
            transfer.kill()
            raise
        finally:
            if self.watchdog is not None:
                self.watchdog.end()

    def _raise_ours(self, exc: Exception, epoch: int, step: int, good: Optional[int]) -> None:
        """Raise what ``exc``, escaped from a call, means in our words: the worker's own error, a dead
        worker's, the samples a DALI operator failed on; return if none (``exc`` is raised as it is)."""
        transfer = self.info.transfer
        dead = transfer.dead()
        transfer.kill()
        carried = transfer.translate(exc)  # the worker's own error object: DALI's text of it adds nothing
        if carried is not None:
            raise carried from None
        if dead or transfer.lost_worker(exc):
            raise self.worker_error(transfer.dead() or dead) from exc
        ahead = transfer.in_flight(self.pipeline) if self.pipeline is not None else 0  # steps DALI may have run on
        ours = dali_failure(exc, self.info, epoch, step, good, ahead)  # the samples it failed on
        if ours is not None:
            raise ours from exc

    def worker_error(self, dead: Sequence[Tuple[int, Optional[int]]]) -> WorkerError:
        """A ``WorkerError`` for the ``dead`` workers (pid, exit code), or the watchdog's verdict."""
        reason = self.watchdog.reason if self.watchdog is not None else None
        if reason is not None:
            return WorkerError(f"{reason}. Restart from the last state_dict() to continue the epoch")
        codes = ", ".join(f"pid {pid}: {describe_exit(code)}" for pid, code in dead) or "unknown"
        return WorkerError(
            f"a dali_shards worker process of rank {self.info.rank} stopped ({codes}). If it was killed for "
            "memory, lower shuffle_buffer or batch_size; otherwise see the worker's output above. Restart from "
            "the last state_dict() to continue the epoch"
        )
