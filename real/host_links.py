"""The launcher's side of the host agents' links (hosts mode, :mod:`real.fleet`).

A host agent connects to the keeper service, proves the run's key and
names its host (``host_hello``); it then gets the run's setup and the
orders that waited for it, and reports what happens to the lives it runs
(``started``, ``exited``). A lost host (``lose_host``) is taken down here:
its link, and every process on it at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Protocol

from real import wire
from real.fleet import Fleet
from real.processes import Processes
from real.procs import Proc
from real.service import Conn, Service

__all__ = ["HostLinks", "HostLinksHost"]


class DeadForgetter(Protocol):
    """The nemesis (:class:`real.nemesis.Nemesis`), whose timed faults forget lost processes."""

    def forget_dead(self) -> None: ...


class Exits(Protocol):
    """The workers' lives (:class:`real.lives.Lives`)."""

    def on_exit(self, p: Proc) -> None:
        """A life ended (its exit reported)."""


class HostLinksHost(Protocol):
    """What the host links need of the launcher."""

    secret: bytes
    run_id: str
    out: Path
    t0: float

    @property
    def service(self) -> Service: ...

    @property
    def fleet(self) -> Optional[Fleet]: ...

    @property
    def processes(self) -> Processes: ...

    @property
    def nemesis(self) -> DeadForgetter: ...

    def now(self) -> float: ...

    @property
    def lives(self) -> Exits: ...


class HostLinks:
    """The host agents' hellos and facts, and a lost host taken down."""

    def __init__(self, host: HostLinksHost) -> None:
        self._host = host

    def host_hello(self, conn: Conn, frame: tuple) -> None:
        """A host agent proves the run's key and names its host: it gets the
        run's setup and the orders that waited for it."""
        host, number = self._host, frame[1]
        service, fleet = host.service, host.fleet
        if not wire.host_hello_ok(host.secret, conn.nonce, host.run_id, frame):
            service.reject(conn, "host hello without the run's key")
        elif fleet is None or number >= len(fleet.hosts):
            service.reject(conn, f"host {number} is not a host of this run")
        elif not fleet.hosts[number].up:
            service.reject(conn, f"host {number} is down (lost, not yet repaired)")
        else:
            conn.authed, conn.host = True, number
            conn.reader.authenticated()
            old = fleet.hosts[number].conn
            if old is not None and old is not conn:
                service.drop(old)  # a host has one agent: the newest
            fleet.connected(number, conn, fleet.setup_frame(host.out, host.t0, host.now()))

    def disconnected(self, conn: Conn) -> None:
        """A host agent's link is gone (the service dropped it)."""
        fleet = self._host.fleet
        if fleet is not None:
            fleet.disconnected(conn)

    def host_frame(self, conn: Conn, frame: tuple) -> None:
        """A fact from a host agent: a life it started runs (its pid), or ended
        (as the local pidfd path, :meth:`real.lives.Lives.on_exit`, would
        have seen it)."""
        host = self._host
        if conn.host is None or frame[0] not in ("started", "exited"):
            host.service.reject(conn, f"{frame[0]} from a "
                                      f"{'worker' if conn.host is None else 'host'}'s connection")
            return
        kind, w, inc, value = frame
        p = host.processes.of_life(w, inc)
        if p is None or p.host != conn.host:
            host.service.reject(conn, f"{kind} of worker {w}.{inc}, not a life host {conn.host} runs")
        elif kind == "started":
            p.remote_pid = value
        elif p.exited_t is None:
            p.returncode = value
            host.processes.ended(p)
            host.lives.on_exit(p)

    def take_down(self, number: int) -> None:
        """``lose_host``: the machine goes (link down, every process on it
        killed at once, see :meth:`real.fleet.Fleet.take_down`); its lives are
        over without an exit report, so only the detector can tell."""
        host = self._host
        assert host.fleet is not None
        host.fleet.take_down(number)
        host.processes.host_lost(number)
        host.nemesis.forget_dead()
