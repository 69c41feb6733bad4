"""Waiting for another process to get somewhere, bounded (no synchronising sleep)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import psutil

ROOT = Path(__file__).resolve().parent.parent


def wait_for(cond: Callable[[], Any], timeout: float, what: str, every: float = 0.01) -> Any:
    """``cond()``'s first truthy value, polled every ``every`` seconds for at
    most ``timeout`` seconds; an AssertionError naming ``what`` after that."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(every)  # bounded poll of a condition, not a synchronising sleep
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def pid_running(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, reaped or not, does not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False



def signal_when(cmd: list[str], cwd: Path, signum: int, ready: Callable[[psutil.Process], Any],
                what: str, exit_timeout_s: float = 120.0) -> tuple[int, str, Any, set[int]]:
    """Start ``python -m rollcall *cmd`` (this checkout on its path), wait
    (bounded) until ``ready(process)`` is truthy, signal it, and return its
    exit status, its stderr, what ``ready`` last gave and every descendant
    seen meanwhile. Killed (by its PID) if it does not exit in time."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "rollcall", *cmd], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen: set[int] = set()
    try:
        def polled() -> Any:
            me = psutil.Process(proc.pid)
            seen.update(c.pid for c in me.children(recursive=True))
            return ready(me)

        got = wait_for(polled, 120, what)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=exit_timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, err.decode(), got, seen
