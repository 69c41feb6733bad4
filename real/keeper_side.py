"""The keeper side of a run with ``keeper.store: etcd``: etcd and the keeper processes.

:class:`KeeperSide` starts, on the launcher's behalf, a 3-member etcd
cluster on loopback (unless ``keeper.etcd_endpoints`` names the user's)
and ``1 + keeper.standbys`` keeper processes (:mod:`real.keeper_proc`),
gives each its way to etcd (a host namespace of its own in hosts mode,
else relays of its own, :class:`EtcdPaths`), replaces one that ends,
carries out the faults on them (kill the serving keeper, cut it from
etcd, kill an etcd member) and stops every one, by PID, at the run's end.
Which keeper serves, and the link to it, are
:class:`real.keeper_link.RemoteKeeper`'s.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlsplit

from rollcall import interrupts
from rollcall.core import DRIVER, rec

from real.keeper_finder import write_keeper_json
from real.keeper_port import Supervisor
from real.keeper_proc import DEPOSED_EXIT
from real.keeper_store import KeeperStore, StoreUnavailable, read_password
from real.procs import die_with_parent, last_line, python_env, release
from real.relay import Relay

__all__ = ["ETCD_MEMBERS", "EtcdPaths", "KeeperHosts", "KeeperProc", "KeeperSide",
           "START_TIMEOUT_S", "keeper_hosts"]

START_TIMEOUT_S = 60.0  # etcd's start, and the first keeper's from the processes' start
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

class KeeperSide:
    """etcd and the keeper processes of one run (``prefix``: its keys in etcd)."""

    def __init__(self, supervisor: Supervisor, sel: selectors.BaseSelector, prefix: str) -> None:
        k = supervisor.sc.keeper
        self._supervisor = supervisor
        self._sel = sel
        self.prefix = prefix
        self.ttl_s = float(k.lease_ttl_s)
        self.standbys = int(k.standbys)
        self.etcd: Any = None  # the run's own cluster (real.etcd.EtcdCluster), if it has one
        self.endpoints = list(k.etcd_endpoints or ())
        self.store: Optional[KeeperStore] = None
        self.procs: list[KeeperProc] = []
        self.paths = EtcdPaths()  # each keeper's relays to etcd (partition_keeper cuts them)
        self.cut: Optional[KeeperProc] = None  # the keeper cut off from etcd now
        self.cut_rule: Any = None  # hosts mode: the nftables partition doing it
        self.hosts: Optional[KeeperHosts] = None  # hosts mode, the run's own etcd
        self.next_candidate = 0
        self.crashes = 0  # keeper processes that crashed since a keeper last took over

    @property
    def users_cluster(self) -> bool:
        """``keeper.etcd_endpoints``: the record lives in the user's etcd."""
        return self._supervisor.sc.keeper.etcd_endpoints is not None

    @property
    def user(self) -> str:
        return self._supervisor.sc.keeper.etcd_user or "root"

    def password_file(self) -> Optional[str]:
        """The user's password file, made absolute against the launcher's
        directory (the keeper processes run in the run's)."""
        path = self._supervisor.sc.keeper.etcd_password_file
        return None if path is None else str(Path(path).expanduser().resolve())

    def password(self) -> Optional[str]:
        """etcd's password: the run's secret for the run's own cluster, the
        user's (read from its file now) for theirs, None where theirs has no auth."""
        if not self.users_cluster:
            return self._supervisor.secret.hex()
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
        """etcd (unless the user's), the record's store and the keeper processes."""
        if not self.endpoints:
            from real.etcd import EtcdCluster

            net, sc = self._supervisor.network, self._supervisor.sc
            if net is not None and keeper_hosts(sc.keeper):  # the launcher made them hosts
                self.hosts = KeeperHosts.after(net, sc.n_hosts, self.standbys)
            where: dict[str, Any] = {}
            if self.hosts is not None:
                h = self.hosts
                where = {"addresses": [h.network.address(e) for e in h.etcd],
                         "spawn": lambda i, argv, **kw: h.network.spawn(h.etcd[i], argv, **kw)}
            self.etcd = EtcdCluster(self._supervisor.real_dir / "etcd", members=ETCD_MEMBERS,
                                    secret=self._supervisor.secret.hex(), **where)
            self.etcd.start(timeout_s=START_TIMEOUT_S)
            self.endpoints = list(self.etcd.endpoints)
        self.store = KeeperStore(self.endpoints, self.prefix, secret=self.password(),
                                 timeout_s=max(1.0, self.ttl_s / 2), user=self.user)
        if self._supervisor.sc.keeper.worker_links == "direct":
            # what each worker needs to find the keeper in etcd itself
            net = self._supervisor.network
            assert net is None or self.hosts is not None, "refused: direct, hosts, the user's etcd"
            auth = ("secret" if not self.users_cluster else
                    "none" if self.password_file() is None else "file")
            write_keeper_json(self._supervisor.real_dir, self.endpoints, self.prefix, auth,
                              self.user, self.password_file())
        for _ in range(1 + self.standbys):
            self.spawn()

    def spawn(self) -> None:
        """One more keeper process: on a host of its own in hosts mode (the
        slot a dead one left), reaching etcd directly; else on this machine,
        through relays of its own (:class:`EtcdPaths`)."""
        supervisor, c = self._supervisor, self.next_candidate
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
               "--candidate", str(c), "--t0", repr(supervisor.t0),
               "--secret-file", str(supervisor.secret_path),
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
        self._sel.register(kp.pidfd, selectors.EVENT_READ, ("kproc", kp))

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
        """Kill and reap every keeper process and etcd member this run started;
        the user's etcd keeps its keys no longer (its cluster outlives the run)."""
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
                self._supervisor.write(rec(self._supervisor.now(), "info", "etcd_cleanup",
                                           DRIVER, prefix=self.prefix, error=str(exc)))
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
        release(self._sel, kp.pidfd, kp.log)
        self.paths.shut(kp.paths)
        kp.paths = []

    # --- faults ------------------------------------------------------------------------

    def serving(self, leader: Optional[str]) -> Optional[KeeperProc]:
        """The process of the keeper named ``leader`` (``keeper-<candidate>``)."""
        return next((p for p in self.procs if f"keeper-{p.candidate}" == leader), None)

    def kill(self, leader: Optional[str]) -> bool:
        """``kill_keeper: active``: SIGKILL the serving keeper's process (False: none runs)."""
        kp = self.serving(leader)
        if kp is None or kp.popen.poll() is not None:
            return False
        kp.popen.send_signal(signal.SIGKILL)
        return True

    def cut_off(self, leader: Optional[str]) -> bool:
        """``partition_keeper: active``: the serving keeper loses etcd but not
        the launcher (False: none serves, or one is cut already). In hosts
        mode an nftables partition of its host from the etcd members'
        hosts; else its relays hold what it sends."""
        kp = self.serving(leader)
        if kp is None or self.cut is not None:
            return False
        self.cut = kp
        if kp.host is not None:
            assert self.hosts is not None
            self.cut_rule = self.hosts.network.partition([kp.host], peers=list(self.hosts.etcd))
        else:
            self.paths.cut(kp.paths, True)
        return True

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

    # --- ends ---------------------------------------------------------------------------

    def ended(self) -> list[KeeperProc]:
        """The keeper processes that ended and are not reaped yet (before the
        launcher's selector reads their pidfds)."""
        return [kp for kp in self.procs if kp.popen.poll() is not None]

    def reap_exited(self, kp: KeeperProc) -> None:
        """A keeper process ended: reap it, and say so in the history."""
        self._reap(kp, kill=False)
        self.procs.remove(kp)
        supervisor = self._supervisor
        supervisor.write(rec(supervisor.now(), "info", "keeper_exit", DRIVER,
                             candidate=kp.candidate, returncode=kp.popen.returncode))

    def replace(self, kp: KeeperProc) -> None:
        """A standby takes the place of the ended ``kp`` (the run keeps 1 +
        standbys), unless the run is over or keepers keep crashing (an exit
        that is not a deposition nor a kill): after ``KEEPER_CRASHES_MAX``
        since a keeper last took over, the run ends in error."""
        supervisor, code = self._supervisor, kp.popen.returncode
        if code is not None and code > 0 and code != DEPOSED_EXIT:
            self.crashes += 1
            if self.crashes >= KEEPER_CRASHES_MAX:
                log = supervisor.real_dir / "logs" / f"keeper-{kp.candidate}.log"
                supervisor.finish("error", f"{self.crashes} keeper processes crashed since a "
                                           f"keeper last took over, the last with exit code "
                                           f"{code}: {last_line(log)} (see {log})")
        if supervisor.result is None:
            self.spawn()

    def took_over(self) -> None:
        """A keeper took over: the crashes are counted afresh."""
        self.crashes = 0
