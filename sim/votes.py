"""The commit votes of the sim's computed steps, cast as they reach the keeper.

Steps are computed at job level in runs (:class:`sim.steps.StepRun`); each
step's vote reaches the keeper one latency after the step ends, sent by the
lowest live member, and counts only through the keeper's commit rule
(``Keeper.commit``, the rule the real launcher applies). A vote is cast
before the first keeper input that comes later, so one that arrives after
a roll call opened is refused and its steps are lost, as on real. While a
member is slow (``strategy.stragglers: evict``) each step's vote is cast
when it arrives, with the members' compute, so that the straggler policy
judges each step when the real target's does.
"""

from __future__ import annotations

from collections import deque
from typing import Optional, Protocol

import numpy as np

from rollcall.core import Checkpointed, Cursor, IdRuns

from sim.host import Host, KeeperOutage
from sim.state import Tally
from sim.steps import EPS, StepRun

__all__ = ["VoteHost", "Votes"]


class Port(Protocol):
    """The keeper's side (:class:`sim.keeper_port.KeeperPort`)."""

    def apply(self, now: float, outputs: list) -> None: ...

    def tick(self, now: float, votes: bool = False) -> None: ...

    def receive(self, now: float, messages: list) -> None: ...

    def receive_at(self, messages: list) -> None: ...


class Batched(Protocol):
    """The agents (:class:`sim.agents.Agents`)."""

    @property
    def any_single(self) -> bool: ...


class Closed(Protocol):
    """The run's ledger (:class:`sim.ledger.Ledger`)."""

    def run_closed(self, run: StepRun) -> None: ...


class VoteHost(Host, Protocol):
    """What the votes need more of the simulation."""

    @property
    def failover(self) -> KeeperOutage: ...

    @property
    def port(self) -> Port: ...

    @property
    def ledger(self) -> Closed: ...

    @property
    def tally(self) -> Tally: ...

    @property
    def agents(self) -> Batched: ...


class Votes:
    """The computed steps whose votes are not all cast, and the casting."""

    def __init__(self, host: VoteHost) -> None:
        self._host = host
        self.runs: deque[StepRun] = deque()  # oldest first; the job appends and closes them
        self._last_voter: Optional[int] = None
        self._first_member: Optional[int] = None  # the usual voter: asked once per vote
        self._wake: Optional[float] = None  # a vote watched while a member is slow

    def keeper_lost(self) -> None:
        """The keeper died: every vote still on its way finds no keeper."""
        for run in self.runs:
            run.refused = True

    def new_generation(self, members: IdRuns) -> None:
        """A generation formed with ``members``: its lowest usually votes."""
        self._first_member = members.first()

    def voter(self) -> int:
        """The member whose commit vote reaches the keeper first: the lowest live one."""
        host = self._host
        w, nodes = self._last_voter, host.nodes
        if w is not None and nodes.member_flags[w] and nodes.proc[w] and not nodes.paused[w]:
            if w == self._first_member or not self._alive_below(w):
                return w
        w = next((m for m in host.job.members if nodes.proc[m] and not nodes.paused[m]),
                 host.job.members.first())  # none is left: their votes were already on the way
        self._last_voter = w
        return w

    def _alive_below(self, w: int) -> bool:
        """Whether a member below ``w`` beats (a paused one resumed, say)."""
        nodes = self._host.nodes
        return bool(np.count_nonzero(nodes.member_flags[:w] & nodes.proc[:w] & ~nodes.paused[:w]))

    def cast(self, t: float, everything: bool = False) -> None:
        """Cast the commit votes that reached the keeper by ``t`` (see
        :mod:`sim.steps`), or, with ``everything``, all votes of the closed
        runs: a roll call is open, so none that is still on its way can pass."""
        runs, lat = self.runs, self._host.lat
        while runs:
            run = runs[0]
            n = run.n  # None: the running segment (run.closed, run.done read inline)
            assert n is not None or not everything, "a roll call closes the running segment first"
            # a segment closed after its last computed step's vote was cast
            # (a slowdown's start or end closes it at that step) has no vote
            # left to wait for: it is written now, not at a vote that never comes
            if n is None or run.voted != n:
                k = n if everything else run.arrived(t, lat)
                if k is None:
                    return  # the next vote is still on its way (the common case: O(1))
                if k > run.voted:
                    self._vote(t, run, k)
                if n is None or run.voted != n:
                    return
            runs.popleft()
            self._host.ledger.run_closed(run)

    def _vote(self, t: float, run: StepRun, k: int) -> None:
        """The vote on steps ``voted+1..k`` of ``run``: the keeper's commit rule."""
        host = self._host
        first, last = run.first + run.voted, run.first + k - 1
        # the keeper hears the run's last vote when it arrives: no later input
        # came since (each casts the votes that reached it first)
        t = min(t, run.vote_at(k, host.lat))
        if host.failover.down:
            run.refused = True  # no keeper hears it (those that reached it were cast at its end)
        if not run.refused:
            w = self.voter()
            verdict = host.keeper.commit(t, w, host.nodes.life_of(w), run.gen, first, last)
            if verdict.ok:
                assert run.vote_at(k, host.lat) <= t + EPS, "a vote passed before it arrived"
                assert verdict.first, "the sim votes each step once"
                run.passed = k
                run.voter = w if run.voter is None else run.voter
                host.job.passed(t, run.cursor_after(k), verdict.complete)
                if run.compute is not None:
                    self._report_compute(t, run, first, last)
            else:
                run.refused = True  # final: the generation is over for commits
        run.voted = k

    def _report_compute(self, t: float, run: StepRun, first: int, last: int) -> None:
        """The members' compute in steps ``first..last``, with their vote (a
        real member's goes with its commit request): the keeper's straggler
        policy decides from it."""
        assert run.compute is not None
        typical, slow = run.compute
        host = self._host
        host.port.apply(t, host.keeper.report_steps(t, run.gen, first, last, typical, slow))

    def report_checkpoint(self, now: float, gen: int, cursor: Cursor) -> None:
        """The checkpoint of ``cursor`` is written: the member that votes
        (the lowest live one) tells the keeper, which hears it a latency later."""
        host = self._host
        reporter = self.voter()
        if not host.alive(reporter):
            return
        msg = Checkpointed(reporter, host.nodes.life_of(reporter), gen, cursor)
        t = now + host.lat
        if t < host.env.peek() and not host.agents.any_single:
            host.port.receive(t, [msg])  # nothing else happens first: deliver it now
        else:
            host.at(t, host.port.receive_at, [msg])

    def lose_outstanding(self) -> None:
        """The run ends: the steps whose votes nobody will answer are lost."""
        host = self._host
        for run in self.runs:
            run.voted = run.n
            host.ledger.run_closed(run)
        self.runs.clear()

    def watch(self) -> None:
        """While a member is slow, each step's vote is cast when it reaches the
        keeper, as each real step's commit request is, so the straggler
        policy judges each step when real's does (a wake per step, only then)."""
        host = self._host
        if self._wake is not None or not self.runs or host.finished:
            return
        run = self.runs[-1]
        limit = run.cap if run.n is None else run.n  # a closed run's steps, or its cap
        if run.refused or run.voted >= limit or run.gen != host.job.gen:
            return
        if run.compute is None or not run.compute[1]:
            return  # nobody slow: the votes go in bulk
        t = run.vote_at(run.voted + 1, host.lat)
        if host.failover.back_at is not None:  # no keeper hears it before a standby takes over
            t = max(t, host.failover.back_at)
        self._wake = t
        host.at(t, self._on_wake)

    def _on_wake(self) -> None:
        host = self._host
        self._wake = None
        if host.finished:
            return
        host.port.tick(host.env.now, votes=True)
        self.watch()
