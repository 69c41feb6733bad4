"""The fault injector: the scenario's schedule and random crashes, in real time.

Pure bookkeeping: it decides *what* is due *when* (by seconds since training
started, or by committed step) from the scenario and the core's seeded draws
(:mod:`rollcall.core.failures`, the same as the sim's);
the launcher carries the faults out on real processes (SIGKILL, SIGSTOP then
SIGCONT, a new worker process or an activated spare) or, in hosts mode, on the
hosts' links (nftables rules in their namespaces, :mod:`real.netns`).
"""

from __future__ import annotations

import dataclasses

from dataclasses import dataclass
from typing import Optional

from rollcall.config import draws
from rollcall.scenario import Scenario


@dataclass(frozen=True)
class Due:
    kind: str                      # kill | kill_rack | lose_host | pause | slow | late_heartbeats | join
    #                                | crash (a lifetime's end)
    #                                | partition | isolate_keeper | loss | delay (hosts mode: a host's link)
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
    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.draws = draws(scenario)  # node lifetimes and random targets, as on the sim
        self.up: set[int] = set()  # workers whose node's current hardware life has started
        self.by_time = []   # (at_s, index, fault)
        self.by_step = []
        for i, f in enumerate(scenario.failures.schedule):
            (self.by_time if f.trigger == "at_s" else self.by_step).append((f.when, i, f))
        self.by_time.sort(key=lambda x: (x[0], x[1]))
        self.by_step.sort(key=lambda x: (x[0], x[1]))
        self.crash_at: dict[int, float] = {}  # worker id -> training-time of its crash
        # worker id -> (training-time, factor) of its next random slowdown
        self.slow_at: dict[int, tuple[float, float]] = {}

    def _due(self, i: int, f) -> Due:
        if f.action == "join":
            return Due("join", f.join, index=i)
        if f.action == "kill_rack":
            return Due("kill_rack", f.kill_rack, index=i)
        if f.action == "lose_host":
            return Due("lose_host", f.lose_host, index=i)
        if f.action == "partition":
            return Due("partition", tuple(f.partition), f.for_s, index=i)
        if f.action == "isolate_keeper":
            return Due("isolate_keeper", f.isolate_keeper, f.for_s, index=i)
        if f.action == "loss":
            return Due("loss", f.loss, f.for_s, rate=f.rate, index=i)
        if f.action == "delay":
            return Due("delay", f.delay, f.for_s, latency_s=f.latency_s, index=i)
        if f.action == "late_heartbeats":
            return Due("late_heartbeats", f.targets, f.for_s, latency_s=f.delay_s, index=i)
        if f.action == "slow":
            return Due("slow", f.targets, f.for_s, rate=f.factor, index=i)
        if f.action == "kill_etcd":
            return Due("kill_etcd", f.kill_etcd, index=i)
        if f.action == "partition_keeper":
            return Due("partition_keeper", "active", f.for_s, index=i)
        return Due(f.action, f.targets, f.for_s, index=i)

    def node_up(self, worker: int, at: float) -> None:
        """``worker`` is active at training time ``at``. The first time since
        its node arrived or was repaired, a hardware life starts: its crash is
        due after the core's lifetime of (seed, node, k), the draw the sim
        makes for the node's k-th life. A restart's relaunch runs on the same
        hardware life and draws nothing."""
        if worker in self.up:
            return
        self.up.add(worker)
        life = self.draws.next_lifetime(worker)
        if life is not None:
            self.crash_at[worker] = at + life
        self._next_slowdown(worker, at)

    def _next_slowdown(self, worker: int, after: float) -> None:
        """The node's next random slowdown, a drawn gap after ``after`` (as the sim's)."""
        drawn = self.draws.next_slowdown(worker)
        if drawn is not None:
            self.slow_at[worker] = (after + drawn[0], drawn[1])

    def node_down(self, worker: int) -> None:
        self.up.discard(worker)
        self.crash_at.pop(worker, None)
        self.slow_at.pop(worker, None)

    def next_time(self) -> Optional[float]:
        times = [t for t, _, _ in self.by_time[:1]] + list(self.crash_at.values())
        times += [t for t, _ in self.slow_at.values()]
        return min(times) if times else None

    def due_by_time(self, t: float) -> list[Due]:
        out = []
        while self.by_time and self.by_time[0][0] <= t:
            _, i, f = self.by_time.pop(0)
            out.append(self._due(i, f))
        for w, at in sorted(self.crash_at.items(), key=lambda kv: kv[1]):
            if at <= t:
                del self.crash_at[w]
                out.append(Due("crash", (w,), origin="mtbf"))  # the machine's end, as on the sim
        slow = self.draws.slow
        for w, (at, factor) in sorted(self.slow_at.items(), key=lambda kv: kv[1]):
            if at <= t:
                assert slow is not None
                del self.slow_at[w]
                out.append(Due("slow", (w,), slow.for_s, rate=factor, origin="mtbf"))
                self._next_slowdown(w, at + slow.for_s)
        return out

    def due_by_step(self, committed: int) -> list[Due]:
        """The faults due once ``committed`` steps are held by every member. A
        ``slow`` of fixed targets at step N is handed out a step early
        (``from_step`` N): the worker must hear it before it computes step N,
        the sim's first slow step, and an order sent at N would race that
        step's compute."""
        out = []
        for entry in [e for e in self.by_step if _early(e[2], committed)]:
            self.by_step.remove(entry)
            _, i, f = entry
            out.append(dataclasses.replace(self._due(i, f), from_step=int(f.when)))
        while self.by_step and self.by_step[0][0] <= committed:
            _, i, f = self.by_step.pop(0)
            out.append(self._due(i, f))
        return out

    def next_gate(self) -> int:
        """The committed count at which :meth:`due_by_step` will next hand out
        a fault (0: none left): a keeper that answers commits itself holds
        the last member's ack of that step until the fault is in."""
        gates = [_handed_out_at(f) for _, _, f in self.by_step]
        return max(1, min(gates)) if gates else 0

    def pick(self, candidates: list[int]) -> Optional[int]:
        """The run's next random target among ``candidates`` (None when empty)."""
        return self.draws.pick(candidates)


def _slow_of_fixed_targets(f) -> bool:
    return f.action == "slow" and f.targets != "random"


def _handed_out_at(f) -> int:
    """The committed count at which step-scripted fault ``f`` is handed out: a
    slow of fixed targets a step early (see :meth:`FaultPlan.due_by_step`)."""
    return int(f.when) - 1 if _slow_of_fixed_targets(f) else int(f.when)


def _early(f, committed: int) -> bool:
    """Whether scripted fault ``f`` is a slow of fixed targets due at the next step."""
    return _slow_of_fixed_targets(f) and _handed_out_at(f) <= committed
