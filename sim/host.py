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

from rollcall.core import Cursor, IdRuns, Keeper

from sim.state import Nodes

__all__ = ["Host", "JobState", "KeeperOutage"]


class KeeperOutage(Protocol):
    """Whether a keeper serves now, and when one serves again
    (:class:`sim.failover.KeeperFailover`)."""

    @property
    def down(self) -> bool: ...

    @property
    def back_at(self) -> Optional[float]: ...


class JobState(Protocol):
    """The job as the parts of a run read it, and the changes of pace they
    report (:class:`sim.job.Job`)."""

    @property
    def gen(self) -> int:
        """The current generation."""

    @property
    def members(self) -> IdRuns: ...

    @property
    def cursor(self) -> Cursor:
        """What the members computed."""

    @property
    def batch(self) -> int:
        """The global batch of the current generation."""

    def passed(self, t: float, cursor: Cursor, complete: bool) -> None:
        """Steps up to ``cursor`` passed the vote at ``t`` (the trainers hold
        that state); ``complete``: the keeper says the job is done."""

    def stall(self, now: float) -> None:
        """Nobody can commit from now on: the members wait."""

    def unstall(self, now: float) -> None:
        """Every member is heard again: the job goes on."""

    def step_end(self, now: float) -> float:
        """When the step in flight at ``now`` is done (``now``: none runs)."""

    def restart_segment(self, now: float) -> None:
        """A price changed: the running segment goes on at the new price."""


class Host(Protocol):
    """The simulation's clock, nodes, keeper, job and history."""

    keeper: Keeper  # replaced at a takeover (sim.failover)

    @property
    def env(self) -> simpy.Environment: ...

    @property
    def nodes(self) -> Nodes: ...

    @property
    def job(self) -> JobState: ...

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
