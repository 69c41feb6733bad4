"""An in-memory world for driving the core's protocol in tests.

One keeper, a set of agents, a message queue whose faults (delay, loss,
duplication, reordering) the test controls, and a clock that only moves when
told. Every output of the core is turned into an effect here and nowhere
else, the way a real driver would; the observations the invariants need are
collected on the way.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Any, Optional

from rollcall.core.agent import Abort, Agent, Enter, Log, Phase, SendToKeeper, Stop
from rollcall.core.detector import TimeoutDetector
from rollcall.core.keeper import (
    Broadcast, Formed, JobFailed, Keeper, KeeperConfig, Record, Relaunch, RestartJob, Send,
)
from rollcall.core.messages import Membership
from rollcall.core.types import Cursor, WorkerId

KEEPER = -1


@dataclass
class Exchange:
    """The all-or-nothing collective of one step over a generation's group.

    A physical effect, not a decision: only the group's members can take
    part, stamped with its generation. Whether the result counts is the
    keeper's commit vote (``Keeper.commit``), asked by each member after.
    """

    generation: int
    step: int
    members: frozenset[WorkerId]
    arrived: set[WorkerId] = field(default_factory=set)

    def offer(self, worker: WorkerId, generation: int, step: int) -> str:
        if generation != self.generation:
            return "stale-generation"
        if worker not in self.members:
            return "not-member"
        if step != self.step:
            return "wrong-step"
        self.arrived.add(worker)
        return "accepted"

    @property
    def complete(self) -> bool:
        return self.arrived >= self.members


@dataclass(order=True)
class Flight:
    at: float
    seq: int
    dst: int = field(compare=False)
    msg: Any = field(compare=False)
    src_incarnation: int = field(compare=False, default=0)


class World:
    def __init__(self, n: int, *, min_workers: int = 1, max_workers: Optional[int] = None,
                 heartbeat_s: float = 0.5, timeout_s: float = 3.0, last_call_s: float = 0.5,
                 latency_s: float = 0.01, strategy: str = "elastic") -> None:
        self.now = 0.0
        self.latency_s = latency_s
        self.heartbeat_s = heartbeat_s
        self.timeout_s = timeout_s
        self.keeper = Keeper(KeeperConfig(
            min_workers=min_workers, max_workers=max_workers or n, last_call_s=last_call_s,
            detector=TimeoutDetector(heartbeat_s, timeout_s), strategy=strategy,
            relaunch_timeout_s=4 * timeout_s))
        self.agents: dict[int, Agent] = {}
        self.crashed: set[int] = set()
        self.paused: set[int] = set()
        self.left: set[int] = set()
        self.flights: list[Flight] = []
        self.held: dict[int, list[Any]] = {}
        self._seq = itertools.count()
        # observations
        self.views: dict[int, tuple[int, ...]] = {}       # gen -> members, as decided
        self.entered: dict[int, list[int]] = {}            # worker -> gens entered, in order
        self.acted_outside: list[str] = []
        self.accepted: list[tuple[int, int, int]] = []     # (worker, gen, step) accepted
        self.records: list[dict] = []
        self.exchange: Optional[Exchange] = None
        self.failed: Optional[str] = None
        self.nodes_lost: set[int] = set()  # crashed with their node (keeper told)
        self.restarts = 0
        for w in range(n):
            self.spawn(w, 0)

    # --- processes ------------------------------------------------------------

    def spawn(self, w: int, incarnation: int) -> None:
        agent = Agent(w, incarnation, self.heartbeat_s)
        self.agents[w] = agent
        self.crashed.discard(w)
        self.paused.discard(w)
        self.left.discard(w)
        self._apply_agent(w, agent.start(self.now, None))

    def resume(self, w: int) -> None:
        self.paused.discard(w)
        for msg in self.held.pop(w, []):
            self.send(w, msg, delay=0.0)

    def live(self) -> set[int]:
        return {w for w, a in self.agents.items()
                if w not in self.crashed and w not in self.paused and w not in self.left
                and a.phase is not Phase.STOPPED}

    # --- network --------------------------------------------------------------

    def send(self, dst: int, msg: Any, delay: Optional[float] = None, incarnation: int = 0) -> None:
        at = self.now + (self.latency_s if delay is None else delay)
        heapq.heappush(self.flights, Flight(at, next(self._seq), dst, msg, incarnation))

    def deliver(self, flight: Flight) -> None:
        if flight.dst == KEEPER:
            self._apply_keeper(self.keeper.receive(self.now, flight.msg))
            return
        w = flight.dst
        if w in self.crashed or w in self.left:
            return
        if w in self.paused:  # sits in the socket buffer until it wakes
            self.held.setdefault(w, []).append(flight.msg)
            return
        self._apply_agent(w, self.agents[w].receive(self.now, flight.msg))

    def advance(self, dt: float) -> None:
        """Move the clock, delivering due messages and firing due timers."""
        end = self.now + dt
        budget = 100_000  # a protocol that livelocks at one instant is a bug
        while True:
            budget -= 1
            assert budget > 0, "message storm: the protocol livelocked"

            t_msg = self.flights[0].at if self.flights else None
            t_tim, who = self._next_timer()
            candidates = [t for t in (t_msg, t_tim) if t is not None and t <= end]
            if not candidates:
                break
            t = min(candidates)
            self.now = max(self.now, t)
            if t_msg is not None and t_msg == t:
                self.deliver(heapq.heappop(self.flights))
            else:
                self._fire(who)
        self.now = end

    def _next_timer(self) -> tuple[Optional[float], Any]:
        best: tuple[Optional[float], Any] = (self.keeper.get_timer(), KEEPER)
        for w, a in self.agents.items():
            if w in self.crashed or w in self.paused or w in self.left:
                continue
            t = a.get_timer()
            if t is not None and (best[0] is None or t < best[0]):
                best = (t, w)
        return best

    def _fire(self, who: Any) -> None:
        if who == KEEPER:
            self._apply_keeper(self.keeper.handle_timer(self.now))
        else:
            self._apply_agent(who, self.agents[who].handle_timer(self.now))

    # --- effects --------------------------------------------------------------

    def _apply_keeper(self, outputs: list) -> None:
        for out in outputs:
            if isinstance(out, Send):
                self._note_membership(out.message)
                self.send(out.to, out.message)
            elif isinstance(out, Broadcast):
                self._note_membership(out.message)
                for w in out.to:
                    self.send(w, out.message)
            elif isinstance(out, Record):
                self.records.append(out.record)
            elif isinstance(out, Formed):
                self.exchange = Exchange(out.generation, out.cursor.step, frozenset(out.members))
            elif isinstance(out, RestartJob):
                self.restarts += 1
                for w in out.teardown:  # every member process is killed
                    if w not in self.left:
                        self.crashed.add(w)
                        self.paused.discard(w)
            elif isinstance(out, Relaunch):
                for w, inc in out.lives().items():
                    # the keeper hears of a lost node at once; of a leave only
                    # when the message arrives, so a leaver may be relaunched
                    assert w not in self.nodes_lost, (w, out)
                    if self.agents[w].incarnation < inc:  # a repeated order is harmless
                        self.spawn(w, inc)
            elif isinstance(out, JobFailed):
                self.failed = out.reason

    def _note_membership(self, msg: Any) -> None:
        if isinstance(msg, Membership):
            seen = self.views.setdefault(msg.generation, msg.members)
            if seen != msg.members:
                self.acted_outside.append(
                    f"two member lists for generation {msg.generation}: {seen} vs {msg.members}")

    def _apply_agent(self, w: int, actions: list) -> None:
        agent = self.agents[w]
        for act in actions:
            if isinstance(act, SendToKeeper):
                self.send(KEEPER, act.message, incarnation=agent.incarnation)
            elif isinstance(act, Enter):
                gens = self.entered.setdefault(w, [])
                if gens and act.generation <= gens[-1]:
                    self.acted_outside.append(f"worker {w} went back to {act.generation} from {gens[-1]}")
                gens.append(act.generation)
                decided = self.views.get(act.generation)
                if decided is None or w not in decided or decided != act.members:
                    self.acted_outside.append(
                        f"worker {w} entered {act.generation} with {act.members}, decided {decided}")
            elif isinstance(act, Log):
                self.records.append(act.record)
            elif isinstance(act, (Abort, Stop)):
                pass

    # --- training -------------------------------------------------------------

    def contribute(self, w: int, forged_generation: Optional[int] = None) -> str:
        """Worker ``w`` offers its gradient to the current exchange.

        ``forged_generation`` lets a test make a worker claim a generation, as
        a stale worker that wakes up mid-step would.
        """
        agent = self.agents[w]
        ex = self.exchange
        if ex is None:
            return "no-exchange"
        gen = agent.generation if forged_generation is None else forged_generation
        verdict = ex.offer(w, gen, ex.step)
        if verdict == "accepted" and ex.complete:
            # every member asks the production commit vote whether it counts
            for m in sorted(ex.members):
                a = self.agents.get(m)
                if a is None or m in self.crashed or m in self.left:
                    continue
                v = self.keeper.commit(self.now, m, a.incarnation, ex.generation, ex.step)
                if v.ok:
                    self.accepted.append((m, ex.generation, ex.step))
                    a.step_committed(self.now, Cursor(ex.step + 1, 0))
            self.exchange = Exchange(ex.generation, ex.step + 1, ex.members)
        return verdict
