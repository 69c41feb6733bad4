"""Waiting for another process to get somewhere, bounded (no synchronising sleep)."""

from __future__ import annotations

import time
from typing import Any, Callable

import psutil


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
