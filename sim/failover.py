"""The record-keeper's death and its successor's takeover, on the sim.

With ``keeper.store: etcd`` the core keeper is durable: each generation it
decides is written to the store before anyone hears of it
(:class:`rollcall.core.keeper.Persist`); here the store is a variable that
accepts every write (etcd's own faults are the real target's to test: a
three-member cluster that loses one member keeps its quorum, so a
``kill_etcd`` costs the job nothing). The write's time is not charged: it is
milliseconds against a step (``benchmarks/`` measures it on real etcd).

A keeper dies at random (``keeper.mtbf_s``, the stream ``keeper``) or when a
``kill_keeper`` fault fires. Physically that means:

- nothing decides until a standby takes over, ``keeper.takeover_s`` later
  (the lease must lapse, then an election and a rebuild): every message sent
  to the keeper meanwhile is lost with its connection, and so are the commit
  requests on their way (the steps they carry are lost work);
- the members cannot commit, so the job stalls;
- the successor is the core's :meth:`Keeper.restored` from the last record,
  told what the supervisor knows (the lives it started, the nodes that are
  down, the lives whose exit their hosts saw: a crashed machine's is left to
  the detector, as on real) and :meth:`Keeper.take_over`
  opens a roll call; every agent re-sends what it had asked and not had
  answered (:meth:`rollcall.core.agent.Agent.reconnected`).

This module only carries that out; every decision is the core's.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from rollcall.core import LEASE_MARGIN, NEMESIS, Keeper, KeeperRecord, Persist, last_renewal, rec

from sim.world import World


class KeeperFailover:
    """One sim run's keeper deaths and takeovers."""

    def __init__(self, sim: World) -> None:
        k = sim.sc.keeper
        self.sim = sim
        self.mtbf_s = k.mtbf_s
        self.takeover_s = k.takeover_s
        self.stored: Optional[KeeperRecord] = None  # the store's latest generation
        self.back_at: Optional[float] = None  # while no keeper serves: when one takes over
        self.took_over_at = 0.0  # when the serving keeper began (its renewals count from then)
        self.count = 0

    @property
    def down(self) -> bool:
        """Whether no keeper serves now."""
        return self.back_at is not None

    def persist(self, now: float, out: Persist) -> list:
        """The store takes the write (the compare-and-set holds: one keeper
        writes at a time here; a restart writes the latest generation again)
        and the keeper hears so."""
        last = 0 if self.stored is None else self.stored.generation
        assert out.generation == last + (0 if out.again else 1), (
            "the store's compare-and-set", out.generation, out.again, last)
        self.stored = out.record
        return self.sim.keeper.persisted(now, out.generation, True)

    def process(self):
        """Random keeper deaths: each keeper lives a draw of the stream ``keeper``."""
        sim = self.sim
        while True:
            life = sim.draws.next_keeper_life(self.mtbf_s)
            if life is None:
                return
            yield sim.env.timeout(life)
            if sim.finished:
                return
            self.fail(sim.env.now, "crash")
            yield sim.env.timeout(self.takeover_s)  # the next keeper's life starts then

    def cut(self, now: float, for_s: float) -> None:
        """``partition_keeper``: the active keeper loses etcd, not its workers.
        It renewed its lease every ``RENEW_SHARE`` of the TTL since it took
        over, none late, so its last renewal is the latest of those at or
        before the cut (:func:`last_renewal`): the keeper is told its lease
        holds until ``LEASE_MARGIN`` of the TTL from then
        (:meth:`Keeper.hold`, as the keeper process is after each renewal)
        and deposes itself there, on its own clock; a standby takes over
        ``takeover_s`` after the cut (not before the keeper stopped)."""
        sim = self.sim
        if self.down or sim.finished:
            return
        keeper = sim.keeper
        sim.write(rec(now, "info", "fault", NEMESIS, kind="partition_keeper",
                       term=keeper.term, for_s=for_s))
        sim.cast_votes(now)  # the commit requests that reached it were answered
        ttl_s = sim.sc.keeper.lease_ttl_s
        renewed = last_renewal(self.took_over_at, now, ttl_s)
        until = renewed + LEASE_MARGIN * ttl_s
        keeper.hold(renewed, until)
        back = max(now + self.takeover_s, until)
        sim.at(until, lambda: self._lease_lapsed(keeper, back))

    def _lease_lapsed(self, keeper: Keeper, back_at: float) -> None:
        """The cut-off keeper's lease ends: woken, it deposes itself (its
        ``deposed`` record and :class:`Deposed`), and it stops."""
        sim = self.sim
        if sim.keeper is not keeper or self.down or sim.finished:
            return
        now = sim.env.now
        sim.port.call(now, keeper.handle_timer)
        if not sim.finished:
            self.fail(now, "partition", back_at=back_at)

    def fail(self, now: float, cause: str, back_at: Optional[float] = None) -> None:
        """The active keeper stops now (``cause``: ``crash`` at random, ``kill``
        by a fault, ``partition``: deposed on its own clock, cut off from etcd);
        a standby takes over at ``back_at`` (default ``takeover_s`` from now)."""
        sim = self.sim
        if self.down or sim.finished:
            return
        if cause != "partition":
            sim.write(rec(now, "info", "fault", NEMESIS, kind="kill_keeper", cause=cause,
                           term=sim.keeper.term))
        sim.cast_votes(now)  # the commit requests that reached it were answered
        sim.job.stall(now)  # nobody can commit: the members wait for a keeper
        sim.votes.keeper_lost()  # requests still on their way find no keeper
        self.count += 1
        self.back_at = now + self.takeover_s if back_at is None else back_at
        sim.at(self.back_at, self.take_over)

    def take_over(self) -> None:
        """A standby of the next term rebuilds the keeper from the store."""
        sim = self.sim
        now = sim.env.now
        if sim.finished:
            self.back_at = None
            return
        old = sim.keeper
        k = Keeper.restored(old.config, self.stored, old.term + 1)
        sim.keeper, self.back_at, self.took_over_at = k, None, now
        nodes = sim.nodes
        # the supervisor's report, as the real launcher's: the lives running
        # or starting (a relaunched process not joined yet), the nodes lost
        # and not given back to the job (a repaired node held idle among
        # them), the exits their hosts saw
        started = nodes.lives_started() | nodes.lives_starting()
        down = [int(w) for w in np.flatnonzero(nodes.held_down)]
        sim.port.call(now, k.take_over, started, down, sorted(nodes.lives_exited().items()),
                      sim.shop.capacity)
        sim.port.vouch(now)  # the silent ones' verdicts come at the new keeper's own timer
        sim.agents.reconnected(now)  # and asks again what went unanswered
        sim.port.rearm(now)
