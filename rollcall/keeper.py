"""The record-keeper: the one place a generation's member list is decided.

Sans-IO (after h11 and aioquic): messages and ``now`` go in, outputs come
out, and ``get_timer()`` says when the driver must call ``handle_timer``.
The keeper reads no clock and sends nothing itself.

Agreement. Every change to the record is a compare-and-set against the
stamps the request carries: a join from an older incarnation, a heartbeat
or step report stamped with a superseded generation, a message from an
evicted worker are refused and answered with the current generation. A
generation is decided once, here, so every worker that enters generation
``g`` receives the same ordered member list.

Liveness. The keeper notes on its own clock when each worker's heartbeat
counter last advanced and asks the detector policy for a verdict; it never
compares a worker's clock with its own.

Rounds. A roll call for generation ``g+1`` opens when a member is declared
dead, leaves, reports a failed step, or a newcomer asks to join while there
is room. Members of ``g`` that are still alive are *expected*: the round
waits for each of them until it answers or the detector declares it dead,
so a slow worker is evicted by the detector's timeout, never by the round.
A round made only of old members closes as soon as they have all answered;
one with newcomers holds a last-call window for more of them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from itertools import repeat
from typing import Iterable, Optional, Union

from rollcall.detector import TimeoutDetector
from rollcall.history import KEEPER, rec
from rollcall.messages import (
    Checkpointed, Heartbeat, Join, JoinBatch, Leave, Membership, Refused, RollCall,
    StepFailed, ToKeeper, ToWorker,
)
from rollcall.types import Cursor, WorkerId, runs_of_sorted

ELASTIC = "elastic"
CHECKPOINT_RESTART = "checkpoint-restart"


@dataclass(frozen=True)
class KeeperConfig:
    min_workers: int
    max_workers: int
    last_call_s: float
    detector: TimeoutDetector
    join_timeout_s: Optional[float] = None
    strategy: str = ELASTIC
    # How long a restart round waits for a relaunched worker that never
    # joins (its host may be dead too); None: as long as join_timeout_s.
    relaunch_timeout_s: Optional[float] = None

    def __post_init__(self) -> None:
        if not 1 <= self.min_workers <= self.max_workers:
            raise ValueError("need 1 <= min_workers <= max_workers")
        if self.strategy not in (ELASTIC, CHECKPOINT_RESTART):
            raise ValueError(f"unknown strategy {self.strategy!r}")


# --- outputs -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Send:
    to: WorkerId
    message: ToWorker


@dataclass(frozen=True, slots=True)
class Broadcast:
    to: tuple[WorkerId, ...]
    message: ToWorker


@dataclass(frozen=True, slots=True)
class Record:
    record: dict


@dataclass(frozen=True, slots=True)
class Formed:
    """A generation closed. ``stale`` members must copy state from ``source``."""

    generation: int
    members: tuple[WorkerId, ...]
    cursor: Cursor
    source: Optional[WorkerId]
    stale: tuple[WorkerId, ...]
    reason: str


@dataclass(frozen=True, slots=True)
class RestartJob:
    """Checkpoint-restart: tear every worker down and relaunch ``relaunch``.

    The keeper expects each relaunched worker (any newer incarnation) in the
    restart round, until it joins or ``join_timeout_s`` passes.
    """

    generation: int
    reason: str
    relaunch: tuple[WorkerId, ...] = ()
    incarnations: tuple[int, ...] = ()  # the life each relaunched worker starts as

    def relaunches(self) -> dict[WorkerId, int]:
        """Worker -> incarnation to start. Relaunching exactly these makes a
        repeated order harmless: the same life is not started twice."""
        return dict(zip(self.relaunch, self.incarnations))


@dataclass(frozen=True, slots=True)
class JobFailed:
    reason: str


Output = Union[Send, Broadcast, Record, Formed, RestartJob, JobFailed]


@dataclass
class Round:
    generation: int
    reason: str
    opened_at: float
    previous: frozenset[WorkerId]
    joined: dict[WorkerId, Optional[Cursor]] = field(default_factory=dict)
    by_cursor: dict[Optional[Cursor], set[WorkerId]] = field(default_factory=dict)
    expected: set[WorkerId] = field(default_factory=set)
    # the generation whose lineage an individually joining worker's state is of
    state_gen: dict[WorkerId, int] = field(default_factory=dict)

    def add(self, workers: set[WorkerId], cursor: Optional[Cursor]) -> None:
        """Record that ``workers`` joined holding state at ``cursor``."""
        for w in workers & self.joined.keys():  # a worker may join twice
            self.by_cursor[self.joined[w]].discard(w)
        self.joined.update(dict.fromkeys(workers, cursor))
        self.by_cursor.setdefault(cursor, set()).update(workers)
        self.expected.difference_update(workers)

    def drop(self, worker: WorkerId) -> None:
        if worker in self.joined:
            self.by_cursor[self.joined.pop(worker)].discard(worker)
        self.expected.discard(worker)
        self.state_gen.pop(worker, None)
    last_call_at: Optional[float] = None
    starved_since: Optional[float] = None
    expect_until: Optional[float] = None  # relaunched lives: not heartbeating yet


class Keeper:
    """The record-keeper's state machine."""

    def __init__(self, config: KeeperConfig) -> None:
        self.config = config
        self.generation = 0
        self.members: tuple[WorkerId, ...] = ()
        self._member_set: frozenset[WorkerId] = frozenset()
        self.cursor = Cursor()
        self.source: Optional[WorkerId] = None
        self.stale: tuple[WorkerId, ...] = ()
        self.incarnations: tuple[int, ...] = ()
        self.checkpoint: Optional[Cursor] = None
        self.round: Optional[Round] = None
        self.failed: Optional[str] = None
        self.incarnation: dict[WorkerId, int] = {}
        self.min_incarnation: dict[WorkerId, int] = {}
        self.standby: dict[WorkerId, Optional[Cursor]] = {}
        self.standby_gen: dict[WorkerId, int] = {}
        self.resumes: list[tuple[int, int]] = []  # (generation, resume step)
        self.counter: dict[WorkerId, int] = {}
        self.advanced_at: dict[WorkerId, float] = {}
        self._out: list[Output] = []

    # --- driver API -----------------------------------------------------------

    def receive(self, now: float, message: ToKeeper) -> list[Output]:
        """Handle one message that arrived at ``now``."""
        self._dispatch(now, message)
        return self._flush()

    def receive_many(self, now: float, messages: Iterable[ToKeeper]) -> list[Output]:
        """Handle messages that arrived at the same instant, in one call."""
        for message in messages:
            self._dispatch(now, message)
        return self._flush()

    def observe_alive(self, now: float, workers: Iterable[WorkerId]) -> None:
        """Mark the heartbeats of ``workers`` as advanced at ``now``.

        A batch form of :class:`Heartbeat` for simulators, which do not
        simulate every beat of every healthy node: the effect on the detector
        is the one each worker's next beat would have had.
        """
        tracked = self.advanced_at
        ws = workers if isinstance(workers, (set, frozenset)) else set(workers)
        tracked.update(dict.fromkeys(tracked.keys() & ws, now))

    def exited(self, now: float, worker: WorkerId, incarnation: int) -> list[Output]:
        """The worker's process is known to be gone (its host saw it exit)."""
        if self.incarnation.get(worker) == incarnation and worker in self.advanced_at:
            self._declare_dead(now, worker, "exited")
        return self._flush()

    def get_timer(self) -> Optional[float]:
        """The next instant at which :meth:`handle_timer` has work to do."""
        if self.failed is not None:
            return None
        times = []
        if self.advanced_at:
            times.append(self.config.detector.expiry(min(self.advanced_at.values())))
        r = self.round
        if r is not None:
            if r.last_call_at is not None:
                times.append(r.last_call_at)
            if r.starved_since is not None and self.config.join_timeout_s is not None:
                times.append(r.starved_since + self.config.join_timeout_s)
            if r.expect_until is not None and r.expected:
                times.append(r.expect_until)
        return min(times) if times else None

    def handle_timer(self, now: float) -> list[Output]:
        if self.failed is not None:
            return []
        dead: list[WorkerId] = []
        if self.advanced_at and self.config.detector.expiry(min(self.advanced_at.values())) <= now:
            dead = self.config.detector.expired(now, self.advanced_at)
        for worker in sorted(dead):
            self._declare_dead(now, worker, "timeout")
        r = self.round
        if r is not None and r.expect_until is not None and now >= r.expect_until and r.expected:
            for worker in sorted(r.expected):
                self._out.append(Record(rec(now, "info", "evict", KEEPER, worker=worker,
                                            incarnation=None, reason="never-relaunched")))
            r.expected.clear()
        self._maybe_close(now)
        return self._flush()

    def is_member(self, worker: WorkerId, generation: int) -> bool:
        return generation == self.generation and worker in self._member_set

    # --- message handling -----------------------------------------------------

    def _dispatch(self, now: float, message: ToKeeper) -> None:
        if self.failed is not None:
            return
        if not isinstance(message, JoinBatch) and not self._incarnation_ok(
                now, message.worker, message.incarnation):
            return
        if isinstance(message, Heartbeat):
            self._heartbeat(now, message)
        elif isinstance(message, Join):
            self._join(now, message)
        elif isinstance(message, JoinBatch):
            self._join_batch(now, message)
        elif isinstance(message, StepFailed):
            self._step_failed(now, message)
        elif isinstance(message, Leave):
            if message.worker in self.advanced_at:
                self._declare_dead(now, message.worker, "left")
        elif isinstance(message, Checkpointed):
            self._checkpointed(now, message)
        else:  # pragma: no cover - typing guards this
            raise TypeError(f"unknown message {message!r}")

    def _incarnation_ok(self, now: float, worker: WorkerId, incarnation: int) -> bool:
        known = max(self.incarnation.get(worker, 0), self.min_incarnation.get(worker, 0))
        if incarnation >= known:
            return True
        self._refuse(now, worker, incarnation, "message", "stale-incarnation")
        return False

    def _heartbeat(self, now: float, hb: Heartbeat) -> None:
        w = hb.worker
        if hb.incarnation != self.incarnation.get(w) or w not in self.advanced_at:
            self._refuse(now, w, hb.incarnation, "heartbeat", "not-member")
            return
        if hb.counter > self.counter.get(w, -1):
            self.counter[w] = hb.counter
            self.advanced_at[w] = now
        # Heal lost messages: a member behind the record learns the answer
        # again, an expected member that missed the roll call hears it again.
        r = self.round
        if r is not None and w in r.expected:
            self._out.append(Send(w, RollCall(r.generation, r.reason)))
        elif hb.generation < self.generation and w in self._member_set:
            self._out.append(Send(w, self._membership()))

    def _join(self, now: float, join: Join) -> None:
        w, inc = join.worker, join.incarnation
        known = self.incarnation.get(w)
        if known is not None and inc > known and w in self.advanced_at:
            # A new life of a worker we still track: its old life is over.
            self._declare_dead(now, w, "restarted")
        new_life = known is None or inc > known or w not in self.advanced_at
        self.incarnation[w] = inc
        if new_life:
            self.counter[w] = -1
        self.advanced_at[w] = now
        r = self.round
        if r is not None:
            r.add({w}, join.cursor)
            r.state_gen[w] = join.generation
            self._maybe_close(now)
            return
        if w in self._member_set and not new_life:
            if join.generation < self.generation:
                self._out.append(Send(w, self._membership()))  # a late duplicate
            else:
                self._fail_generation(now, "rejoin")  # a member wants a new round
                if self.round is not None:
                    self.round.add({w}, join.cursor)
                    self._maybe_close(now)
            return
        self.standby[w] = join.cursor
        self.standby_gen[w] = join.generation
        if self.generation == 0 or len(self.members) < self.config.max_workers:
            self._open(now, "start" if self.generation == 0 else "growth")

    def _join_batch(self, now: float, batch: JoinBatch) -> None:
        r = self.round
        workers = set(batch.workers)
        if batch.incarnations is None:
            incarnation = self.incarnation
            fast = workers & r.expected if r is not None else set()
        else:
            incarnation = dict(zip(batch.workers, batch.incarnations))
            fast = self._new_lives(workers, incarnation) if r is not None else set()
        if fast:
            self.advanced_at.update(dict.fromkeys(fast, now))
            r.add(fast, batch.cursor)
        for w in sorted(workers - fast):
            if self._incarnation_ok(now, w, incarnation.get(w, 0)):
                self._join(now, Join(w, incarnation.get(w, 0), batch.cursor))
        self._maybe_close(now)

    def _new_lives(self, workers: set[WorkerId], incarnation: dict[WorkerId, int]) -> set[WorkerId]:
        """The workers of a relaunch batch that can be admitted wholesale:
        lives newer than any the keeper knows, whose old life is not tracked."""
        ws = workers - self.advanced_at.keys()
        known, minimum = self.incarnation, self.min_incarnation
        order = sorted(ws)
        lives = list(map(incarnation.__getitem__, order))
        if lives == list(map(minimum.get, order, repeat(-1))):
            fresh = ws  # exactly the lives a RestartJob ordered: all newer than known
            self.incarnation.update(zip(order, lives))
        else:
            fresh = {w for w in ws if incarnation[w] >= minimum.get(w, 0)
                     and incarnation[w] > known.get(w, -1)}
            self.incarnation.update((w, incarnation[w]) for w in fresh)
        self.counter.update(dict.fromkeys(fresh, -1))
        return fresh

    def _step_failed(self, now: float, msg: StepFailed) -> None:
        if msg.generation != self.generation or msg.worker not in self._member_set:
            self._refuse(now, msg.worker, msg.incarnation, "step-failed", "stale-generation")
            return
        if self.round is None:
            self._fail_generation(now, "step-failed")

    def _checkpointed(self, now: float, msg: Checkpointed) -> None:
        if msg.generation != self.generation or msg.worker not in self._member_set:
            self._refuse(now, msg.worker, msg.incarnation, "checkpoint", "stale-generation")
            return
        # The current generation resumed at or after the last checkpoint, so
        # a checkpoint it reports is of the current lineage and supersedes it.
        if self.checkpoint is None or msg.cursor.step >= self.checkpoint.step:
            self.checkpoint = msg.cursor

    # --- decisions ------------------------------------------------------------

    def _declare_dead(self, now: float, worker: WorkerId, reason: str) -> None:
        self.advanced_at.pop(worker, None)
        self.counter.pop(worker, None)
        self.standby.pop(worker, None)
        self.standby_gen.pop(worker, None)
        self._out.append(Record(rec(now, "info", "evict", KEEPER, worker=worker,
                                    incarnation=self.incarnation.get(worker), reason=reason)))
        r = self.round
        if r is not None:
            r.drop(worker)
            self._maybe_close(now)
        elif worker in self._member_set:
            self._fail_generation(now, "leave" if reason == "left" else "failure")

    def _fail_generation(self, now: float, reason: str) -> None:
        """A member of the current generation is gone or the step failed."""
        if self.config.strategy == CHECKPOINT_RESTART:
            # Every current life is over: the driver relaunches the live ones.
            members = self.members
            relaunch = tuple(sorted(self.advanced_at.keys() & self._member_set))
            # Element-wise work through map(): a restart of 10^4 members must
            # not be a Python-level loop per member (see benchmarks/sim_scale.py).
            self.min_incarnation.update(zip(members, map(
                int.__add__, map(self.incarnation.get, members, repeat(0)), repeat(1))))
            deque(map(self.advanced_at.pop, members, repeat(None)), maxlen=0)
            deque(map(self.counter.pop, members, repeat(None)), maxlen=0)
            self._out.append(Record(rec(now, "info", "restart", KEEPER,
                                        gen=self.generation, reason=reason)))
            incarnations = tuple(map(self.min_incarnation.__getitem__, relaunch))
            self._out.append(RestartJob(self.generation, reason, relaunch, incarnations))
            self._open(now, "restart", expect=False, relaunch=relaunch)
        else:
            self._open(now, reason)

    def _open(self, now: float, reason: str, expect: bool = True,
              relaunch: tuple[WorkerId, ...] = ()) -> None:
        # After a restart nobody carries over: every joiner is a new life.
        previous = frozenset(self.members) if expect else frozenset()
        r = Round(self.generation + 1, reason, now, previous)
        if expect:
            r.expected = self.advanced_at.keys() & previous
        else:
            r.expected = set(relaunch)
            cfg = self.config
            timeout = cfg.relaunch_timeout_s if cfg.relaunch_timeout_s is not None \
                else cfg.join_timeout_s
            r.expect_until = now + timeout if timeout is not None else None
        by_cursor: dict[Optional[Cursor], set[WorkerId]] = {}
        for w, cursor in self.standby.items():
            by_cursor.setdefault(cursor, set()).add(w)
        for cursor, ws in by_cursor.items():
            r.add(ws, cursor)
        r.state_gen.update(self.standby_gen)
        self.standby.clear()
        self.standby_gen.clear()
        self.round = r
        self._out.append(Record(rec(now, "invoke", "round", KEEPER, gen=r.generation, reason=reason)))
        if r.expected:
            self._out.append(Broadcast(tuple(sorted(r.expected)), RollCall(r.generation, reason)))
        self._maybe_close(now)

    def _maybe_close(self, now: float) -> None:
        r = self.round
        if r is None:
            return
        cfg = self.config
        if len(r.joined) + len(r.expected) < cfg.min_workers:
            if r.starved_since is None:
                r.starved_since = now
            r.last_call_at = None
            timeout = cfg.join_timeout_s
            if timeout is not None and now >= r.starved_since + timeout:
                self._give_up(now, r)
            return
        r.starved_since = None
        if r.expected or len(r.joined) < cfg.min_workers:
            return
        newcomers = not (r.joined.keys() <= r.previous)
        if len(r.joined) >= cfg.max_workers or not newcomers:
            self._close(now, r)
            return
        if r.last_call_at is None:
            r.last_call_at = now + cfg.last_call_s
        if now >= r.last_call_at:
            self._close(now, r)

    def _give_up(self, now: float, r: Round) -> None:
        self.failed = f"below min_workers={self.config.min_workers} for join_timeout_s"
        self._out.append(Record(rec(now, "fail", "round", KEEPER, gen=r.generation,
                                    reason=self.failed)))
        self._out.append(JobFailed(self.failed))

    def _close(self, now: float, r: Round) -> None:
        old = sorted(r.joined.keys() & r.previous)
        room = self.config.max_workers - len(old)
        new = sorted(r.joined.keys() - r.previous)
        for w in new[room:]:
            self.standby[w] = r.joined[w]
            self.standby_gen[w] = r.state_gen.get(w, r.generation - 1)
        members = tuple(sorted(old + new[:room])) if new else tuple(old)
        cursor, source = self._resume_point(r, old, new[:room], overflow=len(new) > room)
        if source is None:
            stale = members if cursor != Cursor() else ()
        else:
            current = r.by_cursor[cursor] & r.previous
            current.discard(source)
            stale = tuple(sorted(set(members) - current - {source}))
        self.generation = r.generation
        self.resumes.append((r.generation, cursor.step))
        self.members = members
        self._member_set = frozenset(members)
        self.incarnations = tuple(map(self.incarnation.__getitem__, members))
        self.cursor = cursor
        self.source = source
        self.stale = stale
        self.round = None
        self._out.append(Record(rec(
            now, "ok", "generation", KEEPER, gen=self.generation,
            members=runs_of_sorted(members), cursor=cursor.to_json(), source=source,
            reason=r.reason, stale=len(stale))))
        self._out.append(Formed(self.generation, members, cursor, source, stale, r.reason))
        self._out.append(Broadcast(members, self._membership()))

    def _resume_point(self, r: Round, old: list[WorkerId], new: list[WorkerId],
                      overflow: bool = False) -> tuple[Cursor, Optional[WorkerId]]:
        """The most advanced state among the members wins; ties go to an old
        member, then to the lowest id. With no state at all, the checkpoint."""
        admitted = set(old).union(new) if overflow else r.joined.keys()
        held = sorted((c for c, ws in r.by_cursor.items()
                       if c is not None and not ws.isdisjoint(admitted)), reverse=True)
        fallback = self.checkpoint or Cursor()
        for best in held:
            if best < fallback:
                break
            for group in (old, new):
                for w in group:  # sorted: the first match is the lowest id
                    if r.joined[w] == best and self._on_lineage(best, r.state_gen.get(w)):
                        return best, w
        return fallback, None

    def _on_lineage(self, cursor: Cursor, state_gen: Optional[int]) -> bool:
        """Is a state of generation ``state_gen`` at ``cursor`` still on the
        lineage? Not if a later generation resumed behind it: that branch was
        abandoned, and resuming it would fork the training history."""
        if state_gen is None:  # answered a roll call of the latest generation
            return True
        for gen, step in reversed(self.resumes):
            if gen <= state_gen:
                break
            if step < cursor.step:
                return False
        return True

    def _membership(self) -> Membership:
        return Membership(self.generation, self.members, self.incarnations, self.cursor,
                          self.source, self.stale)

    def _refuse(self, now: float, worker: WorkerId, incarnation: int, what: str,
                reason: str) -> None:
        self._out.append(Record(rec(now, "info", "refuse", KEEPER, worker=worker,
                                    incarnation=incarnation, what=what, reason=reason)))
        self._out.append(Send(worker, Refused(worker, incarnation, self.generation, reason)))

    def _flush(self) -> list[Output]:
        out, self._out = self._out, []
        return out
