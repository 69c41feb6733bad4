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
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlsplit

from rollcall import interrupts
from rollcall.core import (
    DRIVER, EMPTY, Broadcast, CommitVerdict, IdRuns, JobFailed, Record, Relaunch, RestartJob,
    Send, message_to_data, rec,
)

from real import wire
from real.keeper_port import CommitAsk, Supervisor
from real.relay import Relay
from real.keeper_store import KeeperStore, StoreUnavailable, read_password
from real.keeper_finder import write_keeper_json
from real.keeper_wire import TO_SUPERVISOR, supervisor_mac
from real.keeper_proc import DEPOSED_EXIT
from real.procs import die_with_parent, last_line, python_env, release


POLL_S = 0.05  # while no keeper serves: how often etcd is asked who leads
START_TIMEOUT_S = 60.0  # the first keeper, from the processes' start to its answer
LOST = CommitVerdict(False, "keeper-lost")
MAX_BACKLOG = 8 << 20  # bytes queued for a keeper that does not read: then its link is given up
# Keeper processes that end on their own (not deposed, not killed by a
# fault, not at the run's end) between two takeovers before the run ends in
# error: such an exit is a crash (a traceback, an unreadable run file), and
# one that repeats would have the launcher start keepers without end.
KEEPER_CRASHES_MAX = 5


@dataclass
class KeeperProc:
    candidate: int
    popen: subprocess.Popen
    pidfd: int
    log: Any
    paths: list = field(default_factory=list)  # its relays to the etcd members
    host: Optional[int] = None  # its host namespace (hosts mode), if it has one


ETCD_MEMBERS = 3


def keeper_hosts(keeper: Any) -> int:
    """How many host namespaces a hosts-mode run adds for its keeper side:
    one per keeper process (1 + standbys) and one per member of its own etcd
    cluster, so that a ``partition_keeper`` is an nftables cut between hosts.
    0 for a memory keeper, or for the user's etcd (on this machine's
    loopback, which a namespace does not reach)."""
    if keeper.store != "etcd" or keeper.etcd_endpoints is not None:
        return 0
    return 1 + int(keeper.standbys) + ETCD_MEMBERS


@dataclass(frozen=True)
class KeeperHosts:
    """Hosts mode: the run's :class:`real.netns.Network` and the hosts in it
    that hold keeper processes (one slot each) and etcd members."""

    network: Any
    keepers: tuple[int, ...]
    etcd: tuple[int, ...]

    @classmethod
    def after(cls, network: Any, first: int, standbys: int) -> "KeeperHosts":
        """The hosts after the workers' (``first`` on), in the order :func:`keeper_hosts` counts."""
        k = 1 + standbys
        assert network.hosts >= first + k + ETCD_MEMBERS, (network.hosts, first, k)
        return cls(network, tuple(range(first, first + k)),
                   tuple(range(first + k, first + k + ETCD_MEMBERS)))


class EtcdPaths:
    """Each keeper process's way to etcd: a relay per etcd member
    (:class:`real.relay.Relay`), so that a ``partition_keeper`` fault can cut
    one keeper off from etcd (the relays hold what it sends, as a cut link
    would, until the heal) while its link to the launcher goes on. A thread
    of its own drives them (their selector is not the launcher's); it reads
    and decides nothing."""

    TICK_S = 0.05

    def __init__(self) -> None:
        self.sel = selectors.DefaultSelector()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="etcd-paths", daemon=True)
        self.thread.start()

    def open(self, endpoints: list[str]) -> list[Relay]:
        """One relay to each endpoint (``http://host:port``)."""
        with self.lock:
            return [Relay(self.sel, (str(urlsplit(u).hostname), int(urlsplit(u).port or 0)))
                    for u in endpoints]

    def cut(self, relays: list[Relay], on: bool) -> None:
        with self.lock:
            for r in relays:
                if on:
                    r.hold()
                else:
                    r.release(time.monotonic())

    def shut(self, relays: list[Relay]) -> None:
        with self.lock:
            for r in relays:
                r.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.sel.close()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                events = self.sel.select(self.TICK_S)
            except (OSError, ValueError):  # closed under us at the end
                return
            with self.lock:
                now = time.monotonic()
                for key, mask in events:
                    owner = key.data if isinstance(key.data, Relay) else self._owner(key.data)
                    if owner is not None:
                        owner.event(key.data, mask, now)
                for r in self._relays():
                    r.flush(now)

    def _relays(self) -> list[Relay]:
        return list({id(k.data): k.data for k in self.sel.get_map().values()
                     if isinstance(k.data, Relay)}.values())

    def _owner(self, data: Any) -> Optional[Relay]:
        pair = data[0]
        return next((r for r in self._relays() if pair in r.pairs), None)


class RemoteKeeper:
    """The launcher's side of a keeper in processes of its own: it starts
    the keeper candidates (and etcd where the run makes its own), follows
    etcd to the one that leads, and carries that keeper's frames to the
    launcher (a :class:`Supervisor`) and the launcher's facts to it."""

    def __init__(self, launcher: Supervisor, sel: selectors.BaseSelector) -> None:
        self.supervisor = launcher
        self.sel = sel
        k = launcher.sc.keeper
        self.ttl_s = float(k.lease_ttl_s)
        self.standbys = int(k.standbys)
        self.etcd = None
        self.endpoints = list(k.etcd_endpoints or ())
        self.prefix = f"/rollcall/{launcher.run_id}"
        self.store: Optional[KeeperStore] = None
        self.procs: list[KeeperProc] = []
        self.paths = EtcdPaths()  # each keeper's relays to etcd (partition_keeper cuts them)
        self.cut: Optional[KeeperProc] = None  # the keeper cut off from etcd now
        self.cut_rule: Any = None  # hosts mode: the nftables partition doing it
        self.hosts: Optional[KeeperHosts] = None  # hosts mode, the run's own etcd
        self.next_candidate = 0
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
        self.crashes = 0  # keeper processes that crashed since a keeper last took over

    @property
    def up(self) -> bool:
        return self.sock is not None

    @property
    def direct(self) -> bool:
        """``keeper.worker_links: direct``: the workers link to the keeper themselves."""
        return self.supervisor.sc.keeper.worker_links == "direct"

    @property
    def users_cluster(self) -> bool:
        """``keeper.etcd_endpoints``: the record lives in the user's etcd."""
        return self.supervisor.sc.keeper.etcd_endpoints is not None

    @property
    def user(self) -> str:
        return self.supervisor.sc.keeper.etcd_user or "root"

    def password_file(self) -> Optional[str]:
        """The user's password file, made absolute against the launcher's
        directory (the keeper processes run in the run's)."""
        path = self.supervisor.sc.keeper.etcd_password_file
        return None if path is None else str(Path(path).expanduser().resolve())

    def password(self) -> Optional[str]:
        """etcd's password: the run's secret for the run's own cluster, the
        user's (read from its file now) for theirs, None where theirs has no auth."""
        if not self.users_cluster:
            return self.supervisor.secret.hex()
        path = self.password_file()
        return None if path is None else read_password(path)

    def _credentials(self) -> list[str]:
        """How a keeper process authenticates to etcd (never the password on its command line)."""
        if not self.users_cluster:
            return []  # root, with the run's secret (its --secret-file)
        path = self.password_file()
        if path is None:
            return ["--etcd-no-auth"]
        return ["--etcd-user", self.user, "--etcd-password-file", path]

    # --- start and stop ----------------------------------------------------------------

    def start(self) -> None:
        """etcd (unless the user's), the keeper processes, and the first keeper's answer."""
        if not self.endpoints:
            from real.etcd import EtcdCluster

            net = self.supervisor.network
            if net is not None and keeper_hosts(self.supervisor.sc.keeper):  # the launcher made them hosts
                self.hosts = KeeperHosts.after(net, self.supervisor.sc.n_hosts, self.standbys)
            where: dict[str, Any] = {}
            if self.hosts is not None:
                h = self.hosts
                where = {"addresses": [h.network.address(e) for e in h.etcd],
                         "spawn": lambda i, argv, **kw: h.network.spawn(h.etcd[i], argv, **kw)}
            self.etcd = EtcdCluster(self.supervisor.real_dir / "etcd", members=ETCD_MEMBERS,
                                    secret=self.supervisor.secret.hex(), **where)
            self.etcd.start(timeout_s=START_TIMEOUT_S)
            self.endpoints = list(self.etcd.endpoints)
        self.store = KeeperStore(self.endpoints, self.prefix, secret=self.password(),
                                 timeout_s=max(1.0, self.ttl_s / 2), user=self.user)
        if self.direct:  # what each worker needs to find the keeper in etcd itself
            net = self.supervisor.network
            assert net is None or self.hosts is not None, "refused: direct, hosts, the user's etcd"
            auth = ("secret" if not self.users_cluster else
                    "none" if self.password_file() is None else "file")
            write_keeper_json(self.supervisor.real_dir, self.endpoints, self.prefix, auth, self.user,
                              self.password_file())
        for _ in range(1 + self.standbys):
            self.spawn()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.up and self.supervisor.stop.signum is None:  # a signal: the launcher ends the run
            if time.monotonic() >= deadline:
                raise RuntimeError(f"no keeper answered within {START_TIMEOUT_S:g} s "
                                   f"(see {self.supervisor.real_dir / 'logs'})")
            self.poll()
            for kp in [kp for kp in self.procs if kp.popen.poll() is not None]:
                self.on_proc_exit(kp)  # the launcher's selector is not read yet
            if self.supervisor.result is not None:
                return
            if not self.up:
                time.sleep(POLL_S)  # a bounded wait for a process's start, not a sync

    def spawn(self) -> None:
        """One more keeper process: on a host of its own in hosts mode (the
        slot a dead one left), reaching etcd directly; else on this machine,
        through relays of its own (:class:`EtcdPaths`)."""
        supervisor, c = self.supervisor, self.next_candidate
        self.next_candidate += 1
        log = open(supervisor.real_dir / "logs" / f"keeper-{c}.log", "ab")
        host, paths = None, []
        if self.hosts is not None:
            taken = {p.host for p in self.procs}
            host = next(h for h in self.hosts.keepers if h not in taken)
            listen, endpoints = self.hosts.network.address(host), self.endpoints
        else:
            paths = self.paths.open(self.endpoints)  # its own way to each etcd member
            listen, endpoints = "127.0.0.1", [f"http://127.0.0.1:{r.port}" for r in paths]
        cmd = [sys.executable, "-m", "real.keeper_proc", "--run-dir", str(supervisor.out),
               "--candidate", str(c), "--t0", repr(supervisor.t0), "--secret-file", str(supervisor.secret_path),
               "--run-id", supervisor.run_id, "--prefix", self.prefix, "--listen", listen,
               "--endpoints", ",".join(endpoints), *self._credentials()]
        how: dict[str, Any] = dict(stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   env=python_env(), cwd=str(supervisor.out), start_new_session=True,
                                   preexec_fn=die_with_parent)  # a SIGKILLed launcher leaves none
        with interrupts.shielded():  # started and recorded, or neither
            if host is not None:
                popen = self.hosts.network.spawn(host, cmd, **how)  # type: ignore[union-attr]
            else:
                popen = subprocess.Popen(cmd, **how)
            kp = KeeperProc(c, popen, os.pidfd_open(popen.pid), log, paths, host)
            self.procs.append(kp)
        self.sel.register(kp.pidfd, selectors.EVENT_READ, ("kproc", kp))

    def kill_now(self) -> None:
        """SIGKILL every keeper process and etcd member at once, waiting for none
        (a second signal; :meth:`close` reaps them after)."""
        for kp in self.procs:
            if kp.popen.returncode is None:
                try:
                    os.kill(kp.popen.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if self.etcd is not None:
            self.etcd.kill_now()

    def close(self) -> None:
        """Kill and reap every keeper process and etcd member this run started."""
        self.drop_link()
        for kp in self.procs:
            self._reap(kp, kill=True)
        self.procs.clear()
        self.paths.close()
        if self.etcd is not None:
            self.etcd.stop()
        elif self.store is not None:  # the user's cluster outlives the run: not its keys
            try:
                self.store.delete_prefix()
            except StoreUnavailable as exc:
                self.supervisor.write(rec(self.supervisor.now(), "info", "etcd_cleanup", DRIVER,
                                 prefix=self.prefix, error=str(exc)))
        if self.store is not None:
            self.store.close()

    def _reap(self, kp: KeeperProc, kill: bool) -> None:
        if kill and kp.popen.poll() is None:
            kp.popen.kill()
        try:
            kp.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            kp.popen.kill()
            kp.popen.wait()
        release(self.sel, kp.pidfd, kp.log)
        self.paths.shut(kp.paths)
        kp.paths = []

    # --- faults ------------------------------------------------------------------------

    def _serving(self) -> Optional[KeeperProc]:
        """The process of the keeper the launcher talks to."""
        return next((p for p in self.procs if f"keeper-{p.candidate}" == self.leader), None)

    def kill_active(self) -> Optional[int]:
        """``kill_keeper: active``: SIGKILL the serving keeper's process; its term."""
        kp = self._serving()
        if kp is None or kp.popen.poll() is not None:
            return None
        kp.popen.send_signal(signal.SIGKILL)
        return self.term

    def cut_active(self) -> Optional[int]:
        """``partition_keeper: active``: the serving keeper loses etcd but not
        the launcher; its term. In hosts mode an nftables partition of its
        host from the etcd members' hosts; else its relays hold what it sends."""
        kp = self._serving()
        if kp is None or self.cut is not None:
            return None
        self.cut = kp
        if kp.host is not None:
            assert self.hosts is not None
            self.cut_rule = self.hosts.network.partition([kp.host], peers=list(self.hosts.etcd))
        else:
            self.paths.cut(kp.paths, True)
        return self.term

    def heal_cut(self) -> Optional[int]:
        """The cut ends: what the keeper sent meanwhile goes on (it is
        deposed by then, and etcd refuses a deposed keeper's writes).
        Returns the packets the rules dropped (hosts mode), else None."""
        dropped = None
        if self.cut_rule is not None:
            assert self.hosts is not None
            dropped = self.hosts.network.dropped(self.cut_rule)
            self.hosts.network.heal(self.cut_rule)
            self.cut_rule = None
        elif self.cut is not None:
            self.paths.cut(self.cut.paths, False)
        self.cut = None
        return dropped

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
        self.supervisor.write(rec(self.supervisor.now(), "info", "keeper_exit", DRIVER, candidate=kp.candidate,
                         returncode=kp.popen.returncode))
        if f"keeper-{kp.candidate}" == self.leader:
            self.lost("exited")
        code = kp.popen.returncode
        if code is not None and code > 0 and code != DEPOSED_EXIT:
            self.crashes += 1
            if self.crashes >= KEEPER_CRASHES_MAX:
                log = self.supervisor.real_dir / "logs" / f"keeper-{kp.candidate}.log"
                self.supervisor.finish("error", f"{self.crashes} keeper processes crashed since a "
                                                f"keeper last took over, the last with exit code "
                                                f"{code}: {last_line(log)} (see {log})")
        if self.supervisor.result is None:
            self.spawn()

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
            self.supervisor.commit_answered(ask, LOST)
        self.supervisor.gate_released(frozen=False)  # a gate's later faults are not lost with it

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
        assert self.store is not None
        self.poll_at = self.supervisor.now() + (self.ttl_s / 2 if self.up else POLL_S)
        try:
            found = self.store.leader()
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
        started, down, exited = self.supervisor.physical_report()
        sock.sendall(wire.encode(("report", started, down, exited)))
        reader.authenticated()
        self.reader = reader

    # --- the keeper's frames ---------------------------------------------------------------

    def frame(self, frame: tuple) -> None:
        kind, supervisor = frame[0], self.supervisor
        if kind == "term":
            self.took_over(frame[1])
        elif kind == "send":
            supervisor.effects([Send(frame[1], frame[2])])
        elif kind == "broadcast":
            supervisor.effects([Broadcast(frame[1], frame[2])])
        elif kind == "rec":
            supervisor.effects([Record(frame[1])])
        elif kind == "formed":
            supervisor.formed_generation(frame[1], frame[2])
        elif kind == "restart":
            supervisor.effects([RestartJob(frame[1], frame[2], frame[3])])
        elif kind == "relaunch":
            lives = dict(frame[2])
            ws = IdRuns.of(sorted(lives)) if lives else EMPTY
            supervisor.effects([Relaunch(frame[1], ws, tuple(lives[w] for w in ws))])
        elif kind == "job_failed":
            supervisor.effects([JobFailed(frame[1])])
        elif kind == "verdict":
            _, ask_id, ok, first, complete, reason = frame
            ask = self.asks.pop(ask_id, None)
            if ask is not None:
                supervisor.commit_answered(ask, CommitVerdict(ok, reason, first, complete))
        elif kind == "life":
            supervisor.life_given(frame[1], frame[2])
        elif kind == "committed":
            _, w, life, gen, step, ok, first, complete, reason, record, held = frame
            ask = CommitAsk(None, w, life, gen, step, record, 0.0, 0)
            supervisor.commit_answered(ask, CommitVerdict(ok, reason, first, complete), held)
        elif kind == "released":
            supervisor.gate_released()
        else:
            raise wire.WireError(f"{kind} is not a frame a keeper sends")

    def took_over(self, term: int) -> None:
        """A keeper of ``term`` serves: the workers ask again, repaired nodes get lives."""
        if term != self.term:
            raise wire.WireError(f"the keeper says term {term}, etcd said {self.term}")
        first, self.served = not self.served, True
        self.crashes = 0
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

    def node_up(self, now: float, worker: int) -> None:
        if self.up:
            self._send("node_up", worker)
        else:
            self.pending_lives.append(worker)

    def commit(self, now: float, ask: CommitAsk) -> None:
        if not self.up:
            self.supervisor.commit_answered(ask, LOST)
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
