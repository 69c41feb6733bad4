"""The sim's machines: hardware that comes up and goes down, and the repair shop's answers.

A node's hardware comes up (at the start, repaired, pulled from the cold
pool, a scripted newcomer) and the core's :class:`rollcall.core.FaultPlan`
draws when it crashes; it goes down for a reason (``kill``, ``crash``, a
wrong ``blame``) and the core's :class:`rollcall.core.RepairShop` says what
follows: a repair done when, a retirement, a healthy node blamed instead,
a spare pulled, a warm standby chosen. This module carries those answers
out on the simulated clock and starts processes on the nodes that come
back; what happens to a lost node's process (its exit reported, its
silence, the stall) is :mod:`sim.silence`'s.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import numpy as np

from rollcall.core import NEMESIS, Blame, Draws, FaultPlan, IdRuns, Pull, Relaunch, Repair
from rollcall.core import RepairShop, Retire, Warm, rec

from sim.aging import ComputeAging
from sim.host import Host, KeeperOutage
from sim.keeper_port import KeeperInbox
from sim.state import flags_of_ids, ids_of_flags

__all__ = ["MachineHost", "Machines"]

# what each way down counts as in the summary
NODE_DOWN = {"kill": "kills", "crash": "crashes", "blame": "blames"}


class ProcessLoss(Protocol):
    """What a lost node's process does (:class:`sim.silence.Silences`)."""

    def process_gone(self, now: float, w: int, kind: str) -> None:
        """Node ``w`` went down ``kind``: its process, if any, is gone."""

    def torn_down(self, flags: np.ndarray) -> None:
        """A restart tore the flagged processes down."""


class ProcessAgents(Protocol):
    """The processes' core agents that a restart ends or starts (:class:`sim.agents.Agents`)."""

    def tear_down(self, flags: np.ndarray, ids: IdRuns) -> None:
        """The processes of ``ids`` (flagged) are gone."""

    def forget_flagged(self, flags: np.ndarray) -> None:
        """The single agents of the flagged nodes are gone."""

    def start(self, now: float, ids: IdRuns, incarnations: Any) -> list:
        """Processes started on ``ids``: what their agents send (one batch of Joins)."""


class MachineHost(Host, Protocol):
    """What the machines need of the simulation."""

    @property
    def draws(self) -> Draws: ...

    @property
    def plan(self) -> FaultPlan: ...

    @property
    def shop(self) -> RepairShop: ...

    @property
    def failover(self) -> KeeperOutage: ...

    @property
    def port(self) -> KeeperInbox: ...

    def launch(self, now: float, w: int, incarnation: int) -> list:
        """A process starts on node ``w``: what its agent sends first."""

    @property
    def silences(self) -> ProcessLoss: ...

    @property
    def agents(self) -> ProcessAgents: ...


class Machines:
    """The nodes' hardware lives of one run, and the repair shop's answers."""

    def __init__(self, host: MachineHost, compute_aging: bool, launch_s: float,
                 restart_s: float, wake_faults: Callable[[], None]) -> None:
        """``compute_aging``: ``failures.age: computing`` (only members age,
        while computing: :mod:`sim.aging`); ``launch_s``: a process started
        outside a restart takes that long to start up, ``restart_s`` one a
        restart relaunched; ``wake_faults``: a node came up, so the fault
        plan may have something due sooner."""
        self._host = host
        self._launch_s = launch_s
        self._restart_s = restart_s
        self._wake_faults = wake_faults
        self._hitting: frozenset[int] = frozenset()  # the nodes the fault in progress takes
        self.aging = (ComputeAging(host.env, host.nodes, lambda t, w: self.node_down(t, w, "crash"))
                      if compute_aging and host.draws.model is not None else None)

    # --- up ---------------------------------------------------------------------------

    def arrive(self, now: float, w: int) -> None:
        """Hardware of node ``w`` comes up (start, repair, newcomer): the
        core's fault plan draws when it crashes and slows down (under
        ``failures.age: computing`` its life is spent in compute seconds,
        :mod:`sim.aging`)."""
        host = self._host
        nodes = host.nodes
        nodes.exists[w] = True
        nodes.hw[w] = True
        nodes.life[w] += 1
        if self.aging is not None:
            lifetime = host.draws.next_lifetime(w)
            if lifetime is not None:
                self.aging.arrive(w, lifetime)
        host.plan.node_up(w, now)
        self._wake_faults()

    def start(self, now: float, ws: list[int], lives: list[int], fresh: bool = True) -> None:
        """A process starts on each node of ``ws`` (as ``lives``) outside a
        restart; a ``fresh`` one (a repaired node's, a pulled spare's) asks to
        join once it is up, ``cluster.launch_s`` later, a scripted newcomer's
        (warm, as the real target's) at once."""
        host = self._host
        if not self._launch_s or not fresh:
            joins = []
            for w, life in zip(ws, lives):
                joins += host.launch(now, w, life)
            host.at(now + host.lat, host.port.receive_at, joins)
            return
        hw = [int(host.nodes.life[w]) for w in ws]
        host.at(now + self._launch_s, self._started, ws, lives, hw)

    def _started(self, ws: list[int], lives: list[int], hw: list[int]) -> None:
        """The processes :meth:`start` began are up: each whose node did not
        fail meanwhile (its hardware life is the same) asks to join."""
        host = self._host
        if host.finished:
            return
        now, nodes = host.env.now, host.nodes
        joins = []
        for w, life, h in zip(ws, lives, hw):
            # the node failed meanwhile, or a relaunch started a newer life on it
            if not nodes.hw[w] or int(nodes.life[w]) != h:
                continue
            if nodes.proc[w] or life < nodes.life_of(w):
                continue
            joins += host.launch(now, w, life)
        if joins:
            host.at(now + host.lat, host.port.receive_at, joins)

    # --- a restart ----------------------------------------------------------------------

    def tear_down(self, teardown: IdRuns) -> None:
        """Checkpoint-restart: the process of every node in ``teardown`` (the
        members, or the lives a restart that failed had started) is gone, a
        stopped one too (it never resumes), and one still starting never starts."""
        host = self._host
        nodes = host.nodes
        members = flags_of_ids(teardown, len(nodes.proc))
        assert not (members & ~nodes.member_flags).any(), "the keeper tears down members"
        nodes.pause_epoch += members  # a stopped process is killed too: no resume
        nodes.proc &= ~members
        nodes.paused &= ~members
        nodes.starting[members] = -1
        host.silences.torn_down(members)
        host.agents.tear_down(members, teardown)
        nodes.is_member[:] = False

    def relaunch(self, now: float, order: Relaunch) -> None:
        """The keeper relaunched the nodes it names: a fresh process starts on
        each, as the life the keeper names, ``restart_s`` later (the
        scenario's restart time, physics the keeper does not decide), unless
        its node fails or a teardown voids it meanwhile."""
        host = self._host
        if host.finished:
            return
        nodes = host.nodes
        ids = order.workers
        up = flags_of_ids(ids, len(nodes.proc))
        assert not (up & ~nodes.hw).any(), "the keeper relaunches no node it was told is down"
        assert not (up & nodes.proc).any(), "a relaunched node runs no process"
        # Each process starts as the life the keeper names: the keeper alone
        # counts lives (a life it handed out and a restart then voided is
        # skipped, so a node's next life is not always its last plus one).
        # Checked in full on small jobs, at both ends on large ones.
        sample = ids if len(ids) <= 64 else (ids.first(), ids.last())
        assert all(order.incarnations.of(w) > nodes.life_of(w) for w in sample), \
            "a relaunch starts a newer life on each node"
        number = nodes.relaunch_ordered(up, order.incarnations)
        if self._restart_s > 0:
            host.at(now + self._restart_s, self._relaunched, order, number)
        else:
            self._relaunched(order, number)

    def _relaunched(self, order: Relaunch, number: int) -> None:
        """The processes relaunch ``number`` ordered are up: each that was not
        voided meanwhile runs its life and asks to join."""
        host = self._host
        if host.finished:
            return
        now, nodes = host.env.now, host.nodes
        up = nodes.relaunch_started(number)
        count = int(np.count_nonzero(up))
        if not count:
            return
        ids = order.workers if count == len(order.workers) else ids_of_flags(up)
        nodes.proc |= up
        nodes.paused &= ~up
        np.copyto(nodes.started_at, now, where=up)
        host.agents.forget_flagged(up)
        # each relaunched agent sends Join(w, new incarnation, no state): one
        # batch of new lives, the keeper's own sparse table, so a relaunch of
        # 10^4 workers is admitted in O(changes)
        msgs = host.agents.start(now, ids, order.incarnations)
        host.at(now + host.lat, host.port.receive_at, msgs)

    # --- down -------------------------------------------------------------------------

    def pick(self, targets: Any) -> list[int]:
        """A fault's targets: the listed nodes, or a draw among live members."""
        host = self._host
        if targets != "random":
            return [w for w in targets if w < len(host.nodes.hw)]
        w = host.draws.pick([w for w in host.job.members if host.alive(w)])
        return [] if w is None else [w]

    def nodes_down(self, now: float, victims: list[int], kind: str, record: bool) -> None:
        """One fault takes ``victims`` down (see :meth:`node_down`); none of
        them is an innocent a wrong diagnosis may blame for another."""
        self._hitting = frozenset(victims)
        for w in victims:
            self.node_down(now, w, kind, record)
        self._hitting = frozenset()

    def node_down(self, now: float, w: int, kind: str, record: bool = True) -> None:
        """Node ``w`` is lost until repaired. ``kill``: its process was
        killed, and its host reports the exit; ``crash``: the machine died,
        and nobody reports anything (the detector decides); ``blame``: a
        wrong diagnosis sends the healthy node to repair (its process is
        stopped and its host reports the exit, as for a kill)."""
        assert kind in NODE_DOWN, kind
        host = self._host
        nodes = host.nodes
        if not nodes.hw[w]:
            return
        if host.voting:  # the votes that reached the keeper while it voted count
            host.cast_votes(now)
        host.count(NODE_DOWN[kind])
        if record:
            host.write(rec(now, "info", "fault", NEMESIS, kind=kind, workers=[w]))
        nodes.hw[w] = False
        nodes.held_down[w] = True
        nodes.life[w] += 1
        host.plan.node_down(w)  # its crash and slowdowns to come went with it
        nodes.starting[w] = -1  # a relaunched process still starting never starts
        if not host.failover.down:  # else the supervisor tells the next keeper
            host.keeper.node_down(now, w)
            host.port.rearm(now)  # a restarting group's loss fails the restart
        host.silences.process_gone(now, w, kind)
        if kind != "blame":  # a blamed node's trip to the shop came with the blame
            self._to_shop(now, w)

    # --- the repair shop --------------------------------------------------------------

    def _to_shop(self, now: float, w: int) -> None:
        """Tell the repair shop node ``w`` failed and carry out its answer:
        repaired when, retired, a wrong blame, pulls (the core decides)."""
        host = self._host
        hit = self._hitting  # the rest of the fault being carried out: not innocent

        def innocents() -> list[int]:
            return [m for m in host.job.members if host.alive(m) and m not in hit]

        for act in host.shop.down(now, w, innocents):
            if isinstance(act, Repair):
                host.at(act.back_at_s, self._repaired, act.worker, act)
            elif isinstance(act, Retire):
                host.count("retired")
                host.write(act.record(now))
            elif isinstance(act, Blame):
                host.write(act.record(now))
                self.node_down(now, act.worker, "blame", record=False)
            elif isinstance(act, Warm):
                host.at(act.at_s, self._warmed, act)
            else:
                host.at(act.at_s, self._pulled, act)
        if not host.failover.down:  # else the takeover report carries it
            host.keeper.fleet_capacity(now, host.shop.capacity)
            host.port.rearm(now)

    def _repaired(self, w: int, repair: Repair) -> None:
        host = self._host
        if host.finished:
            return
        if host.failover.back_at is not None:  # its new life is the next keeper's to hand out
            host.at(host.failover.back_at, self._repaired, w, repair)
            return
        now = host.env.now
        host.count("repairs")
        host.write(repair.record(now))
        starts = host.shop.up(now, w)  # else it waits idle, without a process (warm_standbys)
        self.arrive(now, w)
        if starts:
            host.nodes.held_down[w] = False
            self.start(now, [w], [host.keeper.node_up(now, w)])

    def _warmed(self, warm: Warm) -> None:
        """An idle node's host selection ended: its process starts and joins,
        a warm standby's (the repair shop chose it)."""
        host = self._host
        if host.finished:
            return
        if warm.back and host.failover.back_at is not None:  # its life is the next keeper's
            host.at(host.failover.back_at, self._warmed, warm)
            return
        now, w = host.env.now, warm.worker
        if not host.shop.warmed(now, w):
            return  # the node failed during its selection
        host.write(warm.record(now))
        host.nodes.held_down[w] = False
        self.start(now, [w], [host.keeper.node_up(now, w) if warm.back else 0])

    def _pulled(self, pull: Pull) -> None:
        """A spare pulled from the cold pool arrives (after its preemption) and joins."""
        host = self._host
        if host.finished:
            return
        now, w = host.env.now, pull.worker
        host.count("pulled")
        host.shop.up(now, w, pulled=True)
        self.arrive(now, w)
        host.write(pull.record(now))
        self.start(now, [w], [0])
