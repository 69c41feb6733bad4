"""``python -m rollcall ARGS``, signalling itself at named phases: a test seam for exact instants.

    python tests/signal_at.py [--group] PHASE:SIGNAL[,SIGNAL] [PHASE:SIGNAL ...] -- ARGS...

A test that needs a signal *during* something (an import, the start of the
workers, the summary being written) cannot hit it by timing; this runs the
real command with a hook at that point that sends the signals to this very
process (``--group``: to its process group, as a terminal's Ctrl-C does),
one after the other, each handled before the next is sent. The command and
its processes are the real ones; only the instant is chosen. Phases:

- ``importing``: as ``rollcall.scenario`` starts importing (the command's modules load);
- ``checks``: as the run's checks begin (before its directory exists);
- ``importing-torch``: as ``import torch`` runs in the launcher (its first, inside torch);
- ``workers-started``: the launcher has started every worker process;
- ``making-namespaces``: the launcher has made the second host's network namespace;
- ``cleanup``: the launcher begins its cleanup; this phase then waits (at most
  :data:`DEAD_WITHIN_S`) for every worker it started to be dead and prints
  ``signal_at: alive after the signal: [pids]`` on stderr;
- ``writing-summary`` / ``summary-written``: just before / after ``summary.json`` is written.
"""

from __future__ import annotations

import importlib.abc
import os
import runpy
import signal
import sys
import time
from typing import Any, Callable

import psutil

#: the cleanup phase's bound on waiting for the workers' deaths
DEAD_WITHIN_S = 10.0


def _sender(spec: str, group: bool) -> Callable[[], None]:
    """Sends the signals named in ``spec``, the first time it is called only."""
    names = spec.split(",")
    sent: list[bool] = []

    def send() -> None:
        if sent:
            return
        sent.append(True)
        for name in names:
            if group:
                os.killpg(0, signal.Signals[name])
            else:
                os.kill(os.getpid(), signal.Signals[name])
    return send


class _OnImport(importlib.abc.MetaPathFinder):
    """Calls ``then`` once, as module ``name`` is looked for (its import begins)."""

    def __init__(self, name: str, then: Callable[[], None]) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname == self.name:
            sys.meta_path.remove(self)
            self.then()
        return None


def _wrap(owner: Any, attr: str, before: Callable[..., None] | None = None,
          after: Callable[..., None] | None = None) -> None:
    original = getattr(owner, attr)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if before is not None:
            before(*args)
        result = original(*args, **kwargs)
        if after is not None:
            after(*args)
        return result
    setattr(owner, attr, wrapped)


def _dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _at_cleanup(send: Callable[[], None]) -> Callable[[Any], None]:
    def before(launcher: Any) -> None:
        pids = [p.pid for p in launcher.procs if p.popen is not None and p.popen.returncode is None]
        send()
        deadline = time.monotonic() + DEAD_WITHIN_S
        while time.monotonic() < deadline and not all(_dead(p) for p in pids):
            time.sleep(0.01)  # bounded poll of the workers' deaths
        alive = [p for p in pids if not _dead(p)]
        print(f"signal_at: alive after the signal: {alive}", file=sys.stderr, flush=True)
    return before


def _install(phase: str, send: Callable[[], None]) -> None:
    if phase == "importing":
        sys.meta_path.insert(0, _OnImport("rollcall.scenario", send))
    elif phase == "importing-torch":
        sys.meta_path.insert(0, _OnImport("torch.functional", send))
    elif phase == "checks":
        import rollcall.app.checks

        _wrap(rollcall.app.checks, "size_problem", before=lambda *_: send())
    elif phase in ("writing-summary", "summary-written"):
        import real.driver

        key = "before" if phase == "writing-summary" else "after"
        _wrap(real.driver, "write_summary", **{key: lambda *_: send()})
    elif phase == "workers-started":
        from real.launcher import Launcher

        _wrap(Launcher, "start_workers", after=lambda *_: send())  # right after the first spawns
    elif phase == "cleanup":
        from real.launcher import Launcher

        _wrap(Launcher, "shutdown", before=_at_cleanup(send))
    elif phase == "making-namespaces":
        from pyroute2 import netns

        made: list[str] = []
        _wrap(netns, "create", after=lambda name, *_: made.append(name) or (
            send() if len(made) == 2 else None))
    else:
        raise SystemExit(f"signal_at: no phase {phase!r}")


def main() -> None:
    args = sys.argv[1:]
    split = args.index("--")
    hooks, command = args[:split], args[split + 1:]
    group = "--group" in hooks
    for hook in (h for h in hooks if h != "--group"):
        phase, _, signals = hook.partition(":")
        _install(phase, _sender(signals, group))
    sys.argv = ["rollcall", *command]
    runpy.run_module("rollcall", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
