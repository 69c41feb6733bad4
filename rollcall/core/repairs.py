"""What becomes of a failed node, and when the job pulls a spare: the repair shop.

A failed node goes to repair and comes back, or is retired; when too few
nodes are left for the job, spares are pulled from a cold pool (preempted
from other work). Those are decisions, so they are made here, for both
targets: a driver reports a node down (:meth:`RepairShop.down`) and back up
(:meth:`RepairShop.up`) and carries out what it is told (:class:`Repair`,
:class:`Retire`, :class:`Pull`, :class:`Warm`).

Warm standbys (AIReSim's ``warm_standbys``, ``docs/airesim-model.md``
section 1.4): with a limit of ``warm`` standbys, at most ``want + warm``
nodes in service hold a worker process (the job's members and its warm
standbys, which have joined and wait); the rest are idle in the working
pool, without one. When a node holding a process fails, the idle node
that waited longest is made a standby: its host selection takes
``select_s`` (:class:`Warm`), then its process starts and joins. A node
back from repair takes a free place at once (its process starts) or waits
idle. Without a limit every node in service runs a process, as before.

The repair pipeline is AIReSim's (``docs/airesim-model.md`` section 1.5): a
failure is diagnosed with probability ``diagnosis_p`` (an undiagnosed node
stays in service: it is back after a reboot, its fault, if any, still
there); a diagnosed one goes to automated repair (exponential, mean
``auto_s``), escalated with probability ``manual_p`` to a manual repair
(exponential, mean ``manual_s``, after the automated one); a repair leaves
the fault in place with probability ``auto_fail_p`` or ``manual_fail_p``.
Only a repair that worked cures a bad node (:meth:`Draws.cure`): its next
lives are a good node's. A diagnosis blames the wrong node with probability
``wrong_blame_p`` (AIReSim's ``diagnosis_uncertainty``): an innocent live
member, drawn among those the driver names, is taken out of service and
through the repair pipeline (:class:`Blame`), while the culprit is back
after a reboot with its fault intact, as an undiagnosed one is. The
innocent's trip is no failure of its own: it counts toward no retirement.
``fixed_s`` instead: every repair takes that long and brings the node back
as it was, a bad node still bad (the older ``cluster.repair_s``, which has
no diagnosis).

Every draw is the k-th of the stream ``repair/<node>`` (k counts the node's
failures), so a node's repairs depend on the seed and on how often it failed,
never on the target or on the order a driver asks in. Whether a diagnosis
blames the wrong node, and which one, are the culprit's draws of the stream
``blame/<node>``; an innocent's repairs draw from ``blamed/<node>`` (k
counts its blames), so a run without wrong blames draws what it always did.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Union

from rollcall.core.failures import Draws, nth_uniform
from rollcall.core.history import NEMESIS, rec

__all__ = ["Blame", "Pull", "Repair", "RepairPolicy", "RepairShop", "Retire", "ShopAction", "Warm"]

_DRAWS_PER_FAILURE = 5  # diagnosis, automated time, escalation, manual time, outcome
_BLAME_DRAWS = 2  # per failure of the culprit: whether the wrong node is blamed, which one


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
    wrong_blame_p: float = 0.0

    def __post_init__(self) -> None:
        probs = (self.manual_p, self.auto_fail_p, self.manual_fail_p, self.diagnosis_p,
                 self.wrong_blame_p)
        assert all(0.0 <= p <= 1.0 for p in probs), self
        assert self.fixed_s is None or self.fixed_s > 0, self
        assert self.auto_s > 0 and self.manual_s > 0 and self.reboot_s > 0, self
        assert self.retire_after is None or self.retire_after >= 1, self
        assert self.fixed_s is None or not self.wrong_blame_p, "a fixed time has no diagnosis"

    def shop_s(self) -> float:
        """The expected time of a trip through the pipeline (automated, maybe manual)."""
        return self.auto_s + self.manual_p * self.manual_s

    def mean_repair_s(self) -> float:
        """A failure's expected time out of service for the failed node (the
        mean of M/G/inf's service); a wrong blame's innocent is out
        :meth:`shop_s` more, on another node."""
        if self.fixed_s is not None:
            return self.fixed_s
        right = self.diagnosis_p * (1.0 - self.wrong_blame_p)
        return right * self.shop_s() + (1.0 - right) * self.reboot_s

    def fix_p(self) -> float:
        """The probability that a failure's fault is gone once the node is back."""
        if self.fixed_s is not None:
            return 0.0
        worked = (1.0 - self.manual_p) * (1.0 - self.auto_fail_p) \
            + self.manual_p * (1.0 - self.manual_fail_p)
        return self.diagnosis_p * (1.0 - self.wrong_blame_p) * worked


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
class Blame:
    """The diagnosis of ``culprit``'s failure blamed node ``worker`` instead:
    the innocent is taken out of service now (its process stopped, as an
    operator drains a node sent to repair); its :class:`Repair` or
    :class:`Retire` follows in the same answer."""

    worker: int
    culprit: int

    def record(self, now: float) -> dict:
        return rec(now, "info", "fault", NEMESIS, kind="blame", workers=[self.worker],
                   culprit=self.culprit)


@dataclass(frozen=True)
class Pull:
    """A spare from the cold pool, as worker id ``worker``, is up at ``at_s``
    (the wait for the job it is preempted from)."""

    worker: int
    at_s: float

    def record(self, now: float) -> dict:
        """The history's ``pull`` fault record, when the spare is up."""
        return rec(now, "info", "fault", NEMESIS, kind="pull", workers=[self.worker])


@dataclass(frozen=True)
class Warm:
    """Idle node ``worker`` becomes a warm standby: its host selection ends
    at ``at_s``, when its process starts (and joins). ``back``: the node
    failed before and is back from repair, so the keeper hands out its life
    (``Keeper.node_up``); else it never ran a process (life 0)."""

    worker: int
    at_s: float
    back: bool

    def record(self, now: float) -> dict:
        """The history's ``warm`` fault record, when its process starts."""
        return rec(now, "info", "fault", NEMESIS, kind="warm", workers=[self.worker])


ShopAction = Union[Repair, Retire, Blame, Pull, Warm]


class RepairShop:
    """The nodes in service, in repair and in the cold pool of one run.

    ``want``: the nodes the job runs on (its workers); ``target``: the
    nodes it keeps when it pulls (workers and spares). Spares are pulled
    once fewer than ``want`` are up or on their way, one at a time,
    ``preempt_s`` each, until ``target`` are (with warm standbys, no more
    than hold a process); pulled ids start at
    ``first_pool_id``. ``warm``: the most warm standbys (None: no limit),
    ``select_s``: the host selection of an idle node made one.

    The ``up`` nodes in service at the start are ids ``0..up-1``; the first
    :attr:`initial` of them start a process, the others wait idle.
    """

    def __init__(self, draws: Draws, policy: Optional[RepairPolicy], *, up: int, want: int,
                 target: int, pool: int = 0, preempt_s: float = 0.0,
                 first_pool_id: int = 0, warm: Optional[int] = None,
                 select_s: float = 0.0) -> None:
        assert 0 <= want <= target and pool >= 0 and preempt_s >= 0, (want, target, pool)
        assert (warm is None or warm >= 0) and select_s >= 0, (warm, select_s)
        self.draws = draws
        self.policy = policy
        self.want, self.target = want, target
        self.pool_left, self.preempt_s = pool, preempt_s
        self.next_pool_id = first_pool_id
        self.in_service = up  # nodes up, or back from repair (not retired)
        self.coming = 0  # pulled, not up yet
        self._pull_free_s = -math.inf  # when the preemption in progress ends
        self._failures: dict[int, list[float]] = {}  # node -> failure times (retirement)
        self._blamed: dict[int, int] = {}  # node -> times a wrong diagnosis blamed it
        self._out: set[int] = set()  # failed or blamed, not up since (retired included)
        self._repairing = 0  # Repair answers given whose node is not up yet
        self.retired: set[int] = set()
        self.places = None if warm is None else want + warm  # processes at most
        self.select_s = select_s
        #: nodes ``0..initial-1`` start a process; the others in service wait idle
        self.initial = up if self.places is None else min(up, self.places)
        self.busy = self.initial  # nodes holding a process, or getting one
        self.idle: list[int] = list(range(self.initial, up))  # longest idle first
        self._warming: set[int] = set()

    @property
    def capacity(self) -> int:
        """The nodes in service (holding a process or idle) or that may yet
        come: in repair, pulled, or left in the cold pool. Only a
        retirement (and, with no repair policy, any failure) lowers it; a
        scripted join raises it. The keeper's :meth:`Keeper.fleet_capacity`."""
        return self.in_service + self._repairing + self.coming + self.pool_left

    def down(self, now: float, worker: int,
             innocents: Callable[[], Sequence[int]] = tuple) -> list[ShopAction]:
        """Node ``worker`` failed now: its repair or retirement, and any pulls.

        ``innocents()``: the job's live members not hit by the fault in
        progress (asked only when a diagnosis goes wrong). The shop blames
        none of them that it holds out of service (failed or blamed, and not
        up since), nor the culprit."""
        assert worker not in self.retired, worker
        times = self._failures.setdefault(worker, [])
        times.append(now)
        self._out.add(worker)
        self.in_service -= 1
        if worker in self.idle:  # an idle node failed: no process was lost
            self.idle.remove(worker)
        else:
            self._warming.discard(worker)
            self.busy -= 1
        out: list[ShopAction] = []
        if self.policy is not None:
            out += self._retire_or_repair(now, worker, times, innocents)
            self._repairing += sum(1 for act in out if isinstance(act, Repair))
        return out + self._warm(now) + self._pulls(now)

    def joined(self, now: float, worker: int) -> None:
        """Node ``worker`` is new to the fleet (a scripted join, with its process):
        one more in service."""
        assert worker not in self._failures and worker not in self.retired, worker
        self.in_service += 1
        self.busy += 1

    def up(self, now: float, worker: int, pulled: bool = False) -> bool:
        """Node ``worker`` is in service again (a repair ended, or a pulled
        spare came): whether its process starts now (else it waits idle
        until a :class:`Warm` names it; a pulled spare always starts)."""
        assert worker not in self.retired, worker
        self._out.discard(worker)
        self.in_service += 1
        if pulled:
            self.coming -= 1
            assert self.coming >= 0, self.coming
            return True  # counted busy when it was pulled
        self._repairing -= 1
        assert self._repairing >= 0, (worker, self._repairing)
        if self.places is not None and self.busy >= self.places:
            self.idle.append(worker)
            return False
        self.busy += 1
        return True

    def warmed(self, now: float, worker: int) -> bool:
        """The host selection of ``worker`` (a :class:`Warm`) ended: whether its
        process starts (False: the node failed meanwhile)."""
        if worker not in self._warming:
            return False
        self._warming.remove(worker)
        return True

    def _warm(self, now: float) -> list[ShopAction]:
        """Idle nodes made warm standbys while fewer than ``places`` hold a process."""
        out: list[ShopAction] = []
        while self.places is not None and self.idle and self.busy < self.places:
            w = self.idle.pop(0)
            self._warming.add(w)
            self.busy += 1
            out.append(Warm(w, now + self.select_s, w in self._failures))
        return out

    def _retire_or_repair(self, now: float, worker: int, times: list[float],
                          innocents: Callable[[], Sequence[int]]) -> list[ShopAction]:
        p = self.policy
        assert p is not None
        if p.retire_after is not None:
            window = p.retire_window_s
            recent = len(times) if window is None else sum(1 for t in times if t >= now - window)
            if recent >= p.retire_after:
                self.retired.add(worker)
                return [Retire(worker, recent)]
        if p.fixed_s is not None:  # a lemon stays one: the fault was never found
            return [Repair(worker, now + p.fixed_s, "fixed", False)]
        k = len(times) - 1
        seed = self.draws.seed
        if nth_uniform(seed, f"repair/{worker}", k * _DRAWS_PER_FAILURE) > p.diagnosis_p:
            return [Repair(worker, now + p.reboot_s, "undiagnosed", False)]
        innocent = self._wrong_blame(worker, k, innocents) if p.wrong_blame_p else None
        if innocent is None:
            return [self._repair(now, worker, f"repair/{worker}", k)]
        self.in_service -= 1  # the innocent leaves service too; the culprit reboots
        self.busy -= 1  # a live member: it held a process
        blamed = self._blamed.get(innocent, 0)
        self._blamed[innocent] = blamed + 1
        self._out.add(innocent)
        return [Repair(worker, now + p.reboot_s, "misdiagnosed", False), Blame(innocent, worker),
                self._repair(now, innocent, f"blamed/{innocent}", blamed)]

    def _wrong_blame(self, worker: int, k: int,
                     innocents: Callable[[], Sequence[int]]) -> Optional[int]:
        """The node blamed for ``worker``'s k-th failure instead of it, or None
        (the diagnosis was right, or there is nobody else to blame)."""
        p = self.policy
        assert p is not None
        seed, name = self.draws.seed, f"blame/{worker}"
        if nth_uniform(seed, name, k * _BLAME_DRAWS) > p.wrong_blame_p:
            return None
        pool = sorted(w for w in innocents() if w != worker and w not in self._out)
        if not pool:
            return None  # the culprit is blamed after all, as AIReSim does
        u = nth_uniform(seed, name, k * _BLAME_DRAWS + 1)
        return pool[min(len(pool) - 1, int(u * len(pool)))]

    def _repair(self, now: float, worker: int, stream: str, k: int) -> Repair:
        """A diagnosed trip of ``worker`` through the pipeline: the k-th draws of ``stream``."""
        p = self.policy
        assert p is not None and p.fixed_s is None
        seed, base = self.draws.seed, k * _DRAWS_PER_FAILURE
        u = [nth_uniform(seed, stream, base + j) for j in range(1, _DRAWS_PER_FAILURE)]
        took = -p.auto_s * math.log(u[0])
        manual = u[1] <= p.manual_p
        if manual:
            took += -p.manual_s * math.log(u[2])
        cured = u[3] > (p.manual_fail_p if manual else p.auto_fail_p)
        if cured:
            self.draws.cure(worker)
        return Repair(worker, now + took, "manual" if manual else "auto", cured)

    def _pulls(self, now: float) -> list[ShopAction]:
        have = self.in_service + self.coming
        if have >= self.want or not self.pool_left:
            return []
        out: list[ShopAction] = []
        # with warm standbys, no more than the places for processes (AIReSim
        # tops up to job size + standbys): a pulled spare is never left idle
        top = self.target if self.places is None else min(self.target, self.places)
        for _ in range(min(top - have, self.pool_left)):
            at = max(now, self._pull_free_s) + self.preempt_s
            self._pull_free_s = at
            out.append(Pull(self.next_pool_id, at))
            self.next_pool_id += 1
            self.pool_left -= 1
            self.coming += 1
            self.busy += 1
        return out
