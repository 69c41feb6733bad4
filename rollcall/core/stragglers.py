"""The straggler policy: when a slow member costs the job more than it gives.

In synchronous data parallelism every step waits for the slowest member, so
a worker computing at a fraction of its speed (thermal throttling, a noisy
neighbour, a degraded NIC) slows the whole job while its heartbeats stay
perfect: no failure detector will ever see it. ``strategy.stragglers:
evict`` lets the keeper take it out, from what the members already report
with each step (their compute time and micro-batches), on two conditions:

* it *lags*: its compute per micro-batch has exceeded ``factor`` times the
  generation's median for ``steps`` consecutive steps (one slow step is
  noise, a garbage collection, a page fault);
* the job is *faster without it*: the compute of a step over ``n - 1``
  members (each taking more micro-batches: the global batch is kept) saves,
  over the steps left, more than the eviction costs (the step abandoned by
  the roll call, and the one abandoned when it is readmitted, plus that
  round's last call), and ``n - 1 >= min_workers``. Several stragglers due
  at once are weighed together (the slowest ``j`` of them, for the ``j``
  that saves most: taking out one of three 3x workers saves nothing, the
  step still waits for the other two) and leave in one roll call.

An evicted straggler is not dead: it waits as a standby for a *holdout*
(``holdout_s``, doubling each time the same worker is evicted again), then
is readmitted by a growth round; a slowdown that has passed costs one
holdout, one that lasts does not flap.

Pure: :class:`StragglerWatch` is handed reports and returns the lagging
members; :func:`eviction_gain` is the arithmetic. The keeper holds one watch
per generation and decides (``rollcall.core.keeper``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from rollcall.core.reshard import BatchPolicy, rank_range, step_batch
from rollcall.core.types import WorkerId

__all__ = ["StragglerPolicy", "StragglerWatch", "Lagging", "eviction_gain", "median_with"]


@dataclass(frozen=True)
class StragglerPolicy:
    """``strategy.stragglers: evict`` and what its arithmetic needs of the job."""

    factor: float
    steps: int
    holdout_s: float
    global_batch: int
    micro_batch: int
    full_workers: int
    batch: str = BatchPolicy.CONSTANT.value

    def __post_init__(self) -> None:
        if not self.factor > 1.0:
            raise ValueError("straggler factor must be > 1")
        if self.steps < 1 or self.holdout_s <= 0:
            raise ValueError("need straggler steps >= 1 and holdout_s > 0")
        step_batch(self.batch, self.global_batch, self.micro_batch, 1, self.full_workers)

    def shards(self, n: int) -> int:
        """Micro-batches in a step over ``n`` members."""
        return step_batch(self.batch, self.global_batch, self.micro_batch, n,
                          self.full_workers) // self.micro_batch

    def holdout_for(self, times_evicted: int) -> float:
        """The holdout of a worker's ``times_evicted``-th eviction (1-based): doubling."""
        assert times_evicted >= 1, times_evicted
        return self.holdout_s * 2.0 ** min(times_evicted - 1, 30)


@dataclass(frozen=True, slots=True)
class Lagging:
    """A member that has lagged for the policy's ``steps``: its compute per
    micro-batch (``per_batch_s``) against the median's (``typical_s``)."""

    worker: WorkerId
    per_batch_s: float
    typical_s: float

    @property
    def lag(self) -> float:
        return self.per_batch_s / self.typical_s if self.typical_s > 0 else math.inf


def median_with(values: Sequence[float], typical_s: float, typical_count: int) -> float:
    """The median of ``values`` and ``typical_count`` more members at
    ``typical_s`` (the lower median of an even count: a straggler never
    raises the bar it is judged by). Costs ``values``, not the job."""
    assert typical_count >= 0, typical_count
    n = len(values) + typical_count
    assert n >= 1, "a median of nothing"
    k = (n - 1) // 2  # index of the lower median in sorted order
    below = sorted(v for v in values if v < typical_s)
    if k < len(below):
        return below[k]
    if k < len(below) + typical_count:
        return typical_s
    above = sorted(v for v in values if v >= typical_s)
    return above[k - len(below) - typical_count]


@dataclass
class StragglerWatch:
    """One generation's count of each member's consecutive lagging steps."""

    policy: StragglerPolicy
    generation: int
    members: int  # how many: a step is judged once each has reported
    counts: dict[WorkerId, int] = field(default_factory=dict)
    # real target: step -> member -> (compute per micro-batch, micro-batches)
    pending: dict[int, dict[WorkerId, tuple[float, int]]] = field(default_factory=dict)
    judged: int = -1  # the last step judged: a report for it or before is late
    slow: dict[WorkerId, float] = field(default_factory=dict)  # the last judged step's laggards

    def report(self, step: int, worker: WorkerId, compute_s: float,
               load: int) -> Optional[list[Lagging]]:
        """One member's compute for ``step``; once every member has reported
        it, the step is judged (see :meth:`judge`), else None."""
        if step <= self.judged:
            return None
        got = self.pending.setdefault(step, {})
        got[worker] = (compute_s / load if load > 0 else 0.0, load)
        if len(got) < self.members:
            if len(self.pending) > 8:  # a member that died mid-step never completes it
                del self.pending[min(self.pending)]
            return None
        del self.pending[step]
        working = {w: pb for w, (pb, load_) in got.items() if load_ > 0}
        if not working:
            return None
        typical = median_with(list(working.values()), 0.0, 0)
        return self.judge(step, step, typical, working)

    def judge(self, first: int, last: int, typical_s: float,
              per_batch_s: Mapping[WorkerId, float]) -> list[Lagging]:
        """Steps ``first..last`` had the median compute per micro-batch
        ``typical_s``, and the members in ``per_batch_s`` the compute given
        (every other member: ``typical_s`` or less). Returns the members that
        have now lagged for the policy's steps, slowest first."""
        assert last >= first and first > self.judged, (first, last, self.judged)
        self.judged = last
        bar = self.policy.factor * typical_s
        slow = self.slow = {w: pb for w, pb in per_batch_s.items() if pb > bar}
        k = last - first + 1
        self.counts = {w: self.counts.get(w, 0) + k for w in slow}
        due = [Lagging(w, slow[w], typical_s) for w, c in self.counts.items()
               if c >= self.policy.steps]
        due.sort(key=lambda x: (-x.per_batch_s, x.worker))
        return due


def eviction_gain(policy: StragglerPolicy, members: Sequence[WorkerId], out: Sequence[Lagging],
                  others: Mapping[WorkerId, float]) -> tuple[float, float]:
    """The compute of one step with the members ``out`` and without them (seconds).

    With: the busiest typical member (``rank_range``'s rank 0) or a slow
    member's own micro-batches at its own speed, whichever is longest.
    Without: the same over ``n - len(out)`` members, the other slow members
    (``others``: their compute per micro-batch) taken at the busiest load.
    The exchange is left out: it is about the same either way.
    """
    n, gone = len(members), len(out)
    assert 1 <= gone < n, "some members stay"
    typical = out[0].typical_s
    with_n, without_n = policy.shards(n), policy.shards(n - gone)
    busiest = rank_range(with_n, n, 0)
    with_s = typical * (busiest[1] - busiest[0])
    for w, pb in [*others.items(), *((x.worker, x.per_batch_s) for x in out)]:
        lo, hi = rank_range(with_n, n, members.index(w))
        with_s = max(with_s, pb * (hi - lo))
    lo, hi = rank_range(without_n, n - gone, 0)
    without_s = max([typical, *others.values()]) * (hi - lo)
    return with_s, without_s
