"""A slow worker on real: its process duty-cycled with SIGSTOP and SIGCONT.

A ``slow: W, factor: F`` fault makes W compute F times slower. Whoever
started W's process (the launcher, or in hosts mode W's host agent) stops it
for ``(1 - 1/F)`` of every :data:`PERIOD_S` and lets it run the rest, so it
gets ``1/F`` of the wall time it had, and CPU-bound work (a training step's
compute) takes F times as long. Why this and not a cgroup CPU limit: a
quota caps CPU time, not speed, so on a machine whose workers share cores a
quota above what the worker already got slows nothing; and the processes
are the launcher's or the agent's own children, signalled by PID.

:data:`PERIOD_S` is 20 ms: short against a step, so the step time follows F
smoothly, and long against the scheduler's latency for a signal. The
worker's heartbeat thread stops with it, by at most ``(1 - 1/F) *
PERIOD_S`` (15 ms at F = 4) against a heartbeat period of 100 ms or more:
its heartbeats stay on time, as the fault says.

Pure bookkeeping over the owner's clock: the owner's loop asks
:meth:`DutyCycle.next_due` and calls :meth:`DutyCycle.fire`, which sends the
signals through the callback it was given. A paused worker (a ``pause``
fault's SIGSTOP) is left stopped: :meth:`DutyCycle.hold` until its SIGCONT.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Callable, Hashable, Optional

PERIOD_S = 0.02


@dataclass
class _Cycle:
    factor: float
    start: float  # this period's start
    stopped: bool = False
    held: bool = False  # paused by a pause fault: no signal from here

    def run_s(self) -> float:
        return PERIOD_S / self.factor


class DutyCycle:
    """The slowed processes of one owner, by key (its worker and life)."""

    def __init__(self, send: Callable[[Hashable, int], None]) -> None:
        self.send = send  # send(key, signal number)
        self.cycles: dict[Hashable, _Cycle] = {}

    def start(self, now: float, key: Hashable, factor: float) -> None:
        """Slow ``key`` ``factor`` times (a second slowdown compounds)."""
        assert factor > 1, factor
        c = self.cycles.get(key)
        if c is None:
            self.cycles[key] = _Cycle(factor, now)
        else:
            c.factor *= factor

    def end(self, key: Hashable, factor: float) -> None:
        """One slowdown of ``key`` ends; the process runs free once none is left."""
        c = self.cycles.get(key)
        if c is None:
            return
        c.factor /= factor
        if c.factor <= 1 + 1e-12:
            del self.cycles[key]
            if c.stopped and not c.held:
                self.send(key, signal.SIGCONT)

    def forget(self, key: Hashable) -> None:
        """The process is gone."""
        self.cycles.pop(key, None)

    def hold(self, key: Hashable) -> None:
        """A pause stopped it: the cycle sends nothing until :meth:`release`."""
        c = self.cycles.get(key)
        if c is not None:
            c.held = True

    def release(self, now: float, key: Hashable) -> None:
        """The pause's SIGCONT went: the cycle goes on from a running phase."""
        c = self.cycles.get(key)
        if c is not None:
            c.held, c.stopped, c.start = False, False, now

    def next_due(self) -> Optional[float]:
        dues = [c.start + (PERIOD_S if c.stopped else c.run_s())
                for c in self.cycles.values() if not c.held]
        return min(dues) if dues else None

    def fire(self, now: float) -> None:
        """Stop what has run its share of this period; wake what has waited its own."""
        for key, c in list(self.cycles.items()):
            if c.held:
                continue
            if not c.stopped and now >= c.start + c.run_s():
                c.stopped = True
                self.send(key, signal.SIGSTOP)
            if c.stopped and now >= c.start + PERIOD_S:
                c.stopped = False
                # a late wake (a busy owner) starts the next period now: no
                # burst of short periods to catch up
                c.start = max(c.start + PERIOD_S, now)
                self.send(key, signal.SIGCONT)
