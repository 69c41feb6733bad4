"""AgentBatch, the vectorised agent, against N single Agents (hypothesis).

A stateful test drives one :class:`AgentBatch` and N independent core
:class:`Agent` objects with the same inputs (roll calls, memberships
admitting subsets with given lives, refusals, commits, state copies, step
failures, checkpoints, leaves, timers, relaunches as new lives, processes
gone) and splits agents off the batch and back. After every step the
batch's outputs, expanded per id, must be exactly the single agents'
outputs, in each agent's own order (the batch only groups across ids), and
every agent's state, life, ``may_step`` and the timers must agree. With
heartbeats off the batch sends no beats and holds no beat deadline; every
other output must still be the same. With retries off, an agent retries
nothing while in the batch and owes a retry once taken out of it: the
single agents are held to the same contract (their retry deadlines are
suspended while their twin is in the batch), and everything else agrees.

A failure prints the rule sequence that replays it (run with
``HYPOTHESIS_PROFILE=ci`` for the ``@reproduce_failure`` blob too).

Unit tests below check the expansion, the wire form and the cost model by
counting groups and ids handled one by one (never by timing).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from typing import Optional

import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from rollcall.core import (
    Abort, Agent, AgentBatch, AgentState, Broadcast, Cursor, Enter, Formed, GroupAction,
    Heartbeat, IdRuns, Join, JoinBatch, Keeper, KeeperConfig, Lives, Log, Membership,
    Phase, Refused, Relaunch, RestartJob, RollCall, SendToKeeper, TimeoutDetector,
)
from rollcall.core.lives import LifeTable

N = 5          # worker ids 0..N-1 have agents; N, N+1 appear in member lists only
H = 0.25       # heartbeat_s
ids = st.frozensets(st.integers(0, N - 1))
listed = st.frozensets(st.integers(0, N + 1))
cursors = st.builds(Cursor, st.integers(0, 4), st.integers(0, 40))
REASONS = ["not-member", "stale-incarnation", "stale-generation"]


def _masked(state: AgentState) -> AgentState:
    """A state without its beats (what a batch with heartbeats off keeps)."""
    return replace(state, counter=0, beat_at=None)


class BatchVersusAgents(RuleBasedStateMachine):
    """One AgentBatch (plus the agents split off it) versus one Agent per id."""

    @initialize(n=st.integers(1, N), heartbeats=st.booleans(), retries=st.booleans(),
                cursor=st.none() | cursors)
    def setup(self, n: int, heartbeats: bool, retries: bool, cursor: Optional[Cursor]) -> None:
        self.now = 0.0
        self.heartbeats = heartbeats
        self.retries = retries
        self.batch = AgentBatch(H, heartbeats=heartbeats, retries=retries)
        self.singles: dict[int, Agent] = {}
        self.taken: dict[int, Agent] = {}  # split off the batch, driven singly
        self.table = LifeTable()  # the keeper's lives, for realistic Lives snapshots
        self.top_gen = 0
        self._relaunch(IdRuns.span(0, n - 1), 0, cursor)

    # --- lives ----------------------------------------------------------------

    def _relaunch(self, ws: IdRuns, lives, cursor: Optional[Cursor]) -> None:
        for w in ws:
            self.taken.pop(w, None)
        out = self.batch.start(self.now, ws, lives, cursor)
        want = {}
        for k, w in enumerate(ws):
            life = lives if isinstance(lives, int) else lives[k]
            self.singles[w] = Agent(w, life, H)
            want[w] = self.singles[w].start(self.now, cursor)
        self._suspend_retries()
        self._compare(out, {}, want)

    def _suspend_retries(self) -> None:
        """With retries off, an agent in the batch holds no retry deadline."""
        if self.retries:
            return
        for w, a in self.singles.items():
            if w not in self.taken and a.state().retry_at is not None:
                self.singles[w] = Agent.restore(w, a.incarnation, H,
                                                replace(a.state(), retry_at=None))

    @rule(ws=ids, kind=st.sampled_from(["same", "table", "tuple"]),
          extra=st.lists(st.integers(1, 2), min_size=N, max_size=N), cursor=st.none() | cursors)
    def relaunch(self, ws: frozenset, kind: str, extra: list[int], cursor) -> None:
        """New processes for ``ws`` as new lives (also brings discarded ids back)."""
        if not ws:
            return
        ws = IdRuns.of(ws)
        old = {w: self.singles[w].incarnation if w in self.singles else 0 for w in ws}
        if kind == "same":
            self._relaunch(ws, max(old.values()) + extra[0], cursor)
        elif kind == "tuple":
            self._relaunch(ws, tuple(old[w] + extra[k] for k, w in enumerate(ws)), cursor)
        else:  # the keeper's order: its table bumped, a Lives snapshot
            for w in ws:
                self.table.set(w, old[w])
            self.table.bump(ws)
            self._relaunch(ws, self.table.snapshot(ws), cursor)

    @rule(ws=listed)
    def keeper_restart(self, ws: frozenset) -> None:
        """The keeper moves ``ws`` to new lives (later memberships fence the old)."""
        self.table.bump(IdRuns.of(ws))

    @rule(ws=ids)
    def discard(self, ws: frozenset) -> None:
        """The processes of ``ws`` are gone."""
        self.batch.discard(IdRuns.of(ws))
        for w in ws:
            self.taken.pop(w, None)
            self.singles.pop(w, None)

    @precondition(lambda self: self.batch.workers)
    @rule(i=st.integers(0, N))
    def take(self, i: int) -> None:
        held = self.batch.workers
        w = held[i % len(held)]
        self.taken[w] = self.batch.take(w, self.now)
        a = self.singles[w]
        if not self.retries and a.phase in (Phase.JOINING, Phase.BLOCKED):
            # taken out, it owes the retry it did not make while in the batch
            self.singles[w] = Agent.restore(w, a.incarnation, H,
                                            replace(a.state(), retry_at=self.now))

    @precondition(lambda self: self.taken)
    @rule(i=st.integers(0, N))
    def absorb(self, i: int) -> None:
        w = sorted(self.taken)[i % len(self.taken)]
        self.batch.absorb(self.taken.pop(w))
        self._suspend_retries()

    # --- inputs ---------------------------------------------------------------

    def _apply(self, to: frozenset, batch_call, agent_call) -> None:
        """The same input to the batch (for ``to``) and to each agent of ``to``."""
        to = IdRuns.of(to)
        out = batch_call(to)
        taken = {w: agent_call(a) for w, a in self.taken.items() if w in to}
        want = {w: agent_call(a) for w, a in self.singles.items() if w in to}
        self._suspend_retries()
        self._compare(out, taken, want)

    @rule(dt=st.sampled_from([0.01, 0.1, H, 2 * H, 1.0]))
    def advance(self, dt: float) -> None:
        self.now += dt
        now = self.now
        self._apply(frozenset(range(N)), lambda to: self.batch.handle_timer(now),
                    lambda a: a.handle_timer(now))

    @rule(dgen=st.integers(-1, 2), reason=st.sampled_from(["failure", "growth"]), to=ids)
    def roll_call(self, dgen: int, reason: str, to: frozenset) -> None:
        msg = RollCall(max(0, self.top_gen + dgen), reason)
        self._deliver(msg, to)

    def _deliver(self, msg, to: frozenset) -> None:
        now = self.now
        self._apply(to, lambda ws: self.batch.receive(now, msg, ws),
                    lambda a: a.receive(now, msg))

    @rule(dgen=st.integers(-1, 2), members=listed, agree=st.none() | listed, stale=listed,
          cursor=cursors, source=st.integers(0, N + 1), from_table=st.booleans(),
          to=st.none() | ids)
    def membership(self, dgen: int, members: frozenset, agree: Optional[frozenset],
                   stale: frozenset, cursor: Cursor, source: int, from_table: bool, to) -> None:
        """A generation admitting ``agree`` (None: all; the members listed
        with their agent's own life); the other members are listed with
        another life (or whatever the keeper's table says). Sent to the
        members, or to ``to``."""
        gen = max(1, self.top_gen + dgen)
        self.top_gen = max(self.top_gen, gen)
        ms = IdRuns.of(members)
        agree = members if agree is None else agree
        life = {w: a.incarnation for w, a in self.singles.items()}
        if from_table:
            for w in ms & IdRuns.of(agree):
                if w in life:
                    self.table.set(w, life[w])
            incs = self.table.snapshot(ms)
        else:
            incs = tuple(life.get(w, 0) + (w not in agree) for w in ms)
        src = source if source in ms else None
        # the keeper's source holds the state: it is never in the stale set
        m = Membership(gen, ms, incs, cursor, src, ms & IdRuns.of(stale - {src}))
        self._deliver(m, members if to is None else to)

    @precondition(lambda self: self.singles)
    @rule(i=st.integers(0, N), reason=st.sampled_from(REASONS),
          dinc=st.sampled_from([0, 0, -1, 1]), dgen=st.integers(-1, 1), also=ids)
    def refused(self, i: int, reason: str, dinc: int, dgen: int, also: frozenset) -> None:
        """A refusal of worker ``w``'s life (the keeper sends it to ``w`` alone;
        ``also`` hands the same one to other agents, which only their own
        life's refusal may move)."""
        w = sorted(self.singles)[i % len(self.singles)]
        inc = self.singles[w].incarnation + dinc
        self._deliver(Refused(w, inc, max(0, self.top_gen + dgen), reason), also | {w})

    @rule(cursor=cursors, to=ids, ready=st.booleans())
    def committed(self, cursor: Cursor, to: frozenset, ready: bool) -> None:
        """Training reached ``cursor`` (``ready``: a copy or load finished)."""
        now = self.now
        if ready:
            self._apply(to, lambda ws: self.batch.state_ready(now, cursor, ws),
                        lambda a: a.state_ready(now, cursor))
        else:
            self._apply(to, lambda ws: self.batch.step_committed(now, cursor, ws),
                        lambda a: a.step_committed(now, cursor))

    @rule(step=st.integers(0, 4), to=ids)
    def step_failed(self, step: int, to: frozenset) -> None:
        now = self.now
        self._apply(to, lambda ws: self.batch.step_failed(now, step, ws),
                    lambda a: a.step_failed(now, step))

    @rule(cursor=cursors, to=ids)
    def checkpointed(self, cursor: Cursor, to: frozenset) -> None:
        now = self.now
        self._apply(to, lambda ws: self.batch.checkpointed(now, cursor, ws),
                    lambda a: a.checkpointed(now, cursor))

    @rule(to=ids)
    def leave(self, to: frozenset) -> None:
        now = self.now
        self._apply(to, lambda ws: self.batch.leave(now, ws), lambda a: a.leave(now))

    # --- the comparison ---------------------------------------------------------

    def _compare(self, out: list[GroupAction], taken: dict[int, list],
                 want: dict[int, list]) -> None:
        got: dict[int, list] = defaultdict(list)
        for g in out:
            assert g.workers, "a group action names its agents"
            self._check_wire(g)
            for w, act in g.expand():
                got[w].append(act)
        for w, acts in taken.items():
            got[w] += acts
        if not self.heartbeats:
            assert not any(isinstance(g.action, SendToKeeper)
                           and isinstance(g.action.message, Heartbeat) for g in out), \
                "a batch with heartbeats off sends no beat"
            got = {w: _no_beats(a) for w, a in got.items()}
            want = {w: _no_beats(a) for w, a in want.items()}
        got = {w: a for w, a in got.items() if a}
        want = {w: a for w, a in want.items() if a}
        assert got == want, _diff(got, want)

    def _check_wire(self, g: GroupAction) -> None:
        """What goes to the keeper stands for exactly the expanded messages."""
        msgs = g.messages()
        if not isinstance(g.action, SendToKeeper):
            assert msgs == []
            return
        if not isinstance(g.action.message, Join):
            assert msgs == [a.message for _, a in g.expand()]
            return
        (batch,) = msgs
        assert isinstance(batch, JoinBatch)
        assert batch.workers == g.workers and batch.cursor == g.action.message.cursor
        if batch.incarnations is None:  # the keeper's own record: first lives, or admitted ones
            for w in g.workers:
                a = self.singles[w]
                assert a.incarnation == 0 or w in a.members, (w, a.incarnation, a.members)
        else:
            assert tuple(batch.incarnations) == tuple(g.incarnation_of(w) for w in g.workers)
            if g.lives.lives is not None:
                assert isinstance(batch.incarnations, Lives), "the keeper's Lives goes back"

    @invariant()
    def same_agents(self) -> None:
        held = self.batch.workers
        assert held.isdisjoint(IdRuns.of(self.taken))
        assert set(held) | set(self.taken) == set(self.singles)
        for w, single in self.singles.items():
            if w in self.taken:
                agent = self.taken[w]
                state, life = agent.state(), agent.incarnation
            else:
                state, life = self.batch.state_of(w), self.batch.incarnation_of(w)
            want = single.state()
            if not self.heartbeats:
                state, want = _masked(state), _masked(want)
            assert (state, life) == (want, single.incarnation), (w, state, want)

    @invariant()
    def same_may_step(self) -> None:
        for gen in range(self.top_gen + 2):
            got = set(self.batch.may_step(gen)) | \
                {w for w, a in self.taken.items() if a.may_step(gen)}
            assert got == {w for w, a in self.singles.items() if a.may_step(gen)}, gen

    @invariant()
    def same_timer(self) -> None:
        """The batch wakes when its agents would (with heartbeats off: for
        their retries only)."""
        times = []
        for w in self.batch.workers:
            a = self.singles[w]
            if not self.heartbeats:
                a = Agent.restore(w, a.incarnation, H, replace(a.state(), beat_at=None))
            times.append(a.get_timer())
        due = [t for t in times if t is not None]
        assert self.batch.get_timer() == (min(due) if due else None)


def _no_beats(actions: list) -> list:
    return [a for a in actions if not (isinstance(a, SendToKeeper)
                                       and isinstance(a.message, Heartbeat))]


def _diff(got: dict, want: dict) -> str:
    lines = []
    for w in sorted(set(got) | set(want)):
        if got.get(w) != want.get(w):
            lines.append(f"worker {w}:\n  batch  {got.get(w)}\n  agents {want.get(w)}")
    return "\n".join(lines)


BatchVersusAgents.TestCase.settings = settings(
    BatchVersusAgents.TestCase.settings, stateful_step_count=40)
TestBatchVersusAgents = pytest.mark.timeout(600)(BatchVersusAgents.TestCase)


# --- Lives compared sparsely ---------------------------------------------------

table_ops = st.lists(st.tuples(st.sampled_from(["set", "bump", "snap"]), st.frozensets(
    st.integers(0, 30), max_size=12), st.integers(0, 4)), max_size=25)


class _FoldOften(LifeTable):
    FOLD = 3  # snapshots with and without a shared base


def test_snapshots_folds_apart_differ_by_the_folds_between_only() -> None:
    """Two snapshots of one table compare by the ids written between them,
    however many folds apart, not by every life stored in a long run; a
    copy (a message's) carries no fold history and compares by its keys."""
    import pickle

    table = _FoldOften()
    for w in range(40):
        table.set(w, 2)
    a = table.snapshot(IdRuns.span(0, 50))
    for w in range(40, 45):
        table.set(w, 1)
    b = table.snapshot(IdRuns.span(0, 50))
    assert a._own.base is not b._own.base  # folded in between
    assert a._own.changed_keys(b._own) == set(range(40, 45))
    assert b.agreeing(IdRuns.span(0, 50), a) == IdRuns.span(0, 39) | IdRuns.span(45, 50)
    copy = pickle.loads(pickle.dumps(b))
    assert copy._own.folds == [] and tuple(copy) == tuple(b)
    assert copy.agreeing(IdRuns.span(0, 50), a) == b.agreeing(IdRuns.span(0, 50), a)


@given(table_ops, st.frozensets(st.integers(0, 30)), st.integers(0, 5), st.booleans())
def test_lives_agreeing_and_having_match_a_per_id_comparison(ops, ws, life, often) -> None:
    """``Lives.agreeing`` / ``having`` (what the batch admits by) answer what
    comparing the lives one id at a time answers, across bumps and folds."""
    table = _FoldOften() if often else LifeTable()
    everyone = IdRuns.span(0, 30)
    snaps = [table.snapshot(everyone)]
    for op, xs, v in ops:
        if op == "set":
            for w in xs:
                table.set(w, v)
        elif op == "bump":
            table.bump(IdRuns.of(xs))
        else:
            snaps.append(table.snapshot(IdRuns.of(xs) | IdRuns.of(ws)))
    snaps.append(table.snapshot(everyone))
    ws = IdRuns.of(ws)
    for a in snaps:
        common = ws & a.members
        assert list(a.having(ws, life)) == [w for w in common if a.of(w) == life]
        for b in snaps:
            both = common & b.members
            assert list(a.agreeing(ws, b)) == [w for w in both if a.of(w) == b.of(w)]


# --- units: snapshot, expansion, wire form ------------------------------------

def test_an_agent_state_restores_every_attribute() -> None:
    a = Agent(7, 3, H, join_retry_s=0.9)
    a.start(1.0, Cursor(2, 20))
    a.receive(1.1, Membership(4, (5, 7), (0, 3), Cursor(2, 20), 5, (7,)))
    a.step_failed(1.2, 2)
    b = Agent.restore(7, 3, H, a.state(), join_retry_s=0.9)
    assert vars(b) == vars(a)  # an attribute added to Agent but not to AgentState fails here


def test_group_actions_expand_to_each_agents_own() -> None:
    """One membership to a group of three with different lives: each gets its
    rank, its record, and joins with its own life."""
    table = LifeTable()
    ws = IdRuns.of([3, 5, 7])
    for w, life in ((3, 1), (5, 2), (7, 2)):
        table.set(w, life)
    batch = AgentBatch(H)
    batch.start(0.0, ws, table.snapshot(ws))
    members = IdRuns.of([1, 3, 5, 7])
    m = Membership(1, members, table.snapshot(members), Cursor(1, 8), 1, IdRuns.of([7]))
    out = batch.receive(0.1, m, members)
    per = defaultdict(list)
    for g in out:
        for w, act in g.expand():
            per[w].append(act)
    for w, rank, sync in ((3, 1, False), (5, 2, False), (7, 3, True)):
        enter, log = per[w]
        assert enter == Enter(1, members, rank, Cursor(1, 8), 1, sync, True,  # 7 is stale
                              stale=IdRuns.of([7]))
        assert log.record["process"] == w and log.record["f"] == "enter"
    out = batch.receive(0.2, RollCall(2, "failure"), members)
    joins = sorted((a.message for g in out for _, a in g.expand()
                    if isinstance(a, SendToKeeper)), key=lambda j: j.worker)
    assert joins == [Join(3, 1, Cursor(1, 8), 1), Join(5, 2, Cursor(1, 8), 1),
                     Join(7, 2, None, 1)]
    assert all(isinstance(a, (Abort, Log, SendToKeeper)) for g in out for _, a in g.expand())


def test_wire_forms_are_the_joins_a_simulator_sends() -> None:
    """First lives join as one JoinBatch without lives; a relaunch's lives go
    back as the keeper's own Lives; admitted members answer a roll call with
    their cursor, stale ones (copy not done) without."""
    batch = AgentBatch(H, heartbeats=False)
    (g,) = batch.start(0.0, range(6), 0)
    assert g.messages() == [JoinBatch(IdRuns.span(0, 5), None)]
    table = LifeTable()
    ws = IdRuns.span(0, 5)
    table.bump(ws)
    order = table.snapshot(ws)
    batch.discard(ws)
    (g,) = batch.start(1.0, ws, order)
    (msg,) = g.messages()
    assert msg.workers == ws and msg.cursor is None and msg.incarnations is order
    m = Membership(1, ws, table.snapshot(ws), Cursor(3, 30), None, IdRuns.of([4, 5]))
    batch.receive(1.1, m, ws)
    out = batch.receive(2.0, RollCall(2, "failure"), ws)
    sent = [msg for g in out for msg in g.messages()]
    assert sorted(sent, key=lambda j: j.workers.first()) == [
        JoinBatch(IdRuns.span(0, 3), Cursor(3, 30), None, 1),
        JoinBatch(IdRuns.of([4, 5]), None, None, 1)]  # stamped: members of generation 1
    (g,) = AgentBatch(H).start(0.0, [8, 9], (2, 3))
    assert g.messages() == [JoinBatch(IdRuns.of([8, 9]), None, (2, 3))]


def test_heartbeats_off_sets_beats_aside_and_a_taken_agent_owes_one() -> None:
    batch = AgentBatch(H, heartbeats=False)
    batch.start(0.0, range(4), 0)
    assert batch.get_timer() == 2 * H  # the join retry, not the beat
    assert batch.handle_timer(H) == []  # a beat was due: none sent
    a = batch.take(2, 0.3)
    assert a.counter == 0 and a.get_timer() == 0.3  # the beat it owes
    assert a.handle_timer(0.3) == [SendToKeeper(Heartbeat(2, 0, 0, 1))]
    batch.absorb(a)
    assert batch.n_groups == 1  # beats apart, the same state as the others
    assert batch.take(2, 0.4).counter == 1  # its counter comes back, never reset


# --- the cost model, by counting ------------------------------------------------

BIG = 20_000


def _sends(out: list[GroupAction]) -> list:
    return [msg for g in out for msg in g.messages()]


def test_a_big_job_costs_groups_not_ids() -> None:
    """Start, admission, roll call, relaunch of 10^4 lives, admission again,
    a newcomer merging in: a few groups throughout, no id handled singly."""
    ws = IdRuns.span(0, BIG - 1)
    holes = IdRuns.of([17, 4000, 12_345])
    table = LifeTable()
    batch = AgentBatch(H, heartbeats=False)
    assert len(_sends(batch.start(0.0, ws, 0))) == 1 and batch.n_groups == 1
    members = ws - holes
    m = Membership(1, members, table.snapshot(members), Cursor(), None, IdRuns.of([5, 6]))
    out = batch.receive(0.1, m, members)
    assert len(out) == 4 and batch.n_groups == 3  # stale, current, the holes still joining
    assert batch.may_step(1) == members
    batch.state_ready(0.5, Cursor(), IdRuns.of([5, 6]))
    batch.step_committed(9.0, Cursor(90, 900), members)
    assert batch.n_groups == 2
    out = batch.receive(9.1, RollCall(2, "failure"), members)
    assert _sends(out) == [JoinBatch(members, Cursor(90, 900), None, 1)]
    assert batch.may_step(1) == IdRuns.of([])
    # checkpoint-restart: every member's process goes, the keeper's order relaunches them
    table.bump(members)
    order = table.snapshot(members)
    batch.discard(members)
    (g,) = batch.start(10.0, members, order)
    assert g.messages() == [JoinBatch(members, None, order)] and batch.n_groups == 2
    m2 = Membership(2, ws, table.snapshot(ws), Cursor(50, 500), None, ws)
    batch.receive(10.5, m2, ws)
    assert batch.n_groups == 1 and batch.may_step(2) == ws  # the holes admitted too
    a = batch.take(77, 11.0)  # a paused node is driven alone, then merges back
    assert 77 not in batch and batch.workers == ws - IdRuns.of([77])
    batch.absorb(a)
    assert batch.n_groups == 1 and batch.workers == ws
    assert batch.singly == 0


def _config(strategy: str, n: int) -> KeeperConfig:
    return KeeperConfig(min_workers=1, max_workers=n, last_call_s=0.5,
                        detector=TimeoutDetector(H, 3.0), strategy=strategy,
                        relaunch_timeout_s=20.0)


class _Loop:
    """A keeper and a batch wired as a simulator would, latency 0: the
    batch's messages in, the keeper's outputs out."""

    def __init__(self, strategy: str) -> None:
        self.keeper = Keeper(_config(strategy, BIG))
        self.batch = AgentBatch(H, heartbeats=False)
        self.formed: list[Formed] = []
        self.keeper_calls = 0

    def send(self, now: float, out: list[GroupAction]) -> None:
        msgs = _sends(out)
        if msgs:
            self.keeper_calls += 1
            self.apply(now, self.keeper.receive_many(now, msgs))

    def tick(self, now: float) -> None:
        self.keeper.observe_alive_except(now, IdRuns.of([]))
        self.apply(now, self.keeper.handle_timer(now))

    def apply(self, now: float, outputs: list) -> None:
        for o in outputs:
            if isinstance(o, Formed):
                self.formed.append(o)
            elif isinstance(o, Broadcast):
                out = self.batch.receive(now, o.message, o.to)
                if isinstance(o.message, Membership):
                    stale = IdRuns.of(o.message.stale)
                    out += self.batch.state_ready(now, o.message.cursor, stale)
                self.send(now, out)
            elif isinstance(o, RestartJob):
                self.batch.discard(o.teardown)
            elif isinstance(o, Relaunch):
                self.send(now, self.batch.start(now, o.workers, o.incarnations))


@pytest.mark.parametrize("strategy", ["elastic", "checkpoint-restart"])
def test_a_keeper_and_a_batch_of_many_agents(strategy: str) -> None:
    """The batch's wire forms are the ones the keeper admits wholesale: a
    job of 2*10^4 forms, loses a worker, and forms again (elastic: a roll
    call; checkpoint-restart: a relaunch of every other life) in a handful
    of keeper calls, with a few groups and no id handled singly."""
    loop = _Loop(strategy)
    loop.send(0.0, loop.batch.start(0.0, range(BIG), 0))
    loop.tick(1.0)  # the last call
    (first,) = loop.formed
    assert first.members == IdRuns.span(0, BIG - 1) and loop.batch.may_step(1) == first.members
    loop.batch.step_committed(5.0, Cursor(40, 400), first.members)
    dead = 1234
    loop.batch.discard([dead])  # its machine is gone
    loop.keeper.node_down(5.0, dead)
    loop.apply(5.0, loop.keeper.exited(5.0, dead, 0))
    loop.tick(6.5)  # a restart's relaunch is due 1 s after the teardown
    loop.tick(7.0)
    last = loop.formed[-1]
    assert last.generation == 2 and last.members == IdRuns.span(0, BIG - 1) - IdRuns.of([dead])
    assert loop.batch.may_step(2) == last.members
    if strategy == "elastic":
        assert last.cursor == Cursor(40, 400) and last.source == 0
    else:
        assert last.source is None and all(loop.batch.incarnation_of(w) == 1 for w in (0, BIG - 1))
    assert loop.batch.n_groups <= 2 and loop.batch.singly == 0 and loop.keeper_calls <= 4
