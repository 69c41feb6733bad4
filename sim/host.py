"""What every part of a sim run reads of the simulation it belongs to.

The parts of a run (:mod:`sim.agents`, :mod:`sim.machines`,
:mod:`sim.silence`, :mod:`sim.keeper_port`, and the fault carriers through
:class:`sim.world.World`) each name what more they need in a protocol of
their own on top of :class:`Host`; ``tests/test_driver_surfaces.py`` checks
that they touch nothing else and that the simulation offers it all.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Protocol

import simpy

from rollcall.core import Keeper

from sim.state import Nodes

__all__ = ["Host", "KeeperOutage"]


class KeeperOutage(Protocol):
    """Whether a keeper serves now, and when one serves again
    (:class:`sim.failover.KeeperFailover`)."""

    @property
    def down(self) -> bool: ...

    @property
    def back_at(self) -> Optional[float]: ...


class Host(Protocol):
    """The simulation's clock, nodes, keeper and history."""

    keeper: Keeper  # replaced at a takeover (sim.failover)

    @property
    def env(self) -> simpy.Environment: ...

    @property
    def nodes(self) -> Nodes: ...

    @property
    def lat(self) -> float:
        """One message between the keeper and a worker on a sound link, seconds."""

    @property
    def finished(self) -> bool:
        """Whether the run is over (nothing more is carried out)."""

    @property
    def voting(self) -> bool:
        """Whether commit votes are on their way to the keeper."""

    def at(self, t: float, fn: Callable[..., Any], *args: Any) -> None:
        """Call ``fn(*args)`` at simulated time ``t``."""

    def write(self, record: dict) -> None:
        """Append a history record."""

    def count(self, name: str) -> None:
        """One more of ``name`` for the summary."""

    def alive(self, w: int) -> bool:
        """Whether node ``w`` runs a live process."""

    def cast_votes(self, t: float, everything: bool = False) -> None:
        """Cast the commit votes that reached the keeper by ``t``."""
