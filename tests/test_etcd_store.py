"""The keeper's etcd store (real/keeper_store.py) on a real 3-member etcd
cluster on loopback (real/etcd.py), auth on: leadership, terms, the
compare-and-set of generations, fencing of a deposed keeper, a dead member,
and that no etcd process or data outlives the cluster."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from polling import pid_running, wait_for
from real.etcd import EtcdCluster, etcd_binary, free_ports
from real.keeper_store import KeeperStore, Leadership, StoreDenied, StoreUnavailable

pytestmark = pytest.mark.skipif(
    etcd_binary() is None,
    reason="no etcd binary: install Debian's etcd-server (tools/debian-packages.sh)")

SECRET = "3f9c0d1e2b7a4c5d6e8f90a1b2c3d4e5"
START_S = 60.0  # start-up beside a CPU hog
OP_S = 10.0  # every store operation's bound


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    data = tmp_path_factory.mktemp("etcd")
    c = EtcdCluster(data, members=3, secret=SECRET)
    with c.start(timeout_s=START_S):
        yield c
    # stopped: every process it ever started is gone, and so is its data
    assert not [pid for pid in c.started_pids if pid_running(pid)]
    assert not [p for p in data.iterdir() if p.is_dir()], list(data.iterdir())


def store(cluster: EtcdCluster, prefix: str = "") -> KeeperStore:
    """A store on a prefix of its own, so the tests share the cluster in any order."""
    return KeeperStore(cluster.endpoints, prefix or f"/rollcall-test/{uuid.uuid4().hex}",
                       secret=SECRET, timeout_s=OP_S)


def test_campaign_leader_commit_round_trip(cluster: EtcdCluster) -> None:
    s = store(cluster)
    assert s.leader() is None and s.last_generation() is None
    a = s.campaign("keeper-a", "127.0.0.1:7001", ttl_s=30)
    assert a is not None and a.term == 1 and a.ttl_s >= 30
    assert s.leader() == (1, "keeper-a", "127.0.0.1:7001")
    assert s.campaign("keeper-b", "127.0.0.1:7002", ttl_s=30) is None  # a holds the lease
    assert s.keep_alive(a)
    assert s.commit_generation(a, 1, {"members": [0, 1, 2]})
    assert s.commit_generation(a, 2, {"members": [0, 2]})
    assert s.last_generation() == {"generation": 2, "term": 1, "record": {"members": [0, 2]}}
    # a held leadership does not change under a bounded watch
    assert s.wait_leader_change(0.2) == (1, "keeper-a", "127.0.0.1:7001")
    terms = [a.term]
    holder = a
    for name in ("keeper-b", "keeper-c", "keeper-a"):
        s.resign(holder)
        assert not s.keep_alive(holder)
        nxt = s.campaign(name, "127.0.0.1:7003", ttl_s=30)
        assert nxt is not None
        terms.append(nxt.term)
        holder = nxt
    assert terms == sorted(set(terms)), terms  # strictly increasing
    s.resign(holder)
    s.delete_prefix()
    assert s.leader() is None and s.last_generation() is None


def test_commit_refuses_skipped_and_repeated_generations(cluster: EtcdCluster) -> None:
    s = store(cluster)
    a = s.campaign("keeper-a", "127.0.0.1:7001", ttl_s=30)
    assert a is not None
    assert s.commit_generation(a, 4, {"g": 4})  # none stored: any generation may start
    assert not s.commit_generation(a, 6, {"g": 6})  # skips 5
    assert not s.commit_generation(a, 4, {"g": "other"})  # 4 decided already
    assert not s.commit_generation(a, 3, {"g": 3})  # behind
    assert s.commit_generation(a, 5, {"g": 5})
    # the very same decision again (a retry whose answer was lost) is no second decision
    assert s.commit_generation(a, 5, {"g": 5})
    assert s.last_generation() == {"generation": 5, "term": a.term, "record": {"g": 5}}
    # a restart writes the latest generation again, with its budget spent; only the latest
    assert not s.commit_generation(a, 4, {"g": 4, "restarts": 1}, again=True)
    assert not s.commit_generation(a, 6, {"g": 6, "restarts": 1}, again=True)
    assert s.commit_generation(a, 5, {"g": 5, "restarts": 1}, again=True)
    assert s.commit_generation(a, 5, {"g": 5, "restarts": 1}, again=True)  # a retry
    assert s.last_generation() == {"generation": 5, "term": a.term,
                                   "record": {"g": 5, "restarts": 1}}
    assert s.commit_generation(a, 6, {"g": 6})  # the next generation follows it
    s.resign(a)
    s.delete_prefix()


def test_a_resigned_keeper_is_fenced(cluster: EtcdCluster) -> None:
    s = store(cluster)
    a = s.campaign("keeper-a", "127.0.0.1:7001", ttl_s=30)
    assert a is not None and s.commit_generation(a, 1, {"by": "a"})
    s.resign(a)
    b = s.campaign("keeper-b", "127.0.0.1:7002", ttl_s=30)
    assert b is not None and b.term > a.term
    assert not s.commit_generation(a, 2, {"by": "a"})  # deposed: etcd refuses it
    assert not s.commit_generation(a, 1, {"by": "a", "restarts": 1}, again=True)
    assert s.commit_generation(b, 2, {"by": "b"})
    assert s.last_generation() == {"generation": 2, "term": b.term, "record": {"by": "b"}}
    s.resign(b)
    s.delete_prefix()


def test_an_expired_lease_deposes_and_the_standby_hears_at_once(cluster: EtcdCluster) -> None:
    s = store(cluster)
    standby = store(cluster, s.prefix)  # another keeper process's client
    a = s.campaign("keeper-a", "127.0.0.1:7001", ttl_s=1)  # etcd grants its minimum (2 s)
    assert a is not None and s.commit_generation(a, 1, {"by": "a"})
    # no keep-alive: the standby's watch returns when the lease lapses, not at its bound
    t0 = time.monotonic()
    assert standby.wait_leader_change(60.0) is None
    assert time.monotonic() - t0 < 30.0
    assert not s.keep_alive(a)
    b = standby.campaign("keeper-b", "127.0.0.1:7002", ttl_s=30)
    assert b is not None and b.term == a.term + 1
    assert not s.commit_generation(a, 2, {"by": "a"})  # the old keeper's late write
    assert standby.commit_generation(b, 2, {"by": "b"})
    assert s.last_generation() == {"generation": 2, "term": b.term, "record": {"by": "b"}}
    standby.resign(b)
    s.delete_prefix()


def test_one_dead_member_of_three_leaves_the_store_working(cluster: EtcdCluster) -> None:
    s = store(cluster)
    # the raft leader: the worst member to lose (an election before the next write)
    dead = wait_for(lambda: [i for i in [cluster.leader_index()] if i is not None],
                    OP_S, "an etcd leader")[0]
    old_pid = cluster.pid(dead)
    assert old_pid is not None
    cluster.kill(dead)
    try:
        assert not pid_running(old_pid) and cluster.pid(dead) is None
        a = s.campaign("keeper-a", "127.0.0.1:7001", ttl_s=30)
        assert a is not None and s.commit_generation(a, 1, {"members": [1, 2]})
        assert s.last_generation() == {"generation": 1, "term": a.term,
                                       "record": {"members": [1, 2]}}
        assert s.keep_alive(a)
    finally:
        cluster.restart(dead, timeout_s=START_S)
    assert cluster.pid(dead) not in (None, old_pid)
    # the restarted member answers on its own, with what was written while it was down
    alone = KeeperStore([cluster.endpoints[dead]], s.prefix, secret=SECRET, timeout_s=OP_S)
    got = wait_for(lambda: alone.last_generation(), OP_S, "the restarted member's read")
    assert got["generation"] == 1
    s.resign(a)
    s.delete_prefix()


def test_a_client_without_the_secret_is_refused(cluster: EtcdCluster) -> None:
    prefix = f"/rollcall-test/{uuid.uuid4().hex}"
    for secret in (None, "not-the-secret"):
        s = KeeperStore(cluster.endpoints, prefix, secret=secret, timeout_s=OP_S)
        with pytest.raises(StoreDenied):
            s.leader()
        with pytest.raises(StoreDenied):
            s.campaign("intruder", "127.0.0.1:1", ttl_s=30)
        with pytest.raises(StoreUnavailable):  # the one class callers catch
            s.last_generation()


def test_an_unreachable_store_raises_in_time() -> None:
    s = KeeperStore([f"http://127.0.0.1:{p}" for p in free_ports(2)], "/x", timeout_s=0.5)
    t0 = time.monotonic()
    with pytest.raises(StoreUnavailable, match="no answer"):
        s.leader()
    assert time.monotonic() - t0 < 5.0


def test_bad_input_gives_a_clear_error() -> None:
    with pytest.raises(ValueError, match="endpoints"):
        KeeperStore([], "/x")
    with pytest.raises(ValueError, match="endpoints"):
        KeeperStore(["127.0.0.1:2379"], "/x")
    with pytest.raises(ValueError, match="prefix"):
        KeeperStore(["http://127.0.0.1:2379"], "/")
    s = KeeperStore(["http://127.0.0.1:2379"], "/x")
    lead = Leadership(1, 1, "a", "127.0.0.1:1")
    with pytest.raises(ValueError, match="generation"):
        s.commit_generation(lead, -1, {})
    with pytest.raises(ValueError, match="JSON"):
        s.commit_generation(lead, 1, {"x": object()})
    with pytest.raises(ValueError, match="ttl_s"):
        s.campaign("a", "127.0.0.1:1", ttl_s=0)


def test_a_password_file_that_will_not_do_is_one_line(tmp_path: Path) -> None:
    """keeper.etcd_password_file: one line, trailing newline dropped; a
    FIFO is refused without blocking, as are a directory, a large file, a
    missing one and more than one line."""
    import os

    from real.keeper_store import read_password

    good = tmp_path / "pw"
    good.write_text("s3cret\n")
    assert read_password(good) == "s3cret"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    big, two = tmp_path / "big", tmp_path / "two"
    big.write_bytes(b"x" * 5000)
    two.write_text("a\nb\n")
    for path, needle in ((fifo, "not a regular file"), (tmp_path, "is a directory"),
                         (big, "larger than"), (tmp_path / "absent", "cannot read"),
                         (two, "one non-empty line")):
        with pytest.raises(ValueError, match=needle) as err:
            read_password(path)
        assert "\n" not in str(err.value)


def test_a_cluster_is_gone_after_its_with_block_even_on_an_exception(tmp_path: Path) -> None:
    c = EtcdCluster(tmp_path, members=1, secret=SECRET)
    with pytest.raises(RuntimeError, match="boom"):
        with c.start(timeout_s=START_S):
            assert c.pid(0) is not None
            raise RuntimeError("boom")
    assert c.started_pids and not [pid for pid in c.started_pids if pid_running(pid)]
    assert not c.member_dir(0).exists()
    c.stop()  # idempotent


def test_a_workers_finder_links_to_each_new_leader(cluster: EtcdCluster) -> None:
    """``keeper.worker_links: direct``: the worker's finder (real/keeper_finder.py)
    reads the leadership key, connects to the address it names and hands
    the socket over; while linked it watches the key and hands over a link
    to the next term's keeper as soon as that one leads; a lost link makes
    it look again at once (the same term is linked anew)."""
    import select
    import socket

    from real.keeper_finder import KeeperFinder

    s = store(cluster)
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    addr = [f"127.0.0.1:{ls.getsockname()[1]}" for ls in listeners]
    finder = KeeperFinder(store(cluster, s.prefix), ttl_s=60.0)

    def found() -> tuple[int, str, socket.socket]:
        def take():
            r, _, _ = select.select([finder.wake_r], [], [], 0.2)
            return finder.take() if r else None
        got = wait_for(take, OP_S, "the finder's link")
        assert len(got) == 1, got
        return got[0]

    try:
        assert not finder.take()  # nobody leads: nothing found
        a = s.campaign("keeper-a", addr[0], ttl_s=30)
        assert a is not None
        term, candidate, sock = found()
        assert (term, candidate) == (1, "keeper-a")
        listeners[0].accept()[0].close()
        sock.close()
        finder.link_state(1)
        s.resign(a)
        b = s.campaign("keeper-b", addr[1], ttl_s=30)
        assert b is not None and b.term == 2
        term, candidate, sock = found()  # the watch hears it
        assert (term, candidate) == (2, "keeper-b")
        sock.close()
        finder.link_state(None)  # the link to term 2 broke: the same keeper again
        term, _, sock = found()
        assert term == 2
        sock.close()
        s.resign(b)
    finally:
        finder.close()
        finder.thread.join(timeout=OP_S)
        assert not finder.thread.is_alive()
        for ls in listeners:
            ls.close()
