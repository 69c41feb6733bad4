"""A throwaway etcd v3 cluster on loopback, for a run or a test.

:class:`EtcdCluster` starts N members of the ``etcd`` binary (Debian's
``etcd-server``), every client and peer URL on 127.0.0.1 (or, given
``addresses`` and a ``spawn``, each member in a host namespace of the run,
on its address) with ports the kernel chose (bind port 0), each member's
data under one directory. With a
``secret`` it turns etcd's own authentication on from the client side
(user ``root``, password the run's secret, role ``root``, ``auth enable``),
so every client connection must present a token obtained with the secret
(:mod:`real.keeper_store`). Peer links are plain HTTP on loopback: etcd
authenticates peers only with TLS client certificates, which a run does not
make; nothing off this machine can reach them.

Every process it starts is SIGKILLed by its PID and reaped on ``stop()``,
which is idempotent and also runs at interpreter exit (atexit) and when the
``with`` block ends, however it ends; the members also die with the thread
that started them (PR_SET_PDEATHSIG), so a SIGKILLed test leaves none.
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import IO, Any, Callable, Optional, Sequence
from urllib.parse import urlsplit

from etcd3gw import exceptions as gw_errors

from rollcall import interrupts
from real.procs import die_with_parent
from etcd3gw.client import Etcd3Client

POLL_S = 0.05  # between two looks at a starting cluster's health
HEARTBEAT_MS, ELECTION_MS = 50, 500  # raft timing on loopback (see EtcdCluster._command)
KILL_WAIT_S = 10.0  # for a SIGKILLed member to be reaped

Spawn = Callable[..., "subprocess.Popen[bytes]"]  # (member, argv, **popen_kwargs) -> the process

# Every started cluster in this interpreter, so atexit can stop the ones a
# caller forgot (or an exception skipped).
_LIVE: set["EtcdCluster"] = set()


@atexit.register
def _stop_all() -> None:
    for cluster in list(_LIVE):
        cluster.stop()


class EtcdError(RuntimeError):
    """The cluster could not be started, or a member misbehaved."""


def etcd_binary() -> Optional[str]:
    """The etcd server binary's path (``$ROLLCALL_ETCD``, else ``etcd`` on
    PATH, else Debian's /usr/bin/etcd), or None when there is none: callers
    (tests) skip and name the ``etcd-server`` package."""
    for cand in (os.environ.get("ROLLCALL_ETCD"), shutil.which("etcd"), "/usr/bin/etcd"):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def free_ports(n: int) -> list[int]:
    """``n`` distinct loopback ports the kernel hands out now (all held open
    until every one is chosen, so none is chosen twice)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def gateway(url: str, path: str, body: dict[str, Any], timeout_s: float,
            token: Optional[str] = None) -> dict[str, Any]:
    """One POST to the v3 JSON gateway of the member at ``url`` (an
    etcd3gw client: its errors are ``etcd3gw.exceptions.Etcd3Exception``)."""
    parts = urlsplit(url)
    client = Etcd3Client(host=parts.hostname or "127.0.0.1", port=parts.port or 2379,
                         protocol=parts.scheme or "http", timeout=timeout_s, api_path="/v3/")
    if token is not None:
        client.session.headers["Authorization"] = token
    try:
        return client.post(client.get_url(path), json=body)  # type: ignore[no-any-return]
    finally:
        client.session.close()


class EtcdCluster:
    """``members`` etcd processes on 127.0.0.1, data under ``data_dir``.

    ``start()`` waits for a leader; ``kill(i)``/``restart(i)`` a member;
    ``stop()`` kills and reaps them all and deletes their data (``keep_data``
    keeps it). ``endpoints``: the client URLs. A context manager.
    """

    def __init__(self, data_dir: str | Path, members: int = 3, secret: Optional[str] = None,
                 binary: Optional[str] = None, keep_data: bool = False,
                 addresses: Optional[Sequence[str]] = None,
                 spawn: Optional[Spawn] = None) -> None:
        """``addresses``: each member's IP (default 127.0.0.1 for all); with
        ``spawn(i, argv, **popen_kwargs)`` member ``i`` is started elsewhere
        than here (a host's network namespace, :meth:`real.netns.Network.spawn`,
        whose address it then has)."""
        if isinstance(members, bool) or not isinstance(members, int) or members < 1:
            raise ValueError(f"members: a positive int, got {members!r}")
        if secret is not None and (not isinstance(secret, str) or not secret):
            raise ValueError("secret: a non-empty str (the run's secret) or None")
        found = binary or etcd_binary()
        if found is None:
            raise EtcdError("no etcd binary (Debian: apt-get install etcd-server)")
        self.binary = found
        self.dir = Path(data_dir)
        self.secret = secret
        self.keep_data = keep_data
        self.addresses = list(addresses) if addresses is not None else ["127.0.0.1"] * members
        if len(self.addresses) != members:
            raise ValueError(f"addresses: one per member ({members}), got {len(self.addresses)}")
        self._start: Spawn = spawn or (lambda i, argv, **kw: subprocess.Popen(argv, **kw))
        ports = free_ports(2 * members)
        self.client_ports, self.peer_ports = ports[:members], ports[members:]
        self.endpoints = [f"http://{a}:{p}" for a, p in zip(self.addresses, self.client_ports)]
        self.names = [f"m{i}" for i in range(members)]
        self.procs: list[Optional[subprocess.Popen[bytes]]] = [None] * members
        self.started_pids: list[int] = []  # every PID this cluster ever started
        self._logs: list[Optional[IO[bytes]]] = [None] * members
        self._token: Optional[str] = None
        self._cluster_token = f"rollcall-{secrets.token_hex(6)}"

    # --- processes -------------------------------------------------------------------

    def member_dir(self, i: int) -> Path:
        return self.dir / self.names[i]

    def log_path(self, i: int) -> Path:
        return self.dir / f"{self.names[i]}.log"

    def _command(self, i: int, state: str) -> list[str]:
        peers = [f"http://{a}:{p}" for a, p in zip(self.addresses, self.peer_ports)]
        peer = peers[i]
        initial = ",".join(f"{n}={u}" for n, u in zip(self.names, peers))
        return [self.binary, "--name", self.names[i], "--data-dir", str(self.member_dir(i)),
                "--listen-client-urls", self.endpoints[i],
                "--advertise-client-urls", self.endpoints[i],
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", initial, "--initial-cluster-token", self._cluster_token,
                "--initial-cluster-state", state, "--logger", "zap", "--log-outputs", "stderr",
                # loopback: a lost leader is replaced within about half a second
                # (the defaults, 100 ms and 1 s, are for networks), and leases
                # as short as 1 s are granted (etcd's floor is 1.5 election timeouts)
                "--heartbeat-interval", str(HEARTBEAT_MS), "--election-timeout", str(ELECTION_MS)]

    def _spawn(self, i: int, state: str) -> None:
        self.member_dir(i).mkdir(parents=True, exist_ok=True, mode=0o700)
        self.member_dir(i).chmod(0o700)
        log = open(self.log_path(i), "ab")
        # the user's ETCD_* settings would silently override the flags
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
        try:
            with interrupts.shielded():  # started and recorded, or neither
                # a session of its own: a terminal's Ctrl-C is the launcher's to handle
                proc = self._start(i, self._command(i, state), stdin=subprocess.DEVNULL,
                                   stdout=log, stderr=log, env=env, close_fds=True,
                                   start_new_session=True, preexec_fn=die_with_parent)
                self.procs[i], self._logs[i] = proc, log
                self.started_pids.append(proc.pid)
                _LIVE.add(self)
        except BaseException:
            if self._logs[i] is not log:
                log.close()
            raise

    def pid(self, i: int) -> Optional[int]:
        """Member ``i``'s PID while it runs, else None."""
        proc = self.procs[i]
        return proc.pid if proc is not None and proc.poll() is None else None

    def kill_now(self) -> None:
        """SIGKILL every member at once, waiting for none (:meth:`stop` reaps them)."""
        for proc in self.procs:
            if proc is not None and proc.returncode is None:
                try:
                    os.kill(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def kill(self, i: int) -> None:
        """SIGKILL member ``i`` (by its PID) and reap it."""
        proc = self.procs[i]
        self.procs[i] = None
        if proc is not None:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=KILL_WAIT_S)
        log = self._logs[i]
        self._logs[i] = None
        if log is not None:
            log.close()

    def stop(self) -> None:
        """Kill and reap every member; delete their data unless ``keep_data``.
        Idempotent."""
        try:
            for i in range(len(self.procs)):
                self.kill(i)
        finally:
            _LIVE.discard(self)
            if not self.keep_data:
                for i in range(len(self.names)):
                    shutil.rmtree(self.member_dir(i), ignore_errors=True)

    def __enter__(self) -> "EtcdCluster":
        """Starts the cluster unless ``start()`` did (``with c.start(60):`` works too)."""
        if any(p is not None for p in self.procs):
            return self
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- start-up and health --------------------------------------------------------

    def start(self, timeout_s: float = 30.0) -> "EtcdCluster":
        """Start every member; return once the cluster has a leader and every
        member answers a linearizable read (at most ``timeout_s``), with auth
        enabled first when there is a secret."""
        if any(p is not None for p in self.procs):
            raise EtcdError("start(): the cluster was started already")
        deadline = time.monotonic() + timeout_s
        try:
            for i in range(len(self.names)):
                self._spawn(i, "new")
            self._wait(range(len(self.names)), deadline, timeout_s)
            if self.secret is not None:
                self._enable_auth(deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def restart(self, i: int, timeout_s: float = 30.0) -> None:
        """Start the killed member ``i`` again on its data and ports; return
        once it answers as part of the cluster."""
        if self.pid(i) is not None:
            raise EtcdError(f"restart({i}): member {self.names[i]} still runs")
        self.kill(i)  # reap and close what is left of it
        self._spawn(i, "existing")
        self._wait([i], time.monotonic() + timeout_s, timeout_s)

    def _wait(self, members: Any, deadline: float, timeout_s: float) -> None:
        pending = list(members)
        last = "no answer yet"
        while pending:
            for i in list(pending):
                proc = self.procs[i]
                if proc is None or proc.poll() is not None:
                    raise EtcdError(f"etcd member {self.names[i]} exited at start-up: "
                                    f"{self._log_tail(i)}")
                try:
                    self._healthy(i, max(0.2, min(2.0, deadline - time.monotonic())))
                    pending.remove(i)
                except gw_errors.Etcd3Exception as exc:
                    last = f"{self.names[i]}: {exc.detail_text or type(exc).__name__}"
                except EtcdError as exc:
                    last = f"{self.names[i]}: {exc}"
            if pending and time.monotonic() > deadline:
                raise EtcdError(f"etcd cluster not ready after {timeout_s} s ({last})")
            if pending:
                time.sleep(POLL_S)  # a bounded poll of the members' health

    def _healthy(self, i: int, timeout_s: float) -> None:
        status = gateway(self.endpoints[i], "/maintenance/status", {}, timeout_s)
        if int(status.get("leader", 0)) == 0:
            raise EtcdError("no leader yet")
        token = None
        if self._token is not None:  # auth is on: a token from this member itself
            # (simple tokens live in each member's memory: a restarted one lost them)
            got = gateway(self.endpoints[i], "/auth/authenticate",
                          {"name": "root", "password": self.secret}, timeout_s)
            token = str(got["token"])
        # a linearizable read goes through the leader: the member is in the quorum
        gateway(self.endpoints[i], "/kv/range", {"key": "aGVhbHRo"}, timeout_s, token)

    def _enable_auth(self, deadline: float) -> None:
        """User ``root`` with the secret, role ``root``, auth on (as
        ``etcdctl auth enable`` does), then a token for the health checks."""
        url = self.endpoints[0]

        def left() -> float:
            return max(0.5, deadline - time.monotonic())

        gateway(url, "/auth/role/add", {"name": "root"}, left())
        gateway(url, "/auth/user/add", {"name": "root", "password": self.secret}, left())
        gateway(url, "/auth/user/grant", {"user": "root", "role": "root"}, left())
        gateway(url, "/auth/enable", {}, left())
        got = gateway(url, "/auth/authenticate", {"name": "root", "password": self.secret}, left())
        self._token = str(got["token"])

    def leader_index(self, timeout_s: float = 2.0) -> Optional[int]:
        """Which member is the raft leader now (None: none answers or none
        leads): a fault that kills the leader costs an election (about a
        second), one that kills a follower costs nothing."""
        for i, url in enumerate(self.endpoints):
            if self.pid(i) is None:
                continue
            try:
                status = gateway(url, "/maintenance/status", {}, timeout_s)
            except gw_errors.Etcd3Exception:
                continue
            if int(status.get("leader", 0)) == int(status["header"]["member_id"]):
                return i
        return None

    def _log_tail(self, i: int, chars: int = 600) -> str:
        try:
            return self.log_path(i).read_text(errors="replace")[-chars:].strip()
        except OSError:
            return "(no log)"
