"""What every process the real target starts needs: where the project is,
the environment that finds it, dying with its starter, and letting go of
an ended one. Used by the launcher, the host agents, the keeper link and
the etcd members. :class:`Proc` is the launcher's record of one worker
process."""

from __future__ import annotations

import ctypes
import os
import select
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

REPO_ROOT = Path(__file__).resolve().parent.parent

try:  # loaded here, not in a child: between fork and exec only the call runs
    _PRCTL: Any = ctypes.CDLL("libc.so.6", use_errno=True).prctl
except (OSError, AttributeError):
    _PRCTL = None


def worker_log(run_dir: str | Path, worker: int, life: int) -> Path:
    """Where a worker process's output goes: one file per life, on its host."""
    return Path(run_dir) / "real" / "logs" / f"worker-{worker}.{life}.log"


def last_line(path: Path) -> str:
    """The last non-empty line of a log (a crash's exception), or what kept it unread."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - 4096))
            lines = fh.read().decode(errors="replace").strip().splitlines()
    except OSError as exc:
        return f"(log unreadable: {exc.strerror})"
    return lines[-1][:300] if lines else "(empty log)"


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


STOP_WAIT_S = 2.0  # a stop no thread completes in this long is let go, not waited on


def signal_child(pid: int, pidfd: Optional[int], sig: int) -> bool:
    """Send ``sig`` to a child of this process; a ``SIGSTOP`` returns once
    every thread of the child has stopped, or it exited (False: gone, or
    not stopped within :data:`STOP_WAIT_S`).

    Why wait: a signal to a process is delivered to one thread, which stops
    the others when it runs next; until then they run on. A worker's
    trainer thread waiting for a CPU on a busy machine leaves its control
    thread free to answer a roll call the keeper opens meanwhile, so a
    worker paused "now" would still answer it. The kernel tells the parent
    when the whole group has stopped (``waitid(WSTOPPED)``, a report this
    consumes: nothing else here waits for stops); a child stopped already
    makes no new report, but all its threads read as stopped."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    if sig != signal.SIGSTOP or pidfd is None:
        return True
    deadline, step_s = time.monotonic() + STOP_WAIT_S, 0.00005
    while True:
        try:
            if os.waitid(os.P_PIDFD, pidfd, os.WSTOPPED | os.WNOHANG) is not None:
                return True
        except ChildProcessError:
            return False  # reaped already
        if _all_threads_stopped(pid):
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        exited, _, _ = select.select([pidfd], [], [], min(left, step_s))
        if exited:
            return False
        step_s = min(2 * step_s, 0.001)


def _all_threads_stopped(pid: int) -> bool:
    """Every thread of ``pid`` is in the stopped state (``T`` in its stat)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        states = [Path(f"/proc/{pid}/task/{t}/stat").read_text().rsplit(")", 1)[1].split()[0]
                  for t in tasks]
    except (OSError, IndexError):
        return False
    return bool(states) and all(state == "T" for state in states)


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


@dataclass
class Proc:
    """One worker process the launcher started, and what it knows of it."""

    worker: int
    incarnation: int
    popen: Optional[subprocess.Popen]  # None in hosts mode: the host agent holds it
    pidfd: Optional[int]
    spare: bool
    started_t: float
    log: Any
    activated: bool = False
    ready: bool = False             # torch imported, model built: may join now
    want: bool = False              # should join as soon as it is ready
    batch: Optional[int] = None     # started together: join together
    exited_t: Optional[float] = None
    returncode: Optional[int] = None
    fault: Optional[str] = None     # what we did to it: kill | crash | pause | restart
    paused: bool = False
    host: Optional[int] = None      # hosts mode: the host whose agent runs it
    remote_pid: Optional[int] = None  # hosts mode: its pid, as its agent reported

    @property
    def pid(self) -> Optional[int]:
        return self.popen.pid if self.popen is not None else self.remote_pid

    @property
    def alive(self) -> bool:
        return self.exited_t is None
