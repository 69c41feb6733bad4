"""The host agent's relay of its workers' keeper link, and the ``delay`` fault.

These machines' kernel has no ``sch_netem`` and no nftables ``queue``
(``nft add rule ... queue num 0`` answers "No such file or directory"), so a
delay cannot be put on a namespace's link by the kernel. Each worker's
connection to the keeper service goes through its host agent instead: the
worker connects to the relay on its own host's loopback, the relay connects
on to the keeper from the host's address, and copies the bytes both ways.
With no delay set a chunk goes on as soon as it is read. With a delay of
``extra_s`` (``delay: H, latency_s: X`` on real: the launcher orders
``("delay", X)`` at the fault and ``("delay", 0)`` at the heal) each chunk
read goes on ``extra_s`` later, in order: a chunk read at ``s`` leaves at
``max(s + extra_s, when the one before it left)``, as TCP would deliver it
over a slow link (the sim's rule for beats, ``sim/network.py``). So the
heartbeats, joins, commit votes and memberships of the host's workers are
late by ``extra_s`` each way while the fault lasts, and the backlog drains
after it; their gloo groups and the TCPStore connect directly and are not
delayed (README: which delays are real).

The relay reads and decides nothing: frames are authenticated end to end
between worker and keeper. It binds only the namespace's loopback, keeps at
most ``MAX_QUEUED`` bytes per direction (a peer that stops reading loses
that connection pair, not the host agent), and never blocks: every socket
is non-blocking and the agent's selector loop drives it.
"""

from __future__ import annotations

import selectors
import socket
from collections import deque
from typing import Optional

from real import wire

MAX_QUEUED = 16 << 20  # bytes held per direction before the pair is dropped
HELD = float("inf")  # the due time of a chunk read while the relay holds (a cut)
CHUNK = 1 << 16


class _Side:
    """One socket of a pair and the bytes due to be written to it."""

    __slots__ = ("sock", "queue", "queued", "last_due", "shut", "reading", "writing")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        # (due, bytes) in order; bytes None: the peer's end of stream, passed on
        # (shutdown) when due, as late as the data before it
        self.queue: deque[tuple[float, Optional[memoryview]]] = deque()
        self.queued = 0
        self.last_due = 0.0
        self.shut = False  # the end of stream went out: nothing more is written
        self.reading = True  # watched for reading, until its own end of stream
        self.writing = False  # watched for writing, while a write would block


class Pair:
    """A worker's connection (``down``) and the relay's to the keeper (``up``)."""

    def __init__(self, worker_sock: socket.socket, keeper_sock: socket.socket) -> None:
        self.down = _Side(worker_sock)
        self.up = _Side(keeper_sock)
        self.dead = False

    def other(self, side: _Side) -> _Side:
        return self.up if side is self.down else self.down


class Relay:
    """Listens on ``127.0.0.1:port`` and relays each connection to ``keeper``."""

    def __init__(self, sel: selectors.BaseSelector, keeper: tuple[str, int]) -> None:
        self.sel = sel
        self.keeper = keeper
        self.extra_s = 0.0
        self.holding = False  # cut off: what is read waits for release(), as TCP's retransmissions
        self.pairs: list[Pair] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.setblocking(False)
        self.port: int = self.listener.getsockname()[1]
        sel.register(self.listener, selectors.EVENT_READ, self)

    def set_delay(self, extra_s: float) -> None:
        """From now on, each chunk read goes on ``extra_s`` later (0: at once)."""
        assert extra_s >= 0.0, extra_s
        self.extra_s = extra_s

    def hold(self) -> None:
        """A cut: from now on nothing read goes on until :meth:`release`."""
        self.holding = True

    def release(self, now: float) -> None:
        """The cut heals: what it held goes on now, in order (TCP's
        retransmissions after a partition), and new reads at once again."""
        self.holding = False
        for pair in self.pairs:
            for side in (pair.down, pair.up):
                side.queue = deque((now if due == HELD else due, chunk)
                                   for due, chunk in side.queue)
                side.last_due = min(side.last_due, now)
        self.flush(now)

    # --- the selector's events --------------------------------------------------

    def event(self, data: object, mask: int, now: float) -> None:
        """A ready socket of the relay's (``data`` is its selector data)."""
        if data is self:
            self._accept()
            return
        pair, side = data  # type: ignore[misc]
        if pair.dead:
            return
        if mask & selectors.EVENT_READ:
            self._read(pair, side, now)
        if not pair.dead and mask & selectors.EVENT_WRITE:
            self._write(pair, side, now)

    def _accept(self) -> None:
        try:
            worker_sock, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        try:
            keeper_sock = socket.create_connection(self.keeper, timeout=5)
        except OSError:
            worker_sock.close()  # the worker sees its connection end, as without a relay
            return
        pair = Pair(worker_sock, keeper_sock)
        for side in (pair.down, pair.up):
            side.sock.setblocking(False)
            side.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sel.register(side.sock, selectors.EVENT_READ, (pair, side))
        self.pairs.append(pair)

    def _read(self, pair: Pair, side: _Side, now: float) -> None:
        try:
            data = side.sock.recv(CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        dst = pair.other(side)
        if not data:  # this side closed: the other follows, after what it is due
            side.reading = False
            self._watch(pair, side)
        due = HELD if self.holding else max(now + self.extra_s, dst.last_due)
        dst.last_due = due
        dst.queue.append((due, memoryview(data) if data else None))
        dst.queued += len(data)
        if dst.queued > MAX_QUEUED:
            self._drop(pair)
            return
        self._write(pair, dst, now)

    def _write(self, pair: Pair, side: _Side, now: float) -> None:
        """Write what is due to ``side``; watch it for writability if it would block."""
        while side.queue and side.queue[0][0] <= now:
            due, chunk = side.queue[0]
            if chunk is None:
                side.queue.popleft()
                self._shut(pair, side)
                return
            try:
                sent = side.sock.send(chunk)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                self._drop(pair)
                return
            side.queued -= sent
            if sent < len(chunk):
                side.queue[0] = (due, chunk[sent:])
                if not side.writing:
                    side.writing = True
                    self._watch(pair, side)
                return
            side.queue.popleft()
        if side.writing:
            side.writing = False
            self._watch(pair, side)

    def _shut(self, pair: Pair, side: _Side) -> None:
        """Pass an end of stream on; the pair goes once both directions ended."""
        side.shut = True
        try:
            side.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        if pair.other(side).shut:
            self._drop(pair)

    def flush(self, now: float) -> None:
        """Write every chunk that has come due."""
        for pair in list(self.pairs):
            for side in (pair.down, pair.up):
                if not pair.dead and side.queue and not side.writing:
                    self._write(pair, side, now)

    def next_due(self) -> Optional[float]:
        """When the earliest held chunk comes due (None: nothing held)."""
        dues = [s.queue[0][0] for p in self.pairs for s in (p.down, p.up)
                if s.queue and not s.writing]
        return min(dues) if dues else None

    # --- bookkeeping ------------------------------------------------------------

    def _watch(self, pair: Pair, side: _Side) -> None:
        """Have the selector watch ``side`` for what it waits on now."""
        events = (selectors.EVENT_READ if side.reading else 0) \
            | (selectors.EVENT_WRITE if side.writing else 0)
        try:
            self.sel.get_key(side.sock)
        except KeyError:
            if events:
                self.sel.register(side.sock, events, (pair, side))
            return
        if events:
            self.sel.modify(side.sock, events, (pair, side))
        else:
            self.sel.unregister(side.sock)

    def _drop(self, pair: Pair) -> None:
        if pair.dead:
            return
        pair.dead = True
        for side in (pair.down, pair.up):
            wire.close_watched(self.sel, side.sock)
            side.queue.clear()
        self.pairs.remove(pair)

    def close(self) -> None:
        for pair in list(self.pairs):
            self._drop(pair)
        wire.close_watched(self.sel, self.listener)

