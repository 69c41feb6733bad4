"""What the sim's fault carriers may touch of the running simulation.

The nemesis (:mod:`sim.nemesis`), the keeper's failover
(:mod:`sim.failover`), the links (:mod:`sim.network`) and the gray failures
(:mod:`sim.gray`) carry out their faults on the
simulation through :class:`World`, one named surface, and not through the
:class:`sim.driver.Simulation` class: they depend on this module, the
driver depends on them, and no import goes the other way. Whatever is not
listed here is the driver's own.

The job's states are named here once, for the driver and the carriers alike.
"""

from __future__ import annotations

from typing import Any, Final, Iterable, Optional, Protocol

from rollcall.core import Detector, Draws, FaultPlan, RepairShop
from rollcall.scenario import Scenario

from sim.agents import Agents
from sim.host import Host
from sim.keeper_port import KeeperPort
from sim.machines import Machines
from sim.silence import Silences
from sim.votes import Votes

# What the job is doing (``World.state``): idle between generations, copying
# state into a new one, running steps, writing a checkpoint, waiting for the
# last step's vote, done.
IDLE: Final = "idle"
SYNC: Final = "sync"
RUN: Final = "run"
CKPT: Final = "ckpt"
WAIT: Final = "wait"
DONE: Final = "done"


class HostLinks(Protocol):
    """Which hosts are cut off (:class:`sim.network.Links`)."""

    def cut(self, hosts: Iterable[int], kind: str) -> None: ...

    def heal(self, hosts: Iterable[int]) -> None: ...


class LinkFaults(Protocol):
    """The links' faults and prices (:class:`sim.network.NetFaults`)."""

    @property
    def links(self) -> HostLinks: ...

    def start(self, now: float, f: Any) -> None:
        """A ``delay`` or ``loss`` fault fires."""

    def reprice(self, now: float) -> None: ...


class GrayFailures(Protocol):
    """Slow members and late heartbeats (:class:`sim.gray.GrayFaults`)."""

    def slow(self, now: float, f: Any) -> None: ...

    def random_slow(self, now: float, w: int, factor: float, for_s: float) -> None: ...

    def late_heartbeats(self, now: float, f: Any) -> None: ...


class KeeperFaults(Protocol):
    """The keeper's death and its cut from etcd (:class:`sim.failover.KeeperFailover`)."""

    def fail(self, now: float, cause: str, back_at: Optional[float] = None) -> None: ...

    def cut(self, now: float, for_s: float) -> None: ...


class World(Host, Protocol):
    """The simulation as its fault carriers see it."""

    # -- what they read (and Host: the clock, nodes, keeper, history) --------
    @property
    def sc(self) -> Scenario: ...

    @property
    def seed(self) -> int: ...

    @property
    def detector(self) -> Detector: ...

    @property
    def draws(self) -> Draws: ...

    @property
    def votes(self) -> Votes:
        """The computed steps' commit votes, cast as they reach the keeper."""

    @property
    def machines(self) -> Machines:
        """The nodes' hardware: up, down, repaired, the faults' targets."""

    @property
    def silences(self) -> Silences:
        """Who is silent: lost, cut off, paused, or late with its beats."""

    @property
    def agents(self) -> Agents:
        """Every process's core agent, and the messages to and from them."""

    @property
    def plan(self) -> FaultPlan:
        """Which fault is due when (the core's)."""

    @property
    def shop(self) -> RepairShop: ...

    @property
    def net(self) -> LinkFaults: ...

    @property
    def gray(self) -> GrayFailures: ...

    @property
    def failover(self) -> KeeperFaults: ...

    # -- the keeper ------------------------------------------------------------
    @property
    def port(self) -> KeeperPort:
        """The keeper's inputs (calls, messages, liveness, its timer) and outputs."""


__all__ = ["CKPT", "DONE", "GrayFailures", "HostLinks", "IDLE", "KeeperFaults", "LinkFaults",
           "RUN", "SYNC", "WAIT", "World"]
