"""One worker process: ``python -m real.worker --port P --worker W ...``.

Two threads:

- the *control* thread owns the core :class:`rollcall.core.agent.Agent` and the
  connection to the launcher's record-keeper service. It sends heartbeats from
  the agent's timer, so a worker busy in a collective still beats; it turns
  the agent's actions into effects (messages, history records, a new target
  generation for the trainer, an abort flag);
- the *training* thread trains a real torch model: per generation it builds a
  fresh group (gloo, or NCCL on GPUs: ``cluster.backend``) over a fresh store
  connection and key prefix, takes the
  state as the keeper decided (the agent's ``Enter``: who is stale, who is the
  source), and runs steps whose micro-batches come from the core planner.
  It reports to the agent only what happened (a step committed, the state
  is ready); what the worker claims at a roll call is the agent's. Every
  collective is asynchronous and polled together with the abort flag, so a
  dead or evicted peer never holds it longer than the keeper takes to decide.

A third, the *reaper*, tears down the groups of generations the trainer has
left (see :class:`Reaper`): a gloo group's destructor may block on a paused
peer, and a worker that kept its old groups instead grew by a group's fds
and threads every generation. NCCL groups are never torn down: each is
aborted when its generation ends here and kept until the process exits
(:class:`real.device.Communicators`), since a collective whose peer died
never ends on its own and destroying a communicator a dead peer holds can
hang. The worker computes on ``cluster.device`` (its GPU: worker id to GPU
by :func:`real.device.pick_device`); on the CPU nothing of this runs.

A step counts only when the keeper service accepts its commit: the request
carries the generation stamp, and the service answers on the same ordered
stream as the keeper's roll calls, so a worker never applies a step that its
own roll-call answer did not include, and a worker evicted while paused is
refused when it wakes (nothing it computed for an old generation counts).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import queue
import select
import signal
import socket
import sys
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from rollcall.config import job_policy
from rollcall.core import (
    Abort, Agent, Cursor, Enter, Heartbeat, Log, SendToKeeper, Stop, lr_scale, plan_step, rec,
    sample_ids, stripes,
)
from rollcall.scenario import Scenario

from real import reduce, wire
from real.procs import die_with_parent
from real.device import Communicators, nccl_backend, pick_device, worker_env
from real.keeper_finder import KeeperFinder, KeeperLink, open_store

#: A group's collective timeout (gloo and NCCL) and NCCL's non-blocking init
#: and abort limit: a backstop only; the keeper ends a generation long before.
GROUP_TIMEOUT_S = 60.0


class Aborted(Exception):
    """The generation being trained in is over for this worker."""


class Worker:
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
        self.nccl = sc.cluster.backend == "nccl"
        # NCCL only: every communicator of a generation that ended here is aborted
        self.comms: Optional[Communicators] = Communicators() if self.nccl else None
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
        self.stretched = -1  # the last step whose compute was stretched
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
        self.compute: tuple[float, int] = (0.0, 0)  # the last step's compute_s, micro-batches
        self.started = False
        self.wake = threading.Event()
        self.group: Optional[dict] = None  # the current generation's group and store
        self.reaper = Reaper()
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

    # --- training thread --------------------------------------------------------

    def check(self, gen: int) -> None:
        if self.stopped or self.aborted_gen >= gen or (
                self.target is not None and self.target.generation > gen):
            raise Aborted()

    def wait_work(self, work, gen: int) -> None:
        """Wait for an async collective *or* the abort flag, whichever comes first.

        The collective's completion callback and every agent action that can
        end the generation set ``wake``; a short timeout bounds any missed wake.
        """
        wake = self.wake
        try:
            work.get_future().add_done_callback(lambda _f: wake.set())
        except Exception:  # noqa: BLE001 - no future: plain polling below
            pass
        while not work.is_completed():
            self.check(gen)
            wake.wait(0.005)
            wake.clear()
        if self.nccl:  # an NCCL work fails when we abort it: that ends the generation
            self.check(gen)
        work.wait()  # completed: raises if the collective failed

    def watched(self, gen: int, name: str, fn: Callable[[], None]) -> None:
        """Run ``fn`` (a call that blocks and cannot be told to stop) in a
        thread of its own, named ``name``, while this one watches the abort
        flag; re-raise what ``fn`` raised. An aborted generation leaves the
        thread to its own timeout, like an abandoned collective."""
        err: list[Exception] = []

        def run() -> None:
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - raised here, below
                err.append(exc)

        th = threading.Thread(target=run, daemon=True, name=name)
        th.start()
        while th.is_alive():
            self.check(gen)
            th.join(0.001)
        self.check(gen)
        if err:
            raise err[0]

    def train_loop(self) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        torch.set_num_threads(1)
        from real.model import Workload

        sc = self.scenario
        cl = sc.cluster
        count = torch.cuda.device_count() if cl.device == "cuda" else 0
        where = torch.device(pick_device(self.worker, cl.device, cl.backend, count,
                                         cl.gpus_per_worker))
        if where.type == "cuda":
            torch.cuda.set_device(where)  # this process's GPU: NCCL's, the allocator's
        self.wl = Workload(sc.seed, sc.workload.model_params, sc.workload.lr, where)
        self.scratch = None  # exact mode's encoding buffers, kept from step to step
        self.zero = None
        if sc.state.sharding == "sharded":
            from real.zero import ZeroState
            self.zero = ZeroState(self.worker, self.wl, sc.state_shards)
        self.cursor = Cursor()  # position of the state held
        self.holds_state = False
        self.ready = True
        self.send(("ready",))
        self.maybe_start()
        done = 0
        while True:
            with self.cond:
                while not self.stopped and (
                        self.target is None or self.target.generation <= done
                        or self.store_port is None):
                    self.cond.wait(0.5)
                if self.stopped:
                    return
                enter = self.target
            done = enter.generation
            self.retire_group()
            try:
                self.run_generation(enter)
            except Aborted:
                continue
            except Exception as exc:  # a failed collective: report and wait
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                print(f"[worker {self.worker}.{self.incarnation} gen {enter.generation}] "
                      f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
                with self.lock:
                    if self.agent.generation == enter.generation:
                        self.apply(self.agent.step_failed(self.now(), self.cursor.step))

    def build_group(self, enter: Enter):
        if len(enter.members) == 1:
            return None
        dist = self.dist
        from datetime import timedelta
        out: dict = {}

        def build() -> None:
            store = dist.TCPStore(self.keeper_host, self.store_port, is_master=False,
                                  timeout=timedelta(seconds=60))
            prefixed = dist.PrefixStore(f"rollcall/gen{enter.generation}/", store)
            out["gen"] = enter.generation
            if self.nccl:
                out["pg"] = self.nccl_group(prefixed, enter)
                out["store"] = store
                return
            # gloo, on CPU or CUDA tensors
            opts = dist.ProcessGroupGloo._Options()
            opts._timeout = timedelta(seconds=GROUP_TIMEOUT_S)
            opts._devices = [dist.ProcessGroupGloo.create_device(hostname=self.addr)]
            out["pg"] = dist.ProcessGroupGloo(prefixed, enter.rank, len(enter.members), opts)
            out["store"] = store

        self.watched(enter.generation, f"group-{enter.generation}", build)
        assert self.group is None, "the previous generation's group was not retired"
        self.group = out
        return out["pg"]

    def nccl_group(self, prefixed, enter: Enter):
        """This generation's NCCL backend, registered for abort before it
        connects (a peer may die while it does)."""
        comms = self.comms
        assert comms is not None
        return nccl_backend(self.dist, prefixed, enter.rank, len(enter.members), self.wl.device,
                            GROUP_TIMEOUT_S, lambda b: comms.add(enter.generation, b))

    def retire_group(self) -> None:
        """Hand the last generation's group to the reaper. Called when the
        trainer takes a later generation, not when it leaves one: the keeper
        has formed the new one, so each member of the old one has either
        answered its roll call (its agent left the old generation) or was
        left out and is fenced when it next speaks; a collective that fails
        there once this side closes cannot fail a live generation."""
        group, self.group = self.group, None
        if group is None:
            return
        if self.comms is not None:  # NCCL: aborted (if the control thread has not yet) and kept
            self.comms.abort_through(group["gen"])
            return
        if sys.getrefcount(group["pg"]) > 2:
            gc.collect()  # a frame of the last generation kept in a reference cycle
        # Only the dict holds the group now (getrefcount's own argument is
        # the other ref): no frame of the trainer can drop the last reference
        # later and block in the destructor.
        assert sys.getrefcount(group["pg"]) == 2, sys.getrefcount(group["pg"])
        self.reaper.retire(group)

    def allreduce(self, pg, tensor, gen: int) -> None:
        if pg is None:
            return
        self.wait_work(pg.allreduce([tensor]), gen)

    def exact_reduce(self, pg, part, recompute, gen: int):
        """Order-free reduction (see :mod:`real.reduce`): a SUM of fixed-point
        integers under the guessed bound; when there is no guess or a shard
        broke it, a scalar MAX for the true bound and the SUM again."""
        if part.exp is not None:
            total = part.wire()
            self.allreduce(pg, total, gen)
            out = part.result(total)
            if out is not None:
                return out
        top = self.max_over(pg, part.max_abs, gen)
        again = part.again(reduce.top_of(top), recompute(part.kept))
        total = again.wire()
        self.allreduce(pg, total, gen)
        return again.result(total)

    def max_over(self, pg, value: float, gen: int) -> float:
        """``value``'s maximum over the generation (a scalar MAX collective)."""
        t = self.torch.tensor([value], dtype=self.torch.float64, device=self.wl.device)
        if pg is not None:
            opts = self.dist.AllreduceOptions()
            opts.reduceOp = self.dist.ReduceOp.MAX
            self.wait_work(pg.allreduce([t], opts), gen)
        return float(t[0])

    def shard_ids(self, plan, j: int) -> list[int]:
        offs = plan.shard_offsets(j)
        return sample_ids(self.scenario.seed, self.scenario.workload.dataset_samples, offs.start, offs.stop)

    def hold(self, enter: Enter, load) -> None:
        """Adopt the state at ``enter.cursor`` if the generation is still ours."""
        with self.lock:
            self.check(enter.generation)
            load()
            self.cursor = enter.cursor
            self.holds_state = True
            self.apply(self.agent.state_ready(self.now(), enter.cursor))

    def local_state(self, cursor: Cursor):
        """The state at ``cursor`` from the origin or a checkpoint, as a tensor."""
        if cursor == Cursor():
            return self.wl.initial_state()
        from real.model import load_checkpoint
        ck = load_checkpoint(self.run_dir, cursor.step, map_location=self.wl.device)
        if ck is None or ck["sample"] != cursor.sample:
            raise RuntimeError(f"no checkpoint at {cursor}")
        return ck["state"]

    def settle(self, pg, enter: Enter, load, reloaded: bool = False,
               replaced: bool = False) -> None:
        """Adopt the generation's state: ``load`` it, and under ZeRO-1 carry out
        the keeper's shard copies (one gather every member joins) first."""
        z = self.zero
        if z is None or enter.placement is None:
            self.hold(enter, load)
            return
        buf = z.copy_buffer(enter.recovery)
        if buf is not None:
            self.allreduce(pg, buf, enter.generation)

        def adopt() -> None:
            load()
            z.adopt(enter.placement, enter.recovery, buf, reloaded, replaced)

        self.hold(enter, adopt)

    def holds(self, cursor: Cursor) -> bool:
        """Whether the trainer holds the state at ``cursor``."""
        return self.holds_state and self.cursor == cursor

    def sync_state(self, pg, enter: Enter) -> None:
        """Take the generation's state as the keeper decided (``Enter``): load
        it when there is no source; otherwise stale members copy it from the
        source, in one broadcast every member joins when ``enter.broadcast``."""
        if enter.source is None:
            state = self.local_state(enter.cursor)
            self.settle(pg, enter, lambda: self.wl.load_state(state), reloaded=True)
            return
        assert enter.broadcast or not enter.sync, "a stale member always has a copy to take"
        reloaded = False
        if not enter.sync and not self.holds(enter.cursor):
            # The keeper counts this member as holding the state (its agent
            # claimed it); the one claim a trainer may not have backed yet is
            # the origin's (see Enter), and the origin is built, not copied.
            assert enter.cursor == Cursor(), (enter.cursor, self.cursor, self.holds_state)
            self.wl.load_state(self.local_state(enter.cursor))
            self.cursor, self.holds_state = enter.cursor, True
            reloaded = True
        if enter.broadcast:
            self.copy_from_source(pg, enter, reloaded)
        else:
            self.settle(pg, enter, lambda: None, reloaded=reloaded)

    def copy_from_source(self, pg, enter: Enter, reloaded: bool) -> None:
        """The replicated state (under ZeRO-1 the parameters only: shards
        move by the recovery's copies) reaches the stale members: on gloo in
        stripes, each from another holder at once (``stripes``: a copy
        spread over the holders' links, as the sim prices it); on NCCL by
        the source's broadcast, which every member joins and only the stale
        ones keep."""
        torch = self.torch
        sharded = self.zero is not None
        holder = self.worker not in enter.stale if enter.stale else enter.source == self.worker
        if holder:
            buf = self.wl.flat.clone() if sharded else self.wl.state()
        else:
            buf = torch.empty(self.wl.n if sharded else 2 * self.wl.n, device=self.wl.device)
        if pg is not None and enter.stale and not self.nccl:
            self.copy_stripes(pg, enter, buf, holder)
        elif pg is not None:
            self.wait_work(pg.broadcast(buf, enter.members.index(enter.source)),
                           enter.generation)
        if not enter.sync:
            self.settle(pg, enter, lambda: None, reloaded=reloaded)
            return
        load = (lambda: self.wl.flat.copy_(buf)) if sharded else (lambda: self.wl.load_state(buf))
        self.settle(pg, enter, load, reloaded=reloaded, replaced=True)

    def copy_stripes(self, pg, enter: Enter, buf, holder: bool) -> None:
        """Point to point over gloo: a holder sends its stripe of ``buf`` to
        every stale member, a stale member takes each stripe from its holder
        into ``buf``, all at once (one tag per stripe). The ``copy`` record
        says what moved and how long it took, for the calibration."""
        members, gen = list(enter.members), enter.generation
        plan = stripes(members, enter.stale, buf.numel())
        rank = {w: r for r, w in enumerate(members)}
        t0 = self.now()
        if holder:
            works = [pg.send([buf[lo:hi]], rank[w], j) for j, (h, lo, hi) in enumerate(plan)
                     if h == self.worker for w in members if w in enter.stale]
        else:
            works = [pg.recv([buf[lo:hi]], rank[h], j) for j, (h, lo, hi) in enumerate(plan)]
        # gloo's send and receive works never report completion (no future,
        # is_completed stays false): only wait() returns, so a thread waits
        self.watched(gen, f"copy-{gen}", lambda: [work.wait() for work in works])
        if not holder:
            self.record(rec(self.now(), "ok", "copy", self.worker, gen=gen, stripes=len(plan),
                            bytes=buf.numel() * buf.element_size(),
                            seconds=round(self.now() - t0, 6)))

    def run_generation(self, enter: Enter) -> None:
        """Train in ``enter``'s generation, step after step, until it ends for
        this worker (:class:`Aborted`) or the job is complete."""
        gen = enter.generation
        pg = self.build_group(enter)
        self.sync_state(pg, enter)
        policy = job_policy(self.scenario)
        while True:
            self.check(gen)
            cursor = self.cursor
            if policy.complete(cursor.step):
                self.report_final(gen)
                raise Aborted()
            plan = self.plan(cursor, enter.members)
            t0 = self.now()
            update = self.compute_step(pg, plan, cursor, gen)
            self.late_stretch(gen, cursor.step)
            nxt = plan.next_cursor()
            if not self.request_commit(gen, cursor, nxt, plan, t0, update.loss):
                raise Aborted()
            self.apply_update(update)
            with self.lock:
                self.cursor = nxt
            self.checkpoint_if_due(pg, enter, policy, nxt)

    def report_final(self, gen: int) -> None:
        """Hand the launcher the final cursor and weights, then wait for the
        stop (or for a later generation, should the keeper form one)."""
        self.send(("final", self.worker, self.incarnation, self.cursor.to_json(),
                   self.wl.weights_sha256()))
        with self.cond:
            while not self.stopped and self.target.generation == gen:
                self.cond.wait(0.5)

    def plan(self, cursor: Cursor, members: tuple[int, ...]):
        """The core planner's step at ``cursor`` for ``members``."""
        sc = self.scenario
        wl = sc.workload
        return plan_step(cursor, members, global_batch=wl.global_batch,
                         micro_batch=wl.micro_batch, policy=sc.strategy.batch,
                         full_workers=sc.cluster.workers)

    def compute_step(self, pg, plan, cursor: Cursor, gen: int) -> "Update":
        """This worker's gradients, exchanged, and the update they make; nothing is applied."""
        part, losses, mine = self.compute_gradients(pg, plan, cursor, gen)
        self.check(gen)
        grad, loss = self.exchange(pg, plan, part, losses, mine, cursor, gen)
        sc = self.scenario
        scale = lr_scale(sc.strategy.batch, sc.strategy.lr_scaling,
                         plan.global_batch, sc.workload.global_batch)
        if self.zero is None:
            return Update(grad, loss, scale)
        # ZeRO-1: update the held slices, gather the parameters
        moms, params = self.zero.step(grad, scale)
        self.allreduce(pg, params, gen)
        return Update(grad, loss, scale, moms, params)

    def compute_gradients(self, pg, plan, cursor: Cursor, gen: int):
        """The gradients of this worker's shards of the step: accumulated in
        fast mode (``part`` None, one loss per shard), or each kept on its own
        in exact mode's ``part``. The per-sample ledger record leaves here,
        before the exchange, so a kill cannot lose it, with how long the
        compute took (``compute_s``, see :meth:`compute_clock`)."""
        clock = self.compute_clock()
        began = clock()
        self.wl.zero_grad()
        ids_all: list[int] = []
        losses: list[float] = []
        part = None
        if self.scenario.strategy.reduction == "exact":  # the guess comes from the shared momentum
            if self.zero is None:
                hint = reduce.hint_top(self.wl.momentum)
            else:  # sliced: the owners' maxima, MAX-reduced
                hint = reduce.hint_from_max(self.max_over(pg, self.zero.momentum_max(), gen))
            part = reduce.ExactPart(self.wl.n, plan.n_shards, hint, self.scratch, self.wl.device)
        mine = plan.shards_of(self.worker)
        for j in mine:
            self.check(gen)
            ids = self.shard_ids(plan, j)
            ids_all.extend(ids)
            if part is None:
                losses.append(self.wl.accumulate(ids))
            else:  # each shard's gradient on its own, never float-added to another
                grads, loss = self.wl.shard_gradient(ids)
                part.add(j, grads, loss)
        compute_s = clock() - began
        if self.slow_factor > 1 and cursor.step >= self.slow_from:
            self.stretch(gen, (self.slow_factor - 1) * compute_s)
            compute_s *= self.slow_factor
            self.stretched = cursor.step
        compute_s = round(compute_s, 6)
        # the keeper's straggler policy hears it with the commit request
        self.compute = (compute_s, len(mine))
        if ids_all:
            # compute_s: this step's gradients took this long here (a straggler's is long)
            self.record(rec(self.now(), "ok", "contribute", self.worker, gen=gen,
                            step=cursor.step, samples=ids_all, compute_s=compute_s))
        return part, losses, mine

    def compute_clock(self) -> Callable[[], float]:
        """What a step's compute is timed with. On the CPU: this thread's CPU
        time (torch computes on it, ``set_num_threads(1)``). The straggler
        policy compares members' compute, and on a machine the workers share
        with other load, wall time counts the moments a member waited for a
        core: a few milliseconds now and then, against steps of about one,
        which made a member lag or not by chance (``real-straggler`` evicted
        two steps late beside a CPU hog). A ``slow`` fault's stretch, the
        throttling it models, is added to it. On a GPU: wall time (the
        compute runs on the device, not on this thread)."""
        return time.thread_time if self.wl.device.type == "cpu" else time.monotonic

    def late_stretch(self, gen: int, step: int) -> None:
        """A slow order meant for this step (``slow_from``) that came once its
        compute was done: the stretch it missed, before the commit request,
        where the others wait for this worker's next exchange as they would
        have for this one. The reported compute includes it (the keeper's
        straggler policy hears the step as slow on both targets: the sim's
        first slow step is the order's)."""
        if self.slow_factor > 1 and step >= self.slow_from and self.stretched != step:
            compute_s, load = self.compute
            self.stretch(gen, (self.slow_factor - 1) * compute_s)
            self.compute = (round(compute_s * self.slow_factor, 6), load)
            self.stretched = step

    def stretch(self, gen: int, wait_s: float) -> None:
        """A ``slow`` fault: the compute just done takes ``slow_factor`` times as
        long, as on a throttled machine, before the exchange; a wait, not a
        spin (a spin would slow the workers sharing this machine's cores
        too), that an abort still cuts short."""
        until = time.monotonic() + wait_s
        while (left := until - time.monotonic()) > 0:
            self.check(gen)
            self.wake.wait(min(left, 0.05))
            self.wake.clear()
        self.check(gen)

    def exchange(self, pg, plan, part, losses: list[float], mine, cursor: Cursor, gen: int):
        """The step's mean gradient and loss over the generation."""
        if part is None:
            total = reduce.fast_payload(self.wl.grad_buf, losses)
            self.allreduce(pg, total, gen)
            return reduce.fast_result(total, plan.n_shards)

        def recompute(kept) -> list:
            """The shards not kept, computed again (same data, same bits)."""
            out = []
            for j in mine:
                if j not in kept:
                    self.check(gen)
                    out.append((j, *self.wl.shard_gradient(self.shard_ids(plan, j))))
            return out

        try:
            grad, loss = self.exact_reduce(pg, part, recompute, gen)
        except FloatingPointError as exc:
            self.report_fatal(f"step {cursor.step}: {exc}")
            raise Aborted() from exc
        self.scratch = part.scratch  # allocated once, by the first encode
        return grad, loss

    def report_fatal(self, reason: str) -> None:
        """Diverged: every retry would fail the same way, so end the run with
        the reason rather than roll-call forever; wait for the stop."""
        self.send(("fatal", self.worker, reason))
        with self.cond:
            while not self.stopped:
                self.cond.wait(0.5)

    def request_commit(self, gen: int, cursor: Cursor, nxt: Cursor, plan, t0: float,
                       loss: float) -> bool:
        """Ask the keeper service whether the step at ``cursor`` commits; its
        answer comes on the stream of the keeper's roll calls (see the module
        docstring), so the control thread holds those back until it has it."""
        commit = rec(0.0, "ok", "commit", self.worker, gen=gen, step=cursor.step,
                     last=cursor.step, sample=cursor.sample, stop=nxt.sample,
                     batch=plan.global_batch, t0=round(t0, 9), loss=loss)
        with self.cond:
            self.check(gen)
            if not self.agent.may_step(gen):
                raise Aborted()
            self.awaiting_ack = (gen, cursor.step, nxt)
            if not self.to_keeper(("commit", self.worker, self.incarnation, gen, cursor.step,
                                   commit, *self.compute)):
                self.handle(("ack", gen, cursor.step, False))  # no keeper: not committed
            while (gen, cursor.step) not in self.acks and not self.stopped:
                self.cond.wait(0.5)
            return self.acks.pop((gen, cursor.step), False)

    def apply_update(self, update: "Update") -> None:
        """Apply a committed step's update to the state held."""
        if self.zero is not None:
            self.zero.commit(update.moms, update.params)
        else:
            self.wl.apply(update.grad, update.scale)

    def checkpoint_if_due(self, pg, enter: Enter, policy, nxt: Cursor) -> None:
        """The core's checkpoint policy, the sim's too: every strategy
        checkpoints (the keeper resumes from it when no member holds usable
        state). Every member knows when, so ZeRO's gather of the momentum
        slices is a collective all of them join; rank 0 writes."""
        gen = enter.generation
        due = policy.checkpoint_due(nxt.step)
        state = None
        if due and self.zero is not None:
            momentum = self.zero.momentum_buffer()
            self.allreduce(pg, momentum, gen)
            state = self.torch.cat([self.wl.flat, momentum])
        if due and enter.rank == 0:
            from real.model import save_checkpoint
            save_checkpoint(self.run_dir, nxt.step, nxt.sample,
                            self.wl.state() if state is None else state)
            with self.lock:
                if self.agent.generation == gen:
                    self.record(rec(self.now(), "ok", "checkpoint", self.worker,
                                    gen=gen, cursor=nxt.to_json()))
                    self.apply(self.agent.checkpointed(self.now(), nxt))


class Reaper:
    """Tears retired process groups down on a thread of its own.

    A gloo group's destructor waits for the collectives still queued or
    running on it: one waiting on a paused (SIGSTOPped) peer blocks until that
    peer wakes and leaves the generation too (it retires its side, or the
    collective completes), or at worst until the group's collective timeout
    (``build_group``'s 60 s). ``ProcessGroupGloo.abort()`` does not cancel
    such a collective (measured, torch 2.13), so that wait cannot be avoided,
    only moved: it must never be the trainer's, which is training in the next
    generation meanwhile. The destructor releases the GIL while it waits
    (measured), so the control thread keeps beating. One thread, daemon: the
    process ends with ``os._exit`` whatever it is waiting on; groups queue
    here in retirement order and each wait is bounded by that timeout.
    """

    def __init__(self) -> None:
        self.retired: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self.loop, daemon=True, name="reaper")
        self.thread.start()

    def retire(self, group: dict) -> None:
        self.retired.put(group)

    def loop(self) -> None:
        while True:
            group = self.retired.get()
            group.clear()  # the last references: the group's destructor runs here
            del group


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


@dataclass
class Update:
    """A computed step's update, applied only once the step commits."""

    grad: Any
    loss: float
    scale: float
    moms: Optional[dict] = None  # ZeRO-1: the held slices' new momentum
    params: Any = None  # ZeRO-1: the gathered parameters


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
        w.train_loop()
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
