"""The launcher's side of a keeper in other processes (``keeper.store: etcd``).

:class:`RemoteKeeper` has :class:`real.keeper_port.LocalKeeper`'s methods,
but the keeper it talks to is the active one of ``1 + keeper.standbys``
keeper processes (:mod:`real.keeper_proc`), found through etcd: the
leadership key names its term and address. Those processes and, unless
``keeper.etcd_endpoints`` names the user's cluster, a 3-member etcd cluster
on loopback are its :class:`real.keeper_side.KeeperSide`'s, which starts,
replaces and stops them (by PID, when the run ends); this module follows
etcd to the keeper that serves and carries the frames between it and the
launcher.

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
import socket
import time
from typing import Any, Optional

from rollcall.core import (
    DRIVER, EMPTY, Broadcast, CommitVerdict, IdRuns, JobFailed, Record, Relaunch, RestartJob,
    Send, message_to_data, rec,
)

from real import wire
from real.keeper_port import CommitAsk, RemoteSink, Supervisor
from real.keeper_side import START_TIMEOUT_S, KeeperProc, KeeperSide
from real.keeper_store import StoreUnavailable
from real.keeper_wire import TO_SUPERVISOR, supervisor_mac

POLL_S = 0.05  # while no keeper serves: how often etcd is asked who leads
LOST = CommitVerdict(False, "keeper-lost")
MAX_BACKLOG = 8 << 20  # bytes queued for a keeper that does not read: then its link is given up


class RemoteKeeper:
    """The launcher's side of a keeper in processes of its own: it starts
    the keeper candidates (and etcd where the run makes its own, through
    :class:`real.keeper_side.KeeperSide`), follows etcd to the one that
    leads, and carries that keeper's answers to the ``sink`` and the
    launcher's facts (a :class:`Supervisor`) to it."""

    def __init__(self, launcher: Supervisor, sel: selectors.BaseSelector,
                 sink: RemoteSink) -> None:
        self.supervisor = launcher
        self.sink = sink  # what is done with the keeper's answers (real.outputs)
        self.sel = sel
        self.ttl_s = float(launcher.sc.keeper.lease_ttl_s)
        # etcd and the keeper processes (real.keeper_side)
        self.side = KeeperSide(launcher, sel, f"/rollcall/{launcher.run_id}")
        self.term = 0  # the term of the keeper linked (or last linked), as etcd named it
        self.served = False  # a keeper took over already (the next one is a failover)
        self.leader: Optional[str] = None  # the candidate that serves now
        self.sock: Optional[socket.socket] = None
        self.reader = wire.FrameReader(TO_SUPERVISOR)
        self.asks: dict[int, CommitAsk] = {}
        self.out = bytearray()  # frames the keeper's socket has not taken yet
        self.next_ask = 0
        self.pending_lives: list[int] = []  # repaired nodes waiting for a keeper
        self.poll_at: Optional[float] = 0.0

    @property
    def up(self) -> bool:
        return self.sock is not None

    @property
    def direct(self) -> bool:
        """``keeper.worker_links: direct``: the workers link to the keeper themselves."""
        return self.supervisor.sc.keeper.worker_links == "direct"

    # --- start and stop ----------------------------------------------------------------

    def start(self) -> None:
        """etcd (unless the user's), the keeper processes, and the first keeper's answer."""
        self.side.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.up and self.supervisor.stop.signum is None:  # a signal: the launcher ends the run
            if time.monotonic() >= deadline:
                raise RuntimeError(f"no keeper answered within {START_TIMEOUT_S:g} s "
                                   f"(see {self.supervisor.real_dir / 'logs'})")
            self.poll()
            for kp in self.side.ended():
                self.on_proc_exit(kp)  # the launcher's selector is not read yet
            if self.supervisor.result is not None:
                return
            if not self.up:
                time.sleep(POLL_S)  # a bounded wait for a process's start, not a sync

    def kill_now(self) -> None:
        """SIGKILL every keeper process and etcd member at once, waiting for none
        (a second signal; :meth:`close` reaps them after)."""
        self.side.kill_now()

    def close(self) -> None:
        """Kill and reap every keeper process and etcd member this run started."""
        self.drop_link()
        self.side.close()

    # --- faults ------------------------------------------------------------------------

    def kill_active(self) -> Optional[int]:
        """``kill_keeper: active``: SIGKILL the serving keeper's process; its term."""
        return self.term if self.side.kill(self.leader) else None

    def cut_active(self) -> Optional[int]:
        """``partition_keeper: active``: the serving keeper loses etcd but not
        the launcher (:meth:`real.keeper_side.KeeperSide.cut_off`); its term."""
        return self.term if self.side.cut_off(self.leader) else None

    def heal_cut(self) -> Optional[int]:
        """The cut ends (:meth:`real.keeper_side.KeeperSide.heal_cut`): the
        packets the rules dropped (hosts mode), else None."""
        return self.side.heal_cut()

    def kill_etcd(self, member: int) -> bool:
        return self.side.kill_etcd(member)

    # --- events from the launcher's selector --------------------------------------------

    def on_proc_exit(self, kp: KeeperProc) -> None:
        """A keeper process ended: reap it; the serving one's end is a lost
        link; a standby takes its place (the run keeps 1 + standbys)."""
        self.side.reap_exited(kp)
        if f"keeper-{kp.candidate}" == self.leader:
            self.lost("exited")
        self.side.replace(kp)

    def on_event(self) -> None:
        """The link is readable or writable (the launcher's selector)."""
        self.flush()
        if self.sock is not None:
            self.on_readable()

    def on_readable(self) -> None:
        assert self.sock is not None
        data = wire.recv_some(self.sock)
        if data is None:
            return
        if not data:
            self.lost("closed")
            return
        try:
            wire.feed_frames(self.reader, data, self.frame, lambda: self.sock is not None)
        except wire.WireError as exc:
            self.supervisor.write_reject(f"keeper link: {exc}")
            self.lost("bad-frame")

    def lost(self, reason: str) -> None:
        """The serving keeper is gone (``reason``): what it owed the launcher is lost."""
        if self.sock is None:
            return
        self.supervisor.write(rec(self.supervisor.now(), "info", "keeper_link", DRIVER, term=self.term,
                         candidate=self.leader, reason=reason))
        self.drop_link()
        self.poll_at = self.supervisor.now()
        asks, self.asks = self.asks, {}
        for ask in asks.values():
            self.sink.commit_answered(ask, LOST)
        self.sink.gate_released(frozen=False)  # a gate's later faults are not lost with it

    def drop_link(self) -> None:
        self.out = bytearray()
        if self.sock is not None:
            wire.close_watched(self.sel, self.sock)
            self.sock = None

    # --- finding and greeting the keeper ------------------------------------------------

    def get_timer(self) -> Optional[float]:
        return self.poll_at

    def handle_timer(self, now: float) -> None:
        """Look in etcd: often while no keeper serves, every half lease while
        one does (a keeper paused or cut off from etcd loses its lease
        without closing its link: a newer term's keeper is the one to serve)."""
        if self.poll_at is not None and now >= self.poll_at:
            self.poll()

    def poll(self) -> None:
        """Ask etcd who leads; greet a keeper of a newer term."""
        store = self.side.store
        assert store is not None
        self.poll_at = self.supervisor.now() + (self.ttl_s / 2 if self.up else POLL_S)
        try:
            found = store.leader()
        except StoreUnavailable:
            return
        if found is None or found[0] <= self.term:
            return
        term, candidate, address = found
        if self.up:  # a newer term leads: the keeper we talk to was deposed
            self.lost("superseded")
        try:
            sock = wire.connect_to(address, timeout_s=1.0)
            self.greet(sock)
        except (OSError, wire.WireError):
            return  # not listening yet, or gone again: the next poll
        self.sock, self.leader, self.term = sock, candidate, term
        sock.setblocking(False)
        self.sel.register(sock, selectors.EVENT_READ, ("kconn", None))
        self.supervisor.write(rec(self.supervisor.now(), "info", "keeper_link", DRIVER, term=term,
                         candidate=candidate, reason="connected"))

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
        if kind != "challenge" or run != self.supervisor.run_id:
            raise wire.WireError("not this run's keeper")
        pid = os.getpid()
        sock.sendall(wire.encode(("sup_hello", pid, supervisor_mac(self.supervisor.secret, nonce,
                                                                    run, pid))))
        started, down, exited, capacity = self.supervisor.physical_report()
        sock.sendall(wire.encode(("report", started, down, exited, capacity)))
        reader.authenticated()
        self.reader = reader

    # --- the keeper's frames ---------------------------------------------------------------

    def frame(self, frame: tuple) -> None:
        kind, sink = frame[0], self.sink
        if kind == "term":
            self.took_over(frame[1])
        elif kind == "send":
            sink.effects([Send(frame[1], frame[2])])
        elif kind == "broadcast":
            sink.effects([Broadcast(frame[1], frame[2])])
        elif kind == "rec":
            sink.effects([Record(frame[1])])
        elif kind == "formed":
            sink.formed_generation(frame[1], frame[2])
        elif kind == "restart":
            sink.effects([RestartJob(frame[1], frame[2], frame[3])])
        elif kind == "relaunch":
            lives = dict(frame[2])
            ws = IdRuns.of(sorted(lives)) if lives else EMPTY
            sink.effects([Relaunch(frame[1], ws, tuple(lives[w] for w in ws))])
        elif kind == "job_failed":
            sink.effects([JobFailed(frame[1])])
        elif kind == "verdict":
            _, ask_id, ok, first, complete, reason = frame
            ask = self.asks.pop(ask_id, None)
            if ask is not None:
                sink.commit_answered(ask, CommitVerdict(ok, reason, first, complete))
        elif kind == "life":
            sink.life_given(frame[1], frame[2])
        elif kind == "committed":
            _, w, life, gen, step, ok, first, complete, reason, record, held = frame
            ask = CommitAsk(None, w, life, gen, step, record, 0.0, 0)
            sink.commit_answered(ask, CommitVerdict(ok, reason, first, complete), held)
        elif kind == "released":
            sink.gate_released()
        else:
            raise wire.WireError(f"{kind} is not a frame a keeper sends")

    def took_over(self, term: int) -> None:
        """A keeper of ``term`` serves: the workers ask again, repaired nodes get lives."""
        if term != self.term:
            raise wire.WireError(f"the keeper says term {term}, etcd said {self.term}")
        first, self.served = not self.served, True
        self.side.took_over()
        if self.direct:  # the workers find it in etcd; it holds the acks of the next gate
            self._send("gate", self.supervisor.next_gate())
        elif not first:
            self.supervisor.tell_workers(("keeper", term))
        for w in self.pending_lives:
            self._send("node_up", w)
        self.pending_lives = []

    # --- the port's methods (real.keeper_port.LocalKeeper's) ---------------------------------

    def _send(self, *frame: Any) -> None:
        """Queue one frame and send what the socket takes now. A keeper that
        stops reading (frozen, cut off) must not stall the launcher: past
        MAX_BACKLOG bytes unsent its link is given up."""
        if self.sock is None:
            return
        self.out += wire.encode(frame)
        self.flush()

    def flush(self) -> None:
        if self.sock is None or not self.out:
            return
        over = wire.send_some(self.sock, self.out, MAX_BACKLOG)
        if over is not None:
            self.lost(over)
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if self.out else 0)
        self.sel.modify(self.sock, events, ("kconn", None))

    def receive(self, now: float, messages: list) -> None:
        self._send("msgs", [message_to_data(m) for m in messages])

    def exited(self, now: float, worker: int, incarnation: int) -> None:
        self._send("exited", worker, incarnation)

    def node_down(self, now: float, worker: int) -> None:
        self._send("node_down", worker)

    def fleet_capacity(self, now: float, nodes: int) -> None:
        self._send("capacity", nodes)  # lost while down: the next report carries it

    def node_up(self, now: float, worker: int) -> None:
        if self.up:
            self._send("node_up", worker)
        else:
            self.pending_lives.append(worker)

    def commit(self, now: float, ask: CommitAsk) -> None:
        if not self.up:
            self.sink.commit_answered(ask, LOST)
            return
        self.next_ask += 1
        self.asks[self.next_ask] = ask
        self._send("commit", self.next_ask, ask.worker, ask.incarnation, ask.gen, ask.step,
                   ask.compute_s, ask.load)

    def batch(self, lives: list[tuple[int, int]], until: float) -> None:
        """Direct links: the keeper holds these lives' Joins (one arrival)."""
        if self.direct:
            self._send("batch", [list(x) for x in lives], until)

    def gate(self, step: int) -> None:
        if self.direct:
            self._send("gate", step)

    def release(self, worker: int, life: int, gen: int, step: int, freeze: bool) -> None:
        self._send("release", worker, life, gen, step, freeze)

    def resume(self) -> None:
        self._send("resume")
