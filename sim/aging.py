"""Failures that age only while a member computes (``failures.age: computing``).

AIReSim's assumption (``docs/airesim-model.md`` section 1.2): only the job's
active servers fail, and only while the job computes; spares, idle nodes
and a job that detects, restarts or copies state do not age. rollcall's own
model (``age: always``) ages every node that is up, all the time; this one
exists to reproduce AIReSim's numbers beside it.

A node's life is the same draw either way (:meth:`Draws.next_lifetime`),
spent in compute seconds instead of wall seconds. The clock ``C`` counts the
seconds the job has computed; a member clocked in at ``C0`` with ``r``
seconds of life left fails when ``C`` reaches ``C0 + r``, a node leaving the
members keeps what it has left. The failure process sleeps until the first
due node's wall time at the current rate, and checks again when it wakes (a
stop of the clock meanwhile only makes it wake early); starting the clock
wakes it, as new members may be due sooner.
"""

from __future__ import annotations

import heapq
import math
from typing import Any, Callable, Generator, Optional

import numpy as np
import simpy

_DUE_EPS_S = 1e-6  # compute seconds within which a due failure fires


class ComputeAging:
    """The compute clock and the per-node lives it spends, for ``n`` nodes."""

    def __init__(self, env: simpy.Environment, nodes: Any,
                 crash: Callable[[float, int], None]) -> None:
        self.env = env
        self.nodes = nodes  # the driver's node arrays (``sim.state.Nodes``), read only
        self.crash = crash
        n = len(nodes.hw)
        self.acc_s = 0.0  # compute seconds up to t0 (or in all, while stopped)
        self.t0: Optional[float] = None  # wall time the clock last started; None: stopped
        self.left = np.zeros(n)  # an unclocked node's life left, compute seconds
        self.due = np.full(n, math.inf)  # a clocked node's failure, in compute seconds
        self.clocked = np.zeros(n, dtype=bool)
        self.heap: list[tuple[float, int, int]] = []  # (due, node, its life)
        self.proc: Optional[simpy.Process] = None
        self._waiting = False

    def now_s(self, t: float) -> float:
        """Compute seconds at wall time ``t``."""
        return self.acc_s + (t - self.t0 if self.t0 is not None else 0.0)

    def arrive(self, w: int, lifetime: float) -> None:
        """Node ``w`` starts a hardware life of ``lifetime`` compute seconds."""
        self.left[w] = lifetime
        self.clocked[w] = False
        self.due[w] = math.inf

    def clock(self, t: float, running: bool) -> None:
        """The job computes from ``t`` on (``running``), or stops at ``t``."""
        if running == (self.t0 is not None):
            return
        if not running:
            self.acc_s += t - self.t0  # type: ignore[operator]
            self.t0 = None
            return
        self.t0 = t
        self._clock_members(self.acc_s)
        if self._waiting and self.proc is not None and self.env.active_process is not self.proc:
            self._waiting = False
            self.proc.interrupt()

    def _clock_members(self, c: float) -> None:
        """The members up now are the nodes that age: clock in the new, out the gone."""
        ageing = self.nodes.member_flags & self.nodes.hw
        gone = np.flatnonzero(self.clocked & ~ageing)
        if len(gone):
            self.left[gone] = np.maximum(0.0, self.due[gone] - c)
            self.due[gone] = math.inf
            self.clocked[gone] = False
        new = np.flatnonzero(ageing & ~self.clocked)
        if len(new):
            self.due[new] = c + self.left[new]
            self.clocked[new] = True
            for w in new.tolist():
                heapq.heappush(self.heap, (float(self.due[w]), w, int(self.nodes.life[w])))

    def _valid(self, entry: tuple[float, int, int]) -> bool:
        due, w, life = entry
        nodes = self.nodes
        return bool(self.clocked[w] and nodes.hw[w] and self.due[w] == due and nodes.life[w] == life)

    def process(self) -> Generator[simpy.Event, None, None]:
        """Crash each clocked node when the compute clock reaches its due time."""
        heap, env = self.heap, self.env
        while True:
            while heap and not self._valid(heap[0]):
                heapq.heappop(heap)
            self._waiting = True
            try:
                if not heap or self.t0 is None:
                    yield env.event()  # until the clock starts
                    continue
                wait = heap[0][0] - self.now_s(env.now)
                if wait > _DUE_EPS_S:
                    yield env.timeout(wait)
                    continue  # the clock may have stopped meanwhile: check again
            except simpy.Interrupt:
                continue
            finally:
                self._waiting = False
            _, w, _ = heapq.heappop(heap)
            self.clocked[w] = False
            self.crash(env.now, w)
