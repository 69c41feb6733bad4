"""What becomes of a failed node, and when the job pulls a spare: the repair shop.

A failed node goes to repair and comes back, or is retired; when too few
nodes are left for the job, spares are pulled from a cold pool (preempted
from other work). Those are decisions, so they are made here, for both
targets: a driver reports a node down (:meth:`RepairShop.down`) and back up
(:meth:`RepairShop.up`) and carries out what it is told (:class:`Repair`,
:class:`Retire`, :class:`Pull`).

The repair pipeline is AIReSim's (``docs/airesim-model.md`` section 1.5): a
failure is diagnosed with probability ``diagnosis_p`` (an undiagnosed node
stays in service: it is back after a reboot, its fault, if any, still
there); a diagnosed one goes to automated repair (exponential, mean
``auto_s``), escalated with probability ``manual_p`` to a manual repair
(exponential, mean ``manual_s``, after the automated one); a repair leaves
the fault in place with probability ``auto_fail_p`` or ``manual_fail_p``.
Only a repair that worked cures a bad node (:meth:`Draws.cure`): its next
lives are a good node's. ``fixed_s`` instead: every repair takes that long
and brings the node back as it was, a bad node still bad (the older
``cluster.repair_s``, which has no diagnosis).

Every draw is the k-th of the stream ``repair/<node>`` (k counts the node's
failures), so a node's repairs depend on the seed and on how often it failed,
never on the target or on the order a driver asks in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Union

from rollcall.core.failures import Draws, nth_uniform
from rollcall.core.history import NEMESIS, rec

__all__ = ["Pull", "Repair", "RepairPolicy", "RepairShop", "Retire", "ShopAction"]

_DRAWS_PER_FAILURE = 5  # diagnosis, automated time, escalation, manual time, outcome


@dataclass(frozen=True)
class RepairPolicy:
    """How failed nodes are repaired, and when one is retired instead.

    ``retire_after``: a node that fails that many times within
    ``retire_window_s`` (None: ever) is retired at that failure, not repaired.
    """

    fixed_s: Optional[float] = None
    auto_s: float = 7200.0
    manual_s: float = 172800.0
    manual_p: float = 0.8
    auto_fail_p: float = 0.4
    manual_fail_p: float = 0.2
    diagnosis_p: float = 1.0
    reboot_s: float = 600.0
    retire_after: Optional[int] = None
    retire_window_s: Optional[float] = None

    def __post_init__(self) -> None:
        probs = (self.manual_p, self.auto_fail_p, self.manual_fail_p, self.diagnosis_p)
        assert all(0.0 <= p <= 1.0 for p in probs), self
        assert self.fixed_s is None or self.fixed_s > 0, self
        assert self.auto_s > 0 and self.manual_s > 0 and self.reboot_s > 0, self
        assert self.retire_after is None or self.retire_after >= 1, self

    def mean_repair_s(self) -> float:
        """A failure's expected time out of service (the mean of M/G/inf's service)."""
        if self.fixed_s is not None:
            return self.fixed_s
        shop = self.auto_s + self.manual_p * self.manual_s
        return self.diagnosis_p * shop + (1.0 - self.diagnosis_p) * self.reboot_s

    def fix_p(self) -> float:
        """The probability that a failure's fault is gone once the node is back."""
        if self.fixed_s is not None:
            return 0.0
        worked = (1.0 - self.manual_p) * (1.0 - self.auto_fail_p) \
            + self.manual_p * (1.0 - self.manual_fail_p)
        return self.diagnosis_p * worked


@dataclass(frozen=True)
class Repair:
    """Node ``worker`` is back in service at ``back_at_s``; ``how`` is
    ``fixed`` (``fixed_s``), ``auto``, ``manual`` or ``undiagnosed``;
    ``cured``: the repair removed the fault."""

    worker: int
    back_at_s: float
    how: str
    cured: bool

    def record(self, now: float) -> dict:
        """The history's ``repair`` fault record, when the node is back
        (a fixed time says no more than that it is)."""
        extra = {} if self.how == "fixed" else {"how": self.how, "cured": self.cured}
        return rec(now, "info", "fault", NEMESIS, kind="repair", workers=[self.worker], **extra)


@dataclass(frozen=True)
class Retire:
    """Node ``worker`` leaves the fleet for good after ``failures`` failures
    within the policy's window."""

    worker: int
    failures: int

    def record(self, now: float) -> dict:
        return rec(now, "info", "fault", NEMESIS, kind="retire", workers=[self.worker],
                   failures=self.failures)


@dataclass(frozen=True)
class Pull:
    """A spare from the cold pool, as worker id ``worker``, is up at ``at_s``
    (the wait for the job it is preempted from)."""

    worker: int
    at_s: float

    def record(self, now: float) -> dict:
        """The history's ``pull`` fault record, when the spare is up."""
        return rec(now, "info", "fault", NEMESIS, kind="pull", workers=[self.worker])


ShopAction = Union[Repair, Retire, Pull]


class RepairShop:
    """The nodes in service, in repair and in the cold pool of one run.

    ``want``: the nodes the job runs on (its workers); ``target``: the
    nodes it keeps when it pulls (workers and warm spares). Spares are pulled
    once fewer than ``want`` are up or on their way, one at a time,
    ``preempt_s`` each, until ``target`` are; pulled ids start at
    ``first_pool_id``.
    """

    def __init__(self, draws: Draws, policy: Optional[RepairPolicy], *, up: int, want: int,
                 target: int, pool: int = 0, preempt_s: float = 0.0,
                 first_pool_id: int = 0) -> None:
        assert 0 <= want <= target and pool >= 0 and preempt_s >= 0, (want, target, pool)
        self.draws = draws
        self.policy = policy
        self.want, self.target = want, target
        self.pool_left, self.preempt_s = pool, preempt_s
        self.next_pool_id = first_pool_id
        self.in_service = up  # nodes up, or back from repair (not retired)
        self.coming = 0  # pulled, not up yet
        self._pull_free_s = -math.inf  # when the preemption in progress ends
        self._failures: dict[int, list[float]] = {}  # node -> failure times (retirement)
        self.retired: set[int] = set()

    def down(self, now: float, worker: int) -> list[ShopAction]:
        """Node ``worker`` failed now: its repair or retirement, and any pulls."""
        assert worker not in self.retired, worker
        times = self._failures.setdefault(worker, [])
        times.append(now)
        self.in_service -= 1
        out: list[ShopAction] = []
        if self.policy is not None:
            out.append(self._retire_or_repair(now, worker, times))
        return out + self._pulls(now)

    def joined(self, now: float, worker: int) -> None:
        """Node ``worker`` is new to the fleet (a scripted join): one more in service."""
        assert worker not in self._failures and worker not in self.retired, worker
        self.in_service += 1

    def up(self, now: float, worker: int, pulled: bool = False) -> None:
        """Node ``worker`` is in service again (a repair ended, or a pulled spare came)."""
        assert worker not in self.retired, worker
        self.in_service += 1
        if pulled:
            self.coming -= 1
            assert self.coming >= 0, self.coming

    def _retire_or_repair(self, now: float, worker: int, times: list[float]) -> ShopAction:
        p = self.policy
        assert p is not None
        if p.retire_after is not None:
            window = p.retire_window_s
            recent = len(times) if window is None else sum(1 for t in times if t >= now - window)
            if recent >= p.retire_after:
                self.retired.add(worker)
                return Retire(worker, recent)
        return self._repair(now, worker, len(times) - 1)

    def _repair(self, now: float, worker: int, k: int) -> Repair:
        p = self.policy
        assert p is not None
        if p.fixed_s is not None:  # a lemon stays one: the fault was never found
            return Repair(worker, now + p.fixed_s, "fixed", False)
        seed, name, base = self.draws.seed, f"repair/{worker}", k * _DRAWS_PER_FAILURE
        u = [nth_uniform(seed, name, base + j) for j in range(_DRAWS_PER_FAILURE)]
        if u[0] > p.diagnosis_p:
            return Repair(worker, now + p.reboot_s, "undiagnosed", False)
        took = -p.auto_s * math.log(u[1])
        manual = u[2] <= p.manual_p
        if manual:
            took += -p.manual_s * math.log(u[3])
        cured = u[4] > (p.manual_fail_p if manual else p.auto_fail_p)
        if cured:
            self.draws.cure(worker)
        return Repair(worker, now + took, "manual" if manual else "auto", cured)

    def _pulls(self, now: float) -> list[ShopAction]:
        have = self.in_service + self.coming
        if have >= self.want or not self.pool_left:
            return []
        out: list[ShopAction] = []
        for _ in range(min(self.target - have, self.pool_left)):
            at = max(now, self._pull_free_s) + self.preempt_s
            self._pull_free_s = at
            out.append(Pull(self.next_pool_id, at))
            self.next_pool_id += 1
            self.pool_left -= 1
            self.coming += 1
        return out
