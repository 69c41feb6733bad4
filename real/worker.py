"""One worker process: ``python -m real.worker --port P --worker W ...``.

Two threads:

- the *control* thread (:class:`Worker`, this module) owns the core
  :class:`rollcall.core.agent.Agent` and the connection to the launcher's
  record-keeper service. It sends heartbeats from the agent's timer, so a
  worker busy in a collective still beats; it turns the agent's actions
  into effects (messages, history records, a new target generation for the
  trainer, an abort flag);
- the *training* thread (:class:`real.trainer.Trainer`) trains a real torch
  model: per generation it builds a fresh group (gloo, or NCCL on GPUs:
  ``cluster.backend``; :class:`real.groups.Groups`) over a fresh store
  connection and key prefix, takes the state as the keeper decided (the
  agent's ``Enter``: who is stale, who is the source), and runs steps whose
  micro-batches come from the core planner. It reports to the agent only
  what happened (a step committed, the state is ready); what the worker
  claims at a roll call is the agent's. Every collective is asynchronous
  and polled together with the abort flag, so a dead or evicted peer never
  holds it longer than the keeper takes to decide.

A third, the *reaper* (:class:`real.groups.Reaper`), tears down the groups
of generations the trainer has left: a gloo group's destructor may block on
a paused peer, and a worker that kept its old groups instead grew by a
group's fds and threads every generation. NCCL groups are never torn down:
each is aborted when its generation ends here and kept until the process
exits (:class:`real.device.Communicators`), since a collective whose peer
died never ends on its own and destroying a communicator a dead peer holds
can hang. The worker computes on ``cluster.device`` (its GPU: worker id to
GPU by :func:`real.device.pick_device`); on the CPU nothing of this runs.

A step counts only when the keeper service accepts its commit: the request
carries the generation stamp, and the service answers on the same ordered
stream as the keeper's roll calls, so a worker never applies a step that its
own roll-call answer did not include, and a worker evicted while paused is
refused when it wakes (nothing it computed for an old generation counts).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import socket
import sys
import threading
import time
import traceback
from collections import deque
from pathlib import Path
from typing import Optional

from rollcall.core import Abort, Agent, Cursor, Enter, Heartbeat, Log, SendToKeeper, Stop, rec
from rollcall.scenario import Scenario

from real import wire
from real.device import Communicators, worker_env
from real.groups import GROUP_TIMEOUT_S
from real.keeper_finder import KeeperFinder, KeeperLink, open_store
from real.procs import die_with_parent
from real.trainer import Trainer


class Worker:
    """The control side of one worker process: the link to the keeper
    service, the core agent, and the state the training thread
    (:class:`real.trainer.Trainer`) reads through :class:`real.trainer.TrainerHost`."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.worker = args.worker
        self.incarnation = args.incarnation
        self.t0 = args.t0
        self.run_dir = Path(args.run_dir)
        self.spare = args.spare
        self.scenario = Scenario.model_validate(
            json.loads((self.run_dir / "real" / "scenario.json").read_text()))
        sc = self.scenario
        # read by torch when it first touches CUDA or builds a group: set
        # before either (empty on the CPU)
        os.environ.update(worker_env(sc.cluster.device, sc.cluster.backend, GROUP_TIMEOUT_S))
        # NCCL only: every communicator of a generation that ended here is aborted
        nccl = sc.cluster.backend == "nccl"
        self.comms: Optional[Communicators] = Communicators() if nccl else None
        self.keeper_host = args.keeper_host  # the keeper service's and the TCPStore's address
        self.addr = args.addr  # this host's own address: the gloo groups run over it
        # the keeper link: direct, or through the host agent's relay (real/relay.py)
        link = (self.keeper_host, args.port) if args.link_port is None else ("127.0.0.1", args.link_port)
        self.sock = socket.create_connection(link)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.send_lock = threading.Lock()
        self.late = HeldBeats()  # a late_heartbeats fault's held heartbeats
        self.slow_factor = 1.0  # a slow fault's: each step's compute takes this many times as long
        self.slow_from = 0  # ... from this step on
        self.closed = False  # our side of the launcher's link is shut: nothing more is sent
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.reader = wire.FrameReader(wire.TO_WORKER)
        key = wire.read_secret(args.secret_file)
        self.handshake(key)
        # keeper.worker_links: direct: this worker finds the keeper in etcd and links to it
        self.klink: Optional[KeeperLink] = None
        if sc.keeper.worker_links == "direct":
            ttl_s = float(sc.keeper.lease_ttl_s)
            finder = KeeperFinder(open_store(self.run_dir / "real", key, ttl_s), ttl_s)
            self.klink = KeeperLink(self, finder, key)
        self.agent = Agent(self.worker, self.incarnation, sc.detector.heartbeat_s)
        self.target: Optional[Enter] = None
        self.aborted_gen = 0
        self.stopped = False
        self.store_port: Optional[int] = None
        self.acks: dict[tuple[int, int], bool] = {}
        self.awaiting_ack: Optional[tuple[int, int, Cursor]] = None
        self.deferred: list = []  # keeper messages held while a commit is in flight
        self.started = False
        self.wake = threading.Event()
        self.ready = False  # torch imported, model built
        self.crashed = False  # the control thread died of an error
        self.activate = False

    # --- plumbing -------------------------------------------------------------

    def now(self) -> float:
        return time.monotonic() - self.t0

    def handshake(self, key: bytes, timeout_s: float = 60.0) -> None:
        """Answer the service's challenge with the run's key: the ``hello``."""
        self.sock.settimeout(timeout_s)
        frames: list = []
        while not frames:
            data = self.sock.recv(wire.MAX_HELLO)
            if not data:
                raise ConnectionError("the launcher closed the connection before its challenge")
            frames = self.reader.feed(data)
        self.sock.settimeout(None)
        kind, nonce, run = frames[0]
        assert kind == "challenge", kind
        self.reader.authenticated()  # the launcher we connected to: its frames may be large
        pid = os.getpid()
        mac = wire.hello_mac(key, nonce, run, self.worker, self.incarnation, pid, self.spare)
        self.send(("hello", self.worker, self.incarnation, pid, self.spare, mac))

    def send(self, obj) -> None:
        data = wire.encode(obj)
        with self.send_lock:
            if not self.closed:
                self.sock.sendall(data)

    def close_link(self) -> None:
        """The launcher ended its side: end ours, after the last whole frame, so
        it hears every frame sent (a completed run drains each worker's link to
        its end: see ``Launcher.drain``); what the trainer sends later is dropped."""
        with self.send_lock:
            self.closed = True
            try:
                self.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def to_keeper(self, obj) -> bool:
        """A frame for the keeper: on this worker's own link (direct), else
        the launcher's; False when no keeper serves the direct link (dropped)."""
        return self.to_keeper_bytes(wire.encode(obj))

    def to_keeper_bytes(self, data: bytes) -> bool:
        with self.send_lock:
            if self.klink is not None:
                return self.klink.send(data)
            if not self.closed:
                self.sock.sendall(data)
            return True

    def record(self, r: dict) -> None:
        self.send(("rec", r))

    def record_link(self, term: Optional[int], candidate: Optional[str], reason: str) -> None:
        self.record(rec(self.now(), "info", "keeper_link", self.worker,
                        incarnation=self.incarnation, term=term, candidate=candidate,
                        reason=reason))

    def keeper_served(self, term: int) -> None:
        """Direct links: a keeper of ``term`` serves this link; start, or ask
        again what went unanswered (a failover)."""
        with self.lock:
            if self.started:
                self.apply(self.agent.reconnected(self.now()))
        self.maybe_start()

    def keeper_lost(self) -> None:
        """Direct links: the keeper's link ended; the commit in flight is refused."""
        with self.lock:
            p = self.awaiting_ack
            if p is not None:
                self.handle(("ack", p[0], p[1], False))

    def apply(self, actions) -> None:
        """Turn the agent's actions into effects; the caller holds ``lock``."""
        for a in actions:
            if isinstance(a, SendToKeeper):
                if isinstance(a.message, Heartbeat) and self.late.holding:
                    self.late.hold(self.now(), wire.encode(("msg", a.message)))
                else:
                    self.to_keeper(("msg", a.message))
            elif isinstance(a, Enter):
                self.target = a
                if self.comms is not None:  # every earlier generation is over here
                    self.comms.abort_through(a.generation - 1)
                self.wake.set()
                self.cond.notify_all()
            elif isinstance(a, Abort):
                self.aborted_gen = max(self.aborted_gen, a.generation)
                if self.comms is not None:  # a roll call opened: free the stream now
                    self.comms.abort_through(a.generation)
                self.wake.set()
                self.cond.notify_all()
            elif isinstance(a, Stop):
                self.stopped = True
                self.wake.set()
                self.cond.notify_all()
            elif isinstance(a, Log):
                self.record(a.record)

    def maybe_start(self) -> None:
        with self.lock:
            served = self.klink is None or self.klink.served
            if not self.started and self.ready and self.activate and served:
                self.started = True
                self.apply(self.agent.start(self.now(), None))

    # --- control thread ---------------------------------------------------------

    def control_loop(self) -> None:
        reader = self.reader
        try:
            for frame in reader.more():  # what arrived with the challenge
                self.handle(frame)
            while not self.stopped:
                with self.lock:
                    timer = self.agent.get_timer() if self.started else None
                    due = self.late.next_due()
                if due is not None:
                    timer = due if timer is None else min(timer, due)
                timeout = 0.5 if timer is None else max(0.0, timer - self.now())
                fds = [self.sock] + (self.klink.fds() if self.klink is not None else [])
                readable, _, _ = select.select(fds, [], [], timeout)
                if self.klink is not None:
                    self.klink.ready(readable)
                if self.sock in readable:
                    data = self.sock.recv(1 << 16)
                    if not data:
                        self.close_link()  # the launcher is done, or gone
                        break
                    for frame in reader.feed(data):
                        self.handle(frame)
                with self.lock:
                    if self.started:
                        timer = self.agent.get_timer()
                        if timer is not None and self.now() >= timer:
                            self.apply(self.agent.handle_timer(self.now()))
                    for data in self.late.due(self.now()):
                        self.to_keeper_bytes(data)
        except (OSError, ValueError):
            pass  # the connection broke, or a peer sent a bad frame: stop
        except BaseException:
            # a bug: say what it was in full before the process exits (the
            # main thread's os._exit would cut a thread's report short)
            self.crashed = True
            traceback.print_exc()
            sys.stderr.flush()
        finally:
            with self.lock:
                self.stopped = True
                self.cond.notify_all()

    def handle(self, frame) -> None:
        kind = frame[0]
        with self.lock:
            if kind == "msg":
                if self.awaiting_ack is not None:
                    # A commit of ours is in flight and its answer is on its
                    # way: hear it first, so that a roll call is answered
                    # with the state this worker really ends up holding.
                    self.deferred.append(frame[1])
                elif self.started:
                    self.apply(self.agent.receive(self.now(), frame[1]))
            elif kind == "ack":
                _, gen, step, ok = frame
                self.acks[(gen, step)] = ok
                p = self.awaiting_ack
                if ok and p is not None and p[:2] == (gen, step):
                    # the trainer applies an accepted step whatever comes next
                    self.apply(self.agent.step_committed(self.now(), p[2]))
                self.awaiting_ack = None
                deferred, self.deferred = self.deferred, []
                if self.started:
                    for message in deferred:
                        self.apply(self.agent.receive(self.now(), message))
                self.cond.notify_all()
            elif kind == "welcome":
                self.store_port = frame[1]
                self.cond.notify_all()
            elif kind == "activate":
                self.activate = True
            elif kind == "late_beats":  # a late_heartbeats fault (0: on time again)
                self.late.delay_s = frame[1]
            elif kind == "slow":  # a slow fault (1: full speed again)
                self.slow_factor, self.slow_from = frame[1], frame[2]
            elif kind == "keeper" and self.started:  # a failover: ask again what went unanswered
                self.apply(self.agent.reconnected(self.now()))
        if kind == "activate":
            self.maybe_start()

    # --- what the training thread asks (real.trainer's TrainerHost) ----------------------

    def ended(self, gen: int) -> bool:
        """Whether generation ``gen`` is over for this worker: stopped, aborted
        (a roll call opened), or a later one entered."""
        return self.stopped or self.aborted_gen >= gen or (
            self.target is not None and self.target.generation > gen)

    def trainer_ready(self) -> None:
        """torch is imported and the model built: tell the launcher, and start
        the agent once activated."""
        self.ready = True
        self.send(("ready",))
        self.maybe_start()

    def request_commit(self, gen: int, step: int, nxt: Cursor, record: dict,
                       compute: tuple[float, int]) -> Optional[bool]:
        """Ask the keeper service whether ``step`` commits (``compute``: its
        compute_s and micro-batches, for the straggler policy); None when
        the generation ended before it was asked. The answer comes on the
        stream of the keeper's roll calls (see the module docstring), so
        the control thread holds those back until it has it."""
        with self.cond:
            if self.ended(gen) or not self.agent.may_step(gen):
                return None
            self.awaiting_ack = (gen, step, nxt)
            if not self.to_keeper(("commit", self.worker, self.incarnation, gen, step,
                                   record, *compute)):
                self.handle(("ack", gen, step, False))  # no keeper: not committed
            while (gen, step) not in self.acks and not self.stopped:
                self.cond.wait(0.5)
            return self.acks.pop((gen, step), False)

    def report_final(self, gen: int, cursor: list, weights_sha256: str) -> None:
        """Hand the launcher the final cursor and weights, then wait for the
        stop (or for a later generation, should the keeper form one)."""
        self.send(("final", self.worker, self.incarnation, cursor, weights_sha256))
        with self.cond:
            while not self.stopped and self.target is not None and self.target.generation == gen:
                self.cond.wait(0.5)

    def report_fatal(self, reason: str) -> None:
        """Diverged: every retry would fail the same way, so end the run with
        the reason rather than roll-call forever; wait for the stop."""
        self.send(("fatal", self.worker, reason))
        with self.cond:
            while not self.stopped:
                self.cond.wait(0.5)


class HeldBeats:
    """A ``late_heartbeats`` fault, on the worker: while ``delay_s`` > 0 each
    heartbeat frame leaves ``delay_s`` after the agent sent it, in order
    (``max(now + delay_s, the previous one's)``), as a busy host's control
    thread or a loaded link would send them; once it is 0 again what is
    held still leaves in order. Only heartbeats: the worker's work and its
    other messages are on time. The caller holds the worker's lock."""

    def __init__(self) -> None:
        self.delay_s = 0.0
        self.held: deque[tuple[float, bytes]] = deque()

    @property
    def holding(self) -> bool:
        return self.delay_s > 0 or bool(self.held)

    def hold(self, now: float, data: bytes) -> None:
        last = self.held[-1][0] if self.held else now
        self.held.append((max(now + self.delay_s, last), data))

    def next_due(self) -> Optional[float]:
        return self.held[0][0] if self.held else None

    def due(self, now: float) -> list[bytes]:
        out = []
        while self.held and self.held[0][0] <= now:
            out.append(self.held.popleft()[1])
        return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m real.worker")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--keeper-host", default="127.0.0.1", help="the keeper service's address")
    p.add_argument("--addr", default="127.0.0.1", help="this host's address, for gloo")
    p.add_argument("--link-port", type=int, default=None,
                   help="reach the keeper service through the host agent's relay on this port")
    p.add_argument("--worker", type=int, required=True)
    p.add_argument("--incarnation", type=int, default=0)
    p.add_argument("--t0", type=float, required=True)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--spare", action="store_true")
    p.add_argument("--secret-file", required=True, help="the run's key (a 0600 file)")
    args = p.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher owns Ctrl-C
    die_with_parent()
    w = Worker(args)
    ctl = threading.Thread(target=w.control_loop, daemon=True, name="control")
    ctl.start()
    code = 0
    try:
        Trainer(w).run()
    except BaseException:
        traceback.print_exc()
        code = 1
    if w.crashed:
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # never wait on abandoned collectives at exit


if __name__ == "__main__":
    main()
