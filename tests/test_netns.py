"""Hosts as network namespaces (real/netns.py): reachability, faults, and cleanup.

These need root (or CAP_NET_ADMIN and CAP_SYS_ADMIN) and nftables; elsewhere they
skip with netns_available()'s reason. CI runs as root, so CI runs them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
import shutil
import socket
import subprocess
import sys
from typing import Callable, Optional

import pytest

from real.netns import NETNS_DIR, Network, netns_available
from tests.polling import wait_for

REASON = netns_available()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

PORT = 7000
PR_CAPBSET_DROP = 24
CAP_NET_ADMIN = 12
SO_RCVBUFFORCE = 33  # Linux; the socket module does not name it
ECHO = f"""
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", {PORT}))
s.listen(16)
while True:
    c, _ = s.accept()
    c.settimeout(5)
    c.sendall(c.recv(64))
    c.close()
"""
CLIENT = """
import socket, sys
try:
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))
    s.sendall(b"ping")
    print("ok" if s.recv(64) == b"ping" else "bad echo")
except OSError as e:
    print("fail", type(e).__name__)
"""
CONNECT_ONLY = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
    print("ok")
except OSError as e:
    print("fail", type(e).__name__)
"""


def probe(net: Network, host: int, addr: str, port: int = PORT, timeout_s: float = 5.0,
          code: str = CLIENT) -> str:
    """Run a TCP client inside ``host``: "ok" when ``addr`` answered. A blocked
    address times out after ``timeout_s``, so that bounds every negative check."""
    p = net.spawn(host, [sys.executable, "-c", code, addr, str(port), str(timeout_s)],
                  stdout=subprocess.PIPE, text=True)
    out, _ = p.communicate(timeout=timeout_s + 30)
    return out.strip()


def echo_in(net: Network, host: int) -> subprocess.Popen:
    """An echo server inside ``host``, returned once the root namespace reaches it."""
    server = net.spawn(host, [sys.executable, "-c", ECHO])
    wait_for(lambda: root_reaches(net.address(host)), 30, "the echo server")
    return server


def root_reaches(addr: str, port: int = PORT) -> bool:
    try:
        with socket.create_connection((addr, port), timeout=5) as s:
            s.sendall(b"ping")
            return s.recv(64) == b"ping"
    except OSError:
        return False


def leftovers(net: Network) -> list[str]:
    """Whatever of ``net``'s prefix is still in the root namespace or /var/run/netns."""
    from pyroute2 import IPRoute

    with IPRoute() as ip:
        links = [l.get_attr("IFLA_IFNAME") for l in ip.get_links()]
    names = os.listdir(NETNS_DIR) if os.path.isdir(NETNS_DIR) else []
    return [n for n in links + names if n.startswith(net.prefix)]


def alive(pid: int, start: Optional[str]) -> bool:
    """Whether the process ``pid`` that started at ``start`` still runs (not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z" and fields[19] == start


def start_time(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[19]


def chains(net: Network, host: int) -> list[str]:
    """The chains of our nft table inside ``host`` (listed by nft run there)."""
    p = net.spawn(host, [shutil.which("nft", path="/usr/sbin:/sbin:" + os.environ.get("PATH", "")),
                         "list", "table", "inet", "rollcall"], stdout=subprocess.PIPE, text=True)
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 0
    return [line.split()[1] for line in out.splitlines() if line.strip().startswith("chain ")]


def test_reachable_then_partition_and_heal() -> None:
    with Network("t-part", 3) as net:
        assert len({net.address(h) for h in range(3)} | {net.keeper_address}) == 4
        echo_in(net, 0)
        assert probe(net, 1, net.address(0)) == "ok"
        assert probe(net, 2, net.address(0)) == "ok"
        cut = net.partition([2])
        assert probe(net, 2, net.address(0), timeout_s=1.0) == "fail TimeoutError"
        assert probe(net, 1, net.address(0)) == "ok"
        assert chains(net, 2) == [f"{cut.chain}_input", f"{cut.chain}_output"]
        net.heal(cut)
        assert chains(net, 2) == []
        assert probe(net, 2, net.address(0)) == "ok"
        net.heal(cut)  # a second heal is a no-op


def test_partition_cuts_the_keeper_too_but_not_the_group() -> None:
    with Network("t-group", 3) as net:
        echo_in(net, 0)
        echo_in(net, 1)
        net.partition([1, 2])
        assert probe(net, 2, net.address(1)) == "ok"          # inside the group
        assert probe(net, 2, net.address(0), timeout_s=1.0) == "fail TimeoutError"
        assert not root_reaches(net.address(1))                # from the keeper's side
        assert root_reaches(net.address(0))


def test_partition_from_some_peers_only() -> None:
    with Network("t-peers", 3) as net:
        echo_in(net, 0)
        echo_in(net, 1)
        net.partition([2], peers=[0])
        assert probe(net, 2, net.address(0), timeout_s=1.0) == "fail TimeoutError"
        assert probe(net, 2, net.address(1)) == "ok"
        assert probe(net, 1, net.address(0)) == "ok"


def drop_net_admin(libc: ctypes.CDLL) -> Callable[[], None]:
    """A preexec_fn: drop CAP_NET_ADMIN from the bounding set, so the program the
    child execs runs without it, as root in an unprivileged container would."""
    def drop() -> None:
        if libc.prctl(PR_CAPBSET_DROP, CAP_NET_ADMIN, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")
    return drop


def test_without_net_admin_a_one_line_reason() -> None:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    out = subprocess.run([sys.executable, "-c", "from real.netns import netns_available as a; print(a())"],
                         cwd=root, env={**os.environ, "PYTHONPATH": root}, preexec_fn=drop_net_admin(libc),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "hosts as network namespaces need root or CAP_NET_ADMIN\n"


def count_udp(net: Network, sender: int, n: int) -> int:
    """Datagrams of ``n`` sent from ``sender`` to the keeper address that arrive;
    read until 0.5 s pass with none (bounded: the sender has exited by then). A
    datagram dropped at the sender's output hook fails its sendto with EPERM."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx:
        rx.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 1 << 20)  # past rmem_max: none lost to a full buffer
        rx.bind((net.keeper_address, 0))
        code = ("import socket, sys\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                f"for i in range({n}):\n"
                "    try: s.sendto(b'x', (sys.argv[1], int(sys.argv[2])))\n"
                "    except PermissionError: pass  # dropped at this host's output hook\n")
        p = net.spawn(sender, [sys.executable, "-c", code, net.keeper_address, str(rx.getsockname()[1])])
        assert p.wait(timeout=30) == 0
        got = 0
        while got < n and select.select([rx], [], [], 0.5)[0]:
            rx.recv(64)
            got += 1
        return got


def test_loss_drops_all_or_some() -> None:
    with Network("t-loss", 2) as net:
        assert count_udp(net, 1, 200) == 200
        echo_in(net, 1)
        total = net.loss(1, 1.0)
        assert count_udp(net, 1, 200) == 0
        assert probe(net, 0, net.address(1), timeout_s=1.0) == "fail TimeoutError"  # inbound too
        net.heal(total)
        some = net.loss(1, 0.5)
        assert 20 <= count_udp(net, 1, 200) <= 180
        net.heal(some)
        assert probe(net, 0, net.address(1)) == "ok"
        with pytest.raises(ValueError):
            net.loss(1, 1.5)


def test_isolate_blocks_only_the_keeper() -> None:
    with Network("t-iso", 3) as net:
        echo_in(net, 0)
        with socket.socket() as keeper:
            keeper.bind((net.keeper_address, 0))
            keeper.listen(16)
            port = keeper.getsockname()[1]
            assert probe(net, 1, net.keeper_address, port, code=CONNECT_ONLY) == "ok"
            gray = net.isolate(1)
            assert probe(net, 1, net.keeper_address, port, 1.0, CONNECT_ONLY) == "fail TimeoutError"
            assert probe(net, 1, net.address(0)) == "ok"        # peers still reachable
            assert probe(net, 2, net.keeper_address, port, code=CONNECT_ONLY) == "ok"
            net.heal(gray)
            assert probe(net, 1, net.keeper_address, port, code=CONNECT_ONLY) == "ok"


def grandchild(net: Network, host: int) -> tuple[subprocess.Popen, int, str]:
    """A spawned process that leaves a child of its own behind in the namespace."""
    code = ("import os, sys, time\npid = os.fork()\nif pid == 0:\n    os.setsid()\n"
            "    while True: time.sleep(60)\nprint(pid, flush=True)\nwhile True: time.sleep(60)\n")
    p = net.spawn(host, [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pid = int(p.stdout.readline())
    return p, pid, start_time(pid)


def assert_clean(net: Network, procs: list[subprocess.Popen], orphans: list[tuple[int, str]]) -> None:
    assert leftovers(net) == []
    assert all(p.poll() is not None for p in procs)
    assert not any(alive(pid, start) for pid, start in orphans)


def test_exit_removes_everything_it_made() -> None:
    with Network("t-clean", 3) as net:
        server = echo_in(net, 0)
        parent, orphan, start = grandchild(net, 1)
        net.partition([2])
        assert len(leftovers(net)) == 1 + 3 + 3  # bridge, veths, namespaces
    assert_clean(net, [server, parent], [(orphan, start)])
    net.close()  # idempotent


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_error_inside_with_still_cleans_up(error: type) -> None:
    with pytest.raises(error):
        with Network("t-raise", 2) as net:
            server = echo_in(net, 1)
            parent, orphan, start = grandchild(net, 0)
            net.loss(0, 1.0)
            raise error("boom")
    assert_clean(net, [server, parent], [(orphan, start)])


def test_subnet_collision_is_refused_and_leaves_nothing() -> None:
    with Network("t-first", 1) as first:
        second = Network("t-second", 1, subnet=str(first.subnet))
        with pytest.raises(ValueError, match="collides"):
            with second:
                pass
        assert leftovers(second) == []
        mine = leftovers(first)
        assert len(mine) == 3  # bridge, veth, namespace
        with Network("t-third", 1) as third:
            assert not third.subnet.overlaps(first.subnet)
            assert third.prefix != first.prefix
        assert leftovers(third) == []
        assert leftovers(first) == mine  # another run's cleanup left ours alone


class InterruptedAtHost1(Network):
    """A network whose building is interrupted (Ctrl-C) after host 1's namespace exists."""

    def _join(self, h: int) -> None:
        if h == 1:
            raise KeyboardInterrupt
        super()._join(h)


def test_interrupt_while_building_leaves_nothing() -> None:
    net = InterruptedAtHost1("t-build", 3)
    with pytest.raises(KeyboardInterrupt):
        with net:
            raise AssertionError("not reached: building was interrupted")
    assert leftovers(net) == []


def test_a_taken_name_fails_without_deleting_the_owner() -> None:
    with Network("t-same", 1) as first:
        mine = leftovers(first)
        twin = Network("t-same", 1)  # same run id, same process: the same names
        assert twin.prefix == first.prefix
        with pytest.raises(Exception, match="exists"):
            with twin:
                pass
        assert leftovers(first) == mine
        echo_in(first, 0)  # and it still works
