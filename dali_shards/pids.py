"""Facts about processes on this host, shared by the cache, the control block and the workers."""

from __future__ import annotations

import os
import signal
from typing import Optional


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (a reused pid, or another user's process, counts
    as alive)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. another user's process
        return True
    return True


def describe_exit(code: Optional[int]) -> str:
    """A process's exit code in words."""
    if code is None:
        return "running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"
