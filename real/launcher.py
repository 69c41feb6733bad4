"""The launcher: record-keeper service, process supervisor and fault injector.

One thread, one selector loop, one clock (``time.monotonic()`` minus the run's
start, shared with the workers on this host):

- the *record-keeper service* accepts worker connections on 127.0.0.1, feeds
  their protocol messages to the core :class:`rollcall.core.keeper.Keeper` and
  turns its outputs into effects (frames to workers, history records, job
  restarts and relaunches, a failed job). Whether a step may commit is the
  keeper's commit vote (:meth:`Keeper.commit`); the service carries the
  request and the answer;
- the *hosts' agent*: it started every worker process and holds a pidfd for
  each, so the moment one exits it tells the keeper ``exited`` (a SIGKILLed
  worker is known in milliseconds; a SIGSTOPped one only by the detector). A
  random lifetime's end (fault kind ``crash``) is the machine's: the process
  is SIGKILLed but no exit is reported (its host agent died with it), so the
  detector decides, as on the sim;
- the *lives* (:class:`real.lives.Lives`): the worker processes started as
  one batch join the keeper as one arrival, a scripted join brings new
  workers, a lost node takes its process with it, and the repair shop's
  answers start processes again;
- the *fault injector* (:class:`real.nemesis.Nemesis`) kills, pauses and
  adds workers on schedule and, in hosts mode, cuts hosts' links
  (``partition``, ``isolate_keeper``, ``loss``: nftables rules in their
  namespaces) and heals them after ``for_s``; what is due when is the
  core's :class:`rollcall.core.FaultPlan` (``rollcall.config.fault_plan``).

Every process it starts is killed and reaped on the way out, whatever the way
out is (done, failed, exception, SIGINT/SIGTERM, interpreter exit). Signals
follow :mod:`rollcall.interrupts`: the first SIGINT or SIGTERM wakes the loop,
which ends the run (``result: interrupted``) and cleans up; a second one
SIGKILLs every process of the run at once (:meth:`Launcher.kill_now`) and
cuts whatever the launcher waits for. Nothing a signal could cut in the
middle and leave behind (a process started but not recorded, a namespace
half made, torch half imported) runs unshielded. Every child is in a session
of its own, so a terminal's Ctrl-C reaches the launcher alone, and dies with
it (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import socket
import time
from pathlib import Path
from typing import Any, Callable, Optional

from rollcall import interrupts
from rollcall.config import fault_plan, keeper_config, repair_shop
from rollcall.core import DRIVER, Completion, Final, Keeper, rec
from rollcall.results import HISTORY_FILE, HistoryWriter
from rollcall.scenario import Scenario

from real import wire
from real.keeper_port import CommitAsk, LocalKeeper
from real.fault_timing import FaultTiming
from real.nemesis import Nemesis
from real.outputs import Outputs
from real.processes import Processes
from real.procs import Proc
from real.service import Conn, Service
from real.fleet import Fleet
from real.host_links import HostLinks
from real.lives import Lives
from real.netns import Network

# Scripted joins whose processes are started (idle) at launch; more are
# started when their join fires.
PREWARM_MAX = 8

# A completed run's wait for its workers' last frames, beyond any delay still held
# (see Launcher.drain)
DRAIN_S = 5.0

# Every launcher in this interpreter, so atexit can clean up after any of them.
_LIVE: set["Launcher"] = set()


@atexit.register
def _cleanup_all() -> None:
    for launcher in list(_LIVE):
        launcher.kill_all()


class Launcher:
    """``bind``: the keeper service's address and port (default: loopback, or in
    hosts mode the bridge of the run's own namespaces). ``external_hosts``: the
    host agents are someone else's (``rollcall keeper``); the launcher then
    builds no network and starts no process, it serves the agents that connect.
    """

    def __init__(self, scenario: Scenario, out_dir: str | Path,
                 max_wall_s: Optional[float] = None, bind: Optional[tuple[str, int]] = None,
                 external_hosts: bool = False) -> None:
        assert max_wall_s is None or max_wall_s > 0, max_wall_s
        self.hosts_mode = scenario.cluster.workers_per_host is not None
        assert self.hosts_mode or not external_hosts, "external hosts need cluster.workers_per_host"
        self.external_hosts = external_hosts
        self.bind = bind
        self.listen_addr = "127.0.0.1"  # where the service and the store listen (see listen)
        self.on_listening: Optional[Callable[[str, int], None]] = None  # rollcall keeper's notice
        self.max_wall_s = max_wall_s  # the run ends (failed) after this many seconds
        self.sc = scenario
        self.out = Path(out_dir).resolve()  # the processes run elsewhere (REPO_ROOT)
        self.real_dir = self.out / "real"
        self.real_dir.mkdir(parents=True, exist_ok=True)
        (self.real_dir / "logs").mkdir(exist_ok=True)
        (self.real_dir / "scenario.json").write_text(json.dumps(scenario.to_dict()))
        # the run's secret: every connection to the service proves it holds it
        self.secret_path = self.real_dir / "secret"
        self.secret_path.unlink(missing_ok=True)
        self.secret = wire.write_secret(self.secret_path)
        self.run_id = wire.new_nonce()
        hist = self.out / HISTORY_FILE
        if hist.exists():
            hist.unlink()
        self.history = HistoryWriter(self.out)
        self.t0 = time.monotonic()
        self.sel = selectors.DefaultSelector()
        self.service = Service(self.sel, self.secret, self.run_id, self.now, self.write)
        self.service.handler = self
        self.host_links = HostLinks(self)  # hosts mode: the host agents' links
        self.service.host_handler = self.host_links
        # the keeper's answers (real.keeper_port's Sink) carried out; what the
        # launcher knows of the job is what they said (real.outputs)
        self.outputs = Outputs(self)
        if scenario.keeper.store == "etcd":  # keeper processes, one active, found through etcd
            from real.keeper_link import RemoteKeeper

            self.keeper: Any = RemoteKeeper(self, self.sel, self.outputs)
        else:
            self.keeper = LocalKeeper(Keeper(keeper_config(scenario)), self.outputs)
        self.completion = Completion()  # the vote's verdict and the members' final reports
        self.faults = fault_plan(scenario)
        # the lives: batches, joins, the machines and the repair shop's answers
        self.lives = Lives(self, repair_shop(scenario, self.faults.draws))
        self.processes = Processes(self.out, self.t0, self.secret_path, self.sel, self.now,
                                   self.lives.joins)
        self.store: Any = None  # torch's TCPStore, once started
        self.result: Optional[str] = None        # completed | failed | interrupted | error
        self.reason = ""
        self.end_t: Optional[float] = None
        self.stop = interrupts.Stop()  # run() takes its caller's, or one of its own
        self.nemesis = Nemesis(self)  # carries out the faults the plan hands out
        self.fault_timing = FaultTiming(self.faults, self.nemesis.inject)  # and when

    # --- clock and history ------------------------------------------------------

    def now(self) -> float:
        return time.monotonic() - self.t0

    @property
    def network(self) -> Optional[Network]:
        """The hosts' network namespaces, where the run has them."""
        return self.fleet.network if self.fleet is not None else None

    def next_gate(self) -> int:
        """The committed count whose last ack waits for a fault (0: none)."""
        return self.faults.next_gate()

    def write(self, record: dict) -> None:
        if not self.history.closed:
            self.history.write(record)

    # --- processes (the table: real.processes) ------------------------------------------

    @property
    def fleet(self) -> Optional[Fleet]:
        """Hosts mode: the host agents, which start and signal the lives."""
        return self.processes.fleet

    @property
    def port(self) -> int:
        """The keeper service's port once it listens (0 before)."""
        return self.processes.port

    @property
    def procs(self) -> list[Proc]:
        """Every worker process the run started, in order."""
        return self.processes.table

    def kill_now(self) -> None:
        """SIGKILL every process of the run at once, by PID, and wait for none
        (a second signal's handler runs it; :meth:`kill_all` reaps them after)."""
        self.processes.kill_now()
        if self.fleet is not None and self.fleet.network is not None:
            self.fleet.network.kill_now()
        self.keeper.kill_now()

    def kill_all(self) -> None:
        """SIGKILL and reap every process this launcher started (idempotent);
        in hosts mode every agent, worker and namespace goes with the network."""
        self.processes.kill_all()
        self.keeper.close()  # keeper processes and etcd, if any
        _LIVE.discard(self)

    # --- keeper outputs -------------------------------------------------------------

    def physical_report(self) -> tuple[list, list, list, int]:
        """What a new keeper is told on taking over: the latest life started
        for each worker id, the nodes down, the latest lives whose
        process exited (a crashed machine's report nothing), and the repair
        shop's capacity."""
        latest = self.processes.latest()
        started = sorted([w, p.incarnation] for w, p in latest.items())
        exited = sorted([w, p.incarnation] for w, p in latest.items()
                        if not p.alive and p.fault not in ("restart", "crash"))
        return started, sorted(self.lives.nodes.down), exited, self.lives.nodes.shop.capacity

    def tell_workers(self, frame: tuple) -> None:
        self.service.tell_workers(frame)

    def write_reject(self, reason: str) -> None:
        self.service.write_reject(reason)

    # --- service I/O ------------------------------------------------------------------

    def authenticated_frame(self, conn: Conn, frame: tuple, now: float) -> None:
        kind = frame[0]
        if kind == "ready":
            p = self.lives.proc_of(conn)
            if p is not None:
                p.ready = True
                self.lives.maybe_activate()
        elif kind == "msg":
            if not self.lives.hold_join(conn, frame[1]):
                self.keeper.receive(now, [frame[1]])
        elif kind == "rec":
            self.write(frame[1])
        elif kind == "commit":
            self.commit_request(conn, now, *frame[1:])
        elif kind == "fatal":  # e.g. training diverged: no retry can help
            _, w, reason = frame
            self.finish("failed", f"worker {w}: {reason}")
        elif kind == "final":
            _, w, inc, cursor, sha = frame
            self.completion.final(w, Final(cursor, sha))

    def commit_request(self, conn: Conn, now: float, w: int, inc: int, gen: int, step: int,
                       record: dict, compute_s: float, load: int) -> None:
        """Ask the keeper's commit vote; :meth:`commit_answered` gets its answer."""
        self.keeper.commit(now, CommitAsk(conn, w, inc, gen, step, record, compute_s, load))

    # --- faults ------------------------------------------------------------------------

    # --- the loop ------------------------------------------------------------------------

    def finish(self, result: str, reason: str) -> None:
        if self.result is None:
            self.result = result
            self.reason = reason
            self.end_t = self.now()

    def next_deadline(self) -> Optional[float]:
        times = []
        kt = self.keeper.get_timer()
        if kt is not None:
            times.append(kt)  # the keeper's (or, while none serves, the next look in etcd)
        ft = self.fault_timing.next_time(self.outputs.train_start)
        if ft is not None:
            times.append(ft)
        nt = self.nemesis.get_timer()
        if nt is not None:
            times.append(nt)  # a pause or another timed fault ends
        nodes_t = self.lives.nodes.next_time()
        if nodes_t is not None:
            times.append(nodes_t)  # a repair, a pull or a warm-up
        done_t = self.completion.get_timer()
        if done_t is not None:
            times.append(done_t)  # the members' final reports stop being waited for
        jt = self.lives.joins.get_timer()
        if jt is not None:  # a batch's processes activate, and its Joins go, by then
            times.append(jt)
        times += self.service.auth_deadlines()
        if self.fault_timing.waiting:
            times.append(self.now())  # faults a roll call made due
        return min(times) if times else None

    def timers(self) -> None:
        now = self.now()
        self.service.expire_unauthenticated(now)
        self.keeper.handle_timer(now)
        self.fault_timing.handle_timer(now, self.outputs.train_start)  # after the keeper's outputs
        self.nemesis.handle_timer(now)
        self.lives.nodes.handle_timer(now)
        self.lives.maybe_activate()
        self.lives.release_joins()
        self.check_done()

    @property
    def nodes_up(self) -> set[int]:
        """The nodes whose hardware is up (read-only)."""
        return self.lives.nodes.up

    # --- the keeper's outputs, as the rest see them (real.outputs) --------------------------

    def check_done(self) -> None:
        """End the run once the core's rule says the job is over."""
        live = (w for w in self.outputs.members if self.processes.live(w) is not None)
        if self.result is None and self.completion.done(self.now(), live):
            self.finish("completed", "all steps committed")

    def start_store(self) -> None:
        from datetime import timedelta

        with interrupts.shielded():  # torch half imported would crash the next import
            import torch.distributed as dist

        # torch's own server would listen on every interface; handed a socket
        # bound to the service's address, it listens there only (and owns the
        # fd: it closes it when the store goes)
        with socket.create_server((self.listen_addr, 0), backlog=128) as sock:
            port, fd = sock.getsockname()[1], os.dup(sock.fileno())
        self.store = dist.TCPStore(self.listen_addr, port, is_master=True, wait_for_workers=False,
                                   timeout=timedelta(seconds=60), master_listen_fd=fd)
        self.service.welcome(self.store.port)

    def run(self, stop: Optional[interrupts.Stop] = None) -> str:
        """Start everything, serve until the run ends, clean up; the result.
        ``stop``: the signals' record of the caller's :func:`interrupts.catch`
        block (default: one of its own, in the main thread)."""
        _LIVE.add(self)
        with interrupts.catch(immediate=False, stop=stop) as self.stop:
            self.stop.on_second(self.kill_now)
            self.sel.register(self.stop.wake_fd(), selectors.EVENT_READ, ("wake", None))
            try:
                if self.start_up():
                    self.serve()
                if self.stop.signum is not None:
                    self.finish("interrupted", str(self.stop.reason()))
                # the links carry the records of steps already committed (a
                # member's contribute after the first member's commit): heard
                # whatever ended the run, or the ledger of a signalled run
                # lacks them (a second signal still kills at once)
                self.drain()
            except interrupts.Interrupted:  # a second signal: the processes are dead already
                self.finish("interrupted", str(self.stop.reason()))
            except BaseException as exc:
                self.finish("error", f"launcher error: {exc!r}")
                raise
            finally:
                with self.stop.shielded(then_raise=False):
                    self.shutdown()
                # what it kills is gone: a later run handed the same stop has its own
                self.stop.forget(self.kill_now)
        assert self.result is not None  # finish() ran on every way out
        return self.result

    def start_up(self) -> bool:
        """The service, the keeper, the processes, the store; False when a
        signal came or the run ended meanwhile (nothing more is started then)."""
        steps = [self.listen, self.start_keeper, self.start_workers, self.start_store]
        for step in steps:
            if self.stop.signum is not None or self.result is not None:
                return False
            step()
        return self.stop.signum is None and self.result is None

    def start_keeper(self) -> None:
        if not isinstance(self.keeper, LocalKeeper):
            self.keeper.start()  # etcd, the keeper processes, the first keeper's answer

    def start_workers(self) -> None:
        c = self.sc.cluster
        # Spares are workers like the rest: they join at the start and the
        # keeper keeps those beyond max_workers as standbys, admitted at
        # the first roll call with room (as on the sim). The others wait idle.
        first = [(w, 0) for w in range(c.workers)] + [
            (w, 0) for w in range(c.workers, self.lives.nodes.shop.initial)]
        batch = self.lives.start_batch(first)
        # A scripted join is a new worker arriving; its process is started
        # now and kept idle (torch imported) until the join fires, so the
        # arrival is the schedule's and not the seconds of a cold start: the
        # first batch waits for these to be ready too (they do not join).
        joins = sum(f.newcomers for f in self.sc.failures.schedule)
        for _ in range(min(joins, PREWARM_MAX)):
            self.lives.spawn_new(spare=True, batch=batch)

    def serve(self) -> None:
        """The loop: events, timers and faults until the run has a result or a signal came."""
        while self.result is None and self.stop.signum is None:
            deadline = self.next_deadline()
            if self.max_wall_s is not None:
                deadline = min(self.max_wall_s, deadline or self.max_wall_s)
            timeout = 0.5 if deadline is None else min(0.5, max(0.0, deadline - self.now()))
            for key, _ in self.sel.select(timeout):
                kind, obj = key.data
                if kind == "listen":
                    self.service.accept()
                elif kind == "proc":
                    self.lives.on_exit(obj)
                elif kind == "wake":
                    wire.recv_some(key.fileobj)  # the signal is in self.stop
                elif kind == "kconn":
                    if self.keeper.up:
                        self.keeper.on_event()
                elif kind == "kproc":
                    self.keeper.on_proc_exit(obj)
                else:
                    self.service.on_event(obj)
                if self.result is not None or self.stop.signum is not None:
                    break
            if self.stop.signum is not None:
                return
            self.timers()
            self.check_done()
            if self.max_wall_s is not None and self.now() >= self.max_wall_s:
                self.finish("failed", f"wall limit: --max-wall-s {self.max_wall_s:g} reached")

    def drain(self) -> None:
        """Hear each worker's link to its end before any process is stopped.

        Why: frames still on their way when the run ends (a delayed host's
        backlog in its relay, a healed partition's retransmissions, the other
        members' records of a step one member's commit committed just before
        a signal) carry ``contribute`` records, and the ledger needs every
        one. The launcher ends its side of each link; the worker ends its own
        after its last whole frame (``Worker.close_link``). Bounded: :data:`DRAIN_S` plus
        twice the longest delay still held (the ends go through it both ways).
        Only records and final reports are taken: the keeper has decided."""
        held_s = self.nemesis.held_delay_s(self.now())
        # the links of live processes only: a lost machine's never end (no FIN
        # comes from a host whose link went down with it)
        self.service.drain(DRAIN_S + 2 * held_s,
                           lambda c: (p := self.lives.proc_of(c)) is not None and p.alive,
                           self.drained_frame)

    def drained_frame(self, frame: tuple) -> None:
        """What a draining link still brings that counts: records and final reports."""
        if frame[0] == "rec":
            self.write(frame[1])
        elif frame[0] == "final":
            self.completion.final(frame[1], Final(frame[3], frame[4]))

    def listen(self) -> None:
        """Open the keeper service: on loopback, on the bridge of the run's own
        namespaces (hosts mode, which builds them and starts their agents), or
        where ``bind`` says (``rollcall keeper``)."""
        network = None
        if self.hosts_mode and not self.external_hosts:
            extra = 0  # the workers' hosts, then the keeper side's (keepers, etcd members)
            if self.sc.keeper.store == "etcd":
                from real.keeper_side import keeper_hosts

                extra = keeper_hosts(self.sc.keeper)
            network = Network(self.run_id, self.sc.n_hosts + extra)
            self.processes.fleet = Fleet(self.sc.n_hosts, self.service.queue, network)  # close() cleans up from here on
            (self.real_dir / "network.json").write_text(json.dumps(
                {"prefix": network.prefix, "hosts": network.hosts}) + "\n")  # what to look for
            with interrupts.shielded():  # a namespace half made is one close() may not find
                network.open()
            self.listen_addr, port = network.keeper_address, 0
        elif self.hosts_mode:
            self.processes.fleet = Fleet(self.sc.n_hosts, self.service.queue)
            self.listen_addr, port = self.bind or ("127.0.0.1", 0)
        else:
            self.listen_addr, port = self.bind or ("127.0.0.1", 0)
        port = self.processes.port = self.service.open(self.listen_addr, port)
        if self.fleet is not None:
            with interrupts.shielded():
                self.fleet.start_agents((self.listen_addr, port), self.secret_path)
        if self.on_listening is not None:
            self.on_listening(self.listen_addr, port)

    def shutdown(self) -> None:
        self.kill_all()
        self.secret_path.unlink(missing_ok=True)  # no key outlives its run
        now = self.now()
        if self.end_t is None:
            self.end_t = now
        self.write(rec(now, "info", "end", DRIVER, completed=self.result == "completed",
                       cursor=self.completion.end_cursor(list(self.outputs.committed_cursor)),
                       reason=self.reason))
        self.service.close()
        self.sel.close()
        self.history.close()
        self.store = None
