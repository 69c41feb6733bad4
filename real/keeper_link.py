"""The launcher's side of a keeper in other processes (``keeper.store: etcd``).

:class:`RemoteKeeper` has :class:`real.keeper_port.LocalKeeper`'s methods,
but the keeper it talks to is the active one of ``1 + keeper.standbys``
keeper processes (:mod:`real.keeper_proc`), found through etcd: the
leadership key names its term and address. It owns those processes and,
unless ``keeper.etcd_endpoints`` names the user's cluster, a 3-member etcd
cluster on loopback (:class:`real.etcd.EtcdCluster`); all of them are
stopped, by PID, when the run ends.

While no keeper serves (the active one died, its lease has not lapsed yet,
no standby has won), what the launcher would tell it is lost, as it would be
on a broken connection: protocol messages are dropped, a commit request is
answered "no" (``keeper-lost``), a repaired node waits for its life. Once a
keeper of a newer term answers, the launcher reports what it knows
physically (lives started, nodes down, lives exited: the new keeper's
``take_over`` input) and tells every worker (``("keeper", term)``), whose
agent then asks again what went unanswered.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from rollcall.core import (
    EMPTY, Broadcast, CommitVerdict, IdRuns, JobFailed, Record, Relaunch, RestartJob, Send,
    message_to_data,
)

from real import wire
from real.keeper_port import CommitAsk
from real.keeper_store import KeeperStore, StoreUnavailable
from real.keeper_wire import TO_SUPERVISOR, supervisor_mac

if TYPE_CHECKING:
    from real.launcher import Launcher

POLL_S = 0.05  # while no keeper serves: how often etcd is asked who leads
START_TIMEOUT_S = 60.0  # the first keeper, from the processes' start to its answer
LOST = CommitVerdict(False, "keeper-lost")


@dataclass
class KeeperProc:
    candidate: int
    popen: subprocess.Popen
    pidfd: int
    log: Any


class RemoteKeeper:
    def __init__(self, launcher: "Launcher", sel: selectors.BaseSelector) -> None:
        self.l = launcher
        self.sel = sel
        k = launcher.sc.keeper
        self.ttl_s = float(k.lease_ttl_s)
        self.standbys = int(k.standbys)
        self.etcd = None
        self.endpoints = list(k.etcd_endpoints or ())
        self.prefix = f"/rollcall/{launcher.run_id}"
        self.store: Optional[KeeperStore] = None
        self.procs: list[KeeperProc] = []
        self.next_candidate = 0
        self.term = 0
        self.leader: Optional[str] = None  # the candidate that serves now
        self.sock: Optional[socket.socket] = None
        self.reader = wire.FrameReader(TO_SUPERVISOR)
        self.asks: dict[int, CommitAsk] = {}
        self.next_ask = 0
        self.pending_lives: list[int] = []  # repaired nodes waiting for a keeper
        self.poll_at: Optional[float] = 0.0
        self.lost_at: Optional[float] = None  # the serving keeper's link broke then
        self.failovers: list[dict] = []

    @property
    def up(self) -> bool:
        return self.sock is not None

    # --- start and stop ----------------------------------------------------------------

    def start(self) -> None:
        """etcd (unless the user's), the keeper processes, and the first keeper's answer."""
        if not self.endpoints:
            from real.etcd import EtcdCluster

            self.etcd = EtcdCluster(self.l.real_dir / "etcd", members=3,
                                    secret=self.l.secret.hex())
            self.etcd.start(timeout_s=START_TIMEOUT_S)
            self.endpoints = list(self.etcd.endpoints)
        self.store = KeeperStore(self.endpoints, self.prefix, secret=self.l.secret.hex(),
                                 timeout_s=max(1.0, self.ttl_s / 2))
        for _ in range(1 + self.standbys):
            self.spawn()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.up:
            if time.monotonic() >= deadline:
                raise RuntimeError(f"no keeper answered within {START_TIMEOUT_S:g} s "
                                   f"(see {self.l.real_dir / 'logs'})")
            self.poll()
            if not self.up:
                time.sleep(POLL_S)  # a bounded wait for a process's start, not a sync

    def spawn(self) -> None:
        l, c = self.l, self.next_candidate
        self.next_candidate += 1
        log = open(l.real_dir / "logs" / f"keeper-{c}.log", "ab")
        cmd = [sys.executable, "-m", "real.keeper_proc", "--run-dir", str(l.out),
               "--candidate", str(c), "--t0", repr(l.t0), "--secret-file", str(l.secret_path),
               "--run-id", l.run_id, "--endpoints", ",".join(self.endpoints),
               "--prefix", self.prefix]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(Path(__file__).resolve().parent.parent)]
            + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        popen = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                 stderr=subprocess.STDOUT, env=env, cwd=str(l.out))
        kp = KeeperProc(c, popen, os.pidfd_open(popen.pid), log)
        self.procs.append(kp)
        self.sel.register(kp.pidfd, selectors.EVENT_READ, ("kproc", kp))

    def close(self) -> None:
        """Kill and reap every keeper process and etcd member this run started."""
        self.drop_link()
        for kp in self.procs:
            self._reap(kp, kill=True)
        self.procs.clear()
        if self.etcd is not None:
            self.etcd.stop()

    def _reap(self, kp: KeeperProc, kill: bool) -> None:
        if kill and kp.popen.poll() is None:
            kp.popen.kill()
        try:
            kp.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            kp.popen.kill()
            kp.popen.wait()
        try:
            self.sel.unregister(kp.pidfd)
        except (KeyError, ValueError):
            pass
        try:
            os.close(kp.pidfd)
        except OSError:
            pass
        if not kp.log.closed:
            kp.log.close()

    # --- faults ------------------------------------------------------------------------

    def kill_active(self) -> Optional[int]:
        """``kill_keeper: active``: SIGKILL the serving keeper's process; its term."""
        kp = next((p for p in self.procs if f"keeper-{p.candidate}" == self.leader), None)
        if kp is None or kp.popen.poll() is not None:
            return None
        kp.popen.send_signal(signal.SIGKILL)
        return self.term

    def kill_etcd(self, member: int) -> bool:
        if self.etcd is None:
            return False
        self.etcd.kill(member)
        return True

    # --- events from the launcher's selector --------------------------------------------

    def on_proc_exit(self, kp: KeeperProc) -> None:
        """A keeper process ended: reap it; the serving one's end is a lost
        link; a standby takes its place (the run keeps 1 + standbys)."""
        self._reap(kp, kill=False)
        self.procs.remove(kp)
        if f"keeper-{kp.candidate}" == self.leader:
            self.lost()
        if self.l.result is None:
            self.spawn()

    def on_readable(self) -> None:
        assert self.sock is not None
        try:
            data = self.sock.recv(1 << 20)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.lost()
            return
        try:
            frames = self.reader.feed(data)
            while frames and self.sock is not None:
                for frame in frames:
                    self.frame(frame)
                frames = self.reader.more()
        except wire.WireError as exc:
            self.l.write_reject(f"keeper link: {exc}")
            self.lost()

    def lost(self) -> None:
        """The serving keeper is gone: what it owed the launcher is lost."""
        if self.sock is None:
            return
        self.drop_link()
        self.lost_at = self.l.now()
        self.poll_at = self.l.now()
        asks, self.asks = self.asks, {}
        for ask in asks.values():
            self.l.commit_answered(ask, LOST)

    def drop_link(self) -> None:
        if self.sock is not None:
            try:
                self.sel.unregister(self.sock)
            except (KeyError, ValueError):
                pass
            self.sock.close()
            self.sock = None

    # --- finding and greeting the keeper ------------------------------------------------

    def get_timer(self) -> Optional[float]:
        return None if self.up else self.poll_at

    def handle_timer(self, now: float) -> None:
        if not self.up and self.poll_at is not None and now >= self.poll_at:
            self.poll()

    def poll(self) -> None:
        """Ask etcd who leads; greet a keeper of a newer term."""
        assert self.store is not None
        self.poll_at = self.l.now() + POLL_S
        try:
            found = self.store.leader()
        except StoreUnavailable:
            return
        if found is None or found[0] <= self.term:
            return
        term, candidate, address = found
        host, port = address.rsplit(":", 1)
        try:
            sock = socket.create_connection((host, int(port)), timeout=1.0)
            self.greet(sock)
        except (OSError, wire.WireError):
            return  # not listening yet, or gone again: the next poll
        self.sock, self.leader = sock, candidate
        sock.setblocking(False)
        self.sel.register(sock, selectors.EVENT_READ, ("kconn", None))

    def greet(self, sock: socket.socket) -> None:
        """The challenge, our hello, and the report the new keeper takes over with."""
        reader = wire.FrameReader(TO_SUPERVISOR)
        frames: list = []
        while not frames:
            data = sock.recv(4096)
            if not data:
                raise wire.WireError("the keeper closed the link")
            frames = reader.feed(data)
        kind, nonce, run = frames[0]
        if kind != "challenge" or run != self.l.run_id:
            raise wire.WireError("not this run's keeper")
        pid = os.getpid()
        sock.sendall(wire.encode(("sup_hello", pid, supervisor_mac(self.l.secret, nonce,
                                                                    run, pid))))
        started, down, exited = self.l.physical_report()
        sock.sendall(wire.encode(("report", started, down, exited)))
        reader.authenticated()
        self.reader = reader

    # --- the keeper's frames ---------------------------------------------------------------

    def frame(self, frame: tuple) -> None:
        kind, l = frame[0], self.l
        if kind == "term":
            self.took_over(frame[1])
        elif kind == "send":
            l.effects([Send(frame[1], frame[2])])
        elif kind == "broadcast":
            l.effects([Broadcast(frame[1], frame[2])])
        elif kind == "rec":
            l.effects([Record(frame[1])])
        elif kind == "formed":
            l.formed_generation(frame[1], frame[2])
        elif kind == "restart":
            l.effects([RestartJob(frame[1], frame[2], frame[3])])
        elif kind == "relaunch":
            lives = dict(frame[2])
            ws = IdRuns.of(sorted(lives)) if lives else EMPTY
            l.effects([Relaunch(frame[1], ws, tuple(lives[w] for w in ws))])
        elif kind == "job_failed":
            l.effects([JobFailed(frame[1])])
        elif kind == "verdict":
            _, ask_id, ok, first, complete, reason = frame
            ask = self.asks.pop(ask_id, None)
            if ask is not None:
                l.commit_answered(ask, CommitVerdict(ok, reason, first, complete))
        elif kind == "life":
            l.life_given(frame[1], frame[2])
        else:
            raise wire.WireError(f"{kind} is not a frame a keeper sends")

    def took_over(self, term: int) -> None:
        """A keeper of ``term`` serves: the workers ask again, repaired nodes get lives."""
        first = self.term == 0
        self.term = term
        if not first:
            now = self.l.now()
            self.failovers.append({"term": term, "lost_at": self.lost_at, "up_at": now})
            self.l.tell_workers(("keeper", term))
        for w in self.pending_lives:
            self._send("node_up", w)
        self.pending_lives = []

    # --- the port's methods (real.keeper_port.LocalKeeper's) ---------------------------------

    def _send(self, *frame: Any) -> None:
        if self.sock is None:
            return
        try:
            self.sock.setblocking(True)
            self.sock.sendall(wire.encode(frame))
            self.sock.setblocking(False)
        except OSError:
            self.lost()

    def receive(self, now: float, messages: list) -> None:
        self._send("msgs", [message_to_data(m) for m in messages])

    def exited(self, now: float, worker: int, incarnation: int) -> None:
        self._send("exited", worker, incarnation)

    def node_down(self, now: float, worker: int) -> None:
        self._send("node_down", worker)

    def node_up(self, now: float, worker: int) -> None:
        if self.up:
            self._send("node_up", worker)
        else:
            self.pending_lives.append(worker)

    def commit(self, now: float, ask: CommitAsk) -> None:
        if not self.up:
            self.l.commit_answered(ask, LOST)
            return
        self.next_ask += 1
        self.asks[self.next_ask] = ask
        self._send("commit", self.next_ask, ask.worker, ask.incarnation, ask.gen, ask.step,
                   ask.compute_s, ask.load)
