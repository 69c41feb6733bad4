"""A worker's way to find the active keeper through etcd (``keeper.worker_links: direct``).

The worker reads the leadership key itself (:class:`real.keeper_store.KeeperStore`,
the same client the keeper processes use), with the credentials the launcher
wrote for the run (``real/keeper.json``: the endpoints, the key prefix, and
whose password). A thread of its own does the etcd calls and the connect, so
the worker's control thread, which beats and answers roll calls, never waits
on etcd; it hands each connected socket over through a queue and a pipe the
control thread selects on. It decides nothing: the control thread takes a
link to a keeper of a newer term than the one it has, or any keeper when it
has none.

While the worker has a link, the thread watches the leadership key (an
etcd watch, in slices of :data:`WATCH_SLICE_S` so that a lost link is
looked for at once: a keeper deposed without closing its links is replaced
by one of a newer term); while it has none, it reads the key every
:data:`POLL_S`.
"""

from __future__ import annotations

import json
import os
import queue
import socket
import threading
from pathlib import Path
from typing import Optional

from rollcall.results import atomic_write_text

from real import wire
from real.keeper_store import KeeperStore, StoreUnavailable, read_password

POLL_S = 0.05  # while the worker has no keeper link: how often etcd is read
WATCH_SLICE_S = 0.5  # while it has one: the longest watch before the thread looks up
CONNECT_TIMEOUT_S = 1.0

KEEPER_JSON = "keeper.json"  # under the run's real/ directory, written by the launcher


def write_keeper_json(real_dir: Path, endpoints: list[str], prefix: str, auth: str,
                      user: str, password_file: Optional[str]) -> None:
    """What a worker needs to find the keeper (never a password: ``auth`` is
    ``secret`` (the run's, from the worker's own secret file), ``file`` or
    ``none``), written whole or not at all: a reader never sees half of it."""
    assert auth in ("secret", "file", "none"), auth
    doc = {"endpoints": endpoints, "prefix": prefix, "auth": auth, "user": user,
           "password_file": password_file}
    atomic_write_text(real_dir / KEEPER_JSON, json.dumps(doc, indent=1) + "\n")


def open_store(real_dir: Path, secret: bytes, ttl_s: float) -> KeeperStore:
    doc = json.loads((real_dir / KEEPER_JSON).read_text())
    password = {"secret": lambda: secret.hex(), "none": lambda: None,
                "file": lambda: read_password(doc["password_file"])}[doc["auth"]]()
    return KeeperStore(list(doc["endpoints"]), doc["prefix"], secret=password,
                       timeout_s=max(1.0, ttl_s / 2), user=doc["user"])


class KeeperFinder:
    """The thread that reads etcd and connects; :meth:`take` gives its finds."""

    def __init__(self, store: KeeperStore, ttl_s: float) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self.found: "queue.Queue[tuple[int, str, socket.socket]]" = queue.Queue()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        self.linked: Optional[int] = None  # the term of the control thread's link (None: none)
        self.offered = 0  # the newest term handed over and not yet refused
        self.kick = threading.Event()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="keeper-finder", daemon=True)
        self.thread.start()

    def link_state(self, term: Optional[int]) -> None:
        """The control thread's link: to a keeper of ``term``, or none (look now)."""
        self.linked = term
        if term is None:
            self.offered = 0
            self.kick.set()

    def take(self) -> list[tuple[int, str, socket.socket]]:
        try:
            os.read(self.wake_r, 4096)
        except BlockingIOError:
            pass
        out = []
        while True:
            try:
                out.append(self.found.get_nowait())
            except queue.Empty:
                return out

    def close(self) -> None:
        self.stopped.set()
        self.kick.set()

    def _run(self) -> None:
        while not self.stopped.is_set():
            try:
                leader = self.store.leader()
            except StoreUnavailable:
                leader = None
            if leader is not None:
                self._maybe_connect(*leader)
            self.kick.clear()
            if self.linked is None or leader is None:
                self.kick.wait(POLL_S)
                continue
            try:
                self.store.wait_leader_change(min(self.ttl_s / 2, WATCH_SLICE_S))
            except StoreUnavailable:
                self.kick.wait(POLL_S)

    def _maybe_connect(self, term: int, candidate: str, address: str) -> None:
        if term <= max(self.linked or 0, self.offered):
            return
        try:
            sock = wire.connect_to(address, CONNECT_TIMEOUT_S)
        except OSError:
            return  # not listening yet, or gone again: the next read
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.offered = term
        self.found.put((term, candidate, sock))
        os.write(self.wake_w, b"k")


class KeeperLink:
    """The worker's link to the keeper it found (its control thread's side).

    ``worker`` is the :class:`real.worker.Worker`: its frames from the keeper
    go to ``worker.handle`` as the launcher's did, and once a keeper serves
    the link (``("keeper", term)``) the worker starts, or its agent asks
    again what went unanswered (``worker.keeper_served``). A lost link
    refuses the commit in flight (``worker.keeper_lost``), as a launcher
    does whose keeper is gone."""

    SEND_TIMEOUT_S = 5.0  # a keeper that stops reading: the link is given up

    def __init__(self, worker, finder: KeeperFinder, key: bytes) -> None:
        self.w = worker
        self.finder = finder
        self.key = key
        self.sock: Optional[socket.socket] = None
        self.reader = None
        self.term: Optional[int] = None
        self.served = False

    def fds(self) -> list:
        return [self.finder.wake_r] + ([self.sock] if self.sock is not None else [])

    def ready(self, fds: list) -> None:
        if self.finder.wake_r in fds:
            for term, candidate, sock in self.finder.take():
                self._adopt(term, candidate, sock)
        if self.sock is not None and self.sock in fds:
            self._read()

    def send(self, data: bytes) -> bool:
        """Send on the link (the caller holds the worker's send lock); False: no keeper serves."""
        if self.sock is None or not self.served:
            return False
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            return False  # the control thread hears the end when it reads

    def _adopt(self, term: int, candidate: str, sock: socket.socket) -> None:
        if self.term is not None and self.sock is not None and term <= self.term:
            sock.close()
            return
        self._drop("superseded")
        sock.settimeout(self.SEND_TIMEOUT_S)
        self.sock, self.term, self.served = sock, term, False
        self.reader = wire.FrameReader(wire.KEEPER_TO_WORKER)
        self.finder.link_state(term)
        self.w.record_link(term, candidate, "connected")

    def _read(self) -> None:
        try:
            data = self.sock.recv(1 << 16)
        except OSError:
            data = b""
        if not data:
            self._drop("closed")
            return
        try:
            frames = self.reader.feed(data)
            while frames:
                for frame in frames:
                    self._frame(frame)
                    if self.sock is None:
                        return
                frames = self.reader.more()
        except (wire.WireError, OSError):
            self._drop("bad-frame")

    def _frame(self, frame: tuple) -> None:
        kind = frame[0]
        if kind == "challenge":
            _, nonce, run = frame
            w = self.w
            mac = wire.hello_mac(self.key, nonce, run, w.worker, w.incarnation, os.getpid(),
                                 w.spare)
            with w.send_lock:
                self.sock.sendall(wire.encode(("hello", w.worker, w.incarnation, os.getpid(),
                                               w.spare, mac)))
            self.reader.authenticated()
        elif kind == "keeper":
            if frame[1] != self.term:
                raise wire.WireError(f"the keeper says term {frame[1]}, etcd said {self.term}")
            self.served = True
            self.w.keeper_served(self.term)
        else:
            self.w.handle(frame)

    def _drop(self, reason: str) -> None:
        if self.sock is None:
            return
        with self.w.send_lock:
            self.sock.close()
            self.sock, self.served = None, False
        self.finder.link_state(None)
        self.w.record_link(self.term, None, reason)
        self.w.keeper_lost()

    def close(self) -> None:
        self.finder.close()
        if self.sock is not None:
            self.sock.close()
            self.sock = None
