"""The keeper service's links: the workers' and host agents' connections to the launcher.

What a link must prove before it counts: each connection is challenged with
a fresh nonce and has :data:`AUTH_TIMEOUT_S` to answer with the run's key;
at most :data:`MAX_UNAUTHENTICATED` wait at once (the oldest is dropped), so
a stranger cannot hold the service. A frame that does not decode, or comes
before the hello or from the wrong side, drops its connection and leaves a
``reject`` record (the first :data:`MAX_REJECT_RECORDS`; the count is kept).

The service owns the sockets and the bytes; what an authenticated frame
means is its :class:`Handler`'s (the launcher's): a worker's frames, a host
agent's hello and facts, a host agent's link lost.
"""

from __future__ import annotations

import selectors
import socket
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Protocol

from rollcall.core import DRIVER, rec

from real import wire
from real.keeper_port import link_for

# a connection has this long to answer the challenge, and at most this many
# wait at once (the oldest is dropped): a stranger cannot hold the service
AUTH_TIMEOUT_S = 10.0
MAX_UNAUTHENTICATED = 32
MAX_REJECT_RECORDS = 100  # the history records the first ones; the count is kept


@dataclass
class Conn:
    sock: socket.socket
    opened_t: float
    nonce: str = field(default_factory=wire.new_nonce)
    authed: bool = False
    reader: wire.FrameReader = field(default_factory=lambda: wire.FrameReader(wire.TO_LAUNCHER))
    worker: Optional[int] = None
    incarnation: Optional[int] = None
    spare: bool = False
    host: Optional[int] = None      # a host agent's connection: its host
    out: bytearray = field(default_factory=bytearray)


class Handler(Protocol):
    """What the frames of the workers' links mean (the launcher)."""

    def authenticated_frame(self, conn: Conn, frame: tuple, now: float) -> None: ...


class HostHandler(Protocol):
    """What the frames of the host agents' links mean (:class:`real.host_links.HostLinks`)."""

    def host_hello(self, conn: Conn, frame: tuple) -> None: ...

    def host_frame(self, conn: Conn, frame: tuple) -> None: ...

    def disconnected(self, conn: Conn) -> None: ...


class Service:
    """Every link of the keeper service, in the launcher's selector."""

    def __init__(self, sel: selectors.BaseSelector, secret: bytes, run_id: str,
                 now: Callable[[], float], write: Callable[[dict], None]) -> None:
        self.sel, self.secret, self.run_id, self.now, self.write = sel, secret, run_id, now, write
        self.handler: Optional[Handler] = None
        self.host_handler: Optional[HostHandler] = None
        self.conns: dict[socket.socket, Conn] = {}
        self.conn_of: dict[tuple[int, int], Conn] = {}  # each life's link
        self.latest_conn: dict[int, Conn] = {}  # each worker's latest life's link
        self.listener: Optional[socket.socket] = None
        self.store_port: Optional[int] = None  # torch's store, once it listens
        self.rejected = 0  # connections dropped for a bad or unauthenticated frame

    def open(self, address: str, port: int) -> int:
        """Listen on ``address`` (``port`` 0: any free one); the port."""
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((address, port))
        self.listener.listen(128)
        self.listener.setblocking(False)
        self.sel.register(self.listener, selectors.EVENT_READ, ("listen", None))
        return self.listener.getsockname()[1]

    def close(self) -> None:
        """Drop every link and stop listening."""
        for conn in list(self.conns.values()):
            self.drop(conn)
        if self.listener is not None:
            wire.close_watched(self.sel, self.listener)

    # --- connections -------------------------------------------------------------------

    def accept(self) -> None:
        assert self.listener is not None
        while True:
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            waiting = [c for c in self.conns.values() if not c.authed]
            if len(waiting) >= MAX_UNAUTHENTICATED:
                self.reject(min(waiting, key=lambda c: c.opened_t), "too many unauthenticated")
            conn = Conn(sock, self.now())
            self.conns[sock] = conn
            self.sel.register(sock, selectors.EVENT_READ, ("conn", conn))
            self.queue(conn, ("challenge", conn.nonce, self.run_id))

    def reject(self, conn: Conn, reason: str) -> None:
        """Drop one connection for what it sent (or did not): the run goes on."""
        self.write_reject(reason, conn.worker, conn.authed)
        self.drop(conn)

    def write_reject(self, reason: str, worker: Optional[int] = None,
                     authenticated: bool = True) -> None:
        """Count a rejected link or frame; record the first ones."""
        self.rejected += 1
        if self.rejected <= MAX_REJECT_RECORDS:
            self.write(rec(self.now(), "info", "reject", DRIVER, reason=reason[:200],
                           worker=worker, authenticated=authenticated))

    def auth_deadlines(self) -> list[float]:
        """When each link still unauthenticated runs out of time."""
        return [c.opened_t + AUTH_TIMEOUT_S for c in self.conns.values() if not c.authed]

    def expire_unauthenticated(self, now: float) -> None:
        for conn in [c for c in self.conns.values()
                     if not c.authed and now >= c.opened_t + AUTH_TIMEOUT_S]:
            self.reject(conn, "no hello in time")

    def drop(self, conn: Conn) -> None:
        if conn.host is not None and self.host_handler is not None:
            self.host_handler.disconnected(conn)
        wire.close_watched(self.sel, conn.sock)
        self.conns.pop(conn.sock, None)

    def on_event(self, conn: Conn) -> None:
        """The selector says ``conn`` is readable or writable."""
        if conn.sock not in self.conns:
            return
        self.readable(conn)
        if conn.out and conn.sock in self.conns:
            self.writable(conn)

    def readable(self, conn: Conn) -> None:
        data = wire.recv_some(conn.sock)
        if data is None:
            return
        if not data:
            self.drop(conn)
            return
        try:  # (a frame may get its connection rejected: the rest is not read)
            wire.feed_frames(conn.reader, data, lambda frame: self.frame(conn, frame),
                             lambda: conn.sock in self.conns)
        except wire.WireError as exc:
            self.reject(conn, f"bad frame: {exc}")

    def writable(self, conn: Conn) -> None:
        try:
            n = conn.sock.send(conn.out)
        except BlockingIOError:
            return
        except OSError:
            self.drop(conn)
            return
        del conn.out[:n]
        if not conn.out:
            self.sel.modify(conn.sock, selectors.EVENT_READ, ("conn", conn))

    def frame(self, conn: Conn, frame: tuple) -> None:
        """One whole frame: the hello's proof first, then the handler's."""
        assert self.handler is not None and self.host_handler is not None
        kind = frame[0]
        now = self.now()
        if not conn.authed:
            if kind == "host_hello":
                self.host_handler.host_hello(conn, frame)
            elif kind != "hello":
                self.reject(conn, f"unauthenticated {kind}")
            elif not wire.hello_ok(self.secret, conn.nonce, self.run_id, frame):
                self.reject(conn, "hello without the run's key")
            else:
                conn.authed = True
                conn.reader.authenticated()
                self.hello(conn, frame)
        elif kind in ("hello", "host_hello"):
            self.reject(conn, "a second hello")
        elif kind in ("started", "exited") or conn.host is not None:
            self.host_handler.host_frame(conn, frame)
        else:
            self.handler.authenticated_frame(conn, frame, now)

    def hello(self, conn: Conn, frame: tuple) -> None:
        """An authenticated process says who it is: its replies go to this connection."""
        _, w, inc, _pid, spare, _mac = frame
        conn.worker, conn.incarnation, conn.spare = w, inc, spare
        self.conn_of[(w, inc)] = conn
        cur = self.latest_conn.get(w)
        if cur is None or (cur.incarnation or 0) <= inc:
            self.latest_conn[w] = conn
        if self.store_port is not None:
            self.queue(conn, ("welcome", self.store_port))

    def welcome(self, store_port: int) -> None:
        """torch's store listens: every worker linked now, and each later, is told where."""
        self.store_port = store_port
        for conn in self.conns.values():
            if conn.worker is not None:
                self.queue(conn, ("welcome", store_port))

    # --- sending -----------------------------------------------------------------------

    def queue(self, conn: Conn, obj: Any) -> None:
        data = wire.encode(obj)
        if conn.out:
            conn.out += data
            return
        try:
            n = conn.sock.send(data)
        except BlockingIOError:
            n = 0
        except OSError:
            return
        if n < len(data):
            conn.out += data[n:]
            self.sel.modify(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, ("conn", conn))

    def send(self, conn: Conn, frame: tuple) -> bool:
        """Send ``frame`` on ``conn`` if it is still open."""
        if conn.sock not in self.conns:
            return False
        self.queue(conn, frame)
        return True

    def route(self, worker: int, message: Any) -> None:
        """A keeper message to the life it names (``link_for``)."""
        conn = link_for(worker, message, self.conn_of, self.latest_conn)
        if conn is not None:
            self.queue(conn, ("msg", message))

    def tell(self, life: tuple[int, int], frame: tuple) -> bool:
        """Send ``frame`` to that life's process, if its link is open."""
        conn = self.conn_of.get(life)
        return conn is not None and self.send(conn, frame)

    def reachable(self, w: int) -> bool:
        """Whether worker ``w``'s latest process has a link to the launcher."""
        return self.latest_conn.get(w) is not None

    def tell_latest(self, w: int, frame: tuple) -> bool:
        """Send ``frame`` to worker ``w``'s latest process, if it has a link."""
        conn = self.latest_conn.get(w)
        if conn is None:
            return False
        self.queue(conn, frame)
        return True

    def tell_workers(self, frame: tuple) -> None:
        for conn in list(self.conns.values()):
            if conn.authed and conn.worker is not None:
                self.queue(conn, frame)

    # --- the end -----------------------------------------------------------------------

    def drain(self, wait_s: float, live: Callable[[Conn], bool],
              on_frame: Callable[[tuple], None]) -> None:
        """Hear each live worker's link to its end, for at most ``wait_s``:
        the service ends its side, the worker ends its own after its last
        whole frame; what comes meanwhile goes to ``on_frame``."""
        now = self.now()
        deadline = now + wait_s
        sel = selectors.DefaultSelector()
        for conn in self._live_worker_links(live):
            try:
                conn.sock.shutdown(socket.SHUT_WR)
            except OSError:
                continue
            sel.register(conn.sock, selectors.EVENT_READ, conn)
        try:
            while sel.get_map() and (left_s := deadline - self.now()) > 0:
                for key, _ in sel.select(left_s):
                    problem = self._drain_read(key.data, on_frame)
                    if problem is not None:
                        sel.unregister(key.fileobj)
                        if problem:
                            self.reject(key.data, problem)
            still = sorted(k.data.worker for k in sel.get_map().values())
            if still:
                self.write(rec(self.now(), "info", "drain", DRIVER, open=still,
                               waited_s=round(self.now() - now, 3)))
        finally:
            sel.close()

    def _live_worker_links(self, live: Callable[[Conn], bool]) -> Iterable[Conn]:
        return [c for c in self.conns.values() if c.authed and c.worker is not None and live(c)]

    def _drain_read(self, conn: Conn, on_frame: Callable[[tuple], None]) -> Optional[str]:
        """One read of a draining link: None while it is open, "" at its end,
        else what was wrong with its bytes."""
        data = wire.recv_some(conn.sock)
        if data is None:
            return None
        if not data:
            return ""
        try:
            wire.feed_frames(conn.reader, data, on_frame)
        except wire.WireError as exc:
            return f"bad frame: {exc}"
        return None
