"""The launcher's process table: every worker process of the run, started
here (a pidfd each, in the launcher's selector) or by its host's agent
(hosts mode: the agent reports ``started`` and ``exited``), and what is
known of each (:class:`real.procs.Proc`).

It decides nothing: who starts, as which life, and what is signalled when
are the keeper's and the fault plan's; this table carries them out and
answers questions about the processes (which runs for a worker, which are
ready to join, which exited) for the launcher and its fault injector.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterator, Optional

from rollcall import interrupts
from rollcall.core import JoinBatches

from real.fleet import Fleet, host_signal
from real.procs import (REPO_ROOT, Proc, die_with_parent, python_env, release, signal_child,
                        worker_log)


class Processes:
    """``run_dir``, ``t0``, ``secret_path``: what a worker's command line
    names; ``joins``: the launcher's join batches, told when a life ends so
    that its batch stops waiting for it."""

    def __init__(self, run_dir: Path, t0: float, secret_path: Path,
                 sel: selectors.BaseSelector, now: Callable[[], float],
                 joins: JoinBatches) -> None:
        self.run_dir = run_dir
        self.t0 = t0
        self.secret_path = secret_path
        self.sel = sel
        self.now = now
        self.joins = joins
        self.table: list[Proc] = []
        self.fleet: Optional[Fleet] = None  # hosts mode: the host agents start the lives
        self.port = 0  # the keeper service's, once it listens

    def __iter__(self) -> Iterator[Proc]:
        return iter(self.table)

    # --- starting and signalling -----------------------------------------------------

    def start(self, worker: int, incarnation: int, host: Optional[int], spare: bool = False,
              batch: Optional[int] = None) -> Proc:
        """Start worker ``worker``'s life ``incarnation``: here, or through the
        agent of ``host`` (hosts mode). ``spare``: it waits idle until wanted."""
        if self.fleet is not None:
            assert host is not None, worker
            p = Proc(worker, incarnation, None, None, spare, self.now(), None,
                     want=not spare, batch=batch, host=host)
            self.table.append(p)
            self.fleet.order(host, ("start", worker, incarnation, spare))
            return p
        log = open(worker_log(self.run_dir, worker, incarnation), "ab")
        cmd = [sys.executable, "-m", "real.worker", "--port", str(self.port),
               "--worker", str(worker), "--incarnation", str(incarnation),
               "--t0", repr(self.t0), "--run-dir", str(self.run_dir),
               "--secret-file", str(self.secret_path)]
        if spare:
            cmd.append("--spare")
        env = python_env()
        env.setdefault("OMP_NUM_THREADS", "1")
        with interrupts.shielded():  # started and recorded, or neither
            popen = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                     stderr=subprocess.STDOUT, env=env, cwd=str(REPO_ROOT),
                                     start_new_session=True, preexec_fn=die_with_parent)
            pidfd = os.pidfd_open(popen.pid)
            p = Proc(worker, incarnation, popen, pidfd, spare, self.now(), log,
                     want=not spare, batch=batch)
            self.table.append(p)
        self.sel.register(pidfd, selectors.EVENT_READ, ("proc", p))
        return p

    def signal(self, p: Proc, sig: int) -> None:
        """Send ``sig`` to the process of ``p``: directly, or through its host agent."""
        if self.fleet is None:
            assert p.pid is not None, p
            signal_child(p.pid, p.pidfd, sig)
        else:
            assert p.host is not None
            self.fleet.order(p.host, ("signal", p.worker, p.incarnation, host_signal(sig)))

    # --- lookups ----------------------------------------------------------------------

    def of_life(self, worker: int, incarnation: int) -> Optional[Proc]:
        """The process of that life, if one was started."""
        for p in reversed(self.table):
            if p.worker == worker and p.incarnation == incarnation:
                return p
        return None

    def live(self, worker: int) -> Optional[Proc]:
        """Worker ``worker``'s process that has not ended, if any."""
        for p in reversed(self.table):
            if p.worker == worker and p.alive:
                return p
        return None

    def latest(self) -> dict[int, Proc]:
        """Each worker id's latest life."""
        latest: dict[int, Proc] = {}
        for p in self.table:
            if p.worker not in latest or p.incarnation >= latest[p.worker].incarnation:
                latest[p.worker] = p
        return latest

    def idle_spare(self) -> Optional[Proc]:
        """The prewarmed process a scripted join takes first: the lowest id."""
        idle = [p for p in self.table if p.alive and p.spare and not p.want]
        return min(idle, key=lambda p: p.worker) if idle else None

    def ready_to_activate(self) -> list[Proc]:
        """Wanted processes ready to join; one started in a batch waits until
        every live process of its batch is ready, or the batch's time is up,
        so the batch joins together."""
        now, ready = self.now(), []
        for p in self.table:
            if not (p.alive and p.want and p.ready and not p.activated):
                continue
            until = None if p.batch is None else self.joins.until(p.batch)
            if until is not None and now < until:
                group = [q for q in self.table if q.batch == p.batch and q.alive]
                if not all(q.ready for q in group):
                    continue
            ready.append(p)
        return ready

    # --- ends -------------------------------------------------------------------------

    def ended(self, p: Proc) -> None:
        """``p``'s process is over (reaped, reported by its host agent, or gone
        with its machine): its join batch no longer waits for it."""
        p.exited_t = self.now()
        self.joins.exited((p.worker, p.incarnation))

    def reap(self, p: Proc) -> None:
        """Wait for a process started here that exited (or was killed)."""
        if p.exited_t is not None or p.popen is None:
            return  # over already, or hosts mode: its agent reaps it and reports the exit
        try:
            p.returncode = p.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.popen.kill()
            p.returncode = p.popen.wait()
        self.ended(p)
        assert p.pidfd is not None
        release(self.sel, p.pidfd, p.log)

    def host_lost(self, host: int) -> None:
        """``host``'s machine went, every process on it with it, and no exit
        reports from its agent: a crash, as far as the keeper can tell."""
        for p in self.table:
            if p.host == host and p.alive:
                p.fault = p.fault or "crash"
                p.paused = False
                self.ended(p)

    def kill_now(self) -> None:
        """SIGKILL every process started here at once, by PID, and wait for
        none (a second signal's handler runs it; :meth:`kill_all` reaps)."""
        for p in self.table:
            if p.popen is not None and p.popen.returncode is None:
                try:
                    os.kill(p.popen.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def kill_all(self) -> None:
        """SIGKILL and reap every process of the run (idempotent); in hosts
        mode their agents and namespaces go with the fleet."""
        if self.fleet is not None:
            self.fleet.close()
            for p in self.table:
                if p.exited_t is None:
                    self.ended(p)
        for p in self.table:
            if p.popen is not None and p.exited_t is None:
                try:
                    p.popen.kill()
                except OSError:
                    pass
        for p in self.table:
            if p.exited_t is None and p.popen is not None:
                try:
                    p.popen.wait(timeout=10)
                except Exception:  # noqa: BLE001
                    pass
                self.ended(p)
                p.returncode = p.popen.returncode
                assert p.pidfd is not None
                release(self.sel, p.pidfd, p.log)
