"""What every process the real target starts needs: where the project is,
the environment that finds it, dying with its starter, and letting go of
an ended one. Used by the launcher, the host agents, the keeper link and
the etcd members."""

from __future__ import annotations

import ctypes
import os
import selectors
import signal
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent

try:  # loaded here, not in a child: between fork and exec only the call runs
    _PRCTL: Any = ctypes.CDLL("libc.so.6", use_errno=True).prctl
except (OSError, AttributeError):
    _PRCTL = None


def python_env() -> dict[str, str]:
    """This environment with the project first on ``PYTHONPATH``: a child
    started with it imports this tree's ``rollcall``, ``sim`` and ``real``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def die_with_parent() -> None:
    """SIGKILL the calling process when the thread that started it dies
    (PR_SET_PDEATHSIG): in itself, or in a child before exec (``preexec_fn``)."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGKILL)


def release(sel: selectors.BaseSelector, pidfd: int, log: Any) -> None:
    """What watching an ended process held: its pidfd (in ``sel``) and its log."""
    try:
        sel.unregister(pidfd)
    except (KeyError, ValueError):
        pass
    try:
        os.close(pidfd)
    except OSError:
        pass
    if not log.closed:
        log.close()
