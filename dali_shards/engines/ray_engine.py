"""The Ray engine: tasks on a Ray cluster (or a local Ray instance), each task retried on another
worker if its process dies. Ray is the optional extra ``dali-shards[ray]``."""

from __future__ import annotations

import itertools
import os
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from dali_shards.errors import ConfigError, WorkerError

INSTALL = "pip install 'dali-shards[ray]'"
RETRIES = 3  # a task whose process dies is run again this many times
AHEAD = 4  # tasks submitted at once per CPU of the cluster


def import_ray() -> Any:
    """The ``ray`` module, or a ConfigError saying how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(f"engine 'ray' needs Ray, which is not installed ({exc}): {INSTALL}") from None
    return ray


class RayEngine:
    """Runs tasks as Ray tasks on the cluster at ``address`` (else ``RAY_ADDRESS``, else the one
    ``ray start`` began on this machine, as ``ray.init()`` finds it, else a local instance started
    here and stopped by ``close()``); a Ray already initialised in this process is used as it is."""

    def __init__(self, address: Optional[str] = None) -> None:
        self.ray = ray = import_ray()
        self._started = not ray.is_initialized()
        if self._started:
            try:
                ray.init(address=address or os.environ.get("RAY_ADDRESS"), include_dashboard=False,
                         configure_logging=False, log_to_driver=False)  # fmt: skip
            except ConnectionError as exc:
                raise ConfigError(f"cannot reach the Ray cluster at {address!r}: {exc}") from None
        self._asked = float("-inf")
        self.workers = self._cpus()

    def run(self, fn: Callable[[Any], Any], tasks: Sequence[Any]) -> Iterator[Tuple[int, Any]]:
        """``(index, fn(task))`` for every task, as each completes on the cluster; at most
        ``AHEAD`` tasks per CPU of the cluster (as it is now: it may grow) submitted at once, so
        that the driver and the object store hold a few tasks' arguments, not the whole job's."""
        ray = self.ray
        remote = ray.remote(fn).options(max_retries=RETRIES, retry_exceptions=False)
        queued = iter(enumerate(tasks))
        index: Dict[Any, int] = {}
        pending: List[Any] = []
        try:
            while True:
                for i, task in itertools.islice(queued, max(0, AHEAD * self._cpus() - len(pending))):
                    pending.append(remote.remote(task))
                    index[pending[-1]] = i
                if not pending:
                    return
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    yield index.pop(ref), self._get(ref)
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)

    def _cpus(self) -> int:
        """The cluster's CPUs, asked again at most once a second."""
        now = time.monotonic()
        if now - self._asked >= 1.0:
            self.workers = max(1, int(self.ray.cluster_resources().get("CPU", 1)))
            self._asked = now
        return self.workers

    def _get(self, ref: Any) -> Any:
        ray = self.ray
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, BaseException):
                raise cause from None  # the task's own error (a dali_shards error stays one)
            raise WorkerError(f"a Ray task failed: {exc}") from None
        except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError, ray.exceptions.ObjectLostError) as exc:
            raise WorkerError(
                f"a Ray task's process died {RETRIES + 1} times ({type(exc).__name__}); run the same command again: "
                "what was complete is kept"
            ) from None

    def close(self) -> None:
        """Stop the local Ray instance this engine started (a cluster it joined is left running)."""
        if self._started and self.ray.is_initialized():
            self.ray.shutdown()
            self._started = False
