"""Every worker process's core agent on the sim, and the messages between them and the keeper.

The bulk of the agents is one :class:`rollcall.core.AgentBatch` (groups of
identical state; heartbeats are not simulated, the keeper hears liveness
in bulk). An agent whose process is exceptional (paused, cut off, beats
held back, a newcomer until admitted) is taken out of the batch as a
single :class:`rollcall.core.Agent` in its exact state; what is sent to it
while its process cannot hear waits until it can. What any agent sends
reaches the keeper one link latency later (its host's link:
:mod:`sim.network`).

This module only carries messages and reports facts (a process started,
stopped, holds the committed state); the agents decide what to send.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from rollcall.core import Agent, AgentBatch, Cursor, Enter, IdRuns, Log, SendToKeeper, Stop

from sim.host import Host
from sim.keeper_port import KeeperInbox

__all__ = ["Agents", "AgentHost"]


class AgentHost(Host, Protocol):
    """What the agents need more: each worker's link and the keeper's inbox."""

    def one_way_s(self, w: int) -> float:
        """One message between the keeper and worker ``w``, seconds."""

    @property
    def port(self) -> KeeperInbox: ...


class Agents:
    """The agents of one run: the batch, the single ones, what waits for them."""

    def __init__(self, host: AgentHost, heartbeat_s: float, per_worker_records: bool) -> None:
        self._host = host
        self._heartbeat_s = heartbeat_s
        # the agents' own records (enter, abort, fenced) on runs small enough
        # to keep one per worker (the per-sample ledger's)
        self._per_worker_records = per_worker_records
        # no retries: the sim's network loses nothing
        self._batch = AgentBatch(heartbeat_s, heartbeats=False, retries=False)
        self._singles: dict[int, Agent] = {}
        self._held: dict[int, list[Any]] = {}  # sent to a single agent that cannot hear yet

    @property
    def any_single(self) -> bool:
        """Whether some agent is out of the batch (its process is exceptional)."""
        return bool(self._singles)

    # --- processes start and end ---------------------------------------------------

    def launch(self, now: float, w: int, incarnation: int) -> list:
        """A process started on node ``w`` as ``incarnation`` (the node ran
        none): its agent joins the batch; returns what it sends first (a Join)."""
        self.forget(w)
        a = Agent(w, incarnation, self._heartbeat_s)
        msgs = [act.message for act in a.start(now, None) if isinstance(act, SendToKeeper)]
        self._batch.absorb(a)
        return msgs

    def start(self, now: float, ids: IdRuns, incarnations: Any) -> list:
        """Processes started on ``ids`` (the first ones, a relaunch): what
        their agents send (one batch of Joins)."""
        return self.batch_actions(now, self._batch.start(now, ids, incarnations))

    def forget(self, w: int) -> None:
        """Node ``w``'s single agent, and what waited for it, are gone."""
        self._singles.pop(w, None)
        self._held.pop(w, None)

    def discard(self, w: int) -> None:
        """Node ``w``'s process is gone: its agent, wherever it is."""
        self.forget(w)
        self._batch.discard((w,))

    def forget_flagged(self, flags: np.ndarray) -> None:
        """The single agents of the flagged nodes are gone."""
        for w in [w for w in self._singles if flags[w]]:
            self.forget(w)

    def tear_down(self, flags: np.ndarray, ids: IdRuns) -> None:
        """A restart's teardown: the processes of ``ids`` (flagged) are gone."""
        self.forget_flagged(flags)
        self._batch.discard(ids)

    # --- messages to the agents ----------------------------------------------------

    def single(self, now: float, w: int) -> Agent:
        """Node ``w``'s agent as a single one (taken out of the batch)."""
        a = self._singles.get(w)
        if a is None:
            a = self._singles[w] = self._batch.take(w, now)
        return a

    def hold_for_singles(self, message: Any, to: IdRuns) -> None:
        """``message`` to ``to``: the single agents among them (paused
        processes) get it when they hear again."""
        for w in self._singles:
            if w in to:
                self._held.setdefault(w, []).append(message)

    def step_committed(self, now: float, committed: Cursor, holders: IdRuns) -> None:
        """The trainers of ``holders`` hold the committed state (a fact)."""
        self._batch.step_committed(now, committed, holders)

    def receive(self, now: float, message: Any, to: IdRuns) -> list:
        """``message`` reaches the batch's agents of ``to``: what they send."""
        return self.batch_actions(now, self._batch.receive(now, message, to))

    def send(self, now: float, w: int, message: Any) -> None:
        """The keeper sends ``message`` to worker ``w``: it arrives a link later."""
        a = self._singles.get(w)
        if a is None:
            self._host.at(now + self._host.one_way_s(w), self._deliver_to_batch, w, message)
        else:
            self._host.at(now + self._host.one_way_s(w), self._deliver, w, a, message)

    def _deliver_to_batch(self, w: int, message: Any) -> None:
        host = self._host
        now = host.env.now
        if w in self._singles:  # taken out of the batch meanwhile (paused)
            self._deliver(w, self._singles[w], message)
            return
        msgs = self.receive(now, message, IdRuns.of((w,)))
        if msgs:
            host.at(now + host.one_way_s(w), host.port.receive_at, msgs)

    def _deliver(self, w: int, a: Agent, message: Any) -> None:
        nodes = self._host.nodes
        if self._singles.get(w) is not a or not nodes.proc[w]:
            return
        if nodes.paused[w]:
            self._held.setdefault(w, []).append(message)
            return
        now = self._host.env.now
        self.actions(now, w, a.receive(now, message))

    def beat_again(self, now: float, w: int) -> None:
        """Node ``w``'s agent hears what was held for it and sends the beat
        that was due (its first in a while), then goes back among the bulk."""
        a = self.single(now, w)
        actions: list = []
        for message in self._held.pop(w, []):
            actions += a.receive(now, message)
        actions += a.handle_timer(now)
        self.actions(now, w, actions)
        if self._singles.get(w) is a:  # beating again: back among the bulk
            del self._singles[w]
            self._batch.absorb(a)

    def reconnected(self, now: float) -> None:
        """A new keeper serves: every agent reaches it and asks again what
        went unanswered."""
        host = self._host
        msgs = self.batch_actions(now, self._batch.reconnected(now))
        if msgs:
            host.at(now + host.lat, host.port.receive_at, msgs)
        nodes = host.nodes
        for w, a in list(self._singles.items()):
            if nodes.proc[w] and not nodes.paused[w]:
                self.actions(now, w, a.reconnected(now))

    # --- what the agents do ----------------------------------------------------------

    def batch_actions(self, now: float, out: list) -> list:
        """What the batch's agents send the keeper; their records too, on
        runs that keep them. Fenced agents' processes exit (a life started
        as one the keeper has since moved past: a repaired node's, refused
        once a restart came)."""
        msgs = []
        for group in out:
            msgs += group.messages()
            if isinstance(group.action, Log) and self._per_worker_records:
                for _, act in group.expand():
                    self._host.write(act.record)
            elif isinstance(group.action, Stop):
                for w in group.workers:
                    self._host.nodes.proc[w] = False
                self._batch.discard(group.workers)
        return msgs

    def actions(self, now: float, w: int, actions: list) -> None:
        """Carry out what node ``w``'s single agent does."""
        host = self._host
        msgs = []
        for act in actions:
            if isinstance(act, SendToKeeper):
                msgs.append(act.message)
            elif isinstance(act, Log):
                host.write(act.record)
            elif isinstance(act, Stop):
                host.nodes.proc[w] = False
                self._singles.pop(w, None)
                self._batch.discard((w,))
            elif isinstance(act, Enter):
                pass  # the job follows the keeper's Formed output
        if msgs:
            host.at(now + host.one_way_s(w), host.port.receive_at, msgs)
