"""A host agent: ``python -m real.host --keeper ADDR:PORT --token-file F --host H``.

One per host (as torchrun's elastic agent is one per machine), running on
the host (in hosts mode, inside the host's network namespace). It connects
to the keeper service, proves it holds the run's secret (the same HMAC
challenge-response a worker answers, with a ``host_hello``), says which host
it is, and then only does what it is told and reports what happened:

- ``start`` (worker, incarnation, spare): start that worker life as a child
  (``python -m real.worker``), pointed at the keeper's address for its own
  connection and the TCPStore, and at this host's address (the one this
  agent's connection to the keeper leaves from) for its gloo groups;
- ``signal`` (worker, incarnation, SIGKILL | SIGSTOP | SIGCONT): send it;
- ``lose``: die at once with every worker, reporting nothing (a lost
  machine, where no one can take the link down for the keeper);
- every child is held by a pidfd; when one exits the agent reaps it and
  reports ``exited`` (worker, incarnation, returncode: negative for a signal).

It decides nothing: which lives run, when, and what an exit means are the
keeper's and the launcher's. When the keeper's connection ends, the run is
over for this host: the agent SIGKILLs and reaps its workers and exits.

The clock: workers stamp records with ``time.monotonic() - t0``, on the
keeper's scale. The ``setup`` frame carries the keeper's ``t0``, its clock
reading at sending, and its boot id: on the keeper's own machine (same boot
id: one monotonic clock) the agent uses ``t0`` itself; elsewhere it maps the
keeper's reading onto its own clock (off by the one-way delay of the frame).
"""

from __future__ import annotations

import argparse
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from real import wire
from real.procs import REPO_ROOT, python_env, signal_child, worker_log
from real.procs import die_with_parent as _die_with_parent  # serve() has a flag of the name
from real.relay import Relay

BOOT_ID = "/proc/sys/kernel/random/boot_id"
CONNECT_TIMEOUT_S = 60.0  # the keeper may start after its hosts: retry this long


def boot_id() -> str:
    """This machine's boot id: equal on two processes exactly when they share a
    monotonic clock (same machine, same boot)."""
    try:
        return Path(BOOT_ID).read_text().strip()[:64]
    except OSError:
        return ""


@dataclass
class Child:
    worker: int
    incarnation: int
    popen: subprocess.Popen
    pidfd: int
    log: object


class HostAgent:
    def __init__(self, keeper: tuple[str, int], key: bytes, token_file: str, host: int) -> None:
        self.keeper = keeper
        self.key = key
        self.token_file = str(Path(token_file).resolve())
        self.host = host
        self.sel = selectors.DefaultSelector()
        self.children: dict[tuple[int, int], Child] = {}
        self.reader = wire.FrameReader(wire.TO_HOST)
        self.sock = self.connect()
        self.address = self.sock.getsockname()[0]  # this host's address, as the keeper sees it
        self.relay = Relay(self.sel, keeper)  # the workers' keeper link (``delay``)
        self.run_dir: Optional[str] = None
        self.t0: Optional[float] = None
        self.pending: list[tuple] = []  # orders that came before the setup (none should)

    def connect(self) -> socket.socket:
        """Connect to the keeper, retrying (bounded) while it is not listening yet."""
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while True:
            try:
                sock = socket.create_connection(self.keeper, timeout=5)
                break
            except socket.gaierror:
                raise
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)  # bounded retry of a connect, not a synchronising sleep
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def handshake(self) -> list[tuple]:
        """Answer the challenge with a ``host_hello``; the frames after it."""
        self.sock.settimeout(30)
        frames: list = []
        while not frames:
            data = self.sock.recv(wire.MAX_HELLO)
            if not data:
                raise ConnectionError("the keeper closed the connection before its challenge")
            frames = self.reader.feed(data)
        kind, nonce, run = frames[0]
        if kind != "challenge":
            raise ConnectionError(f"the keeper's first frame is {kind!r}, not a challenge")
        self.reader.authenticated()
        pid = os.getpid()
        self.send(("host_hello", self.host, pid, wire.host_mac(self.key, nonce, run, self.host, pid)))
        self.sock.settimeout(None)
        return frames[1:] + self.reader.more()

    def send(self, frame: tuple) -> None:
        try:
            self.sock.sendall(wire.encode(frame))
        except OSError:
            pass  # the keeper is gone: the loop sees the end of its connection

    # --- orders ---------------------------------------------------------------------

    def order(self, frame: tuple) -> None:
        kind = frame[0]
        if kind == "setup":
            _, self.run_dir, t0, keeper_now, their_boot = frame
            self.t0 = t0 if their_boot and their_boot == boot_id() else time.monotonic() - keeper_now
            for f in self.pending:
                self.order(f)
            self.pending.clear()
        elif self.run_dir is None:
            self.pending.append(frame)
        elif kind == "start":
            self.start(*frame[1:])
        elif kind == "signal":
            self.kill((frame[1], frame[2]), frame[3])
        elif kind == "lose":
            self.lose()
        elif kind == "delay":
            self.relay.set_delay(frame[1])

    def kill(self, key: tuple[int, int], sig: int) -> None:
        """Signal a worker of this host (one that has exited is left alone)."""
        child = self.children.get(key)
        if child is not None and child.popen.returncode is None:
            signal_child(child.popen.pid, child.pidfd, sig)  # a SIGSTOP: once all stopped

    def start(self, worker: int, incarnation: int, spare: bool) -> None:
        assert self.run_dir is not None and self.t0 is not None
        if (worker, incarnation) in self.children:
            return  # a life starts once
        path = worker_log(self.run_dir, worker, incarnation)
        path.parent.mkdir(parents=True, exist_ok=True)
        log = open(path, "ab")
        cmd = [sys.executable, "-m", "real.worker", "--keeper-host", self.keeper[0],
               "--port", str(self.keeper[1]), "--link-port", str(self.relay.port),
               "--addr", self.address,
               "--worker", str(worker), "--incarnation", str(incarnation),
               "--t0", repr(self.t0), "--run-dir", self.run_dir, "--secret-file", self.token_file]
        if spare:
            cmd.append("--spare")
        env = python_env()
        env.setdefault("OMP_NUM_THREADS", "1")
        popen = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 env=env, cwd=str(REPO_ROOT))
        child = Child(worker, incarnation, popen, os.pidfd_open(popen.pid), log)
        self.children[(worker, incarnation)] = child
        self.sel.register(child.pidfd, selectors.EVENT_READ, child)
        self.send(("started", worker, incarnation, popen.pid))

    def reap(self, child: Child, report: bool = True) -> None:
        code = child.popen.wait(timeout=10)
        self.sel.unregister(child.pidfd)
        os.close(child.pidfd)
        child.log.close()
        del self.children[(child.worker, child.incarnation)]
        if report:
            self.send(("exited", child.worker, child.incarnation, code))

    def kill_all(self) -> None:
        """SIGKILL and reap every worker; report nothing (the run is over here)."""
        for child in list(self.children.values()):
            if child.popen.returncode is None:
                try:
                    child.popen.kill()
                except OSError:
                    pass
        for child in list(self.children.values()):
            self.reap(child, report=False)

    def lose(self) -> None:
        """The machine dies: every worker and this agent at once, nothing reported."""
        for child in self.children.values():
            try:
                os.kill(child.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        os.kill(os.getpid(), signal.SIGKILL)

    # --- the loop -------------------------------------------------------------------

    def run(self) -> int:
        """Serve orders until the keeper's connection ends; 0, or 1 when it never got a setup."""
        for frame in self.handshake():
            self.order(frame)
        self.sel.register(self.sock, selectors.EVENT_READ, None)
        try:
            while True:
                due = self.relay.next_due()
                wait = None if due is None else max(0.0, due - time.monotonic())
                # the keeper's orders first: a pause ordered before a roll
                # call was relayed is in force before the worker can read it
                events = sorted(self.sel.select(wait), key=lambda e: e[0].data is not None)
                for key, mask in events:
                    if isinstance(key.data, Child):
                        self.reap(key.data)
                    elif key.data is not None:
                        self.relay.event(key.data, mask, time.monotonic())
                    elif not self.readable():
                        return 0 if self.run_dir is not None else 1
                self.relay.flush(time.monotonic())
        finally:
            self.kill_all()
            self.relay.close()
            self.sock.close()

    def readable(self) -> bool:
        """Carry out the orders that arrived; False when the connection ended."""
        try:
            data = self.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        if not data:
            return False
        try:
            frames = self.reader.feed(data)
        except wire.WireError as exc:
            print(f"rollcall host: bad frame from the keeper: {exc}", file=sys.stderr)
            return False
        for frame in frames:
            self.order(frame)
        return True


def serve(keeper: tuple[str, int], token_file: str, host: int, die_with_parent: bool = False) -> int:
    """Run one host agent; the exit status. Bad input: one line on stderr, 2."""
    try:
        key = wire.read_secret(token_file)
    except (OSError, wire.WireError) as exc:
        print(f"rollcall host: --token-file {token_file}: {getattr(exc, 'strerror', None) or exc}",
              file=sys.stderr)
        return 2
    signal.signal(signal.SIGINT, signal.SIG_IGN if die_with_parent else signal.default_int_handler)
    if die_with_parent:
        _die_with_parent()
    try:
        agent = HostAgent(keeper, key, token_file, host)
    except OSError as exc:
        print(f"rollcall host: cannot reach the keeper at {keeper[0]}:{keeper[1]}: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return 2
    try:
        return agent.run()
    except (ConnectionError, wire.WireError, socket.timeout) as exc:
        print(f"rollcall host: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def main(argv: Optional[list[str]] = None) -> int:
    from rollcall.cli_args import OneLineParser, parse_keeper

    p = OneLineParser(prog="python -m real.host")
    p.add_argument("--keeper", type=parse_keeper, required=True, metavar="ADDR:PORT")
    p.add_argument("--token-file", required=True, metavar="F")
    p.add_argument("--host", type=int, required=True, metavar="H")
    p.add_argument("--die-with-parent", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.host < 0:
        p.error(f"--host: must be >= 0, got {args.host}")
    return serve(args.keeper, args.token_file, args.host, args.die_with_parent)


if __name__ == "__main__":
    raise SystemExit(main())
