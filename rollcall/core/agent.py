"""A worker's side of the rendezvous protocol, sans-IO.

The driver (a simulated node or a real worker process) feeds the agent what
the keeper said and what training did; the agent answers with messages to
send and with instructions for the trainer. The agent is the worker's fence:
it never lets the trainer act in a generation it has not been admitted to,
and it drops anything stamped with a generation older than the one it holds,
or sent by a keeper of an older term than the newest it has heard from (a
deposed keeper's late decisions: :mod:`rollcall.core.messages`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Collection, Optional, Sequence, Union

from rollcall.core.history import members_field, rec
from rollcall.core.messages import (
    Checkpointed, Heartbeat, Join, Leave, Membership, Refused, RollCall,
    StepFailed, ToKeeper, ToWorker,
)
from rollcall.core.placement import RecoveryPlan
from rollcall.core.types import Cursor, WorkerId


class Phase(str, Enum):
    IDLE = "idle"          # not started
    JOINING = "joining"    # asked to join, waiting for a generation
    ACTIVE = "active"      # a member: may train in ``generation``
    BLOCKED = "blocked"    # a member whose step failed: waits for the keeper
    STOPPED = "stopped"    # left, or an older life of this worker


# --- outputs -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SendToKeeper:
    message: ToKeeper


@dataclass(frozen=True, slots=True)
class Enter:
    """Start training in ``generation``.

    Rebuild the collective for ``members``; if ``sync`` copy the state at
    ``cursor`` from ``source`` (or load the checkpoint when ``source`` is
    None) before the first step, then call :meth:`Agent.state_ready`.
    Execute an :class:`Abort` before sending what follows it: a ``Join``
    must carry the cursor of the state the trainer really holds.

    ``broadcast``: some member is stale and ``source`` is set, so every
    member takes part in one copy of the state (a collective needs all of
    them, and each member's own ``sync`` says only whether *it* is stale):
    the ``stale`` members each take a stripe from every other member
    (:func:`rollcall.core.reshard.stripes`), or the whole from ``source``
    where the backend broadcasts instead. A member that is not stale holds the state at ``cursor`` as the
    keeper counts it; when that is the origin its trainer may not have
    built it yet (the agent claims the origin from the moment it enters a
    generation that starts there), and builds it rather than copying it.

    Sharded state only (defaults otherwise), copied from the keeper's
    :class:`~rollcall.core.messages.Membership`: ``placement[s]`` is the holder
    tuple of shard ``s`` (owner first); ``recovery`` the
    :class:`~rollcall.core.placement.RecoveryPlan` whose copies and reloads this
    worker takes part in (as ``src`` or ``dst``) before the first step, even
    when ``sync`` is false; ``fallback``: a shard was lost, the generation
    resumes from the checkpoint at ``cursor`` and ``sync`` is true for all.
    See :mod:`rollcall.core.keeper` for the exact meaning.
    """

    generation: int
    members: tuple[WorkerId, ...]
    rank: int
    cursor: Cursor
    source: Optional[WorkerId]
    sync: bool
    broadcast: bool
    placement: Optional[tuple[tuple[WorkerId, ...], ...]] = None
    recovery: Optional[RecoveryPlan] = None
    fallback: bool = False
    stale: Collection[WorkerId] = ()


@dataclass(frozen=True, slots=True)
class Abort:
    """Abandon the step in flight; nothing computed for it may be counted."""

    generation: int
    reason: str


@dataclass(frozen=True, slots=True)
class Stop:
    reason: str


class Log:
    """A history record for the driver to write: ``Log(record)``, or
    ``Log.later(make)``, whose record is built by ``make()`` when first read.

    Why later: an agent's ``enter`` record names the generation's members,
    and at 10^5 nodes deriving that list costs a millisecond, paid for every
    generation by a simulator's batch of agents, which does not keep its
    agents' records at that scale (the compact ledger)."""

    __slots__ = ("_record", "_make")

    def __init__(self, record: Optional[dict] = None) -> None:
        assert record is None or isinstance(record, dict), record
        self._record = record
        self._make: Optional[Callable[[], dict]] = None

    @classmethod
    def later(cls, make: Callable[[], dict]) -> "Log":
        out = cls()
        out._make = make
        return out

    @property
    def record(self) -> dict:
        if self._record is None:
            assert self._make is not None, "a Log holds a record or a way to make one"
            self._record, self._make = self._make(), None
        return self._record

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Log) and self.record == other.record

    __hash__ = None  # type: ignore[assignment]  # a record is a dict

    def __repr__(self) -> str:
        return f"Log({self.record!r})"


Action = Union[SendToKeeper, Enter, Abort, Stop, Log]


@dataclass(frozen=True, slots=True)
class AgentState:
    """Everything an :class:`Agent` holds but who it is (worker id, incarnation)
    and its settings.

    Two agents in equal states answer every input alike, up to their own id,
    life and rank: :class:`rollcall.core.agents.AgentBatch` keeps one state per
    group of agents, and :meth:`Agent.restore` turns a state back into an agent.
    """

    phase: Phase
    generation: int
    members: Sequence[WorkerId]
    cursor: Optional[Cursor]
    counter: int
    beat_at: Optional[float]
    retry_at: Optional[float]
    failed_step: int
    term: int = 0
    _hash: Optional[int] = field(default=None, init=False, repr=False, compare=False)

    def __hash__(self) -> int:
        """The fields' hash, computed once: a batch keys its groups by state, and
        a state's member list and cursor would be hashed again on every lookup."""
        h = self._hash
        if h is None:
            h = hash((self.phase, self.generation, self.members, self.cursor, self.counter,
                      self.beat_at, self.retry_at, self.failed_step, self.term))
            object.__setattr__(self, "_hash", h)
        return h


class Agent:
    """One worker's membership state machine."""

    def __init__(self, worker: WorkerId, incarnation: int, heartbeat_s: float,
                 join_retry_s: Optional[float] = None) -> None:
        self.worker = worker
        self.incarnation = incarnation
        self.heartbeat_s = heartbeat_s
        self.join_retry_s = join_retry_s if join_retry_s is not None else 2 * heartbeat_s
        self.phase = Phase.IDLE
        self.generation = 0
        self.members: tuple[WorkerId, ...] = ()
        self.cursor: Optional[Cursor] = None
        self.counter = 0
        self._beat_at: Optional[float] = None
        self._retry_at: Optional[float] = None
        self._failed_step = 0
        self.term = 0  # the newest keeper term heard from

    @classmethod
    def restore(cls, worker: WorkerId, incarnation: int, heartbeat_s: float,
                state: AgentState, join_retry_s: Optional[float] = None) -> "Agent":
        """The agent of ``worker``'s life ``incarnation`` in ``state`` (see :meth:`state`)."""
        agent = cls(worker, incarnation, heartbeat_s, join_retry_s)
        agent.phase = state.phase
        agent.generation = state.generation
        agent.members = state.members  # type: ignore[assignment]
        agent.cursor = state.cursor
        agent.counter = state.counter
        agent._beat_at = state.beat_at
        agent._retry_at = state.retry_at
        agent._failed_step = state.failed_step
        agent.term = state.term
        return agent

    def state(self) -> AgentState:
        """A snapshot of everything but the identity: ``restore`` undoes it."""
        return AgentState(self.phase, self.generation, self.members, self.cursor, self.counter,
                          self._beat_at, self._retry_at, self._failed_step, self.term)

    # --- driver API -----------------------------------------------------------

    def may_step(self, generation: int) -> bool:
        """Whether the trainer may still commit a step of ``generation``: the
        agent is an active member of it (no roll call, refusal or failure since)."""
        return self.phase is Phase.ACTIVE and self.generation == generation

    def start(self, now: float, cursor: Optional[Cursor] = None) -> list[Action]:
        """Begin: ask to join. ``cursor`` is the state held, if any."""
        self.cursor = cursor
        self._beat_at = now + self.heartbeat_s
        return self._join(now)

    def get_timer(self) -> Optional[float]:
        if self.phase in (Phase.IDLE, Phase.STOPPED):
            return None
        times = [t for t in (self._beat_at, self._retry_at) if t is not None]
        return min(times) if times else None

    def handle_timer(self, now: float) -> list[Action]:
        out: list[Action] = []
        if self.phase in (Phase.IDLE, Phase.STOPPED):
            return out
        if self._beat_at is not None and now >= self._beat_at:
            self.counter += 1
            out.append(SendToKeeper(Heartbeat(self.worker, self.incarnation,
                                              self.generation, self.counter)))
            self._beat_at = now + self.heartbeat_s
        if self._retry_at is not None and now >= self._retry_at:
            # Our last request may have been lost: ask again until answered.
            if self.phase is Phase.JOINING:
                out.extend(self._join(now))
            elif self.phase is Phase.BLOCKED:
                out.extend(self._report_failure(now))
        return out

    def receive(self, now: float, message: ToWorker) -> list[Action]:
        if self.phase in (Phase.IDLE, Phase.STOPPED):
            return []
        if message.term < self.term:
            return []  # a deposed keeper's: a newer one has spoken since
        self.term = message.term
        if isinstance(message, Membership):
            return self._membership(now, message)
        if isinstance(message, RollCall):
            return self._roll_call(now, message)
        if isinstance(message, Refused):
            return self._refused(now, message)
        raise TypeError(f"unknown message {message!r}")  # pragma: no cover

    def reconnected(self, now: float) -> list[Action]:
        """The worker reached a keeper again (a new connection; after a
        failover, the next term's keeper). What it had asked and not had
        answered went down with the old connection: ask again now, rather
        than at the next retry (a simulator's agents have no retries)."""
        if self.phase is Phase.JOINING:
            return self._join(now)
        if self.phase is Phase.BLOCKED:
            return self._report_failure(now)
        return []

    def step_committed(self, now: float, cursor: Cursor) -> list[Action]:
        """The trainer now holds the state at ``cursor``."""
        self.cursor = cursor
        return []

    state_ready = step_committed  # after the copy from the source or the load

    def step_failed(self, now: float, step: int) -> list[Action]:
        """The collective of ``step`` failed: report and wait for the keeper."""
        if self.phase is not Phase.ACTIVE:
            return []
        self.phase = Phase.BLOCKED
        self._failed_step = step
        return self._report_failure(now)

    def checkpointed(self, now: float, cursor: Cursor) -> list[Action]:
        if self.phase is not Phase.ACTIVE:
            return []
        return [SendToKeeper(Checkpointed(self.worker, self.incarnation, self.generation, cursor))]

    def leave(self, now: float) -> list[Action]:
        if self.phase is Phase.STOPPED:
            return []
        self.phase = Phase.STOPPED
        return [SendToKeeper(Leave(self.worker, self.incarnation))]

    # --- transitions ----------------------------------------------------------

    def _report_failure(self, now: float) -> list[Action]:
        self._retry_at = now + self.join_retry_s
        return [SendToKeeper(StepFailed(self.worker, self.incarnation, self.generation,
                                        self._failed_step))]

    def _join(self, now: float) -> list[Action]:
        self.phase = Phase.JOINING
        self._retry_at = now + self.join_retry_s
        return [SendToKeeper(Join(self.worker, self.incarnation, self.cursor, self.generation))]

    def _abort(self, now: float, reason: str) -> list[Action]:
        if self.phase not in (Phase.ACTIVE, Phase.BLOCKED):
            return []
        return [Abort(self.generation, reason),
                Log(rec(now, "fail", "abort", self.worker, gen=self.generation, reason=reason))]

    def _membership(self, now: float, m: Membership) -> list[Action]:
        if m.generation <= self.generation or not m.admits(self.worker, self.incarnation):
            return []  # stale, duplicated, or we wait as a standby
        out = self._abort(now, "superseded")
        self.generation = m.generation
        self.members = m.members
        self.phase = Phase.ACTIVE
        self._retry_at = None
        sync = self.worker in m.stale
        assert not (sync and m.source == self.worker), "the source is never stale"
        # A stale member holds no valid state until the copy or load is done;
        # until the driver says so (state_ready), it claims none at a roll call.
        self.cursor = None if sync else m.cursor
        broadcast = m.source is not None and len(m.stale) > 0
        out.append(Enter(m.generation, m.members, m.members.index(self.worker),
                         m.cursor, m.source, sync, broadcast, m.placement, m.recovery,
                         m.fallback, m.stale))
        w, life = self.worker, self.incarnation
        out.append(Log.later(lambda: rec(now, "ok", "enter", w, gen=m.generation,
                                         incarnation=life, members=members_field(m.members))))
        return out

    def _roll_call(self, now: float, call: RollCall) -> list[Action]:
        if call.generation <= self.generation or self.phase is Phase.JOINING:
            return []
        out = self._abort(now, f"roll-call:{call.reason}")
        return out + self._join(now)

    def _refused(self, now: float, refusal: Refused) -> list[Action]:
        if refusal.incarnation != self.incarnation:
            return []  # meant for another life of this worker id
        if refusal.reason == "stale-incarnation":
            out = self._abort(now, "stale-incarnation")
            self.phase = Phase.STOPPED
            out.append(Log(rec(now, "info", "fenced", self.worker, gen=self.generation,
                               reason="stale-incarnation")))
            return out + [Stop("an older life of this worker")]
        if refusal.reason == "stale-generation" and refusal.generation <= self.generation:
            return []  # an answer to something we sent before we moved on
        if refusal.generation < self.generation:
            return []
        if self.phase is Phase.JOINING:
            return self._join(now)  # refused while asking: ask again
        out = self._abort(now, refusal.reason)
        out.append(Log(rec(now, "info", "fenced", self.worker, gen=self.generation,
                           reason=refusal.reason)))
        return out + self._join(now)
