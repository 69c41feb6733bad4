"""Stepping a sim run's events to its end, or ending it early.

``env.run(until=done)`` would step the same events in the same order; this
loop also ends the run early, at an event boundary, when a wall-clock
deadline passes or the caller asks (an interrupt, polled so that a signal
never lands in the middle of an event's effects), and raises
:class:`SimulationStuck` when events keep being stepped at one simulated
instant (a livelock in the simulator). A run that is not cut short writes
the very history ``env.run`` would.
"""

from __future__ import annotations

import gc
import time
from contextlib import contextmanager
from typing import Callable, Iterator, Optional

import simpy

from rollcall.interrupts import StopRequest

__all__ = ["POLL_EVENTS", "SPIN_EVENTS", "SPIN_EVENTS_PER_NODE", "SimulationStuck", "Stepper",
           "few_collections"]

# Events stepped at one simulated instant past which a run is stuck (a
# livelock, a bug): no run needs more than a few per node there (the fuzzer
# sees thousands at most), so the bound is this plus SPIN_EVENTS_PER_NODE each.
SPIN_EVENTS = 1_000_000
SPIN_EVENTS_PER_NODE = 16
# the stop hook and the wall clock are polled once every this many events
POLL_EVENTS = 1024


class SimulationStuck(Exception):
    """The simulated clock stopped moving while events kept being stepped:
    a livelock in the simulator, not a property of the scenario."""


@contextmanager
def few_collections(young: int = 100_000) -> Iterator[None]:
    """Run with Python's cyclic collector triggered every ``young``
    allocations instead of every 700.

    A run allocates millions of short-lived, acyclic objects (records, id-set
    results) while the history it keeps grows: at the default threshold the
    young collections and the full ones they trigger rescan that history
    over and over (a tenth of a 10^5-node run). Cycles (simpy's events and
    their callbacks) are still reclaimed, just in larger batches. The old
    thresholds come back when the run ends.
    """
    old = gc.get_threshold()
    gc.set_threshold(young, *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)


class Stepper:
    """The event loop of one run."""

    def __init__(self, env: simpy.Environment, done: simpy.Event, nodes: int,
                 describe: Callable[[], str], end: Callable[[float, str], None]) -> None:
        """``nodes``: the run's node count (the spin bound grows with it);
        ``describe``: the job's state, for a stuck run's message; ``end``:
        finish the run, not completed, for a reason (at an instant)."""
        self._env, self._done = env, done
        self._spin_limit = SPIN_EVENTS + SPIN_EVENTS_PER_NODE * nodes
        self._describe, self._end = describe, end
        self._stop: Optional[StopRequest] = None
        self._max_wall_s: Optional[float] = None
        self._wall_deadline: Optional[float] = None
        self.halt: Optional[str] = None  # why the run is ending early (wall limit, signal)
        self.interrupted = False  # the stop hook ended it
        # the latest instant the job met ahead of the env's clock: the end waits for it
        self.ahead_t = 0.0

    def check(self) -> None:
        """Note in :attr:`halt` why the run must end early, if it must."""
        reason = self._stop.reason() if self._stop is not None else None
        if reason is not None:
            self.halt, self.interrupted = reason, True
        elif self._wall_deadline is not None and time.perf_counter() >= self._wall_deadline:
            self.halt = f"wall limit: --max-wall-s {self._max_wall_s:g} reached"

    def run(self, wall0: float, max_wall_s: Optional[float],
            stop: Optional[StopRequest]) -> None:
        """Step the events until the run ends, or end it early: once
        ``max_wall_s`` seconds have passed since ``wall0``, or once
        ``stop.reason()`` returns one."""
        env = self._env
        self._stop, self._max_wall_s = stop, max_wall_s
        if max_wall_s is not None:
            self._wall_deadline = wall0 + max_wall_s
        try:
            self._until_halt()
        except RuntimeError:
            # simpy's "no scheduled events left" (the job can never end); any
            # other error raised inside a callback is a bug and crashes loudly
            if self._done.triggered or env.peek() != float("inf"):
                raise
            self._end(env.now, "stuck: no events left")

    def _until_halt(self) -> None:
        env, done = self._env, self._done
        stepped = same_instant = 0
        instant = env.now
        while not done.processed:
            try:
                env.step()
            except simpy.core.EmptySchedule:
                raise RuntimeError("no scheduled events left") from None
            stepped += 1
            if stepped % POLL_EVENTS == 0:
                if env.now != instant:
                    instant, same_instant = env.now, 0
                else:
                    same_instant += POLL_EVENTS
                    if same_instant >= self._spin_limit:
                        raise SimulationStuck(
                            f"{same_instant} events stepped at simulated t={instant!r} s "
                            f"without the clock moving ({self._describe()})")
                if self.halt is None:
                    self.check()
            # the end is written once the env's clock has caught up with the
            # job's run-ahead, so the history stays in time order
            if self.halt is not None and not done.triggered and env.now >= self.ahead_t:
                self._end(env.now, self.halt)
                return
