"""Jobs in subprocesses and whether processes have ended, for tests that kill or orphan workers:
a script run in its own process (``start_script``/``run_script``) prints its workers' pids
(``read_pids``); ``end_job`` kills what a failed case left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any, Dict, Iterable, List, Optional, Sequence


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


def children(pid: int) -> List[int]:
    """The live processes whose parent is ``pid`` (Linux ``/proc``), but multiprocessing's resource
    tracker (a helper of ``spawn`` that ends on its own once its users are gone)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                state, parent = f.read().rsplit(")", 1)[1].split()[:2]
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read()
        except OSError:
            continue
        if int(parent) == pid and state not in ("Z", "X") and b"resource_tracker" not in command:
            found.append(int(entry))
    return sorted(found)


def _default_signals() -> None:
    """In the child: SIGHUP, SIGINT and SIGTERM end it, even under nohup or a shell that ignores SIGINT."""
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def _command(path: Any, script: str, args: Sequence[Any]) -> List[str]:
    with open(path, "w") as f:  # a file, not -c: AutoGraph and spawned workers need the source
        f.write(script)
    return [sys.executable, str(path), *map(str, args)]


def start_script(path: Any, script: str, *args: Any, env: Optional[Dict[str, str]] = None) -> subprocess.Popen:
    """Write ``script`` to ``path`` and start it with ``args``, in this environment plus ``env``,
    SIGHUP, SIGINT and SIGTERM at their defaults, its output (text) piped: read its pids with
    ``read_pids``, and end what is left with ``end_job``."""
    return subprocess.Popen(
        _command(path, script, args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        preexec_fn=_default_signals,
    )


def run_script(
    path: Any, script: str, *args: Any, env: Optional[Dict[str, str]] = None, timeout: float = 120
) -> subprocess.CompletedProcess:
    """``start_script`` run to its end (within ``timeout`` seconds): its return code and output."""
    return subprocess.run(
        _command(path, script, args),
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        preexec_fn=_default_signals,
    )


def read_pids(proc: subprocess.Popen, seconds: float, tag: str = "PIDS") -> List[int]:
    """The pids on the first line of ``proc``'s output that starts with ``tag`` (``PIDS 12 13``);
    fails with the end of its error output if it ends, or ``seconds`` pass, first (killing it)."""
    assert proc.stdout is not None and proc.stderr is not None, "start the job with start_script"
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith(tag):
            return [int(p) for p in line.split()[1:]]
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError("the job did not start its workers: " + proc.stderr.read()[-3000:])


def end_job(proc: subprocess.Popen, pids: Iterable[int]) -> None:
    """Kill what a failed case left behind: the job, then its workers by pid (continued first, in
    case they were stopped)."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for pid in pids:
        if not gone(pid):
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
