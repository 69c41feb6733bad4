"""The fault plan: which scripted or random fault is due when.

Pure bookkeeping. :class:`FaultPlan` is handed the scenario's schedule as
:class:`ScheduledFault` values (``rollcall.config.fault_plan`` builds them)
and the run's :class:`~rollcall.core.failures.Draws`, and decides *what* is
due *when*: a scripted fault by seconds since training started (``at_s``), by
committed step (``at_step``) or by a protocol event, the keeper opening the
roll call for a generation (``at_roll_call``); a node's random crash after the core's
lifetime of (seed, node, k), and its random slowdowns, the draws the sim
makes too. It is told ``now`` (training time) and which nodes are up; it
reads no clock. The driver carries each :class:`Due` out (the real target's
launcher: SIGKILL, SIGSTOP then SIGCONT, a new worker process or an
activated spare, or in hosts mode nftables rules on the hosts' links).
"""

from __future__ import annotations

import dataclasses
import heapq
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence, Union

from rollcall.core.failures import Draws

__all__ = ["Due", "FaultPlan", "ScheduledFault"]

TRIGGERS = ("at_s", "at_step", "at_roll_call")
#: a roll call's opening in the history: the keeper's record, on both targets
_ROLL_CALL_OPENS = ("round", "invoke")


@dataclass(frozen=True)
class ScheduledFault:
    """One fault of the scenario's schedule, as the fault plan reads it.

    ``index`` is its place in the schedule (ties of ``when`` go in that
    order, and :attr:`Due.index` names it). ``when`` is seconds since
    training started for ``at_s``, a committed step for ``at_step``, a
    generation (>= 1) for ``at_roll_call``.
    ``targets`` is what the fault hits, as :attr:`Due.targets` carries it:
    worker ids or ``"random"`` (kill, pause, slow, late_heartbeats), a count
    (join), a rack (kill_rack), a host index or ``"random"`` (lose_host,
    isolate_keeper, loss, delay), hosts (partition), an etcd member
    (kill_etcd), ``"active"`` (partition_keeper), ``()`` (kill_keeper).
    ``for_s`` is set for the faults that last; each action's own parameter
    is set for it alone: ``rate`` (loss), ``latency_s`` (delay), ``factor``
    (slow), ``delay_s`` (late_heartbeats).
    """

    index: int
    trigger: str
    when: Union[float, int]
    action: str
    targets: object = ()
    for_s: Optional[float] = None
    rate: Optional[float] = None
    latency_s: Optional[float] = None
    factor: Optional[float] = None
    delay_s: Optional[float] = None

    def __post_init__(self) -> None:
        if self.trigger not in TRIGGERS:
            raise ValueError(f"unknown fault trigger {self.trigger!r}")
        whole = self.trigger != "at_s"
        least = 1 if self.trigger == "at_roll_call" else 0
        if not self.when >= least or (whole and self.when != int(self.when)):
            raise ValueError(f"bad fault trigger {self.trigger} {self.when!r}")

    def due(self) -> "Due":
        """The fault as the driver carries it out: a ``slow``'s factor is the
        due's ``rate``, a ``late_heartbeats``'s ``delay_s`` its ``latency_s``."""
        rate = self.factor if self.action == "slow" else self.rate if self.action == "loss" else None
        latency_s = (self.delay_s if self.action == "late_heartbeats"
                     else self.latency_s if self.action == "delay" else None)
        return Due(self.action, self.targets, self.for_s, rate=rate, latency_s=latency_s,
                   index=self.index)


@dataclass(frozen=True)
class Due:
    kind: str                      # kill | kill_rack | lose_host | pause | slow | late_heartbeats | join
    #                                | crash (a lifetime's end)
    #                                | partition | isolate_keeper | loss | delay (hosts mode: a host's link)
    #                                | kill_keeper | kill_etcd | partition_keeper
    targets: object                # ids, "random", a count (join), a rack (kill_rack), a host
    #                                (lose_host, isolate_keeper, loss, delay: an index or "random"),
    #                                hosts (partition)
    for_s: Optional[float] = None
    rate: Optional[float] = None   # loss: the fraction of packets dropped; slow: the factor
    latency_s: Optional[float] = None  # delay: the extra one-way latency; late_heartbeats: delay_s
    origin: str = "schedule"       # schedule | mtbf
    index: int = -1
    from_step: Optional[int] = None  # slow, at_step: the first step it slows


class FaultPlan:
    """The run's faults, due by training time (:meth:`due_by_time`), by
    committed step (:meth:`due_by_step`) and by the keeper's records
    (:meth:`due_by_record`); random crashes and slowdowns of the
    nodes it is told are up (:meth:`node_up`), drawn from ``draws``.

    Crashes and slowdowns wait in heaps (a node's entry is void once it goes
    down: its epoch moved on), so a sim of 10^5 nodes asks for the next one
    in O(log n). With ``crashes`` false the plan draws no lifetimes: a model
    that spends them in compute seconds (the sim's ``failures.age:
    computing``) times the crashes itself."""

    def __init__(self, schedule: Sequence[ScheduledFault], draws: Draws,
                 crashes: bool = True) -> None:
        self._draws = draws  # node lifetimes and random targets, as on the sim
        self._crashes_drawn = crashes
        self._up: set[int] = set()  # workers whose node's current hardware life has started
        order = sorted(schedule, key=lambda f: (f.when, f.index))
        self._by_time: list[ScheduledFault] = [f for f in order if f.trigger == "at_s"]
        self._by_step: list[ScheduledFault] = [f for f in order if f.trigger == "at_step"]
        self._by_roll_call: list[ScheduledFault] = [f for f in order if f.trigger == "at_roll_call"]
        self._epoch: dict[int, int] = {}  # worker id -> hardware lives begun (voids old entries)
        self._crashes: list[tuple[float, int, int]] = []  # (training-time, worker, epoch)
        # (training-time, worker, epoch, factor) of each node's next random slowdown
        self._slowdowns: list[tuple[float, int, int, float]] = []

    @property
    def draws(self) -> Draws:
        """The run's draws (the repair shop's and the random targets' too)."""
        return self._draws

    def node_up(self, worker: int, at: float) -> None:
        """``worker`` is active at training time ``at``. The first time since
        its node arrived or was repaired, a hardware life starts: its crash is
        due after the core's lifetime of (seed, node, k), the draw the sim
        makes for the node's k-th life. A restart's relaunch runs on the same
        hardware life and draws nothing."""
        if worker in self._up:
            return
        self._up.add(worker)
        epoch = self._epoch[worker] = self._epoch.get(worker, 0) + 1
        life = self._draws.next_lifetime(worker) if self._crashes_drawn else None
        if life is not None:
            heapq.heappush(self._crashes, (at + life, worker, epoch))
        self._next_slowdown(worker, epoch, at)

    def _next_slowdown(self, worker: int, epoch: int, after: float) -> None:
        """The node's next random slowdown, a drawn gap after ``after`` (as the sim's)."""
        drawn = self._draws.next_slowdown(worker)
        if drawn is not None:
            heapq.heappush(self._slowdowns, (after + drawn[0], worker, epoch, drawn[1]))

    def node_down(self, worker: int) -> None:
        """``worker``'s node is gone: its pending crash and slowdown are void."""
        if worker in self._up:
            self._up.discard(worker)
            self._epoch[worker] += 1

    def _live(self, worker: int, epoch: int) -> bool:
        return worker in self._up and self._epoch[worker] == epoch

    def _first(self, heap: list) -> Optional[float]:
        """The time of the heap's first entry still live (void ones dropped)."""
        while heap and not self._live(heap[0][1], heap[0][2]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def next_time(self) -> Optional[float]:
        """The training time at which :meth:`due_by_time` next has a fault (None: none)."""
        times = [t for t in (self._by_time[0].when if self._by_time else None,
                             self._first(self._crashes), self._first(self._slowdowns)) if t is not None]
        return min(times) if times else None

    def due_by_time(self, t: float) -> list[Due]:
        """The faults due by training time ``t``: scripted ``at_s`` faults in
        trigger order, then crashes, then random slowdowns, each in time order."""
        out = []
        while self._by_time and self._by_time[0].when <= t:
            out.append(self._by_time.pop(0).due())
        while (at := self._first(self._crashes)) is not None and at <= t:
            _, worker, _ = heapq.heappop(self._crashes)
            out.append(Due("crash", (worker,), origin="mtbf"))  # the machine's end, as on the sim
        slow = self._draws.slow
        while (at := self._first(self._slowdowns)) is not None and at <= t:
            assert slow is not None
            _, worker, epoch, factor = heapq.heappop(self._slowdowns)
            out.append(Due("slow", (worker,), slow.for_s, rate=factor, origin="mtbf"))
            self._next_slowdown(worker, epoch, at + slow.for_s)
        return out

    def due_by_step(self, committed: int) -> list[Due]:
        """The faults due once ``committed`` steps are held by every member. A
        ``slow`` of fixed targets at step N is handed out a step early
        (``from_step`` N): the worker must hear it before it computes step N,
        the sim's first slow step, and an order sent at N would race that
        step's compute."""
        early = [f for f in self._by_step if _early(f, committed)]
        out = [dataclasses.replace(f.due(), from_step=int(f.when)) for f in early]
        if early:
            self._by_step = [f for f in self._by_step if not _early(f, committed)]
        while self._by_step and self._by_step[0].when <= committed:
            out.append(self._by_step.pop(0).due())
        return out

    def due_by_record(self, record: Mapping[str, Any]) -> list[Due]:
        """The faults that history record ``record`` makes due: those scripted
        ``at_roll_call: N`` once the keeper opens the roll call for generation
        N or a later one (its ``invoke round`` record; a roll call a new
        keeper opens again does not fire them twice), in schedule order. A
        driver hands in every record the keeper writes and carries the faults
        out after the keeper's outputs of the moment, never inside them."""
        if not self._by_roll_call or (record.get("f"), record.get("type")) != _ROLL_CALL_OPENS:
            return []
        generation = record["gen"]
        out = []
        while self._by_roll_call and self._by_roll_call[0].when <= generation:
            out.append(self._by_roll_call.pop(0).due())
        return out

    def next_step(self) -> Optional[int]:
        """The committed count at which the next step-scripted fault acts
        (its ``at_step``; None: none left): a sim that steps a run of steps
        at once ends the run there."""
        return int(self._by_step[0].when) if self._by_step else None

    def next_gate(self) -> int:
        """The committed count at which :meth:`due_by_step` will next hand out
        a fault (0: none left): a keeper that answers commits itself holds
        the last member's ack of that step until the fault is in."""
        gates = [_handed_out_at(f) for f in self._by_step]
        return max(1, min(gates)) if gates else 0

    def pick(self, candidates: list[int]) -> Optional[int]:
        """The run's next random target among ``candidates`` (None when empty)."""
        return self._draws.pick(candidates)


def _slow_of_fixed_targets(f: ScheduledFault) -> bool:
    return f.action == "slow" and f.targets != "random"


def _handed_out_at(f: ScheduledFault) -> int:
    """The committed count at which step-scripted fault ``f`` is handed out: a
    slow of fixed targets a step early (see :meth:`FaultPlan.due_by_step`)."""
    return int(f.when) - 1 if _slow_of_fixed_targets(f) else int(f.when)


def _early(f: ScheduledFault, committed: int) -> bool:
    """Whether scripted fault ``f`` is a slow of fixed targets due at the next step."""
    return _slow_of_fixed_targets(f) and _handed_out_at(f) <= committed
