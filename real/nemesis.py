"""The real target's nemesis: each fault the core's plan hands out, carried out.

Which fault is due when is the core's :class:`rollcall.core.FaultPlan`; the
launcher asks it (by training time, and by committed step at the gate of a
step's last ack) and hands each :class:`Due` here. This module carries it
out on processes, hosts and links (signals, nftables rules, orders to a host
agent or a worker), writes its ``fault`` record, and undoes the timed ones
when their ``for_s`` is over (a ``resume`` or ``heal`` record). Who is
evicted, fenced or readmitted for it is the keeper's.

It reaches the launcher through :class:`Cluster`, the members it may use;
one timer pair (:meth:`Nemesis.get_timer`, :meth:`Nemesis.handle_timer`)
is all the launcher's loop reads of it.
"""

from __future__ import annotations

import signal
from typing import Any, Optional, Protocol

from rollcall.core import NEMESIS, Blame, Due, FaultPlan, Retire, rec
from rollcall.scenario import LINK_ACTIONS, Scenario

from real.fleet import Fleet
from real.procs import Proc

# A timed fault in force: (undone at, what to undo, its hosts, the lives it cut off).
Heal = tuple[float, Any, list[int], list[tuple[int, int]]]


class JobFacts(Protocol):
    """What the keeper's outputs said of the job (:class:`real.outputs.Outputs`)."""

    @property
    def generation(self) -> int: ...

    @property
    def committed(self) -> int:
        """The highest committed step."""


class Links(Protocol):
    """The workers' links (:class:`real.service.Service`)."""

    @property
    def store_port(self) -> Optional[int]:
        """torch's store, once it listens."""

    def tell(self, life: tuple[int, int], frame: tuple) -> bool:
        """Send ``frame`` to that life's process, if its link is open."""

    def reachable(self, w: int) -> bool:
        """Whether worker ``w``'s latest process has a link to the launcher."""

    def tell_latest(self, w: int, frame: tuple) -> bool:
        """Send ``frame`` to worker ``w``'s latest process, if it has a link."""


class ProcessTable(Protocol):
    """The process table (:class:`real.processes.Processes`)."""

    def live(self, w: int) -> Optional[Proc]:
        """Worker ``w``'s live process, if it has one."""

    def signal(self, p: Proc, sig: int) -> None: ...


class Lives(Protocol):
    """What a fault does to the workers' lives (:class:`real.lives.Lives`)."""

    def candidates(self) -> list[int]:
        """The live members of the current generation."""

    def node_lost(self, now: float, w: int, kind: str) -> None: ...

    def join(self, n: int) -> list[int]: ...


class HostLoss(Protocol):
    """How a host is lost (:class:`real.host_links.HostLinks`)."""

    def take_down(self, number: int) -> None:
        """The machine goes: its link, and every process on it at once."""


class Cluster(Protocol):
    """What the nemesis needs of the launcher (:class:`real.launcher.Launcher`)."""

    @property
    def sc(self) -> Scenario: ...

    @property
    def keeper(self) -> Any:
        """The keeper the launcher talks to (in process or in its own)."""

    @property
    def fleet(self) -> Optional[Fleet]: ...

    @property
    def faults(self) -> FaultPlan: ...

    @property
    def outputs(self) -> JobFacts:
        """What the keeper's outputs said of the job (:class:`real.outputs.Outputs`)."""

    @property
    def nodes_up(self) -> set[int]: ...

    @property
    def service(self) -> Links:
        """The workers' links (:class:`real.service.Service`)."""

    @property
    def processes(self) -> ProcessTable:
        """The process table (:class:`real.processes.Processes`)."""

    def now(self) -> float: ...

    def write(self, record: dict) -> None: ...

    @property
    def lives(self) -> Lives:
        """The workers' lives (:class:`real.lives.Lives`)."""

    @property
    def host_links(self) -> HostLoss: ...


class Nemesis:
    """The faults of one real run: carried out, and undone when they end."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.sigconts: list[tuple[float, Proc]] = []  # paused processes: (resume at, it)
        self.heals: list[Heal] = []
        self.delays: list[tuple[float, float]] = []  # each delay ordered: (heal at, latency_s)
        self.slowed: dict[tuple[int, int], float] = {}  # a slow life -> its factor (compounded)
        self.answers: list[Retire | Blame] = []  # the shop's, for the fault being carried out
        self.hitting: set[int] = set()  # the nodes the fault being carried out takes

    # --- the launcher's loop -----------------------------------------------------------

    def get_timer(self) -> Optional[float]:
        """When a pause or another timed fault ends next (None: none is on)."""
        times = [t for t, _ in self.sigconts] + [x[0] for x in self.heals]
        return min(times) if times else None

    def handle_timer(self, now: float) -> None:
        """Resume the paused processes and undo the timed faults that are over."""
        for t, p in list(self.sigconts):
            if now >= t:
                self.sigconts.remove((t, p))
                if p.alive:
                    self.cluster.processes.signal(p, signal.SIGCONT)
                    p.paused = False
                    self.cluster.write(rec(now, "info", "fault", NEMESIS, kind="resume",
                                           workers=[p.worker]))
        self._heal_due(now)

    def forget_dead(self) -> None:
        """Processes ended (a teardown, a lost host): no resume is owed them."""
        self.sigconts = [(t, p) for t, p in self.sigconts if p.alive]

    def exited(self, life: tuple[int, int]) -> None:
        """That life's process ended: its slowdowns ended with it."""
        self.slowed.pop(life, None)

    def held_delay_s(self, now: float) -> float:
        """The longest ``delay`` still holding a host's link back (0: none)."""
        return max((x for heal, x in self.delays if heal + x > now), default=0.0)

    def shop_answered(self, act: Retire | Blame) -> None:
        """The repair shop's answer to a node lost in the fault being carried
        out: carried out once that fault's record is written."""
        self.answers.append(act)

    # --- carrying a fault out ----------------------------------------------------------

    def inject(self, due: Due) -> None:
        """Carry out one fault and write its ``fault`` record (one per fault,
        listing the workers it hit)."""
        cluster = self.cluster
        now = cluster.now()
        fields: dict[str, Any] = {"gen": cluster.outputs.generation, "origin": due.origin}
        if due.kind == "join":
            hit = cluster.lives.join(int(due.targets))
        elif due.kind == "pause":
            hit = self._pause(now, due, fields)
        elif due.kind == "late_heartbeats":
            hit = self._late_beats(now, due, fields)
        elif due.kind == "slow":
            hit = self._slow(now, due, fields)
        elif due.kind in LINK_ACTIONS:
            hit = self._cut_links(now, due, fields)
        elif due.kind == "kill_keeper":  # the active keeper process: a standby takes over
            hit, fields["term"] = [], cluster.keeper.kill_active()
        elif due.kind == "partition_keeper":  # cut from etcd, not from us: it must depose itself
            hit, fields["term"], fields["for_s"] = [], cluster.keeper.cut_active(), due.for_s
            self.heals.append((now + float(due.for_s), ("keeper_cut",), [], []))
        elif due.kind == "kill_etcd":  # one member of three: the quorum holds
            hit, fields["member"] = [], int(due.targets)
            cluster.keeper.kill_etcd(int(due.targets))
        else:
            hit = self._nodes_down(now, due, fields)
        record = rec(now, "info", "fault", NEMESIS, kind=due.kind, workers=hit, **fields)
        cluster.write(record)
        self._shop_answers(now)

    def _pause(self, now: float, due: Due, fields: dict[str, Any]) -> list[int]:
        """``pause``: SIGSTOP now, SIGCONT after ``for_s``."""
        hit = []
        for w in self._targets(due, fields):
            p = self.cluster.processes.live(w)
            if p is not None and p.activated:
                hit.append(w)
                p.fault = p.fault or "pause"
                p.paused = True
                self.cluster.processes.signal(p, signal.SIGSTOP)
                self.sigconts.append((now + float(due.for_s), p))
        fields["for_s"] = due.for_s
        return hit

    def _nodes_down(self, now: float, due: Due, fields: dict[str, Any]) -> list[int]:
        """``kill``, ``kill_rack``, ``lose_host``, ``crash``: nodes lost (a
        machine's end, a lifetime's or a lost host's, reports no exit)."""
        assert due.kind in ("kill", "kill_rack", "lose_host", "crash"), due
        cluster = self.cluster
        how = "crash" if due.kind in ("crash", "lose_host") else "kill"
        hit = []
        targets = self._targets(due, fields)
        if due.kind == "lose_host" and cluster.fleet is not None and fields["host"] is not None:
            if any(w in cluster.nodes_up for w in targets):
                cluster.host_links.take_down(fields["host"])
        self.hitting = set(targets)
        for w in targets:
            if w in cluster.nodes_up:  # a node already down is not lost again
                hit.append(w)
                cluster.lives.node_lost(now, w, how)
        self.hitting = set()
        return hit

    def _shop_answers(self, now: float) -> None:
        """Carry out what the repair shop answered for the faults just
        carried out, after their records (as on the sim): a retirement's
        record, and a wrong diagnosis's innocent taken down."""
        answers, self.answers = self.answers, []
        for act in answers:
            self.cluster.write(act.record(now))
            if isinstance(act, Blame) and act.worker in self.cluster.nodes_up:
                self.cluster.lives.node_lost(now, act.worker, "blame")

    def _slow(self, now: float, due: Due, fields: dict[str, Any]) -> list[int]:
        """A ``slow`` fault: the worker is told to compute ``factor`` times
        slower for ``for_s`` (it stretches each step's compute: see
        ``real.trainer.Trainer.stretch``); its heartbeats stay on time. Only the effect is
        here: whether to wait for it or evict it is the keeper's."""
        hit = []
        factor = float(due.rate)
        for w in self._targets(due, fields):
            p = self.cluster.processes.live(w)
            if p is not None and p.activated and self.cluster.service.reachable(w):
                hit.append(w)
                self._order_slow((w, p.incarnation), factor, due.from_step)
                self.heals.append((now + float(due.for_s),
                                   ("slow", w, p.incarnation, factor), [], [(w, p.incarnation)]))
        fields.update(factor=factor, for_s=due.for_s)
        return hit

    def _order_slow(self, life: tuple[int, int], factor: float,
                    from_step: Optional[int] = None) -> None:
        """One slowdown of ``life`` starts (``factor`` > 1) or ends (``1 / factor``):
        the worker hears the compounded factor of those still on."""
        total = self.slowed.get(life, 1.0) * factor
        if total <= 1.0 + 1e-9:
            self.slowed.pop(life, None)
            total = 1.0
        else:
            self.slowed[life] = total
        # from the sim's first slow step: a scripted at_step's (ordered a
        # step early, FaultPlan.due_by_step), or the step in flight
        start = self.cluster.outputs.committed if from_step is None else from_step
        self.cluster.service.tell(life, ("slow", min(total, 1000.0), start))

    def _late_beats(self, now: float, due: Due, fields: dict[str, Any]) -> list[int]:
        """A ``late_heartbeats`` fault: the worker is told to hold each heartbeat
        ``delay_s`` before it sends it (its control thread busy, its link to
        the keeper loaded), in order, and after ``for_s`` to send them on
        time again; everything else it sends goes at once. Only the effect is
        here: whether the silence is death is the keeper's detector's call."""
        hit = []
        for w in self._targets(due, fields):
            p = self.cluster.processes.live(w)
            if (p is not None and p.activated
                    and self.cluster.service.tell_latest(w, ("late_beats", float(due.latency_s)))):
                hit.append(w)
                self.heals.append((now + float(due.for_s),
                                   ("late_beats", w, p.incarnation), [], [(w, p.incarnation)]))
        fields.update(delay_s=due.latency_s, for_s=due.for_s)
        return hit

    def _cut_links(self, now: float, due: Due, fields: dict[str, Any]) -> list[int]:
        """Hosts mode: a ``partition`` (the hosts cut off from every other address
        on the bridge, the keeper's included), an ``isolate_keeper`` (the host
        cut off from the keeper's address only: the service and the TCPStore,
        not its peers) or a ``loss`` (a fraction of the host's packets dropped)
        as nftables rules in the hosts' namespaces, undone after ``for_s``; a
        ``delay`` as an order to the host's agent, whose relay holds its
        workers' keeper link back (real/relay.py), and one to stop after ``for_s``.
        Only the effect is here: who is evicted, fenced and readmitted is the
        keeper's, from the heartbeats that do or do not arrive. Returns the
        workers with a live process on those hosts (the sim's ``workers``)."""
        cluster = self.cluster
        fleet, sc = cluster.fleet, cluster.sc
        assert fleet is not None, "refused before the run: link faults need hosts"
        assert fleet.network is not None or due.kind == "delay", \
            "refused before the run: nftables faults need the run's own namespaces"
        net = fleet.network
        if due.kind == "partition":
            hosts = list(due.targets)
            fields["hosts"] = hosts
        else:
            host = due.targets
            if host == "random":  # as the sim: among the hosts holding a live member
                hosts_hit = {sc.host_of(w) for w in cluster.lives.candidates()}
                host = cluster.faults.pick(sorted(hosts_hit))
            fields["host"] = host
            hosts = [] if host is None else [int(host)]
        fields["for_s"] = due.for_s
        if due.kind == "loss":
            fields["rate"] = due.rate
        if due.kind == "delay":
            fields["latency_s"] = due.latency_s
        lives = [(w, p.incarnation) for h in hosts for w in sc.host_workers(h)
                 if (p := cluster.processes.live(w)) is not None]
        until = now + float(due.for_s)
        if hosts and due.kind == "delay":
            fleet.order(hosts[0], ("delay", float(due.latency_s)))
            self.heals.append((until, ("delay", hosts[0]), hosts, lives))
            self.delays.append((until, float(due.latency_s)))
        elif hosts:
            assert net is not None
            if due.kind == "partition":
                fault = net.partition(hosts)
            elif due.kind == "isolate_keeper":
                fault = net.isolate(hosts[0])  # default: the keeper's (the bridge's) address
            else:
                fault = net.loss(hosts[0], float(due.rate))
            self.heals.append((until, fault, hosts, lives))
            if due.kind != "loss":
                self._start_retransmit_clocks(lives)
        return [w for w, _ in lives]

    def _start_retransmit_clocks(self, lives: list[tuple[int, int]]) -> None:
        """Send each cut-off life a frame it already holds (the store's port:
        idempotent) the moment the rules are in. Why: after the heal a TCP
        connection is heard again at its next retransmission, and the backoff
        (0.2, 0.4, 0.8 ... s) counts from its first lost segment; a connection
        the keeper happened to write to only later (a roll call a second on)
        would come back a second or more after one written to at the cut,
        and its worker would rejoin in a generation of its own. Started
        together, the cut-off workers come back together, as on the sim,
        where what was held is delivered at the heal."""
        port = self.cluster.service.store_port
        if port is None:
            return
        for life in lives:
            self.cluster.service.tell(life, ("welcome", port))

    def _heal_due(self, now: float) -> None:
        """Undo the link faults, slowdowns and late heartbeats whose ``for_s`` is
        over; a ``heal`` record names the hosts (link faults) and the lives
        still running (as the sim's), and, a physical fact the sim has not, how
        many packets the rules dropped."""
        cluster = self.cluster
        for item in [x for x in self.heals if now >= x[0]]:
            self.heals.remove(item)
            _, fault, hosts, lives = item
            extra: dict[str, Any] = {}
            if isinstance(fault, tuple) and fault[0] == "keeper_cut":  # it reaches etcd again
                dropped = cluster.keeper.heal_cut()
                if dropped is not None:  # an nftables cut (hosts mode): what it stopped
                    extra["dropped_packets"] = dropped
            elif isinstance(fault, tuple) and fault[0] == "slow":  # one slowdown ends
                self._order_slow(fault[1:3], 1.0 / fault[3])
            elif isinstance(fault, tuple) and fault[0] == "late_beats":  # on time from now
                cluster.service.tell(fault[1:], ("late_beats", 0.0))
            elif isinstance(fault, tuple):  # a delay: the relay sends on at once from now
                assert cluster.fleet is not None
                cluster.fleet.order(fault[1], ("delay", 0.0))
            else:
                assert cluster.fleet is not None and cluster.fleet.network is not None
                extra["dropped_packets"] = cluster.fleet.network.dropped(fault)
                cluster.fleet.network.heal(fault)
            alive = [w for w, inc in lives if (p := cluster.processes.live(w)) is not None
                     and p.incarnation == inc]
            if hosts:  # (late heartbeats are a worker's, not a host's)
                extra["hosts"] = hosts
            cluster.write(rec(now, "info", "fault", NEMESIS, kind="heal", workers=alive, **extra))

    def _targets(self, due: Due, fields: dict[str, Any]) -> tuple[int, ...]:
        """The workers a kill, rack kill, lost host, crash or pause names: its
        ids, a seeded pick among the live members (``random``), or a rack's
        or host's ids (``fields`` gets the rack or host)."""
        cluster = self.cluster
        targets = due.targets
        if due.kind in ("kill_rack", "lose_host"):  # every worker of it whose node is up
            domain, index = ("rack" if due.kind == "kill_rack" else "host"), targets
            if index == "random":
                index = cluster.faults.pick(sorted({cluster.sc.domain_of(domain, w)
                                                    for w in cluster.lives.candidates()}))
            fields[domain] = index
            return () if index is None else cluster.sc.domain_workers(domain, index)
        if targets == "random":
            w = cluster.faults.pick(cluster.lives.candidates())
            return () if w is None else (w,)
        return tuple(targets)
