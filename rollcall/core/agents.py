"""Many identical agents at once: the vectorised :class:`~rollcall.core.agent.Agent`.

A simulator of 10^5 nodes cannot run 10^5 agents, and must not answer for
them by code of its own (a second implementation of the protocol's worker
side). :class:`AgentBatch` runs the one implementation, :class:`Agent`, on
*groups*: every agent of a group is in the same :class:`AgentState`, so
each input is handed to one representative agent per group (its lowest id),
and what it answers stands for the whole group, up to each agent's own
worker id, incarnation and rank (:class:`GroupAction`). Groups are id sets
(:class:`IdRuns`); groups that end in equal states merge. An input costs the
groups it reaches, not their ids.

Where an :class:`Agent` reads a per-worker fact, the group is first split by
it, so that the representative's answer is each member's answer:

* a :class:`Membership` admits a worker by its life (``admits``) and makes it
  copy the state if it is ``stale``: a group splits into admitted-stale,
  admitted-current and the rest. Admission compares lives sparsely (keeper
  snapshots :class:`Lives` against each other, or against one life for all),
  see :meth:`Lives.agreeing`;
* a :class:`Refused` concerns one life: the reached ids split by it.

Each agent's life is kept per group as a *life source*: one life for all
(the job's first lives, 0), the keeper's :class:`Lives` a relaunch named, or
the :class:`Membership` that admitted them (equal, by admission, and shared
by every group it admitted, so they merge again).

Heartbeats. With ``heartbeats=True`` the batch is exactly N agents: it
beats when each of them would (one :class:`Heartbeat` per id). A simulator
does not simulate the beats of healthy nodes (it reports liveness in bulk,
``Keeper.observe_alive_except``), so with ``heartbeats=False`` the batch's
agents are *assumed to beat on time*: they hold no beat deadline (nothing to
wake for, nothing sent) and their beat counters are set aside. Nothing an
agent decides reads its beats (a beat is sent, never answered by a state
change of the agent), so every other output is the same as with beats (the
property test checks it). An agent taken out of such a batch (:meth:`take`)
gets its counter back and owes a beat at once: it was not beating while
taken (a paused process), or starts beating itself now.

Retries. An agent asks again (a ``Join``, a failure report) when no answer
came within ``join_retry_s``: its last message may have been lost. A
simulator whose network loses nothing never runs the batch's timer, and
with ``retries=False`` the batch keeps no retry deadline either (each one is
a time per agent, so standbys that asked at different instants would each
be a group of their own). An agent taken out of such a batch owes a retry
at once if it is waiting for an answer (joining, or blocked on a failed
step): it was not retrying while taken.

Every operation costs O(groups) set operations, plus, only where lives
really differ or are given as plain sequences, a step per id: ``singly``
counts those ids (tests check it stays 0 in the common cases).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Iterable, Optional, Sequence, Union

from rollcall.core.agent import (
    Action, Agent, AgentState, Enter, Log, Phase, SendToKeeper,
)
from rollcall.core.idset import EMPTY, IdRuns
from rollcall.core.lives import Lives
from rollcall.core.messages import (
    Heartbeat, Join, JoinBatch, Membership, Refused, RollCall, ToKeeper, ToWorker,
)
from rollcall.core.types import Cursor, WorkerId

Ids = Union[IdRuns, Iterable[int]]
LivesArg = Union[int, Lives, Sequence[int]]


class LifeSource:
    """The incarnation of each agent of a group: one life for all (``same``),
    or looked up in a keeper :class:`Lives`, or in a plain map by worker id.

    Compared by identity: a batch makes one source per life value, per
    relaunch order and per :class:`Membership`, and groups sharing one merge.
    """

    __slots__ = ("same", "lives", "by_id")

    def __init__(self, same: Optional[int] = None, lives: Optional[Lives] = None,
                 by_id: Optional[dict[WorkerId, int]] = None) -> None:
        assert (same is not None) + (lives is not None) + (by_id is not None) == 1
        self.same = same
        self.lives = lives
        self.by_id = by_id

    def of(self, w: WorkerId) -> int:
        if self.same is not None:
            return self.same
        if self.lives is not None:
            life = self.lives.of(w)
            assert life is not None, f"worker {w} has no life in this source"
            return life
        return self.by_id[w]  # type: ignore[index]

    def get(self, w: WorkerId) -> Optional[int]:
        """The life of ``w``; None if the source has none for ``w`` (where
        :meth:`of` asserts it has)."""
        if self.same is not None:
            return self.same
        if self.lives is not None:
            return self.lives.of(w)
        return self.by_id.get(w)  # type: ignore[union-attr]

    def incarnations(self, ws: IdRuns) -> Sequence[int]:
        """The lives of ``ws`` paired with them, as a :class:`JoinBatch` carries
        them: the keeper's own :class:`Lives` where it came from one (so the
        keeper admits a relaunch wholesale), else a tuple."""
        if self.lives is not None:
            return self.lives if self.lives.members == ws else self.lives.restricted(ws)
        return tuple(self.of(w) for w in ws)

    def __repr__(self) -> str:
        kind = f"same={self.same}" if self.same is not None else \
            f"lives={self.lives!r}" if self.lives is not None else f"by_id={self.by_id!r}"
        return f"LifeSource({kind})"


@dataclass(frozen=True, slots=True)
class GroupAction:
    """``action`` taken by every agent of ``workers``.

    ``action`` is the one the lowest id took; each other agent's is the same
    with its own worker id and incarnation (messages), rank (:class:`Enter`)
    and ``process`` (:class:`Log` records): :meth:`expand` lists them.
    :meth:`messages` is what to send the keeper for it.

    ``known``: the group's lives are the keeper's own record of them (first
    lives, 0, or lives a :class:`Membership` admitted), so its joins go as
    one :class:`JoinBatch` without incarnations; other lives (a relaunch's)
    go with them. A :class:`JoinBatch` carries the ``generation`` its joins are
    stamped with: the agents share it, being in one state. The
    form without incarnations is only sound while the batch holds the one
    live process of each id: a driver discards the lives a restart tears
    down (the keeper admits an expected worker's lives-less join without
    checking its life).
    """

    workers: IdRuns
    action: Action
    lives: LifeSource
    known: bool = False

    def incarnation_of(self, w: WorkerId) -> int:
        assert w in self.workers, w
        return self.lives.of(w)

    def expand(self) -> list[tuple[WorkerId, Action]]:
        """Every agent's own action, in id order (a step per id: for tests and
        for drivers that want each agent's records)."""
        first = self.workers.first()
        act = self.action
        return [(w, _as_worker(act, first, w, self.lives.of(w))) for w in self.workers]

    def messages(self) -> list[ToKeeper]:
        """The messages to the keeper: one :class:`JoinBatch` for a group's
        joins, each agent's own message otherwise (none for other actions)."""
        act = self.action
        if not isinstance(act, SendToKeeper):
            return []
        msg = act.message
        if isinstance(msg, Join):
            incs = None if self.known else self.lives.incarnations(self.workers)
            return [JoinBatch(self.workers, msg.cursor, incs, msg.generation)]
        return [a.message for _, a in self.expand()]  # type: ignore[union-attr]


def _as_worker(act: Action, first: WorkerId, w: WorkerId, life: int) -> Action:
    """The action of agent ``w`` (life ``life``) where agent ``first`` took ``act``."""
    if w == first:
        return act
    if isinstance(act, SendToKeeper):
        msg = act.message
        assert msg.worker == first, (msg, first)  # type: ignore[union-attr]
        return SendToKeeper(replace(msg, worker=w, incarnation=life))  # type: ignore[type-var]
    if isinstance(act, Enter):
        return replace(act, rank=act.members.index(w))
    if isinstance(act, Log):
        assert act.record["process"] == first, (act, first)
        record = {**act.record, "process": w}
        if "incarnation" in record:
            record["incarnation"] = life
        return Log(record)
    return act  # Abort, Stop: nothing in them names the worker


Key = tuple[AgentState, LifeSource]


class AgentBatch:
    """Agents of many worker ids, grouped by identical state (module docstring).

    Every input names the ids it reaches (``to``: an id set, None for all the
    batch holds; ids the batch does not hold are ignored) and returns the
    :class:`GroupAction` list of what they do, in the order each agent does it.
    """

    def __init__(self, heartbeat_s: float, join_retry_s: Optional[float] = None,
                 heartbeats: bool = True, retries: bool = True) -> None:
        self.heartbeat_s = heartbeat_s
        self.join_retry_s = join_retry_s if join_retry_s is not None else 2 * heartbeat_s
        self.heartbeats = heartbeats
        self.retries = retries
        self._groups: dict[Key, IdRuns] = {}
        # the keys of _groups by state, in _groups' order (a state's groups differ in lives)
        self._by_state: dict[AgentState, dict[Key, None]] = {}
        self._same: dict[int, LifeSource] = {}  # one source per life held by all
        self._admitted: Optional[tuple[Membership, LifeSource]] = None  # the latest's lives
        self._counters: dict[WorkerId, int] = {}  # beats off: counters set aside (non-zero)
        self._idle = Agent(0, 0, heartbeat_s, self.join_retry_s).state()
        self.singly = 0  # ids handled one by one (lives compared or copied per id)

    # --- what the batch holds ------------------------------------------------

    @property
    def n_groups(self) -> int:
        return len(self._groups)

    @property
    def workers(self) -> IdRuns:
        out = EMPTY
        for ids in self._groups.values():
            out = out | ids
        return out

    def __contains__(self, w: object) -> bool:
        return any(w in ids for ids in self._groups.values())

    def groups(self) -> list[tuple[IdRuns, AgentState]]:
        """The groups: their ids and the state every agent of each is in."""
        return [(ids, state) for (state, _), ids in self._groups.items()]

    def state_of(self, w: WorkerId) -> AgentState:
        (state, _), _ = self._find(w)
        if not self.heartbeats:
            state = replace(state, counter=self._counters.get(w, 0))
        return state

    def incarnation_of(self, w: WorkerId) -> int:
        (_, src), _ = self._find(w)
        return src.of(w)

    def may_step(self, generation: int, to: Optional[Ids] = None) -> IdRuns:
        """The ids (of ``to``) whose agent may commit a step of ``generation``."""
        sel = _ids(to)
        out = EMPTY
        for key, ids in self._groups.items():
            part = ids if sel is None else ids & sel
            if part and self._agent(part.first(), key).may_step(generation):
                out = out | part
        return out

    def get_timer(self) -> Optional[float]:
        """The earliest instant at which :meth:`handle_timer` has work (with
        heartbeats off: join and failure-report retries only)."""
        times = [self._agent(ids.first(), key).get_timer() for key, ids in self._groups.items()]
        due = [t for t in times if t is not None]
        return min(due) if due else None

    # --- lives starting, leaving and coming back -----------------------------

    def start(self, now: float, workers: Ids, lives: LivesArg,
              cursor: Optional[Cursor] = None) -> list[GroupAction]:
        """A new process (agent) for each of ``workers``, as life ``lives``
        (one int for all, the keeper's :class:`Lives` of a relaunch, or a
        sequence paired with the ids in order), holding the state at
        ``cursor`` if any. It replaces any agent the batch held for the id."""
        ws = IdRuns.of(workers)
        if not ws:
            return []
        self.discard(ws)
        src = self._source(ws, lives)
        return self._each(ws, lambda a: a.start(now, cursor), only=[((self._idle, src), ws)])

    def discard(self, workers: Ids) -> None:
        """The processes of ``workers`` are gone: their agents leave the batch."""
        ws = IdRuns.of(workers)
        m, left = ws.mask, len(ws)
        for key, ids in list(self._groups.items()):
            if ids.mask & m:
                part = ids & ws
                self._cut(key, ids, part)
                left -= len(part)
                if not left:
                    break  # an id is in one group at most
        if self._counters:
            for w in [w for w in self._counters if w in ws]:
                del self._counters[w]

    def take(self, w: WorkerId, now: float) -> Agent:
        """Split agent ``w`` off as a single :class:`Agent` in its exact state
        (with heartbeats off: its counter back, a beat due at ``now``; with
        retries off: a retry due at ``now`` if it waits for an answer)."""
        key, ids = self._find(w)
        self._cut(key, ids, IdRuns.span(w, w))
        state, src = key
        if not self.heartbeats:
            live = state.phase not in (Phase.IDLE, Phase.STOPPED)
            state = replace(state, counter=self._counters.pop(w, 0),
                            beat_at=now if live else None)
        if not self.retries and state.phase in (Phase.JOINING, Phase.BLOCKED):
            state = replace(state, retry_at=now)
        return Agent.restore(w, src.of(w), self.heartbeat_s, state, self.join_retry_s)

    def absorb(self, agent: Agent) -> None:
        """Take a single agent (one :meth:`take` gave, or any) into the batch."""
        w = agent.worker
        bit = 1 << w  # `w not in self`, without a call per group
        assert not any(ids.mask & bit for ids in self._groups.values()), \
            f"worker {w} already has an agent in the batch"
        assert (agent.heartbeat_s, agent.join_retry_s) == (self.heartbeat_s, self.join_retry_s)
        state = agent.state()
        if not self.heartbeats and state.counter:
            self._counters[w] = state.counter
        state = self._canon(state)
        # the first group (in the batch's order) in this state whose source
        # has the agent's life: found among the groups in this state only
        src = next((s for _, s in self._by_state.get(state, ())
                    if s.get(w) == agent.incarnation), None)
        self._put((state, src or self._one_life(agent.incarnation)), IdRuns.span(w, w))

    # --- inputs --------------------------------------------------------------

    def receive(self, now: float, message: ToWorker, to: Optional[Ids] = None) -> list[GroupAction]:
        sel = _ids(to)
        if isinstance(message, Membership):
            return self._membership(now, message, sel)
        if isinstance(message, RollCall):
            return self._each(sel, lambda a: a.receive(now, message))
        if isinstance(message, Refused):
            life = self._one_life(message.incarnation)
            return self._each(sel, lambda a: a.receive(now, message),
                              split=lambda part, src: self._split_by(part, src, life))
        raise TypeError(f"unknown message {message!r}")

    def reconnected(self, now: float, to: Optional[Ids] = None) -> list[GroupAction]:
        """The agents of ``to`` reached a keeper again (:meth:`Agent.reconnected`)."""
        return self._each(_ids(to), lambda a: a.reconnected(now))

    def step_committed(self, now: float, cursor: Cursor, to: Optional[Ids] = None
                       ) -> list[GroupAction]:
        """The trainers of ``to`` now hold the state at ``cursor``."""
        return self._each(_ids(to), lambda a: a.step_committed(now, cursor))

    def state_ready(self, now: float, cursor: Cursor, to: Optional[Ids] = None
                    ) -> list[GroupAction]:
        """The copy or load of ``to`` is done: they hold the state at ``cursor``."""
        return self._each(_ids(to), lambda a: a.state_ready(now, cursor))

    def step_failed(self, now: float, step: int, to: Optional[Ids] = None) -> list[GroupAction]:
        return self._each(_ids(to), lambda a: a.step_failed(now, step))

    def checkpointed(self, now: float, cursor: Cursor, to: Optional[Ids] = None
                     ) -> list[GroupAction]:
        return self._each(_ids(to), lambda a: a.checkpointed(now, cursor))

    def leave(self, now: float, to: Optional[Ids] = None) -> list[GroupAction]:
        return self._each(_ids(to), lambda a: a.leave(now))

    def handle_timer(self, now: float) -> list[GroupAction]:
        return self._each(None, lambda a: a.handle_timer(now))

    # --- internals -----------------------------------------------------------

    def _membership(self, now: float, m: Membership, sel: Optional[IdRuns]) -> list[GroupAction]:
        members, stale = IdRuns.of(m.members), IdRuns.of(m.stale)
        theirs = self._lives_of(m, members)

        def split(part: IdRuns, src: LifeSource) -> list[tuple[IdRuns, LifeSource, LifeSource]]:
            admitted = self._agreeing(part & members, src, theirs)
            if not admitted:  # the whole part, as it is (a group no change reached stays put)
                return [(part, src, src)]
            return [(admitted & stale, src, theirs), (admitted - stale, src, theirs),
                    (part - admitted, src, src)]

        return self._each(sel, lambda a: a.receive(now, m), split=split)

    def _each(self, sel: Optional[IdRuns], fn: Callable[[Agent], list[Action]],
              split: Optional[Callable[[IdRuns, LifeSource], list]] = None,
              only: Optional[list[tuple[Key, IdRuns]]] = None) -> list[GroupAction]:
        """Run ``fn`` on a representative of every group's part in ``sel``
        (after ``split`` divides it by the per-id facts ``fn`` reads) and
        regroup the parts by the states they end in.

        ``split`` yields (ids, source, source after): a part whose agent
        entered a generation takes the admitting membership's lives.
        """
        out: list[GroupAction] = []
        moved: list[tuple[Key, IdRuns]] = []
        for key, ids in (only if only is not None else list(self._groups.items())):
            if sel is not None and not (ids.mask & sel.mask):
                continue
            part = ids if sel is None else ids & sel
            state, src = key
            parts = split(part, src) if split is not None else [(part, src, src)]
            for sub, mine, after in parts:
                if not sub:
                    continue
                agent = self._agent(sub.first(), (state, mine))
                acts = fn(agent)
                new = self._canon(agent.state())
                life = after if new.generation != state.generation else mine
                if acts:
                    out += self._actions(sub, agent, life, acts)
                if only is None and sub is ids and life is src and new == state:
                    continue  # the whole group, unchanged: it stays as it is
                if only is None:
                    self._cut(key, self._groups[key], sub)
                moved.append(((new, life), sub))
        for key, ids in moved:  # after the loop: a part must not be handled twice
            self._put(key, ids)
        return out

    def _actions(self, sub: IdRuns, agent: Agent, src: LifeSource,
                 acts: list[Action]) -> list[GroupAction]:
        out = []
        for act in acts:
            known = False
            if isinstance(act, SendToKeeper):
                assert self.heartbeats or not isinstance(act.message, Heartbeat)
                if isinstance(act.message, Join):
                    admitted = agent.worker in agent.members
                    assert not admitted or sub <= IdRuns.of(agent.members), \
                        "agents in one state were all admitted, or none"
                    known = admitted or src is self._same.get(0)
            out.append(GroupAction(sub, act, src, known))
        return out

    def _agent(self, w: WorkerId, key: Key) -> Agent:
        state, src = key
        return Agent.restore(w, src.of(w), self.heartbeat_s, state, self.join_retry_s)

    def _canon(self, state: AgentState) -> AgentState:
        """With heartbeats off, no agent holds a beat deadline or counter;
        with retries off, none a retry deadline."""
        beats = self.heartbeats or (state.beat_at is None and not state.counter)
        retries = self.retries or state.retry_at is None
        if beats and retries:
            return state
        # a new state, not dataclasses.replace: this runs for every group an input reaches
        return AgentState(state.phase, state.generation, state.members, state.cursor,
                          state.counter if beats else 0, state.beat_at if beats else None,
                          state.retry_at if retries else None, state.failed_step, state.term)

    def _put(self, key: Key, ids: IdRuns) -> None:
        have = self._groups.get(key)
        if have is None:
            self._groups[key] = ids
            self._by_state.setdefault(key[0], {})[key] = None
        else:
            self._groups[key] = have | ids

    def _cut(self, key: Key, ids: IdRuns, part: IdRuns) -> None:
        rest = ids - part
        if rest:
            self._groups[key] = rest
        else:
            del self._groups[key]
            same = self._by_state[key[0]]
            del same[key]
            if not same:
                del self._by_state[key[0]]

    def _find(self, w: WorkerId) -> tuple[Key, IdRuns]:
        for key, ids in self._groups.items():
            if w in ids:
                return key, ids
        raise KeyError(f"worker {w} has no agent in the batch")

    def _one_life(self, life: int) -> LifeSource:
        src = self._same.get(life)
        if src is None:
            src = self._same[life] = LifeSource(same=life)
        return src

    def _source(self, ws: IdRuns, lives: LivesArg) -> LifeSource:
        if isinstance(lives, int):
            return self._one_life(lives)
        if isinstance(lives, Lives):
            assert ws <= lives.members, "every started worker has a life in the order"
            return LifeSource(lives=lives)
        lives = tuple(lives)
        assert len(lives) == len(ws), "one life per worker, in id order"
        self.singly += len(ws)
        return LifeSource(by_id=dict(zip(ws, lives)))

    def _lives_of(self, m: Membership, members: IdRuns) -> LifeSource:
        """The lives ``m`` admits, one source per membership (so the groups it
        admits share it and merge)."""
        if self._admitted is not None and self._admitted[0] is m:
            return self._admitted[1]
        if isinstance(m.incarnations, Lives):
            assert m.incarnations.members == members
            src = LifeSource(lives=m.incarnations)
        else:
            self.singly += len(members)
            src = LifeSource(by_id=dict(zip(m.members, m.incarnations)))
        self._admitted = (m, src)
        return src

    def _split_by(self, part: IdRuns, src: LifeSource, life: LifeSource) -> list:
        same = self._agreeing(part, src, life)
        return [(same, src, src), (part - same, src, src)]

    def _agreeing(self, ws: IdRuns, a: LifeSource, b: LifeSource) -> IdRuns:
        """The ids of ``ws`` (covered by both) whose lives agree in ``a`` and ``b``."""
        if a is b or not ws:
            return ws
        if a.same is not None and b.same is not None:
            return ws if a.same == b.same else EMPTY
        if a.lives is not None and b.lives is not None:
            return a.lives.agreeing(ws, b.lives)
        if a.lives is not None and b.same is not None:
            return a.lives.having(ws, b.same)
        if b.lives is not None and a.same is not None:
            return b.lives.having(ws, a.same)
        self.singly += len(ws)
        return IdRuns.of(w for w in ws if a.of(w) == b.of(w))


def _ids(to: Optional[Ids]) -> Optional[IdRuns]:
    return None if to is None else IdRuns.of(to)
