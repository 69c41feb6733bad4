"""An in-memory world for driving the core's protocol in tests.

One keeper, a set of worker processes, a message queue whose faults (delay,
loss, duplication, reordering) the test controls, and a clock that only moves
when told. Every output of the core is turned into an effect here and nowhere
else, the way a real driver would; the observations the invariants need are
collected on the way.

A worker id may have several processes alive at once: a paused process whose
id was started again (``restart_paused``) wakes up as a *zombie*, an older
life. Messages addressed to an id reach every process of it (a stronger
adversary than one socket per life); each agent filters by incarnation.

Besides what each agent believes, the world keeps the ground truth of what
each process's trainer holds (``Proc.state``, ``Proc.shards``), so the
keeper's decisions (who is stale, who is a source, which replica survives)
can be checked against facts rather than against the claims they were made
from. Contributions commit only through the production rule: the worker asks
while its agent says it may (``Agent.may_step``, as ``real/worker.py`` does)
and the keeper's commit vote (``Keeper.commit``) answers.

Two driver styles of the simulator run here too: ``batched`` feeds joins as
``JoinBatch`` (the job's first arrival, the members' answers to a roll call,
brand-new workers, a relaunch's new lives), and ``bulk`` reports liveness in
bulk (``observe_alive_except`` before every keeper timer, ``observe_alive``
when a process goes silent) besides the heartbeats.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Optional

from rollcall.core.agent import Abort, Agent, Enter, Log, Phase, SendToKeeper, Stop
from rollcall.core.checkers import DataSpec
from rollcall.core.detector import LN10, PhiDetector, TimeoutDetector
from rollcall.core.history import commit, rec
from rollcall.core.keeper import (
    Broadcast, CommitVerdict, Deposed, Formed, JobFailed, Keeper, KeeperConfig, Persist, Record,
    Relaunch, RestartJob, Send,
)
from rollcall.core.record import KeeperRecord
from rollcall.core.liveness import Liveness
from rollcall.core.messages import Join, JoinBatch, Membership, Refused, RollCall
from rollcall.core.reshard import plan_step, sample_ids
from rollcall.core.sharding import ShardSpec
from rollcall.core.stragglers import StragglerPolicy
from rollcall.core.types import Cursor, WorkerId

KEEPER = -1
ORIGIN = Cursor()

# The data the model's steps consume: small enough that runs cross epochs.
GLOBAL_BATCH = 8
MICRO_BATCH = 2
DATA = DataSpec(seed=7, dataset_samples=24, global_batch=GLOBAL_BATCH, micro_batch=MICRO_BATCH)

RUNNING, PAUSED, CRASHED, LEFT = "running", "paused", "crashed", "left"


class SmallBulkLiveness(Liveness):
    """The keeper's liveness record with its bulk path taken from two workers
    on (the production threshold, 8, only trades speed), so that a model of
    a handful of workers runs the grouped code a simulator of 10^4 runs."""

    __slots__ = ()
    BULK_MIN = 2


@dataclass(eq=False)
class Proc:
    """One process life of a worker id: its agent and what its trainer holds."""

    agent: Agent
    status: str = RUNNING
    held: list = field(default_factory=list)  # the socket buffer while paused
    state: Optional[Cursor] = None  # the training state the trainer holds
    shards: frozenset[int] = frozenset()  # sharded state: replicas held at ``state``
    enter: Optional[Enter] = None  # the generation last entered
    ready: bool = False  # the copies and loads ``enter`` asked for are done
    ask: Optional["Ask"] = None  # its commit request, until it read the answer
    slow: float = 1.0  # a straggler's: its compute takes this many times as long

    @property
    def worker(self) -> WorkerId:
        return self.agent.worker

    @property
    def life(self) -> tuple[WorkerId, int]:
        return self.agent.worker, self.agent.incarnation

    @property
    def alive(self) -> bool:
        return self.status in (RUNNING, PAUSED) and self.agent.phase is not Phase.STOPPED

    @property
    def running(self) -> bool:
        return self.status == RUNNING and self.agent.phase is not Phase.STOPPED


@dataclass(eq=False)
class Ask:
    """A participant's request to commit the step of ``generation`` at
    ``cursor`` (``real/worker.py``): sent when the exchange completes (or when
    the paused participant wakes), answered by the keeper's commit vote on
    arrival, read by the worker when it runs. Until then the worker defers
    every other message, so a roll call is answered with the state it ends
    up holding."""

    proc: "Proc"
    generation: int
    cursor: Cursor
    sent: bool = False
    verdict: Optional[CommitVerdict] = None


@dataclass
class Exchange:
    """The all-or-nothing collective of one step over a generation's group.

    A physical effect, not a decision: only processes that entered the
    generation take part, each holding the state at ``cursor`` (its copies
    and loads done). Whether the result counts is the keeper's commit vote,
    asked by each participant after.
    """

    generation: int
    cursor: Cursor
    members: tuple[WorkerId, ...]
    arrived: dict[WorkerId, Proc] = field(default_factory=dict)

    def offer(self, p: Proc) -> str:
        if not p.agent.may_step(self.generation):
            return "not-active"
        if p.worker not in self.members:
            return "not-member"
        if not p.ready or p.state != self.cursor:
            return "not-ready"
        if p.worker in self.arrived:
            return "again"
        self.arrived[p.worker] = p
        return "accepted"

    @property
    def complete(self) -> bool:
        return len(self.arrived) == len(self.members)


@dataclass(order=True)
class Flight:
    at: float
    seq: int
    dst: Any = field(compare=False)  # KEEPER, a worker id, or a tuple of ids (a multicast)
    msg: Any = field(compare=False)
    # a JoinBatch: the (worker, incarnation, generation) of each sender
    lives: tuple = field(compare=False, default=())


class World:
    def __init__(self, n: int, *, min_workers: int = 1, max_workers: Optional[int] = None,
                 heartbeat_s: float = 0.5, timeout_s: float = 3.0, last_call_s: float = 0.5,
                 latency_s: float = 0.01, strategy: str = "elastic",
                 sharding: Optional[ShardSpec] = None, batched: bool = False,
                 bulk: bool = False, phi: bool = False, stragglers: bool = False,
                 durable: bool = False, max_restarts: Optional[int] = None) -> None:
        self.now = 0.0
        self.max_restarts = max_restarts
        self.latency_s = latency_s
        self.heartbeat_s = heartbeat_s
        self.batched = batched
        self.bulk = bulk
        self.keeper = Keeper(KeeperConfig(
            min_workers=min_workers, max_workers=max_workers or n, last_call_s=last_call_s,
            # phi: the threshold whose nominal silence is timeout_s (a worker
            # whose beats came late or in bursts gets more, never less)
            detector=PhiDetector(heartbeat_s, timeout_s / (heartbeat_s * LN10)) if phi
            else TimeoutDetector(heartbeat_s, timeout_s), strategy=strategy,
            relaunch_timeout_s=4 * timeout_s, sharding=sharding,
            # stragglers: a member twice the median for 2 steps is evicted, benched 0.5 s
            stragglers=StragglerPolicy(2.0, 2, 0.5, GLOBAL_BATCH, MICRO_BATCH, n)
            if stragglers else None, durable=durable, max_restarts=max_restarts))
        if bulk:
            self.keeper = Keeper(self.keeper.config, liveness=SmallBulkLiveness())
        # a durable record: the store's latest generation, and while
        # the keeper is down, when its successor takes over
        self.stored: Optional[KeeperRecord] = None
        self.keeper_back_at: Optional[float] = None
        self.takeovers = 0
        self.procs: dict[WorkerId, list[Proc]] = {}  # every life of each id, oldest first
        self.flights: list[Flight] = []
        self.sent: deque[Flight] = deque(maxlen=32)  # recent traffic the network may replay
        self._seq = itertools.count()
        self._answers: Optional[dict[Optional[Cursor], list[tuple]]] = None
        self._quiet_join = False  # the Join a spawn sends travels in a batch instead
        self.exchange: Optional[Exchange] = None
        self.failed: Optional[str] = None
        self.nodes_lost: set[int] = set()  # crashed with their node (keeper told)
        # observations
        self.views: dict[int, Membership] = {}  # gen -> the member list, as decided
        self.entered: dict[tuple[int, int], list[int]] = {}  # life -> gens entered
        self.violations: list[str] = []
        self.accepted: list[tuple[int, int, int, int]] = []  # (worker, life, gen, step)
        self.records: list[dict] = []
        self.joined: set[tuple[int, int]] = set()  # lives whose join reached the keeper
        self.newest: dict[int, int] = {}  # worker -> newest life that reached the keeper
        self.lineage: list[Cursor] = [ORIGIN]  # the end of every committed prefix
        self.durable: set[Cursor] = set()  # checkpoints written
        self.restarts = 0
        self._batch_join(self.spawn_many(range(n)))

    # --- processes ------------------------------------------------------------

    def spawn(self, w: int, incarnation: int) -> Proc:
        """Start life ``incarnation`` of worker ``w``: its agent asks to join."""
        assert all(p.agent.incarnation != incarnation for p in self.procs.get(w, ())), \
            f"life {incarnation} of worker {w} started twice"
        p = Proc(Agent(w, incarnation, self.heartbeat_s))
        self.procs.setdefault(w, []).append(p)
        self._apply_agent(p, p.agent.start(self.now, None))
        return p

    def spawn_many(self, ids: Any, lives: Optional[dict[int, int]] = None) -> list[Proc]:
        """Start several lives at once; when batched their joins travel as one."""
        self._quiet_join = self.batched
        try:
            return [self.spawn(w, (lives or {}).get(w, 0)) for w in ids]
        finally:
            self._quiet_join = False

    def latest(self, w: int) -> Proc:
        return self.procs[w][-1]

    def processes(self) -> list[Proc]:
        """Every process ever started, by (worker, life)."""
        return [p for w in sorted(self.procs) for p in self.procs[w]]

    def running_ids(self) -> set[int]:
        return {p.worker for p in self.processes() if p.running}

    def admitted(self, generation: int, w: int) -> Optional[Proc]:
        """The process of the life generation ``generation`` admitted for ``w``."""
        m = self.views[generation]
        life = m.incarnations[m.members.index(w)]
        return next((p for p in self.procs.get(w, ()) if p.agent.incarnation == life), None)

    def pause(self, p: Proc) -> None:
        assert p.running
        p.status = PAUSED
        self._went_silent(p)

    def resume(self, p: Proc) -> None:
        """Wake a paused process: it sends the commit request it owed, or reads
        the answer that came meanwhile, then what else its socket holds."""
        assert p.status == PAUSED
        p.status = RUNNING
        ask = p.ask
        if ask is not None and not ask.sent:
            self._send_ask(ask)
        elif ask is not None and ask.verdict is not None:
            self._read_answer(ask)
        else:
            self._read_held(p)

    def _read_held(self, p: Proc) -> None:
        while p.held and p.running and p.ask is None:
            self._apply_agent(p, p.agent.receive(self.now, p.held.pop(0)))

    def crash(self, p: Proc) -> None:
        if p.status == RUNNING:
            self._went_silent(p)
        p.status = CRASHED
        p.held, p.ask = [], None

    def _went_silent(self, p: Proc) -> None:
        """Bulk liveness: the keeper hears when the life it tracks last beat."""
        k = self.keeper
        if self.bulk and p.agent.incarnation == k.incarnation_of(p.worker):
            k.observe_alive(self.now, (p.worker,))

    # --- network --------------------------------------------------------------

    def send(self, dst: Any, msg: Any, delay: Optional[float] = None, lives: tuple = ()) -> None:
        at = self.now + (self.latency_s if delay is None else delay)
        flight = Flight(at, next(self._seq), dst, msg, lives)
        heapq.heappush(self.flights, flight)
        if not isinstance(msg, Ask):
            self.sent.append(flight)

    def deliver(self, flight: Flight) -> None:
        if isinstance(flight.msg, Ask):
            self._commit_vote(flight.msg)
        elif flight.dst == KEEPER:
            self._to_keeper(flight)
        elif isinstance(flight.dst, tuple):
            self._multicast(flight.dst, flight.msg)
        else:
            self._to_worker(flight.dst, flight.msg)

    def _to_worker(self, w: int, msg: Any) -> None:
        for p in self.procs.get(w, ()):
            if p.status == PAUSED or (p.running and p.ask is not None):
                p.held.append(msg)  # in the socket buffer until it wakes, or reads its answer
            elif p.running:
                self._apply_agent(p, p.agent.receive(self.now, msg))

    def _multicast(self, ws: tuple[int, ...], msg: Any) -> None:
        """A roll call heard by many at once: the members' answers travel as
        one JoinBatch per cursor held, as the simulator sends them."""
        self._answers = {}
        try:
            for w in ws:
                self._to_worker(w, msg)
            answers, self._answers = self._answers, None
        finally:
            self._answers = None
        for cursor, lives in answers.items():
            (gen,) = {g for _, _, g in lives}  # members of the current generation answering
            self.send(KEEPER, JoinBatch(tuple(w for w, _, _ in lives), cursor, None, gen),
                      lives=tuple(lives))

    def _batch_join(self, procs: list[Proc]) -> None:
        """When batched, the first joins of brand-new ids travel as one
        JoinBatch without incarnations (each is life 0, the keeper knows none)."""
        if not self.batched or not procs:
            return
        assert all(p.agent.incarnation == 0 and len(self.procs[p.worker]) == 1 for p in procs)
        lives = tuple((p.worker, 0, 0) for p in procs)
        self.send(KEEPER, JoinBatch(tuple(w for w, _, _ in lives), None), lives=lives)

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
        k_at = self.keeper.get_timer() if self.keeper_back_at is None else self.keeper_back_at
        best: tuple[Optional[float], Any] = (k_at, KEEPER)
        for p in self.processes():
            t = p.agent.get_timer() if p.running else None
            if t is not None and (best[0] is None or t < best[0]):
                best = (t, p)
        return best

    def _fire(self, who: Any) -> None:
        if who == KEEPER and self.keeper_back_at is not None:
            self._take_over()
        elif who == KEEPER:
            if self.bulk:
                self.keeper.observe_alive_except(self.now, self._silent())
            self._apply_keeper(self.keeper.handle_timer(self.now))
        else:
            self._apply_agent(who, who.agent.handle_timer(self.now))

    def _silent(self) -> list[int]:
        """The ids whose life the keeper tracks is not beating (the simulator's
        "every node but these few is alive")."""
        k = self.keeper
        beating = {p.worker for p in self.processes()
                   if p.running and p.agent.incarnation == k.incarnation_of(p.worker)}
        return sorted(set(self.procs) - beating)

    # --- the keeper's side -----------------------------------------------------

    def _to_keeper(self, flight: Flight) -> None:
        msg = flight.msg
        if self.keeper_back_at is not None:
            return  # no keeper to hear it (a commit request: see _commit_vote)
        if isinstance(msg, JoinBatch):
            self._keeper_hears(msg, tuple((w, inc) for w, inc, _ in flight.lives))
        else:
            joins = ((msg.worker, msg.incarnation),) if isinstance(msg, Join) else ()
            self._keeper_hears(msg, joins)

    def _keeper_hears(self, msg: Any, joins: tuple[tuple[int, int], ...]) -> None:
        """Deliver ``msg``; a message from a life older than one that already
        reached the keeper must be refused as stale, whatever it says."""
        k = self.keeper
        w, life = getattr(msg, "worker", None), getattr(msg, "incarnation", None)
        older = w is not None and k.failed is None and life < self.newest.get(w, -1)
        out = k.receive(self.now, msg)
        for x, inc in joins:
            self.joined.add((x, inc))
            self.newest[x] = max(inc, self.newest.get(x, -1))
        if older and not any(
                isinstance(o, Send) and isinstance(o.message, Refused) and o.to == w
                and o.message.incarnation == life and o.message.reason == "stale-incarnation"
                for o in out):
            self._violate(f"the keeper took {type(msg).__name__} from life {life} of worker "
                          f"{w} after life {self.newest[w]} joined")
        self._apply_keeper(out)

    def _apply_keeper(self, outputs: list) -> None:
        for out in outputs:
            if isinstance(out, Send):
                self._note_membership(out.message)
                self.send(out.to, out.message)
            elif isinstance(out, Broadcast):
                self._note_membership(out.message)
                if self.batched and isinstance(out.message, RollCall):
                    self.send(tuple(out.to), out.message)
                else:
                    for w in out.to:
                        self.send(w, out.message)
            elif isinstance(out, Record):
                self.records.append(out.record)
            elif isinstance(out, Formed):
                self.exchange = Exchange(out.generation, out.cursor, tuple(out.members))
            elif isinstance(out, RestartJob):
                self.restarts += 1
                for w in out.teardown:  # every process of a member id (real/launcher.py)
                    for p in self.procs.get(w, ()):
                        if p.alive:
                            self.crash(p)
            elif isinstance(out, Relaunch):
                self._relaunch(out)
            elif isinstance(out, JobFailed):
                self.failed = out.reason
            elif isinstance(out, Persist):
                self._persist(out)
            elif isinstance(out, Deposed):
                self._violate(f"the only keeper of term {self.keeper.term} was deposed: {out}")

    # --- the durable record and failover -------------------------------------------

    def _persist(self, out: Persist) -> None:
        """The store's compare-and-set: the generation after the one it holds,
        or that one again (a restart's budget), from the current term; then
        the keeper hears the answer."""
        last = 0 if self.stored is None else self.stored.generation
        ok = out.generation == last + (0 if out.again else 1) and out.term == self.keeper.term
        if not ok:
            self._violate(f"Persist of generation {out.generation} (term {out.term}) "
                          f"after generation {last}")
        else:
            self.stored = out.record
        self._apply_keeper(self.keeper.persisted(self.now, out.generation, ok))

    @property
    def keeper_up(self) -> bool:
        """Whether a keeper serves now (the supervisor's reports reach it)."""
        return self.keeper_back_at is None

    def fail_keeper(self, outage_s: float) -> None:
        """The keeper process dies; a standby takes over ``outage_s`` later
        (the lease's expiry and an election), from the store's record. The
        messages sent to the keeper meanwhile are lost."""
        assert self.keeper.config.durable and self.keeper_back_at is None
        self.keeper_back_at = self.now + outage_s

    def _take_over(self) -> None:
        old = self.keeper
        k = Keeper.restored(old.config, self.stored, old.term + 1)
        if self.bulk:
            k.liveness = SmallBulkLiveness()
        self.keeper, self.keeper_back_at = k, None
        self.takeovers += 1
        # what the new keeper knows of lives: the record's, not what reached the old one
        self.newest = {w: ps[-1].agent.incarnation for w, ps in self.procs.items()
                       if (w, ps[-1].agent.incarnation) in self.joined}
        started = {w: ps[-1].agent.incarnation for w, ps in self.procs.items()}
        self._apply_keeper(k.take_over(self.now, started))
        for w in sorted(self.nodes_lost):  # the supervisor reports what is down
            k.node_down(self.now, w)

    def _relaunch(self, order: Relaunch) -> None:
        """Start the lives the keeper names, as one JoinBatch of new lives when
        batched. The keeper must never name a life already started (never the
        same life twice); the model does not start one again."""
        lives = order.lives()
        for w in lives:
            if w in self.nodes_lost:  # the keeper hears of a lost node at once
                self._violate(f"relaunch of worker {w}, whose node is down: {order}")
        fresh = {w: inc for w, inc in lives.items()
                 if all(p.agent.incarnation != inc for p in self.procs.get(w, ()))}
        for w in sorted(set(lives) - set(fresh)):
            self._violate(f"relaunch of life {lives[w]} of worker {w}, already started: {order}")
        procs = self.spawn_many(sorted(fresh), fresh)
        if self.batched and procs:
            whole = len(fresh) == len(lives)
            incs = order.incarnations if whole else tuple(fresh[w] for w in sorted(fresh))
            ws = order.workers if whole else tuple(sorted(fresh))
            self.send(KEEPER, JoinBatch(ws, None, incs),
                      lives=tuple((w, fresh[w], 0) for w in sorted(fresh)))

    def _note_membership(self, msg: Any) -> None:
        if not isinstance(msg, Membership):
            return
        seen = self.views.get(msg.generation)
        if seen is None:
            self.views[msg.generation] = msg
            self._new_generation(msg)
        elif (tuple(seen.members), tuple(seen.incarnations)) != (
                tuple(msg.members), tuple(msg.incarnations)):
            self._violate(f"two member lists for generation {msg.generation}: "
                          f"{seen.members} vs {msg.members}")

    # --- a generation's decision, checked against the facts ----------------------

    def _violate(self, what: str) -> None:
        self.violations.append(f"t={self.now:.3f}: {what}")

    def _new_generation(self, m: Membership) -> None:
        """Generation ``m.generation`` was just decided; nothing moved since."""
        if len(m.members) > self.keeper.config.max_workers:
            self._violate(f"generation {m.generation} has {len(m.members)} members")
        for w, inc in zip(m.members, m.incarnations):
            if (w, inc) not in self.joined:
                self._violate(f"generation {m.generation} admits life {inc} of worker {w}, "
                              f"which never asked to join")
        self._check_resume(m)
        if m.source is not None:
            self._check_holders(m)
        if m.placement is not None:
            self._check_shards(m)

    def _check_resume(self, m: Membership) -> None:
        """The resume cursor ends a prefix of the committed steps, at or after the
        checkpoint; without a source it is the checkpoint (or the origin)."""
        c, ck, g = m.cursor, self.keeper.checkpoint, m.generation
        if c in self.lineage:
            del self.lineage[self.lineage.index(c) + 1:]  # the steps after it are lost
        else:
            self._violate(f"generation {g} resumes at {c}, which ends no prefix of the "
                          f"lineage (it ends at {self.lineage[-1]})")
        if ck is not None and c < ck:
            self._violate(f"generation {g} resumes at {c}, behind the checkpoint {ck}")
        if m.source is None and c != (ck or ORIGIN):
            self._violate(f"generation {g} resumes at {c} without a source, "
                          f"not at the checkpoint {ck}")

    def _check_holders(self, m: Membership) -> None:
        """Every member not told to copy (the source too) holds the state at the cursor."""
        for w in m.members:
            p = self.admitted(m.generation, w)
            if w not in m.stale and p is not None and p.alive and p.state != m.cursor:
                role = "the source" if w == m.source else "not stale"
                self._violate(f"generation {m.generation}: worker {w} is {role} but holds "
                              f"{p.state}, not {m.cursor}")

    def _check_shards(self, m: Membership) -> None:
        """Holders are members; a plan copies only replicas that exist and keeps
        only replicas that are held; a fallback copies nothing."""
        g, members, plan = m.generation, set(m.members), m.recovery
        for s, holders in enumerate(m.placement):
            if not holders or not set(holders) <= members:
                self._violate(f"generation {g}: shard {s} held by {holders}, members {members}")
        if m.fallback:
            if m.source is not None or set(m.stale) != members or plan is None or plan.copies:
                self._violate(f"generation {g} falls back but copies or keeps state: {m}")
            return
        if plan is None:
            return  # a fresh placement: every holder starts or loads its shards
        if plan.reloads or plan.placement.shards != m.placement:
            self._violate(f"generation {g}: a plan without fallback reloads or disagrees: {plan}")
        for c in plan.copies:
            src = self.admitted(g, c.src) if c.src in members else None
            if src is None:
                self._violate(f"generation {g} copies shard {c.shard} from non-member {c.src}")
            elif src.alive and not self._holds(src, m.cursor, c.shard):
                self._violate(f"generation {g} copies shard {c.shard} from worker {c.src}, "
                              f"which does not hold it at {m.cursor}", g, src.life)
        copied = {(c.shard, c.dst) for c in plan.copies}
        for s, holders in enumerate(m.placement):
            for h in holders:
                p = self.admitted(g, h)
                if (s, h) not in copied and p.alive and not self._holds(p, m.cursor, s):
                    self._violate(f"generation {g}: worker {h} keeps shard {s}, which it does "
                                  f"not hold at {m.cursor} ({sorted(p.shards)} at {p.state})")

    @staticmethod
    def _holds(p: Optional[Proc], cursor: Cursor, shard: Optional[int] = None, *,
               running: bool = False) -> bool:
        """``p`` holds the state at ``cursor`` (and ``shard``); ``running``: and
        can send it now (a paused or dead source fails a copy)."""
        return (p is not None and (p.running if running else p.alive) and p.state == cursor
                and (shard is None or shard in p.shards))

    # --- the agents' side --------------------------------------------------------

    def _apply_agent(self, p: Proc, actions: list) -> None:
        for act in actions:
            if isinstance(act, SendToKeeper):
                self._from_agent(p, act.message)
            elif isinstance(act, Enter):
                self._entered(p, act)
            elif isinstance(act, Log):
                self.records.append(act.record)
            elif isinstance(act, (Abort, Stop)):
                pass  # nothing in flight counts: an agent that moved on never asks to commit

    def _from_agent(self, p: Proc, msg: Any) -> None:
        if self._quiet_join and isinstance(msg, Join):
            return  # the spawn's batch carries it
        k = self.keeper
        if (self._answers is not None and isinstance(msg, Join)
                and k.is_member(p.worker, msg.generation)
                and msg.incarnation == k.incarnation_of(p.worker)):
            # a member of the current generation answering, as the life the keeper knows
            self._answers.setdefault(msg.cursor, []).append(
                (p.worker, msg.incarnation, msg.generation))
            return
        self.send(KEEPER, msg)

    def _entered(self, p: Proc, e: Enter) -> None:
        gens = self.entered.setdefault(p.life, [])
        if gens and e.generation <= gens[-1]:
            self._violate(f"life {p.life} went back to {e.generation} from {gens[-1]}")
        gens.append(e.generation)
        m = self.views.get(e.generation)
        if m is None or tuple(m.members) != tuple(e.members) or not m.admits(*p.life):
            self._violate(f"life {p.life} entered {e.generation} with {e.members}, "
                          f"decided {m and m.members}")
        if e.source is not None and not e.sync and p.state != e.cursor:
            self._violate(f"life {p.life} entered {e.generation} as current at {e.cursor} "
                          f"but holds {p.state}")
        p.enter, p.ready = e, False
        moves = e.recovery is not None and any(
            x.dst == p.worker for x in (*e.recovery.copies, *e.recovery.reloads))
        if not (e.sync or moves):
            self.recover(p)

    # --- training -----------------------------------------------------------------

    def recover(self, p: Proc) -> bool:
        """Do what ``p``'s Enter asks before the first step: copy the state from
        the source, or load the checkpoint (start at the origin); copy and
        reload shards. A copy from a process that does not hold what it
        should (or is not running) fails, and the trainer reports the step."""
        e, w = p.enter, p.worker
        assert e is not None and not p.ready
        if not p.agent.may_step(e.generation):
            return False  # superseded before it was done
        shards = set(p.shards) if p.state == e.cursor else set()
        if e.source is None or (e.placement is not None and e.recovery is None):
            self._load(p, e.cursor)
            shards = set(_shards_of(e, w))
        if e.source is not None and e.sync and not self._holds(
                self.admitted(e.generation, e.source), e.cursor, running=True):
            return self._copy_failed(p)
        for c in e.recovery.copies if e.recovery is not None else ():
            if c.dst == w:
                if not self._holds(self.admitted(e.generation, c.src), e.cursor, c.shard,
                                   running=True):
                    return self._copy_failed(p)
                shards.add(c.shard)
        for r in e.recovery.reloads if e.recovery is not None else ():
            if r.dst == w:
                self._load(p, e.cursor)
                shards.add(r.shard)
        missing = set(_shards_of(e, w)) - shards
        if missing:
            self._violate(f"after its recovery for {e.generation} worker {w} lacks shards "
                          f"{sorted(missing)}")
        p.state, p.shards, p.ready = e.cursor, frozenset(shards), True
        if e.sync:
            self._apply_agent(p, p.agent.state_ready(self.now, e.cursor))
        return True

    def _load(self, p: Proc, cursor: Cursor) -> None:
        if cursor != ORIGIN and cursor not in self.durable:
            self._violate(f"worker {p.worker} told to load a checkpoint at {cursor}, "
                          f"which was never written")

    def _copy_failed(self, p: Proc) -> bool:
        assert p.enter is not None
        self._apply_agent(p, p.agent.step_failed(self.now, p.enter.cursor.step))
        return False

    def contribute(self, p: Proc) -> str:
        """``p`` offers its gradient to the current exchange; when it completes,
        every participant asks the commit vote (a paused one when it wakes)."""
        ex = self.exchange
        if ex is None:
            return "no-exchange"
        verdict = ex.offer(p)
        if verdict != "accepted":
            return verdict
        self._ledger(p, ex)
        if ex.complete:
            self.exchange = Exchange(ex.generation, _after(ex.cursor), ex.members)
            for w in sorted(ex.arrived):
                q = ex.arrived[w]
                if q.alive:
                    q.ask = Ask(q, ex.generation, ex.cursor)
                    if q.running:
                        self._send_ask(q.ask)
        return verdict

    def _ledger(self, p: Proc, ex: Exchange) -> None:
        """The per-sample record of what ``p`` trained on (as ``real/worker.py``)."""
        plan = plan_step(ex.cursor, ex.members, global_batch=GLOBAL_BATCH, micro_batch=MICRO_BATCH)
        ids = [i for j in plan.shards_of(p.worker) for offs in (plan.shard_offsets(j),)
               for i in sample_ids(DATA.seed, DATA.dataset_samples, offs.start, offs.stop)]
        if ids:
            self.records.append(rec(self.now, "ok", "contribute", p.worker, gen=ex.generation,
                                    step=ex.cursor.step, samples=ids))

    def _send_ask(self, ask: Ask) -> None:
        """The production commit rule, worker side: ask only while the agent
        says it may step (``real/worker.py``); the request is never lost."""
        p = ask.proc
        if not p.agent.may_step(ask.generation):
            p.ask = None
            self._read_held(p)
            return
        ask.sent = True
        self.send(KEEPER, ask)

    def _commit_vote(self, ask: Ask) -> None:
        """The request arrives (its sender may have died since): the keeper's
        commit vote answers it."""
        p, a = ask.proc, ask.proc.agent
        if self.keeper_back_at is not None:  # its connection to the keeper broke
            v = CommitVerdict(False, "keeper-lost")
        else:
            v = self.keeper.commit(self.now, p.worker, a.incarnation, ask.generation,
                                   ask.cursor.step)
        ask.verdict = v
        if v.ok and a.incarnation != self.newest.get(p.worker):
            self._violate(f"life {p.life} committed step {ask.cursor.step} of {ask.generation} "
                          f"after life {self.newest.get(p.worker)} joined")
        if v.first:
            nxt = _after(ask.cursor)
            if ask.cursor != self.lineage[-1]:
                self._violate(f"step {ask.cursor.step} of {ask.generation} commits at "
                              f"{ask.cursor}, but the lineage ends at {self.lineage[-1]}")
            self.lineage.append(nxt)
            self.records.append(commit(self.now, p.worker, ask.generation, ask.cursor.step,
                                       ask.cursor.step, ask.cursor.sample, nxt.sample,
                                       GLOBAL_BATCH, self.now))
        self._report_compute(ask)
        if p.ask is ask and p.running:
            self._read_answer(ask)

    def _report_compute(self, ask: Ask) -> None:
        """The compute the request carries, for the straggler policy (``real/worker.py``)."""
        p = ask.proc
        view = self.views.get(ask.generation)
        if view is None or p.worker not in view.members:
            load = 0
        else:
            plan = plan_step(ask.cursor, tuple(view.members), global_batch=GLOBAL_BATCH,
                             micro_batch=MICRO_BATCH)
            load = plan.load(p.worker)
        self._apply_keeper(self.keeper.report_compute(
            self.now, p.worker, p.agent.incarnation, ask.generation, ask.cursor.step,
            0.01 * load * p.slow, load))

    def _read_answer(self, ask: Ask) -> None:
        """The worker reads the vote: on yes it applies the step, then it hears
        the messages it deferred."""
        p, v = ask.proc, ask.verdict
        assert v is not None and p.ask is ask and p.running
        p.ask = None
        if v.ok:
            if p.state != ask.cursor:
                self._violate(f"life {p.life} applies step {ask.cursor.step} holding {p.state}")
            nxt = _after(ask.cursor)
            p.state = nxt
            if p.enter is not None and p.enter.placement is not None:  # copies proven done
                p.shards = frozenset(_shards_of(p.enter, p.worker))
            self._apply_agent(p, p.agent.step_committed(self.now, nxt))
            self.accepted.append((p.worker, p.agent.incarnation, ask.generation, ask.cursor.step))
        self._read_held(p)

    def checkpoint(self, p: Proc) -> bool:
        """``p`` writes the state it holds durably, then tells the keeper."""
        a = p.agent
        if not (p.running and p.ready and a.may_step(a.generation) and p.state is not None):
            return False
        self.durable.add(p.state)
        self.records.append(rec(self.now, "ok", "checkpoint", p.worker, gen=a.generation,
                                cursor=p.state.to_json()))
        self._apply_agent(p, a.checkpointed(self.now, p.state))
        return True

    def step_failed(self, p: Proc) -> None:
        a = p.agent
        if p.running and a.may_step(a.generation):
            step = self.exchange.cursor.step if self.exchange else 0
            self._apply_agent(p, a.step_failed(self.now, step))

    def leave(self, p: Proc) -> None:
        self._apply_agent(p, p.agent.leave(self.now))
        p.status = LEFT

    # --- liveness -----------------------------------------------------------------

    def settled(self) -> bool:
        """No round open; every running process is the one life of its id; as
        many of them as fit are members, active in the keeper's generation
        as the lives it admitted, and the rest wait as standbys."""
        k = self.keeper
        procs = [p for p in self.processes() if p.running]
        ids = {p.worker for p in procs}
        if k.round is not None or len(procs) != len(ids):
            return False
        members = dict(zip(k.members, k.member_lives))
        if not set(members) <= ids or len(members) != min(len(ids), k.config.max_workers):
            return False
        for p in procs:
            a = p.agent
            if p.worker not in members:
                if a.phase is not Phase.JOINING:
                    return False
            elif (a.phase is not Phase.ACTIVE or a.generation != k.generation
                  or a.incarnation != members[p.worker]):
                return False
        return True

    def train_members(self) -> None:
        """Every member of the keeper's generation recovers and offers."""
        k = self.keeper
        for w in k.members:
            p = self.admitted(k.generation, w)
            if p is not None and p.running and (p.ready or self.recover(p)):
                self.contribute(p)


def _after(cursor: Cursor) -> Cursor:
    return Cursor(cursor.step + 1, cursor.sample + GLOBAL_BATCH)


def _shards_of(e: Enter, w: WorkerId) -> tuple[int, ...]:
    """The shards ``w`` holds in the placement ``e`` carries (none: replicated state)."""
    return tuple(s for s, h in enumerate(e.placement or ()) if w in h)
