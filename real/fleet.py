"""The launcher's side of the host agents (real/host.py): one per host.

In *hosts mode* (a scenario with ``cluster.workers_per_host``) the launcher
starts no worker itself: it orders each worker life started by the agent of
the worker's host (``Scenario.host_of``), and hears of its pid and its exit
from that agent. Two ways to have agents:

- *namespaces* (``rollcall run``): the launcher builds a
  :class:`real.netns.Network` with one namespace per host that can ever hold
  a worker (``Scenario.n_hosts``: the initial workers' hosts and those of the
  spares and of every scripted newcomer, all made up front, so that a join
  never waits for a namespace), and starts one agent inside each
  (``Network.spawn``). A lost host is taken down for real: its link goes down
  and every process inside its namespace is SIGKILLed at once; a repaired
  one comes back with its link up and a new agent;
- *external* (``rollcall keeper``): the agents are started by someone else
  (``rollcall host`` on each machine) and connect when they like. A lost
  host is told to die (``lose``): every worker and the agent at once, nothing
  reported; its link is not the keeper's to take down. A repaired host is
  waited for: orders for it are held until an agent of it connects again.

Orders for a host whose agent has not connected yet wait in its queue and go
out, in order, the moment it has authenticated. Nothing here decides: what
to start, kill or take down is the launcher's (and so the core keeper's).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from real.host import boot_id
from real.procs import REPO_ROOT, python_env
from real.netns import Network


@dataclass
class HostState:
    index: int
    conn: Any = None                         # the agent's authenticated connection
    agent: Optional[subprocess.Popen] = None  # the agent we started (namespaces)
    up: bool = True                          # the machine is up (not lost, or repaired)
    pending: list[tuple] = field(default_factory=list)  # orders waiting for an agent


class Fleet:
    """Host agents, their connections and their queues of orders; in namespaces
    mode also the run's :class:`Network`."""

    def __init__(self, n_hosts: int, send: Callable[[Any, tuple], None],
                 network: Optional[Network] = None) -> None:
        assert n_hosts >= 1, n_hosts
        self.hosts = [HostState(h) for h in range(n_hosts)]
        self.send = send          # the launcher's queue(conn, frame)
        self.network = network
        self.keeper: Optional[tuple[str, int]] = None
        self.secret_path: Optional[Path] = None

    def start_agents(self, keeper: tuple[str, int], secret_path: Path) -> None:
        """Namespaces mode: one agent inside each host's namespace."""
        self.keeper, self.secret_path = keeper, secret_path
        if self.network is not None:
            for h in self.hosts:
                self.spawn_agent(h)

    def spawn_agent(self, h: HostState) -> None:
        assert self.network is not None and self.keeper is not None
        env = python_env()
        argv = [sys.executable, "-m", "real.host", "--keeper", f"{self.keeper[0]}:{self.keeper[1]}",
                "--token-file", str(self.secret_path), "--host", str(h.index), "--die-with-parent"]
        h.agent = self.network.spawn(h.index, argv, stdin=subprocess.DEVNULL, env=env,
                                     cwd=str(REPO_ROOT))

    def order(self, host: int, frame: tuple) -> None:
        """Send ``frame`` to the host's agent, or hold it until one connects."""
        h = self.hosts[host]
        if h.conn is not None:
            self.send(h.conn, frame)
        else:
            h.pending.append(frame)

    def connected(self, host: int, conn: Any, setup: tuple) -> None:
        """An agent of ``host`` authenticated: it gets the setup, then what waited."""
        h = self.hosts[host]
        h.conn = conn
        self.send(conn, setup)
        for frame in h.pending:
            self.send(conn, frame)
        h.pending.clear()

    def disconnected(self, conn: Any) -> None:
        for h in self.hosts:
            if h.conn is conn:
                h.conn = None

    def take_down(self, host: int) -> None:
        """The machine is lost: link down first (nothing it does gets out), then
        every process on it dies at once; in external mode, the agent is told to."""
        h = self.hosts[host]
        h.up = False
        h.pending.clear()
        if self.network is not None:
            self.network.set_link(host, up=False)
            self.network.kill_host(host)
            h.agent = None
        elif h.conn is not None:
            self.send(h.conn, ("lose",))
        h.conn = None

    def bring_up(self, host: int) -> None:
        """The machine is repaired: link up and a fresh agent (namespaces), or
        wait for one to connect (external)."""
        h = self.hosts[host]
        if h.up:
            return
        h.up = True
        if self.network is not None:
            self.network.set_link(host, up=True)
            self.spawn_agent(h)

    def setup_frame(self, run_dir: Path, t0: float, now: float) -> tuple:
        return ("setup", str(run_dir.resolve()), t0, now, boot_id())

    def close(self) -> None:
        """Namespaces mode: every agent, worker and namespace of the run goes."""
        for h in self.hosts:
            h.conn = None
        if self.network is not None:
            self.network.close()


def host_signal(sig: int) -> int:
    assert sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCONT), sig
    return int(sig)
