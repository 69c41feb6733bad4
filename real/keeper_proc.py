"""A record-keeper process of its own: the active one, or a standby.

``keeper.store: etcd``. The launcher starts ``1 + keeper.standbys`` of these;
each binds a loopback port, then campaigns for the leadership key in etcd
(:class:`real.keeper_store.KeeperStore`). The winner rebuilds the core keeper
from the last generation the store holds (:meth:`Keeper.restored`, its term
the one it won), publishes its address with the key, and serves the launcher
(one connection, :mod:`real.keeper_wire`); the others wait on the key.

What this process does is I/O only; every decision is the core keeper's:

- each generation it decides is written with a compare-and-set
  (``Persist``) before the launcher hears of it; a refused or failed write
  is the keeper's input (``persisted(ok=False)``), and it deposes itself;
- it renews its lease every ``RENEW_SHARE`` of ``lease_ttl_s`` and tells the keeper the
  lease holds until the renewal's *send* time plus 90% of the TTL
  (``Keeper.hold``): a keeper that cannot renew stops deciding on its own
  clock before the store lets a standby win;
- no store call waits past the lease's end on its own clock, so a keeper
  cut off from etcd deposes itself on time, not when a call gives up;
- deposed, it revokes its lease (so a standby wins at once) and exits 3.

Exit codes: 0 the launcher closed the link (the run is over), 3 deposed,
2 bad arguments or an unusable store.
"""

from __future__ import annotations

import argparse
import json
import selectors
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any, Optional

from rollcall.config import keeper_config
from rollcall.core import (
    LEASE_MARGIN, RENEW_SHARE, Broadcast, Deposed, Formed, JobFailed, Keeper, Persist, Record,
    Relaunch, RestartJob, Send, message_to_data, record_from_data, record_to_data,
)
from rollcall.scenario import Scenario

from real import wire
from real.keeper_store import KeeperStore, StoreUnavailable, read_password
from real.keeper_wire import TO_KEEPER_PROC, supervisor_ok
from real.keeper_workers import WorkerLinks

DEPOSED_EXIT = 3
MAX_PENDING = 64  # links accepted and not yet authenticated: past this the oldest goes


def _etcd_password(args: argparse.Namespace, secret: bytes) -> Optional[str]:
    """The password the keeper gives etcd (None: the user's cluster has no auth)."""
    if args.etcd_no_auth:
        return None
    if args.etcd_password_file is not None:
        return read_password(args.etcd_password_file)
    return secret.hex()


class KeeperProcess:
    def __init__(self, args: argparse.Namespace) -> None:
        run = Path(args.run_dir)
        self.sc = Scenario.model_validate(json.loads((run / "real" / "scenario.json").read_text()))
        self.t0 = args.t0
        self.candidate = f"keeper-{args.candidate}"
        self.secret = wire.read_secret(args.secret_file)
        self.run_id = args.run_id
        self.ttl_s = float(self.sc.keeper.lease_ttl_s)
        self.store = KeeperStore(args.endpoints.split(","), args.prefix,
                                 secret=_etcd_password(args, self.secret),
                                 timeout_s=max(1.0, self.ttl_s / 2), user=args.etcd_user)
        self.listener = socket.create_server((args.listen, 0))  # its host's address
        self.listener.setblocking(False)
        self.address = f"{args.listen}:{self.listener.getsockname()[1]}"
        self.lead: Any = None
        self.keeper: Optional[Keeper] = None
        self.conn: Optional[socket.socket] = None
        self.reader = wire.FrameReader(TO_KEEPER_PROC)
        self.serving = False  # took over (the launcher's first report came)
        self.renew_at = 0.0
        self.sel = selectors.DefaultSelector()
        self.direct = self.sc.keeper.worker_links == "direct"
        # links accepted, not yet authenticated: the launcher's or a worker's (direct)
        self.pending: dict[socket.socket, tuple[wire.FrameReader, str]] = {}
        self.workers = WorkerLinks(self.sel, self.send, self.emit, self.now)

    def now(self) -> float:
        return time.monotonic() - self.t0

    # --- standby ------------------------------------------------------------------

    def stand_by(self) -> None:
        """Campaign until this candidate holds the leadership key."""
        while self.lead is None:
            try:
                self.lead = self.store.campaign(self.candidate, self.address, self.ttl_s)
            except StoreUnavailable:
                self.lead = None
            if self.lead is None:
                try:
                    self.store.wait_leader_change(self.ttl_s)
                except StoreUnavailable:
                    time.sleep(0.1)  # etcd is electing or away: look again, bounded
        sent = self.now()
        last = self.store.last_generation()
        record = None if last is None else record_from_data(last["record"])
        self.keeper = Keeper.restored(keeper_config(self.sc), record, self.lead.term)
        self.keeper.hold(sent, sent + LEASE_MARGIN * self.ttl_s)
        self.renew_at = sent + RENEW_SHARE * self.ttl_s

    # --- the launcher's link ----------------------------------------------------------

    def send(self, *frame: Any) -> None:
        """One frame to the launcher; a broken link drops it (the launcher
        found another keeper, or ended the run: the loop sees the end)."""
        if self.conn is None:
            return
        try:
            self.conn.setblocking(True)
            self.conn.sendall(wire.encode(frame))
            self.conn.setblocking(False)
        except OSError:
            pass

    def accept(self) -> None:
        """A new link: challenged; its first frame says whose it is (:meth:`first`)."""
        try:
            sock, _ = self.listener.accept()
        except BlockingIOError:
            return
        if len(self.pending) >= MAX_PENDING:  # the oldest unauthenticated link goes
            self.drop_pending(next(iter(self.pending)))
        kinds = {"sup_hello": TO_KEEPER_PROC["sup_hello"]}
        if self.direct:
            kinds["hello"] = wire.WORKER_TO_KEEPER["hello"]
        reader, nonce = wire.FrameReader(kinds), wire.new_nonce()
        self.pending[sock] = (reader, nonce)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sel.register(sock, selectors.EVENT_READ, ("pending", reader))
        try:
            sock.send(wire.encode(("challenge", nonce, self.run_id)))  # fits an empty buffer
        except OSError:
            self.drop_pending(sock)

    def drop_pending(self, sock: socket.socket) -> None:
        self.pending.pop(sock, None)
        self.sel.unregister(sock)
        sock.close()

    def first(self, sock: socket.socket) -> None:
        """The first frame of a link: the launcher's ``sup_hello`` (the newest
        supervisor link wins) or, with direct links, a worker's ``hello``."""
        reader, nonce = self.pending[sock]
        data = wire.recv_some(sock)
        if data is None:
            return
        try:
            frames = reader.feed(data) if data else None
        except wire.WireError:
            frames = None
        if frames is None:  # closed, or not a hello of this protocol
            self.drop_pending(sock)
            return
        if not frames:
            return  # the rest of the hello is on its way
        frame = frames[0]
        del self.pending[sock]
        if frame[0] == "hello" and wire.hello_ok(self.secret, nonce, self.run_id, frame):
            self.workers.adopt(sock, reader, frame[1], frame[2])
            self.workers.feed(sock, reader, b"")  # what came with the hello
        elif frame[0] == "sup_hello" and supervisor_ok(self.secret, nonce, self.run_id, frame):
            if self.conn is not None:  # one supervisor: the newest link wins
                self.drop_conn()
            self.workers.resume()  # a gate the old link left frozen is the launcher's no more
            self.conn, self.reader = sock, reader
            reader.kinds = TO_KEEPER_PROC
            reader.authenticated()
            self.sel.modify(sock, selectors.EVENT_READ, "conn")
            if not self.feed(b""):
                self.drop_conn()
        else:
            self.sel.unregister(sock)
            sock.close()
            print(f"real.keeper_proc: {self.candidate}: dropped a link without the run's "
                  f"hello", file=sys.stderr, flush=True)

    def drop_conn(self) -> None:
        assert self.conn is not None
        self.sel.unregister(self.conn)
        self.conn.close()
        self.conn = None

    def readable(self) -> bool:
        """Read the link; False once the launcher closed it (or sent a bad frame)."""
        assert self.conn is not None
        data = wire.recv_some(self.conn)
        if data is None:
            return True
        if not data:
            print(f"real.keeper_proc: {self.candidate}: the launcher closed the link",
                  file=sys.stderr, flush=True)
            return False
        return self.feed(data)

    def feed(self, data: bytes) -> bool:
        try:
            wire.feed_frames(self.reader, data, self.frame)
        except wire.WireError as exc:
            print(f"real.keeper_proc: {self.candidate}: dropped the launcher's link: {exc}",
                  file=sys.stderr, flush=True)
            return False  # a bad peer: drop it (the launcher reconnects)
        return True

    def frame(self, frame: tuple) -> None:
        kind, now, k = frame[0], self.now(), self.keeper
        assert k is not None
        if kind == "report":
            _, started, down, exited, capacity = frame
            self.send("term", k.term)
            if self.serving:
                return  # the launcher's link came back: this keeper took over already
            self.serving = True
            self.emit(k.take_over(now, dict(started), down, [tuple(p) for p in exited],
                                  capacity))
            if self.direct:
                self.workers.serve(k)
        elif not self.serving:
            raise wire.WireError(f"{kind} before the report")
        elif kind == "msgs":
            self.emit(k.receive_many(now, frame[1]))
        elif kind == "exited":
            self.emit(k.exited(now, frame[1], frame[2]))
            self.workers.exited(frame[1], frame[2])
        elif kind == "node_down":
            k.node_down(now, frame[1])
        elif kind == "capacity":
            k.fleet_capacity(now, frame[1])
        elif kind == "node_up":
            self.send("life", frame[1], k.node_up(now, frame[1]))
        elif kind == "commit":
            self.commit(now, *frame[1:])
        elif kind == "batch":
            self.workers.batch(frame[1], frame[2])
        elif kind == "gate":
            self.workers.gate = frame[1]
        elif kind == "release":
            self.workers.release(*frame[1:])
        elif kind == "resume":
            self.workers.resume()
        else:
            raise wire.WireError(f"{kind} is not a frame a supervisor sends")

    def commit(self, now: float, ask: int, w: int, inc: int, gen: int, step: int,
               compute_s: float, load: int) -> None:
        k = self.keeper
        assert k is not None
        v = k.commit(now, w, inc, gen, step)
        self.send("verdict", ask, v.ok, v.first, v.complete, v.reason)
        self.emit(k.report_compute(now, w, inc, gen, step, compute_s, load))

    # --- the keeper's outputs ---------------------------------------------------------

    def emit(self, outputs: list) -> None:
        for out in outputs:
            if isinstance(out, Persist):
                self.emit(self.keeper.persisted(self.now(), out.generation, self.persist(out)))
            elif isinstance(out, Deposed):
                self.depose()
            elif isinstance(out, Send) and self.direct:
                self.workers.route(out.to, out.message)
            elif isinstance(out, Broadcast) and self.direct:
                for w in out.to:
                    self.workers.route(w, out.message)
            elif isinstance(out, Send):
                self.send("send", out.to, message_to_data(out.message))
            elif isinstance(out, Broadcast):
                self.send("broadcast", out.to.runs(), message_to_data(out.message))
            elif isinstance(out, Record):
                self.send("rec", out.record)
            elif isinstance(out, Formed):
                self.workers.formed(len(out.members))
                self.send("formed", out.generation, out.members.runs())
            elif isinstance(out, RestartJob):
                self.send("restart", out.generation, out.reason, out.teardown.runs())
            elif isinstance(out, Relaunch):
                self.send("relaunch", out.generation, sorted(map(list, out.lives().items())))
            elif isinstance(out, JobFailed):
                self.send("job_failed", out.reason)

    def persist(self, out: Persist) -> bool:
        """The compare-and-set of one generation; any doubt is a refusal."""
        try:
            with self.store.until(self.lease_end()):
                return self.store.commit_generation(self.lead, out.generation,
                                                    record_to_data(out.record), again=out.again)
        except StoreUnavailable:
            return False

    def depose(self) -> None:
        """Revoke the lease, waiting no longer than etcd would hold it anyway
        (a keeper cut off from etcd exits at once), and exit 3."""
        try:
            with self.store.until(self.lease_end() + (1 - LEASE_MARGIN) * self.ttl_s):
                self.store.resign(self.lead)
        except StoreUnavailable:
            pass
        raise SystemExit(DEPOSED_EXIT)

    def lease_end(self) -> float:
        """The keeper's lease end on ``time.monotonic()``: no store call of a
        serving keeper waits past it (it could decide nothing after it)."""
        assert self.keeper is not None and self.keeper.lease_until is not None
        return self.t0 + self.keeper.lease_until

    # --- the loop ---------------------------------------------------------------------

    def renew(self) -> None:
        sent = self.now()
        try:
            with self.store.until(self.lease_end()):
                alive = self.store.keep_alive(self.lead)
        except StoreUnavailable:
            alive = False
        if alive:
            self.keeper.hold(sent, sent + LEASE_MARGIN * self.ttl_s)
        self.renew_at = sent + RENEW_SHARE * self.ttl_s

    def serve(self) -> int:
        self.sel.register(self.listener, selectors.EVENT_READ, "listen")
        while True:
            k = self.keeper
            assert k is not None
            due = [t for t in (k.get_timer(), self.renew_at, self.workers.next_due())
                   if t is not None]
            timeout = max(0.0, min(due) - self.now()) if due else 0.5
            # the launcher's link first: what it sent before a fault took
            # effect (a node lost before its process died) is heard before
            # what the workers say of that fault on their own links
            events = sorted(self.sel.select(min(timeout, 0.5)),
                            key=lambda event: event[0].data != "conn")
            # the keeper's own clock first: one that was paused past its lease
            # deposes itself before it reads (and could act on) anything
            if self.serving:
                self.emit(k.handle_timer(self.now()))
            for key, mask in events:
                if key.data == "listen":
                    self.accept()
                elif key.data == "conn":
                    if self.conn is not None and not self.readable():
                        return 0  # the launcher is gone: the run is over
                elif key.fileobj in self.pending:
                    self.first(key.fileobj)
                elif key.data[0] == "worker":
                    self.workers.event(key.fileobj, key.data[1], mask)
            if self.workers.next_due() is not None:  # a batch of Joins is open
                self.workers.release_joins()
            if self.now() >= self.renew_at:
                self.renew()

    def run(self) -> int:
        self.stand_by()
        return self.serve()


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="real.keeper_proc")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--candidate", type=int, required=True)
    p.add_argument("--t0", type=float, required=True)
    p.add_argument("--secret-file", required=True)
    p.add_argument("--run-id", required=True)
    p.add_argument("--endpoints", required=True)
    p.add_argument("--prefix", required=True)
    p.add_argument("--listen", default="127.0.0.1")  # hosts mode: its namespace's address
    # etcd's credentials: by default root with the run's secret (the run's own
    # cluster); the user's cluster: a user and a password file, or no auth
    p.add_argument("--etcd-user", default="root")
    p.add_argument("--etcd-password-file")
    p.add_argument("--etcd-no-auth", action="store_true")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        return KeeperProcess(args).run()
    except (StoreUnavailable, ValueError) as exc:  # etcd unreachable or refusing; bad credentials
        print(f"real.keeper_proc: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
