"""Whether processes have ended, for tests that kill or orphan workers."""

from __future__ import annotations

import os
import time
from typing import Iterable, List


def gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie counts as gone: it holds no memory or files)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False


def wait_gone(pids: Iterable[int], seconds: float) -> List[int]:
    """Wait up to ``seconds`` for every process in ``pids`` to end; those still running."""
    pids = list(pids)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not all(gone(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if not gone(p)]
