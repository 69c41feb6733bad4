"""The sim's nemesis: each fault the core's plan hands out, carried out.

Which fault is due when is the core's :class:`rollcall.core.FaultPlan`
(scripted ``at_s`` faults, the nodes' crashes and random slowdowns by
simulated time; ``at_step`` faults by committed step, handed here by the
job loop). This module only routes each one to its effect: nodes down, a
pause, hosts cut off, a link degraded, a gray failure, the keeper killed or
cut off from etcd, newcomers. It reaches the simulation through
:class:`sim.world.World`.
"""

from __future__ import annotations

from typing import Any, Generator, Optional

import simpy

from rollcall.core import NEMESIS, Due, rec

from sim.world import World


class Nemesis:
    """The fault process of one simulation, and the faults' own effects."""

    def __init__(self, sim: World) -> None:
        self.sim = sim
        self.proc: Optional[simpy.Process] = None
        self.wait_until: Optional[float] = None  # when the process wakes (inf: never)
        cluster = sim.sc.cluster
        self.next_join_id = cluster.workers + cluster.spares  # a scripted newcomer's id

    def process(self) -> Generator[simpy.Event, Any, None]:
        """Every fault the plan says is due by simulated time."""
        plan, env = self.sim.plan, self.sim.env
        while True:
            t = plan.next_time()
            if t is None or t > env.now:
                self.wait_until = float("inf") if t is None else t
                try:
                    yield env.event() if t is None else env.timeout(t - env.now)
                except simpy.Interrupt:
                    continue
            self.wait_until = None
            for due in plan.due_by_time(env.now):
                if self.sim.finished:
                    return
                self.carry_out(env.now, due)

    def wake(self) -> None:
        """A fault the plan now has due sooner than the process waits for:
        wake it (the plan is asked only while the process waits: not at
        start-up, when every node arrives before the process runs)."""
        proc, env = self.proc, self.sim.env
        if self.wait_until is None or proc is None or env.active_process is proc:
            return
        t = self.sim.plan.next_time()
        if t is not None and t < self.wait_until:
            self.wait_until = None
            proc.interrupt()

    def carry_out(self, now: float, due: Due) -> None:
        """One fault the plan handed out: a crash is the machine's end, a
        random slowdown the node's; a scripted one is the schedule's."""
        sim = self.sim
        if due.kind == "crash":
            sim.machines.nodes_down(now, [due.targets[0]], "crash", record=True)
        elif due.origin == "mtbf":
            assert due.kind == "slow" and due.rate is not None and due.for_s is not None
            sim.gray.random_slow(now, due.targets[0], due.rate, due.for_s)
        else:
            self.scripted(now, sim.sc.failures.schedule[due.index])

    def scripted(self, now: float, f: Any) -> None:
        """A fault of the scenario's ``failures.schedule``, due now."""
        sim, action = self.sim, f.action
        if action == "kill":
            sim.machines.nodes_down(now, sim.machines.pick(f.targets), "kill", record=True)
        elif f.domain is not None:
            self._domain_down(now, *f.domain)
        elif action in ("partition", "isolate_keeper"):
            self._cut_hosts(now, f)
        elif f.link is not None:
            sim.net.start(now, f)  # delay, loss
        elif action == "pause":
            for w in sim.machines.pick(f.targets):
                self._pause(now, w, float(f.for_s))
        elif action == "late_heartbeats":
            sim.gray.late_heartbeats(now, f)
        elif action == "slow":
            sim.gray.slow(now, f)
        elif action == "kill_keeper":
            sim.failover.fail(now, "kill")
        elif action == "partition_keeper":
            sim.failover.cut(now, float(f.for_s))
        elif action == "kill_etcd":  # two of three members keep the quorum: nothing happens
            sim.write(rec(now, "info", "fault", NEMESIS, kind="kill_etcd", member=f.kill_etcd))
        elif action == "join":
            self._join(now, f.join)

    def step_faults(self, now: float, due: list[Due]) -> None:
        """Scripted faults a step made due (the job's loop hands them over),
        carried out in the order given; none once the run is over."""
        sim = self.sim
        if sim.finished:
            return
        schedule = sim.sc.failures.schedule
        for fault in due:
            self.scripted(now, schedule[fault.index])

    def step_faults_now(self, due: list[Due]) -> None:
        """:meth:`step_faults` at a scheduled instant."""
        self.step_faults(self.sim.env.now, due)

    def _join(self, now: float, count: int) -> None:
        """``count`` newcomers with ids of their own arrive and start at once."""
        sim = self.sim
        ws = list(range(self.next_join_id, self.next_join_id + count))
        self.next_join_id += count
        for w in ws:
            sim.count("joins")
            sim.shop.joined(now, w)
            sim.machines.arrive(now, w)
        sim.write(rec(now, "info", "fault", NEMESIS, kind="join", workers=ws))
        if not sim.failover.down:  # else the takeover report carries it
            sim.keeper.fleet_capacity(now, sim.shop.capacity)
        sim.machines.start(now, ws, [0] * len(ws), fresh=False)

    def _domain_down(self, now: float, domain: str, index: Any) -> None:
        """A correlated failure: every node of a rack (``kill_rack``: each
        process killed, its host reports the exit) or of a host
        (``lose_host``: the machine dies with the agent that would report, a
        ``crash`` the detector decides) whose hardware is up, at once.

        ``"random"`` draws among the racks or hosts holding a live member (as
        a random kill draws among live members), from the ``schedule`` stream.
        """
        sim = self.sim
        sc = sim.sc
        if index == "random":
            index = sim.draws.pick(sorted({sc.domain_of(domain, w) for w in sim.job.members
                                           if sim.alive(w)}))
            if index is None:
                return
        victims = [w for w in sc.domain_workers(domain, int(index)) if sim.nodes.hw[w]]
        if domain == "rack":
            sim.count("rack_kills")
        kind, how = ("kill_rack", "kill") if domain == "rack" else ("lose_host", "crash")
        sim.write(rec(now, "info", "fault", NEMESIS, kind=kind, **{domain: int(index)},
                      workers=victims))
        sim.machines.nodes_down(now, victims, how, record=False)

    def _pause(self, now: float, w: int, for_s: float) -> None:
        sim = self.sim
        sim.count("pauses")
        sim.write(rec(now, "info", "fault", NEMESIS, kind="pause", workers=[w], for_s=for_s))
        if sim.silences.cut_off(now, w):
            sim.at(now + for_s, sim.silences.resume, w, int(sim.nodes.pause_epoch[w]))

    def _cut_hosts(self, now: float, f: Any) -> None:
        """A ``partition`` or an ``isolate_keeper``, for ``for_s``.

        ``partition``: the hosts are cut off from everyone else (the keeper
        stays with the rest): to the keeper and to the other members their
        processes are as silent as stopped ones (a collective with them
        hangs). ``isolate_keeper``, the gray failure: the host loses the
        keeper but not its peers: its heartbeats and requests stop reaching
        the keeper while the job's collectives with it still work, so the
        step in flight is done and committed through the other members'
        votes; then its members wait for commit answers that cannot come
        and the job stalls until the detector evicts them. Either way what
        they send is held until the heal; then they learn they were evicted
        and come back as newcomers.
        """
        sim = self.sim
        peers = f.action == "isolate_keeper"
        hosts = [f.isolate_keeper] if peers else list(f.partition)
        cut = [w for h in hosts for w in sim.sc.host_workers(h) if sim.alive(w)]
        where = {"host": hosts[0]} if peers else {"hosts": hosts}
        sim.net.links.cut(hosts, f.action)
        sim.write(rec(now, "info", "fault", NEMESIS, kind=f.action, **where, workers=cut,
                      for_s=float(f.for_s)))
        held = [(w, int(sim.nodes.pause_epoch[w])) for w in cut
                if sim.silences.cut_off(now, w, peers=peers)]
        if peers:
            step_end = sim.job.step_end(now)
            for w, _ in held:
                sim.silences.waits_for_answers(step_end, w)
        sim.at(now + float(f.for_s), self._heal, hosts, held)

    def _heal(self, hosts: list[int], held: list[tuple[int, int]]) -> None:
        sim = self.sim
        if sim.finished:
            return
        workers = [w for w, epoch in held if sim.nodes.pause_epoch[w] == epoch]
        sim.net.links.heal(hosts)
        sim.write(rec(sim.env.now, "info", "fault", NEMESIS, kind="heal", hosts=hosts,
                      workers=workers))
        for w, epoch in held:
            sim.silences.resume(w, epoch, record=False)
