"""Workers that stop being heard, on the sim: lost, paused, cut off, or late with their beats.

A member whose process stops beating (its machine lost, the process
stopped, on the far side of a partition) hangs the all-or-nothing exchange:
the job stalls until it is heard again or the keeper evicts it. The keeper
is told when its last beat arrived (``Keeper.observe_silent``, at
``detector.last_arrival``) and its detector decides. A worker cut off from
the keeper only (``isolate_keeper``) still trains with its peers, so the
step in flight is done; then it waits for a commit answer that cannot come,
as a real member does, and the job's next exchange hangs on it. A worker
whose heartbeats are late on a degraded link (:mod:`sim.network`), or held
back (``late_heartbeats``), trains, votes and answers on time; only its
beats are late.

This module keeps who is silent and why; the job's stall and the keeper's
verdicts are the simulation's and the keeper's.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from rollcall.core import NEMESIS, Detector, rec

from sim.host import Host
from sim.keeper_port import KeeperInbox

__all__ = ["SilenceHost", "Silences"]


class Singles(Protocol):
    """The agents (:class:`sim.agents.Agents`)."""

    def single(self, now: float, w: int) -> Any: ...

    def beat_again(self, now: float, w: int) -> None: ...

    def discard(self, w: int) -> None: ...


class SilenceHost(Host, Protocol):
    """What the silences need of the simulation."""

    @property
    def detector(self) -> Detector: ...

    @property
    def exit_notice_s(self) -> float:
        """A killed process's exit, heard by the keeper this much later."""

    @property
    def port(self) -> KeeperInbox: ...

    @property
    def agents(self) -> Singles: ...


class Silences:
    """Who of one run is silent, and how many members hang the exchange."""

    def __init__(self, host: SilenceHost) -> None:
        self._host = host
        self._isolated: set[int] = set()  # cut off from the keeper only (isolate_keeper)
        # late_heartbeats: worker -> its process's start, while its beats are held
        self._held: dict[int, float] = {}
        self._members = 0  # members whose silence hangs the exchange

    @property
    def late_beats(self) -> tuple[int, ...]:
        """Live workers whose beats are held back (``late_heartbeats``)."""
        return tuple(sorted(self._held))

    def launched(self, w: int) -> None:
        """A new process runs on node ``w``: its beats are its own."""
        self._held.pop(w, None)

    def recount(self) -> int:
        """Members of the current generation whose process does not beat
        (and so hangs the collective: one only the keeper lost does not)."""
        nodes = self._host.nodes
        silent = int(np.count_nonzero(nodes.member_flags & ~(nodes.proc & ~nodes.paused)))
        self._members = silent - sum(1 for w in self._isolated if nodes.member_flags[w])
        return self._members

    def torn_down(self, flags: np.ndarray) -> None:
        """A restart tore the flagged processes down; no member is left."""
        self._isolated = {w for w in self._isolated if not flags[w]}
        self._members = 0

    # --- going silent -----------------------------------------------------------------

    def _go_silent(self, now: float, w: int, stall: bool = True) -> None:
        """Node ``w`` stops beating now: tell the keeper its last beat, schedule
        the verdict; a member stalls the job (its collective hangs) unless
        its peers still reach it (``stall`` false: only the keeper lost it)."""
        host = self._host
        last = host.detector.last_arrival(now, float(host.nodes.started_at[w]), host.lat)
        host.keeper.observe_silent(last, (w,))
        host.port.rearm(now)
        if stall:
            self._member_silent(now, w)

    def _member_silent(self, now: float, w: int) -> None:
        if self._host.nodes.is_member[w]:
            self._members += 1
            if self._members == 1:
                self._host.job.stall(now)

    def process_gone(self, now: float, w: int, kind: str) -> None:
        """Node ``w`` went down (:meth:`sim.machines.Machines.node_down`):
        after a ``kill`` or a ``blame`` its host reports its process's exit
        (:meth:`sim.keeper_port.KeeperPort.exited`); after a ``crash`` nobody
        reports anything (the detector decides). Its silence stalls the job
        if it was a member."""
        host = self._host
        nodes = host.nodes
        if nodes.proc[w]:
            if kind != "crash":
                nodes.exit_seen[w] = nodes.life_of(w)
                host.at(now + host.exit_notice_s, host.port.exited, w, nodes.life_of(w))
            nodes.proc[w] = False
            if nodes.paused[w]:
                nodes.paused[w] = False  # already silent; its verdict is scheduled
                nodes.pause_epoch[w] += 1
                if w in self._isolated:  # its peers reached it: now its collective hangs
                    self._isolated.discard(w)
                    self._member_silent(now, w)
            else:
                self._go_silent(now, w)
        host.agents.discard(w)

    def cut_off(self, now: float, w: int, peers: bool = False) -> bool:
        """Node ``w``'s process reaches nobody from now on (stopped, or on the
        far side of a partition), or with ``peers`` only its peers and not
        the keeper: it keeps its agent's state, and what it and the keeper
        send each other waits (TCP holds it) until :meth:`resume`. False
        when it runs no live process."""
        host = self._host
        if not host.alive(w):
            return False
        if host.voting:  # the votes that reached the keeper while it voted count
            host.cast_votes(now)
        host.agents.single(now, w)
        host.nodes.paused[w] = True
        host.nodes.pause_epoch[w] += 1
        if peers:
            self._isolated.add(w)
        self._go_silent(now, w, stall=not peers)
        return True

    def waits_for_answers(self, at: float, w: int) -> None:
        """Node ``w``, cut off from the keeper only (:meth:`cut_off` with
        ``peers``), finishes the step in flight with its peers; from ``at``
        on it waits for a commit answer that cannot come, and a member so
        waiting hangs the job like a silent one, until it is heard again."""
        self._host.at(at, self._waiting, w, int(self._host.nodes.pause_epoch[w]))

    def _waiting(self, w: int, epoch: int) -> None:
        nodes = self._host.nodes
        if w in self._isolated and nodes.paused[w] and nodes.pause_epoch[w] == epoch:
            self._isolated.discard(w)  # its peers reach it, but now its collective hangs
            self._member_silent(self._host.env.now, w)

    def hold_beats(self, now: float, w: int, last: float) -> bool:
        """``late_heartbeats``: node ``w``'s beats after the one that reached
        the keeper at ``last`` are held (the worker holds them); all else it
        sends and hears is on time: it answers roll calls, votes and trains.
        The verdict is the keeper's detector's. False when it runs no live
        process or its beats are held already."""
        host = self._host
        if not host.alive(w) or w in self._held:
            return False
        self._held[w] = float(host.nodes.started_at[w])
        host.keeper.observe_silent(last, (w,))  # the keeper's clock: when it saw the beat
        host.port.rearm(now)
        return True

    # --- heard again ------------------------------------------------------------------

    def release_beats(self, w: int, phase: float) -> None:
        """The held beat of ``w``'s process started at ``phase`` leaves now and
        reaches the keeper a latency later; its beats are on time again. A
        life the keeper evicted meanwhile learns so from the answer and
        comes back as a newcomer."""
        host = self._host
        if host.finished or self._held.get(w) != phase:
            return
        del self._held[w]
        if not host.alive(w):
            return  # stopped since: it beats when it wakes
        host.agents.beat_again(host.env.now, w)

    def resume(self, w: int, epoch: int, record: bool = True) -> None:
        """Node ``w``, cut off in pause epoch ``epoch``, reaches everyone again."""
        host = self._host
        nodes = host.nodes
        if nodes.pause_epoch[w] != epoch or not nodes.paused[w] or host.finished:
            return
        now = host.env.now
        if record:
            host.write(rec(now, "info", "fault", NEMESIS, kind="resume", workers=[w]))
        nodes.paused[w] = False
        stalled_it = w not in self._isolated
        self._isolated.discard(w)
        host.agents.beat_again(now, w)
        if nodes.is_member[w] and stalled_it:
            self._members -= 1
            if self._members == 0:
                host.job.unstall(now)
