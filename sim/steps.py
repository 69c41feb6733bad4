"""Runs of steps the simulated job has computed, on their way to the commit vote.

The sim steps a whole job at once: a *run* is the steps of one segment
(from a start to a checkpoint, an interruption, a scripted fault or the
end). Each step's commit vote reaches the keeper one network latency after
the step ends, and only the keeper's answer (:meth:`Keeper.commit`) makes
it count. The keeper's state changes only inside a keeper call, so the
driver casts, before each call at ``T``, the votes of every step whose vote
arrived by ``T`` (:meth:`StepRun.arrived`): the keeper answers each exactly
as it would have at the vote's own arrival. A run is voted in pieces, one
piece per keeper call it spans, and written as one ``commit`` record (the
steps that passed) once its last vote is cast.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Optional, Sequence

from rollcall.core import Cursor, describe_assignment, rank_range, step_batch
from rollcall.scenario import Scenario

EPS = 1e-9  # the tolerance for "the step ended by t" (float sums of step_s), the driver's too


@dataclass(slots=True)
class StepRun:
    """Steps ``first..`` of generation ``gen``, computed from ``t0`` at ``step_s`` each."""

    gen: int
    first: int
    sample: int
    batch: int
    t0: float
    step_s: float
    cap: int                 # steps the segment may reach (its stop)
    members: Sequence[int]   # the generation's members, in rank order
    n: Optional[int] = None  # steps computed, once the segment closed (None: running)
    voted: int = 0           # votes cast so far (steps first..first+voted-1)
    passed: int = 0          # of which the keeper committed (a prefix: a refusal is final)
    refused: bool = False
    voter: Optional[int] = None  # the member whose vote committed the first step
    # stragglers: evict: the members' compute per micro-batch in these steps
    # (typical, the slow ones'), what goes with their votes
    compute: Optional[tuple[float, dict[int, float]]] = None
    # when the first step began, where that is not t0 (a stall held it up,
    # or a new price rescaled the part done; None: at t0): its commit
    # record's t0
    started: Optional[float] = None

    def arrived(self, t: float, latency_s: float) -> Optional[int]:
        """How many of the run's steps had their vote reach the keeper by
        ``t``; None while the next vote to cast (``voted + 1``) is still on
        its way (the common case: one comparison, no division)."""
        if t < self.t0 + (self.voted + 1) * self.step_s + latency_s - EPS:  # vote_at(voted + 1)
            return None
        limit = self.cap if self.n is None else self.n
        k = int((t - latency_s - self.t0) / self.step_s + EPS) if self.step_s > 0 else limit
        # the division rounds: far into a run (t ~ 10^5 s) it can fall short of a
        # vote whose arrival the comparison above counted (the same instant)
        if k < limit and self.vote_at(k + 1, latency_s) <= t + EPS:
            k += 1
        return max(0, min(limit, k))

    def vote_at(self, k: int, latency_s: float) -> float:
        """When the vote of the run's ``k``-th step (1-based) reaches the keeper."""
        assert 1 <= k, k
        return self.t0 + k * self.step_s + latency_s

    @property
    def closed(self) -> bool:
        return self.n is not None

    @property
    def done(self) -> bool:
        """Closed, and every vote cast."""
        return self.n is not None and self.voted == self.n

    def cursor_after(self, k: int) -> Cursor:
        return Cursor(self.first + k, self.sample + k * self.batch)


class StepPlans:
    """Each member count's step, worked out once: the global batch
    (``strategy.batch``), the step's seconds (the busiest rank's
    micro-batches and the exchange, or a measured ``step_s_by_workers``) and
    the shards' assignment as the ``assign`` record writes it."""

    def __init__(self, sc: Scenario) -> None:
        self._sc = sc
        self._plans: dict[int, tuple[int, float, dict[str, Any]]] = {}

    def of(self, members: Sequence[int]) -> tuple[int, float, dict[str, Any]]:
        """``(batch, step_s, assignment)`` of a generation of ``members``."""
        n = len(members)
        plan = self._plans.get(n)
        if plan is None:
            sc, w = self._sc, self._sc.workload
            batch = step_batch(sc.strategy.batch, w.global_batch, w.micro_batch, n,
                               sc.cluster.workers)
            shards = batch // w.micro_batch
            lo, hi = rank_range(shards, n, 0)  # rank 0 carries the most micro-batches
            step_s = w.step_s_by_workers.get(n)
            if step_s is None:
                step_s = (hi - lo) * w.micro_batch_s + sc.exchange_s(n)
            assignment = describe_assignment(SimpleNamespace(members=members, n_shards=shards))
            plan = self._plans[n] = (batch, step_s, assignment)
        return plan

    def step_s(self, n: int) -> float:
        """The healthy step's seconds with ``n`` members (a generation of them was formed)."""
        return self._plans[n][1]
