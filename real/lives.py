"""The worker processes' lives, on the launcher's side.

A life is one process of one worker id. This module starts them in batches
that join the keeper as one arrival (the core's :class:`JoinBatches`),
activates them once ready, brings new workers for a scripted ``join``,
takes a node down for a fault, carries out the repair shop's answers
(:class:`real.nodes.Nodes`, whose owner this is) and hears a process's
exit. It decides nothing: who is lost, who comes back as which life, and
which batch goes when are the core's (the keeper, the fault plan, the
repair shop); it carries them out on the process table
(:class:`real.processes.Processes`) through :class:`LivesHost`.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any, Optional, Protocol

from rollcall.core import DRIVER, FaultPlan, IdRuns, Join, JoinBatches, RepairShop, rec
from rollcall.scenario import Scenario

from real.nodes import Nodes
from real.processes import Processes
from real.procs import Proc, last_line, worker_log
from real.service import Conn, Service

__all__ = ["Lives", "LivesHost"]

# how long a batch of lives waits for its last member to be ready, seconds
STARTUP_TIMEOUT_S = 180.0


class Faults(Protocol):
    """The fault injector (:class:`real.nemesis.Nemesis`)."""

    @property
    def hitting(self) -> set[int]:
        """The nodes the fault being carried out takes."""

    def exited(self, life: tuple[int, int]) -> None: ...

    def shop_answered(self, act: Any) -> None: ...


class JobFacts(Protocol):
    """What the keeper's outputs said of the job (:class:`real.outputs.Outputs`)."""

    @property
    def train_start(self) -> Optional[float]:
        """When the first generation formed (None before)."""

    @property
    def members(self) -> IdRuns:
        """The latest generation's members."""


class LivesHost(Protocol):
    """What the lives need of the launcher."""

    @property
    def sc(self) -> Scenario: ...

    @property
    def out(self) -> Path:
        """The run's directory (the workers' logs)."""

    @property
    def keeper(self) -> Any:
        """The keeper's port (:class:`real.keeper_port.LocalKeeper` or a remote one)."""

    @property
    def service(self) -> Service: ...

    @property
    def processes(self) -> Processes: ...

    @property
    def faults(self) -> FaultPlan: ...

    @property
    def nemesis(self) -> Faults: ...

    @property
    def outputs(self) -> JobFacts:
        """What the keeper's outputs said of the job (:class:`real.outputs.Outputs`)."""

    @property
    def result(self) -> Optional[str]: ...

    def now(self) -> float: ...

    def write(self, record: dict) -> None: ...

    def finish(self, result: str, reason: str) -> None: ...


class Lives:
    """The lives of one real run: batches, activation, joins, lost nodes, exits."""

    def __init__(self, host: LivesHost, shop: RepairShop) -> None:
        cluster = host.sc.cluster
        self._host = host
        self.nodes = Nodes(shop, self)  # the machines, and the shop's answers until due
        self.joins = JoinBatches()  # each batch's Joins, held until it joins as one
        self.next_id = cluster.workers + cluster.spares  # a new worker's id

    # --- starting ---------------------------------------------------------------------

    def spawn(self, worker: int, incarnation: int, spare: bool = False,
              batch: Optional[int] = None) -> Proc:
        host = self._host
        p = host.processes.start(worker, incarnation, host.sc.host_of(worker), spare, batch)
        if not spare:  # a prewarmed join's node arrives when its join fires
            self.nodes.arrived(host.now(), worker)
        return p

    def spawn_new(self, spare: bool = False, batch: Optional[int] = None) -> Proc:
        """Start a worker with the next new id (a prewarmed join, a join)."""
        w = self.next_id
        self.next_id += 1
        return self.spawn(w, 0, spare=spare, batch=batch)

    def new_batch(self, lives: list[tuple[int, int]]) -> int:
        """The processes about to start as ``lives`` are one batch: they
        activate together, and their Joins reach the keeper as one arrival
        (the core's :class:`JoinBatches`; with direct links the keeper holds
        them). Returns the batch's number."""
        until = self._host.now() + STARTUP_TIMEOUT_S
        batch = self.joins.open(lives, until)
        self._host.keeper.batch(lives, until)
        return batch

    def start_batch(self, lives: list[tuple[int, int]]) -> int:
        """Start ``lives`` as one batch that joins together once every one is
        ready. Returns the batch's number."""
        batch = self.new_batch(lives)
        for w, life in lives:
            self.spawn(w, life, batch=batch)
        return batch

    def maybe_activate(self) -> None:
        """Let wanted processes join once ready; a batch started together (the
        initial workers, a relaunched job) joins together, so the first
        generation is the whole job and not whoever imported torch first."""
        for p in self._host.processes.ready_to_activate():
            self.activate(p)

    def activate(self, p: Proc) -> None:
        host = self._host
        p.activated = True
        host.service.tell((p.worker, p.incarnation), ("activate",))
        train_start = host.outputs.train_start
        if train_start is not None:
            host.faults.node_up(p.worker, host.now() - train_start)

    def proc_of(self, conn: Conn) -> Optional[Proc]:
        if conn.worker is None or conn.incarnation is None:
            return None  # not a worker's link
        return self._host.processes.of_life(conn.worker, conn.incarnation)

    def hold_join(self, conn: Conn, msg: object) -> bool:
        """Whether a process's Join waits for the rest of its batch (see
        :meth:`new_batch`); the batches it completes go to the keeper."""
        p = self.proc_of(conn)
        if not isinstance(msg, Join) or p is None:
            return False
        if not self.joins.hold(self._host.now(), (p.worker, p.incarnation), msg):
            return False
        self.release_joins()
        return True

    def release_joins(self) -> None:
        """Hand over each batch that is complete, lost a member, or is late."""
        if self.joins.get_timer() is None:
            return  # no batch open
        now = self._host.now()
        for joins in self.joins.release(now):
            self._host.keeper.receive(now, joins)

    # --- faults -----------------------------------------------------------------------

    def candidates(self) -> list[int]:
        """Targets of a ``random`` fault: the live members of the current
        generation, as on the sim."""
        processes = self._host.processes
        return [w for w in self._host.outputs.members
                if (p := processes.live(w)) is not None and p.activated and not p.paused]

    def innocents(self) -> list[int]:
        """The pool a wrong diagnosis draws from: live members not taken by
        the fault in progress, as on the sim (the shop leaves out the nodes
        it holds out of service, those it blamed included)."""
        return [w for w in self.candidates() if w not in self._host.nemesis.hitting]

    def join(self, n: int) -> list[int]:
        """``n`` new workers arrive: idle prewarmed processes first (the lowest
        id first: the sim numbers joins in order too), then fresh ones. They
        arrive as one batch, as on the sim: they activate together and their
        Joins reach the keeper as one arrival, so one roll call admits them
        all whichever process was scheduled first."""
        host = self._host
        procs = []
        for _ in range(n):
            warm = host.processes.idle_spare()
            p = warm if warm is not None else self.spawn_new()
            p.want = True
            self.nodes.arrived(host.now(), p.worker, joined=True)
            host.keeper.fleet_capacity(host.now(), self.nodes.shop.capacity)
            procs.append(p)
        batch = self.new_batch([(p.worker, p.incarnation) for p in procs])
        for p in procs:
            p.batch = batch
        return [p.worker for p in procs]

    def node_lost(self, now: float, w: int, kind: str) -> None:
        """Node ``w`` is lost until ``repair_s``, with its process if it runs
        one (activated or still starting, as on the sim: the node goes down
        whether or not a process was there). ``kill``: the process is
        killed, its host sees the exit and reports it (:meth:`on_exit`);
        ``crash``: the machine died, and the host agent that would have
        reported died with it, so the detector's timeout decides; ``blame``:
        a wrong diagnosis sends the healthy node to repair (its process is
        stopped and its host reports the exit, as for a kill)."""
        host = self._host
        self.nodes.lost(w)
        p = host.processes.live(w)
        # the keeper hears of the lost node before its process can die, so
        # before any exit notice, detector verdict or failed step a survivor
        # reports (with direct links those reach it on links of their own)
        host.keeper.node_down(now, w)
        if p is not None:
            p.fault = kind
            p.paused = False
            host.processes.signal(p, signal.SIGKILL)
        host.faults.node_down(w)
        if kind == "blame":
            return  # its trip to the shop came with the blame
        for act in self.nodes.to_shop(now, w, self.innocents):  # the core's decisions
            host.nemesis.shop_answered(act)  # once the fault's record is written
        host.keeper.fleet_capacity(now, self.nodes.shop.capacity)

    # --- the repair shop's answers (real.nodes.Owner) ---------------------------------

    def write(self, record: dict) -> None:
        self._host.write(record)

    def spawn_node(self, worker: int) -> None:
        """A node's first process (a pulled cold spare, a warm standby)."""
        self.spawn(worker, 0)

    def node_back(self, now: float, worker: int) -> None:
        """A repaired node is up: the keeper names its life (:meth:`life_given`)."""
        self._host.keeper.node_up(now, worker)

    def host_back(self, worker: int) -> None:
        fleet = self._host.processes.fleet
        if fleet is not None:
            host = self._host.sc.host_of(worker)
            assert host is not None, worker
            fleet.bring_up(host)

    def life_given(self, worker: int, life: int) -> None:
        """The keeper handed out the life a repaired node's process starts as."""
        self.spawn(worker, life)

    # --- exits ------------------------------------------------------------------------

    def on_exit(self, p: Proc) -> None:
        """A process ended (its pidfd, or its host agent's ``exited``)."""
        host = self._host
        host.processes.reap(p)
        host.nemesis.exited((p.worker, p.incarnation))
        self.maybe_activate()
        self.release_joins()
        now = host.now()
        if p.fault not in ("restart", "crash"):  # a crashed machine's host reports nothing
            host.keeper.exited(now, p.worker, p.incarnation)
        if p.fault is None and host.result is None:
            host.write(rec(now, "info", "exit", DRIVER, worker=p.worker,
                           incarnation=p.incarnation, returncode=p.returncode))
        if p.fault is None and not p.ready and p.returncode != 0:
            # it died before it could join (a traceback in its start-up):
            # the harness is broken, and the job would wait for it forever
            log = worker_log(host.out, p.worker, p.incarnation)
            host.finish("error", f"worker {p.worker} (life {p.incarnation}) exited with code "
                                 f"{p.returncode} before it was ready: {last_line(log)} (see {log})")
