"""Hosts as Linux network namespaces on one bridge, and network faults as nftables rules.

The real target's "machines" are network namespaces: a host lost or cut off then
behaves as a machine would (no exit notice, SYNs into the void), unlike a killed
process, whose pidfd reports at once. :class:`Network` creates one bridge and one
namespace per host, each joined by a veth pair, all through netlink (pyroute2),
never a shell-out to ``ip``. Everything it creates carries the run's prefix and is
recorded, so that cleanup removes exactly that and never another run's objects.

Faults are nftables rules in a table of our own (``table inet rollcall``) inside
the affected hosts' namespaces, one pair of base chains (input, output) per fault,
so that undoing a fault is deleting its chains; every dropping rule counts
what it drops (:meth:`Network.dropped`, the launcher's ``heal`` record):

- ``partition``: drop traffic between the given hosts and every other address on
  the bridge, the keeper's (the bridge's own) included;
- ``loss``: drop a fraction of the host's packets, each direction independently
  (``numgen random mod 1000``);
- ``isolate``: drop traffic between one host and one address (the keeper's): the
  gray failure, heartbeats stop while collectives still work.

Delay is not here: these machines' kernel has no ``sch_netem``, and nftables can
neither hold a packet back nor (no ``queue`` support) hand it to userspace. The
host agent delays its workers' keeper link in userspace instead (real/relay.py);
gloo's collectives run directly between hosts and are not delayed.

The hosts reach each other through the root namespace's bridge; where br_netfilter
is loaded, bridged packets also pass the root's iptables FORWARD chain, so a host
whose FORWARD policy drops (Docker sets one) must accept the bridge's traffic.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
import ipaddress
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from rollcall import interrupts

NFT_TABLE = "rollcall"
NETNS_DIR = "/var/run/netns"
CAP_NET_ADMIN_BIT = 12
CAP_SYS_ADMIN_BIT = 21  # mounting /var/run/netns/<name> needs it too
CLEANUP_WAIT_S = 10.0
CLONE_NEWNET = 0x40000000
CANDIDATES = 55 * 256  # the /24s of 10.200.0.0 to 10.254.255.255


def _nft_binary() -> Optional[str]:
    return shutil.which("nft") or shutil.which("nft", path="/usr/sbin:/sbin")


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def _unshare_net() -> None:
    if _libc().unshare(CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET)")


def netns_available() -> Optional[str]:
    """None when this process can build a :class:`Network`, else a one-line
    reason: the tests skip with it and the CLI exits 2 with it. The probe is
    real: nft lists its tables inside a fresh, throwaway namespace."""
    try:
        with open("/proc/self/status") as f:
            caps = next(int(l.split()[1], 16) for l in f if l.startswith("CapEff:"))
    except (OSError, StopIteration, ValueError):
        return "cannot read this process's capabilities from /proc/self/status"
    for bit, name in ((CAP_NET_ADMIN_BIT, "CAP_NET_ADMIN"), (CAP_SYS_ADMIN_BIT, "CAP_SYS_ADMIN")):
        if not caps >> bit & 1:
            return f"hosts as network namespaces need root or {name}"
    nft = _nft_binary()
    if nft is None:
        return "nftables' nft binary not found (install the nftables package)"
    try:
        subprocess.run([nft, "list", "tables"], preexec_fn=_unshare_net, capture_output=True,
                       text=True, timeout=30, check=True)
    except subprocess.CalledProcessError as e:
        first = (e.stderr or "").strip().splitlines() or [f"exit status {e.returncode}"]
        return f"nft does not work here: {first[0]}"
    except subprocess.TimeoutExpired:
        return "nft did not answer within 30 s"
    except OSError as e:
        return f"cannot run {nft}: {e.strerror}"
    except subprocess.SubprocessError:  # the preexec_fn, unshare, failed
        return "cannot create a network namespace (unshare(CLONE_NEWNET) failed)"
    return None


def _used_networks(ip: Any) -> list[ipaddress.IPv4Network]:
    """The IPv4 destinations routed (every table, the default route aside) and
    the networks of the addresses held in the namespace of ``ip``."""
    used = [ipaddress.ip_network(f"{r.get_attr('RTA_DST')}/{r['dst_len']}", strict=False)
            for r in ip.get_routes(family=socket.AF_INET, table=0) if r["dst_len"] > 0]
    return used + [ipaddress.ip_network(f"{a.get_attr('IFA_ADDRESS')}/{a['prefixlen']}", strict=False)
                   for a in ip.get_addr(family=socket.AF_INET)]


def _pids_in(namespaces: Sequence[str]) -> set[int]:
    """Live processes whose network namespace is one of ``namespaces`` (paths)."""
    inodes = set()
    for path in namespaces:
        try:
            st = os.stat(path)
        except OSError:
            continue
        inodes.add((st.st_dev, st.st_ino))
    found = set()
    for entry in os.listdir("/proc") if inodes else ():
        try:
            st = os.stat(f"/proc/{entry}/ns/net") if entry.isdigit() else None
        except OSError:
            continue
        if st is not None and (st.st_dev, st.st_ino) in inodes:
            found.add(int(entry))
    return found


def _counted(rule: str) -> str:
    """A dropping rule with a counter before its verdict (see :meth:`Network.dropped`)."""
    assert rule.endswith(" drop"), rule
    return rule[: -len("drop")] + "counter drop"


@dataclass(frozen=True)
class Fault:
    """A fault in force: the hosts whose namespaces hold its chains, and their name."""
    kind: str
    hosts: tuple[int, ...]
    chain: str


class Network:
    """A bridge and ``hosts`` namespaces for one run; use as a context manager.

    Names: ``rc-<6 hex>-h<N>`` (namespace), ``-br`` (bridge), ``-v<N>`` (veth,
    bridge side), ``-p<N>`` (veth, host side); at most 15 bytes (IFNAMSIZ).
    The bridge holds ``.1`` of the subnet (the keeper's endpoint on the root
    side); host N holds ``.N+2``.
    """

    def __init__(self, run_id: str, hosts: int, subnet: Optional[str] = None) -> None:
        if not 1 <= hosts <= 250:
            raise ValueError(f"hosts must be 1..250, got {hosts}")
        self.run_id = run_id
        self.hosts = hosts
        self.prefix = "rc-" + hashlib.sha256(f"{run_id}:{os.getpid()}".encode()).hexdigest()[:6]
        self.requested_subnet = subnet
        self.subnet: Optional[ipaddress.IPv4Network] = None
        self.bridge = f"{self.prefix}-br"
        self.created: list[tuple[str, str]] = []  # ("link" | "netns", name), in order made
        self.spawned: list[subprocess.Popen] = []
        self.faults: dict[str, Fault] = {}
        self._serial = 0
        self._nft = _nft_binary()
        assert len(f"{self.prefix}-v{hosts - 1}") <= 15

    def __enter__(self) -> "Network":
        try:
            self.open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def netns(self, host: int) -> str:
        assert 0 <= host < self.hosts, host
        return f"{self.prefix}-h{host}"

    def address(self, host: int) -> str:
        assert self.subnet is not None and 0 <= host < self.hosts, host
        return str(self.subnet[host + 2])

    @property
    def keeper_address(self) -> str:
        """The bridge's own address: a root-namespace endpoint every host reaches."""
        assert self.subnet is not None
        return str(self.subnet[1])

    def _pick_subnet(self, ip: Any) -> ipaddress.IPv4Network:
        """The requested subnet, or a private /24, that overlaps no route or address
        of the root namespace (another run's bridge included); the scan starts at a
        point derived from the prefix so that concurrent runs rarely try the same one."""
        used = _used_networks(ip)
        if self.requested_subnet is not None:
            net = ipaddress.ip_network(self.requested_subnet)
            if not (net.version == 4 and net.is_private and net.num_addresses >= self.hosts + 4):
                raise ValueError(f"subnet {net} must be a private IPv4 range with room for {self.hosts} hosts")
            if any(net.overlaps(u) for u in used):
                raise ValueError(f"subnet {net} collides with an existing route")
            return net
        start = int(self.prefix[3:], 16)
        for k in range(CANDIDATES):
            i = (start + k) % CANDIDATES
            net = ipaddress.ip_network(f"10.{200 + i // 256}.{i % 256}.0/24")
            if not any(net.overlaps(u) for u in used):
                return net
        raise RuntimeError("no free private /24 for the bridge")

    def open(self) -> None:
        """Create the bridge, then each host; every object is recorded (``_make``)
        so that a failure or Ctrl-C part way leaves nothing behind."""
        from pyroute2 import IPRoute, netns

        # No IPRoute stays open across a fork (netns.create and IPRoute(netns=)
        # fork children): a child inherits the open one's epoll instance, and
        # its exit could unregister the parent's socket there, leaving the
        # parent waiting forever for a netlink answer (seen: a hang at the
        # second veth, most runs from the CLI).
        with IPRoute() as ip:
            self.subnet = self._pick_subnet(ip)
            self._make("link", self.bridge, lambda: ip.link("add", ifname=self.bridge, kind="bridge"))
            br = ip.link_lookup(ifname=self.bridge)[0]
            ip.addr("add", index=br, address=self.keeper_address, prefixlen=self.subnet.prefixlen)
            ip.link("set", index=br, state="up")
        for h in range(self.hosts):
            self._make("netns", self.netns(h), lambda: netns.create(self.netns(h)))
            self._join(h)

    def _make(self, kind: str, name: str, create: Callable[[], Any]) -> None:
        """Create one object, recorded first: a Ctrl-C during ``create`` still has
        it removed, while a failure (the name taken) forgets it, never deleting
        what is not ours."""
        assert name.startswith(self.prefix + "-"), name
        self.created.append((kind, name))
        try:
            create()
        except Exception:
            self.created.pop()
            raise

    def _join(self, h: int) -> None:
        """Join host ``h`` to the bridge: a veth pair, its far end moved into the
        namespace and given the host's address; loopback up there."""
        from pyroute2 import IPRoute

        outer, inner = f"{self.prefix}-v{h}", f"{self.prefix}-p{h}"
        with IPRoute() as ip:
            self._make("link", outer, lambda: ip.link("add", ifname=outer, kind="veth", peer=inner))
            ip.link("set", index=ip.link_lookup(ifname=inner)[0], net_ns_fd=self.netns(h))
            v = ip.link_lookup(ifname=outer)[0]
            ip.link("set", index=v, master=ip.link_lookup(ifname=self.bridge)[0])
            ip.link("set", index=v, state="up")
        with IPRoute(netns=self.netns(h), flags=0) as ns:
            ns.link("set", index=ns.link_lookup(ifname="lo")[0], state="up")
            p = ns.link_lookup(ifname=inner)[0]
            ns.addr("add", index=p, address=self.address(h), prefixlen=self.subnet.prefixlen)
            ns.link("set", index=p, state="up")

    def _preexec(self, host: int, then: Any = None) -> tuple[int, Any]:
        """An fd on the host's namespace (opened here, in the parent) and a
        preexec_fn that moves the child, after fork and before exec, into it."""
        from pyroute2 import netns

        libc = _libc()  # loaded here: find_library would run ldconfig in the child
        fd = os.open(os.path.join(NETNS_DIR, self.netns(host)), os.O_RDONLY | os.O_CLOEXEC)

        def enter() -> None:
            netns.setns(fd, flags=0, libc=libc)
            if then is not None:
                then()

        return fd, enter

    def spawn(self, host: int, argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen:
        """Start ``argv`` inside host ``host``'s namespace; close() kills it and
        whatever it left in the namespace. By default in a session of its own, so a
        terminal's Ctrl-C reaches only the launcher, which then cleans up."""
        assert self.subnet is not None, "spawn() on a network not open"
        fd, enter = self._preexec(host, popen_kwargs.pop("preexec_fn", None))
        popen_kwargs.setdefault("start_new_session", True)
        try:
            with interrupts.shielded():  # started and recorded, or neither
                proc = subprocess.Popen(list(argv), preexec_fn=enter, **popen_kwargs)
                self.spawned = [p for p in self.spawned if p.returncode is None] + [proc]
        finally:
            os.close(fd)
        return proc

    def kill_now(self) -> None:
        """SIGKILL what we spawned and everything inside our namespaces at
        once, waiting for none (a second signal; :meth:`close` reaps and
        removes after)."""
        for proc in self.spawned:
            if proc.returncode is None:
                try:
                    os.kill(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for pid in _pids_in([os.path.join(NETNS_DIR, n) for k, n in self.created if k == "netns"]):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _nft_run(self, host: int, script: str) -> str:
        """Run an nft script inside host ``host``'s namespace, where the rules act;
        returns what nft printed."""
        assert self._nft is not None, "nft not found"
        p = self.spawn(host, [self._nft, "-f", "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
        out, err = p.communicate(script, timeout=30)
        if p.returncode != 0:
            raise RuntimeError(f"nft in {self.netns(host)} failed: {err.strip()}")
        return out

    def _add(self, kind: str, hosts: Sequence[int], rules: Sequence[str]) -> Fault:
        """Install one fault as its own input and output base chains in each host's
        table, each rule once per direction (``$ADDR``: saddr in, daddr out; ``$IF``:
        iifname in, oifname out). Half-installed, it is removed again."""
        assert hosts and all(0 <= h < self.hosts for h in hosts), hosts
        self._serial += 1
        chain = f"{kind}{self._serial}"
        script = [f"add table inet {NFT_TABLE}"]
        for hook, addr, iface in (("input", "saddr", "iifname"), ("output", "daddr", "oifname")):
            name = f"{chain}_{hook}"
            script.append(f"add chain inet {NFT_TABLE} {name} {{ type filter hook {hook} priority 0; }}")
            script += [f"add rule inet {NFT_TABLE} {name} " + _counted(r).replace("$ADDR", addr)
                       .replace("$IF", iface) for r in rules]
        done: list[int] = []  # nft -f is one transaction: a host holds all of it or none
        try:
            for h in hosts:
                self._nft_run(h, "\n".join(script) + "\n")
                done.append(h)
        except BaseException:
            self.faults[chain] = Fault(kind, tuple(done), chain)
            self.heal(self.faults[chain])
            raise
        self.faults[chain] = Fault(kind, tuple(hosts), chain)
        return self.faults[chain]

    def partition(self, hosts: Sequence[int], peers: Optional[Sequence[int]] = None) -> Fault:
        """Cut ``hosts`` off from ``peers`` (default: every other address on the
        bridge, the keeper's included, and IPv6 on the link, so no way round it);
        the hosts still reach each other."""
        group = sorted(set(hosts))
        if peers is None:
            inside = "{ " + ", ".join(self.address(h) for h in group) + " }"
            return self._add("part", group, [f"ip $ADDR {self.subnet} ip $ADDR != {inside} drop",
                                             'meta nfproto ipv6 $IF != "lo" drop'])
        others = sorted(set(peers) - set(group))
        assert others, "partition with no peers to cut"
        return self._add("part", group, ["ip $ADDR { " + ", ".join(self.address(p) for p in others) + " } drop"])

    def loss(self, host: int, rate: float) -> Fault:
        """Drop a fraction ``rate`` of host ``host``'s packets, each direction independently."""
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"loss rate must be in [0, 1], got {rate}")
        per_mille = round(rate * 1000)
        cond = "" if per_mille >= 1000 else f"numgen random mod 1000 < {per_mille} "
        return self._add("loss", [host], [f'$IF != "lo" {cond}drop'])

    def isolate(self, host: int, addr: Optional[str] = None) -> Fault:
        """Drop traffic between host ``host`` and ``addr`` only (default: the keeper's)."""
        target = ipaddress.ip_address(addr or self.keeper_address)
        assert target.version == 4, target
        return self._add("iso", [host], [f"ip $ADDR {target} drop"])

    def dropped(self, fault: Fault) -> int:
        """Packets ``fault``'s rules have dropped so far, in and out, on all its
        hosts (each rule counts): the evidence that a fault did cut something."""
        if fault.chain not in self.faults:
            return 0
        total = 0
        for h in fault.hosts:
            for hook in ("input", "output"):
                listing = self._nft_run(h, f"list chain inet {NFT_TABLE} {fault.chain}_{hook}\n")
                total += sum(int(n) for n in re.findall(r"counter packets (\d+)", listing))
        return total

    def heal(self, fault: Fault) -> None:
        """Undo ``fault`` (any kind) by deleting its chains; a second heal is a no-op."""
        if self.faults.pop(fault.chain, None) is None:
            return
        for h in fault.hosts:
            self._nft_run(h, f"delete chain inet {NFT_TABLE} {fault.chain}_input\n"
                             f"delete chain inet {NFT_TABLE} {fault.chain}_output\n")

    def set_link(self, host: int, up: bool) -> None:
        """Take host ``host``'s link down (its bridge-side veth: nothing goes in or
        out, as when a machine loses power or its cable) or bring it back up."""
        from pyroute2 import IPRoute

        assert 0 <= host < self.hosts, host
        with IPRoute() as ip:
            (v,) = ip.link_lookup(ifname=f"{self.prefix}-v{host}")
            ip.link("set", index=v, state="up" if up else "down")

    def kill_host(self, host: int) -> list[int]:
        """SIGKILL every process inside host ``host``'s namespace at once, until
        none is left (bounded); reap those we spawned. Returns the pids killed."""
        path = [os.path.join(NETNS_DIR, self.netns(host))]
        killed: list[int] = []
        deadline = time.monotonic() + CLEANUP_WAIT_S
        while pids := _pids_in(path):
            if time.monotonic() > deadline:
                raise RuntimeError(f"processes {sorted(pids)} survive in {self.netns(host)}")
            for pid in pids - set(killed):
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except ProcessLookupError:
                    pass
            time.sleep(0.001)  # bounded poll for the kernel to finish the kills
        for proc in self.spawned:
            if proc.pid in killed:
                proc.wait(timeout=CLEANUP_WAIT_S)
        return killed

    def _kill_all(self) -> None:
        """SIGKILL what we spawned, then anything still inside our namespaces
        (a spawned process's children), until none is left, bounded."""
        for proc in self.spawned:
            if proc.poll() is None:
                proc.kill()
        for proc in self.spawned:
            proc.wait(timeout=CLEANUP_WAIT_S)
        deadline = time.monotonic() + CLEANUP_WAIT_S
        while pids := _pids_in([os.path.join(NETNS_DIR, n) for k, n in self.created if k == "netns"]):
            if time.monotonic() > deadline:
                raise RuntimeError(f"processes {sorted(pids)} survive in {self.prefix}'s namespaces")
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.01)  # bounded poll for the kernel to finish the kills

    def close(self) -> None:
        """Remove everything this run created, newest first; idempotent. Every
        step is tried; the first failure is raised after the rest are done."""
        from pyroute2 import IPRoute, netns

        errors: list[BaseException] = []
        try:
            self._kill_all()
        except Exception as e:
            errors.append(e)
        with IPRoute() as ip:
            while self.created:
                kind, name = self.created[-1]
                assert name.startswith(self.prefix + "-"), name
                try:
                    if kind == "link":
                        for idx in ip.link_lookup(ifname=name):
                            ip.link("del", index=idx)
                    elif name in netns.listnetns():
                        netns.remove(name)
                except Exception as e:
                    errors.append(e)
                self.created.pop()
        self.faults.clear()
        if errors:
            raise errors[0]
