"""The record-keeper is not a single point of failure, on the real target.

``keeper.store: etcd``: the run starts its own 3-member etcd cluster on
loopback, one active keeper process and a standby. The tests kill the
active keeper (twice, with a worker killed between), kill one etcd member,
and check what the design promises: the run stays valid with the per-sample
ledger, no generation number is decided twice, terms only go up, one lost
etcd member changes nothing, and nothing the run started (workers, keepers,
etcd members) is left behind. Nothing sleeps to synchronise.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import psutil
import pytest

from polling import pid_running, wait_for
from real_processes import REAL_PROCESSES
from real.keeper_proc import DEPOSED_EXIT
from rollcall.results import read_history
from rollcall.scenario import Scenario, parse_scenario

pytestmark = REAL_PROCESSES


def _etcd_missing() -> str | None:
    from real.etcd import etcd_binary

    return None if etcd_binary() else "no etcd binary (Debian's etcd-server)"


skip_no_etcd = pytest.mark.skipif(_etcd_missing() is not None, reason=str(_etcd_missing()))


def _scenario(faults: str, steps: int = 60, workers: int = 3, ttl_s: float = 1.0,
              keeper: str = "",
              strategy: str = "kind: elastic, checkpoint_interval_steps: 10") -> Scenario:
    return parse_scenario(f"""
name: real-keeper-failover
target: real
cluster: {{workers: {workers}}}
workload: {{steps: {steps}, global_batch: 24, micro_batch: 4, dataset_samples: 480,
           model_params: 20000, lr: 0.05}}
detector: {{heartbeat_s: 0.1, timeout_s: 2.0}}
rendezvous: {{min_workers: 2, last_call_s: 0.2, join_timeout_s: 20.0}}
strategy: {{{strategy}}}
keeper: {{store: etcd, standbys: 1, lease_ttl_s: {ttl_s}{keeper}}}
failures:
  schedule: [{faults}]
""")


def _run(sc: Scenario, out: Path) -> tuple[dict[str, Any], list[dict]]:
    from real import driver

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    summary = driver.run(sc, out)
    left = [c for c in psutil.Process().children(recursive=True) if c.pid not in before]
    assert not left, f"processes left behind: {[(c.pid, c.cmdline()[:3]) for c in left]}"
    assert not [p["pid"] for p in summary["processes"] if pid_running(p["pid"])]
    return summary, list(read_history(out))


def _generations(recs: list[dict]) -> list[dict]:
    return [r for r in recs if r["f"] == "generation" and r["type"] == "ok"]


@skip_no_etcd
def test_the_active_keeper_killed_twice_and_a_worker_once(tmp_path: Path) -> None:
    sc = _scenario("{at_step: 12, kill_keeper: active}, {at_step: 25, kill: 1},"
                   " {at_step: 38, kill_keeper: active}")
    s, recs = _run(sc, tmp_path)
    assert s["completed"] and s["valid"], (s["end_reason"], s["violations"])
    assert s["samples_duplicated"] == 0 and s["samples_skipped"] == 0
    assert any(r["f"] == "contribute" and "samples" in r for r in recs), "the per-sample ledger"
    # Two kills, two failovers; a keeper starved past its 1 s lease (a busy
    # machine) deposes itself and costs one more, with its own record.
    lapses = [r for r in recs if r["f"] == "deposed" and r["reason"] == "lease-lapsed"]
    extra = len(lapses)
    mid_run = sum(1 for r in lapses if r["gen"] > 0)  # one before any generation opens no round
    assert s["keeper_failovers"] == 2 + extra
    assert len(s["keeper_failover_s"]) == 2 + mid_run  # an outage is timed while a job runs
    gens = _generations(recs)
    numbers = [g["gen"] for g in gens]
    assert numbers == sorted(set(numbers)), "no generation number decided twice"
    terms = [g.get("term", 0) for g in gens]
    assert terms == sorted(terms) and terms[-1] == 3 + extra, terms
    assert [g["reason"] for g in gens if g["reason"] == "failover"] == ["failover"] * (2 + mid_run)
    takeovers = [r for r in recs if r["f"] == "takeover"]
    assert [r["term"] for r in takeovers] == list(range(1, 4 + extra))


@skip_no_etcd
def test_restarts_spend_a_budget_the_next_keeper_keeps(tmp_path: Path) -> None:
    """Checkpoint-restart with the record in etcd and ``max_restarts: 1``.
    The first kill's restart writes its generation again with the budget
    spent (etcd takes it from the same term: nobody is deposed); the keeper
    that takes over at step 30 restores that budget and gives up at the
    next kill, with enough workers left to go on but no restart left."""
    sc = _scenario("{at_step: 12, kill: 1}, {at_step: 30, kill_keeper: active},"
                   " {at_step: 45, kill: 2}", workers=4,
                   strategy="kind: checkpoint-restart, checkpoint_interval_steps: 10, "
                            "max_restarts: 1")
    s, recs = _run(sc, tmp_path)
    assert not s["completed"] and "max_restarts=1 reached" in s["end_reason"], s["end_reason"]
    assert s["valid"], s["violations"]
    deposed = [r for r in recs if r["f"] == "deposed"]
    assert all(r["reason"] == "lease-lapsed" for r in deposed), deposed  # none store-refused
    # term 1 takes over at the start, term 2 at the kill (one more per keeper
    # a busy machine starved past its lease, as in the test above)
    order = [r["f"] for r in recs if r["f"] in ("restart", "takeover")]
    assert order.count("restart") == 1 and order.count("takeover") == 2 + len(deposed), order
    t_restart = next(r["t"] for r in recs if r["f"] == "restart")
    gave_up = [r for r in recs if r["f"] == "round" and r["type"] == "fail"]
    assert gave_up and any(t_restart < r["t"] < gave_up[-1]["t"]
                           for r in recs if r["f"] == "takeover"), "a successor gave up"


@skip_no_etcd
def test_keepers_that_crash_end_the_run_in_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A keeper process that crashes at every start (here: the run's scenario
    file it reads was damaged when the active keeper was killed) is not
    started without end: after ``KEEPER_CRASHES_MAX`` crashes since the last
    takeover the run ends in error, naming the exit code and the log's last
    line, and leaves nothing behind."""
    from real import keeper_link, keeper_side

    kill_active = keeper_link.RemoteKeeper.kill_active

    def damage_then_kill(self: Any) -> Any:
        (self.supervisor.real_dir / "scenario.json").write_text("not json")
        return kill_active(self)

    monkeypatch.setattr(keeper_link.RemoteKeeper, "kill_active", damage_then_kill)
    s, recs = _run(_scenario("{at_step: 5, kill_keeper: active}", steps=5000), tmp_path)
    assert s["result"] == "error" and not s["completed"], (s["result"], s["end_reason"])
    assert "keeper processes crashed" in s["end_reason"], s["end_reason"]
    assert "exit code 2: real.keeper_proc: Expecting value" in s["end_reason"], s["end_reason"]
    crashed = [r for r in recs if r["f"] == "keeper_exit" and r["returncode"] == 2]
    assert keeper_side.KEEPER_CRASHES_MAX <= len(crashed) < 4 * keeper_side.KEEPER_CRASHES_MAX, crashed


@skip_no_etcd
def test_one_etcd_member_lost_changes_nothing(tmp_path: Path) -> None:
    # the lease outlasts the election a lost etcd leader costs (about half a
    # second on loopback: real/etcd.py's raft timing); 4 s, not the default
    # 2 s, so that a busy machine starving the keeper for a second or two
    # (a lease lapse the tests above count) is not mistaken for the loss
    sc = _scenario("{at_step: 10, kill_etcd: 1}", steps=40, ttl_s=4.0)
    s, recs = _run(sc, tmp_path)
    assert s["completed"] and s["valid"], (s["end_reason"], s["violations"])
    assert [g["gen"] for g in _generations(recs)] == [1], "the job did not notice"
    assert s["keeper_failovers"] == 0
    assert any(r["f"] == "fault" and r.get("kind") == "kill_etcd" for r in recs)


@skip_no_etcd
def test_a_keeper_that_lost_its_lease_stops_deciding(tmp_path: Path) -> None:
    """The active keeper is frozen (SIGSTOP: as cut off from etcd, it cannot
    renew) past its lease: a standby of the next term takes over, the
    launcher follows etcd to it, and the old keeper, woken, finds its lease
    over on its own clock and deposes itself (exit 3) before it reads anything:
    nothing it could decide reaches a worker or etcd."""
    import os
    import signal
    import threading

    from polling import wait_for
    from rollcall.results import read_jsonl_so_far

    sc = _scenario("", steps=150, ttl_s=1.0)
    hist = tmp_path / "history.jsonl"
    done = threading.Event()
    frozen: list[int] = []
    errors: list[str] = []

    def keeper_pid() -> int | None:
        """The process of the keeper the launcher talks to (its ``keeper_link``)."""
        links = [r for r in read_jsonl_so_far(hist)
                 if r["f"] == "keeper_link" and r["reason"] == "connected"]
        if not links:
            return None
        number = links[-1]["candidate"].rsplit("-", 1)[1]
        for c in psutil.Process().children(recursive=True):
            cmd = c.cmdline()
            if "real.keeper_proc" in cmd and cmd[cmd.index("--candidate") + 1] == number:
                return c.pid
        return None

    def freeze_then_wake() -> None:
        try:
            wait_for(lambda: done.is_set() or any(
                r["f"] == "generation" for r in read_jsonl_so_far(hist)), 120, "generation 1")
            pid = keeper_pid()
            if done.is_set() or pid is None:
                return
            os.kill(pid, signal.SIGSTOP)
            frozen.append(pid)
            wait_for(lambda: done.is_set() or any(
                r["f"] == "takeover" and r["term"] == 2 for r in read_jsonl_so_far(hist)),
                60, "the standby's takeover")
        except AssertionError as exc:
            errors.append(str(exc))
        finally:
            for pid in frozen:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass

    t = threading.Thread(target=freeze_then_wake)
    t.start()
    try:
        s, recs = _run(sc, tmp_path)
    finally:
        done.set()
        t.join(timeout=30)
    assert not errors and frozen, errors or "the active keeper was never frozen"
    assert s["completed"] and s["valid"], (s["end_reason"], s["violations"])
    assert [r["term"] for r in recs if r["f"] == "takeover"][:2] == [1, 2]
    first = next(r["candidate"] for r in recs if r["f"] == "keeper_link")
    exits = {f"keeper-{r['candidate']}": r["returncode"] for r in recs if r["f"] == "keeper_exit"}
    assert exits.get(first) == 3, exits  # deposed: its lease lapsed on its own clock
    links = [r for r in recs if r["f"] == "keeper_link"]
    lost = [r["reason"] for r in links if r["reason"] != "connected"]
    # The launcher left the frozen keeper: on etcd's word of the new term, or,
    # where a busy machine delays that word, on the keeper's own exit.
    assert lost[:1] in (["superseded"], ["exited"]), lost
    later = [r["candidate"] for r in links if r["reason"] == "connected"][1:]
    assert later and first not in later, links  # and linked to another keeper
    gens = [g["gen"] for g in _generations(recs)]
    assert gens == sorted(set(gens))


@skip_no_etcd
def test_a_keeper_cut_off_from_etcd_stops_deciding(tmp_path: Path) -> None:
    """``partition_keeper``: the active keeper loses etcd (its relays to the
    members hold what it sends) but not its workers. It cannot renew, stops
    deciding when its lease ends on its own clock, and a standby of the next
    term takes over; nothing of the old term is decided after that."""
    sc = _scenario("{at_step: 12, partition_keeper: active, for_s: 2}", steps=200)
    s, recs = _run(sc, tmp_path)
    _assert_the_cut_keeper_was_replaced(s, recs)


def _assert_the_cut_keeper_was_replaced(s: dict[str, Any], recs: list[dict]) -> dict:
    """A ``partition_keeper`` run: valid; the cut keeper deposed itself on
    its own clock (exit 3) and a standby of the next term decided every
    later generation; the heal came. A keeper starved past its lease on a
    busy machine deposes itself too (exit 3) and costs one more term; no
    keeper is replaced otherwise. Returns the heal record."""
    assert s["completed"] and s["valid"], (s["end_reason"], s["violations"])
    takeovers = [r for r in recs if r["f"] == "takeover"]
    terms = [r["term"] for r in takeovers]
    assert terms == list(range(1, len(terms) + 1)), terms
    assert s["keeper_failovers"] == len(terms) - 1
    serving = {r["term"]: r["candidate"] for r in recs if r["f"] == "keeper_link"
               and r["process"] == "driver" and r["reason"] == "connected"}
    exits = {f"keeper-{r['candidate']}": r["returncode"] for r in recs if r["f"] == "keeper_exit"}
    # deposed without waiting on etcd past its lease: exit 3 well before the
    # job ends. Its deposed record may miss the history (a keeper starved
    # past the store's own expiry: the launcher follows etcd first).
    assert all(exits.get(serving[t]) == 3 for t in terms[:-1]), (serving, exits)
    assert all(r["reason"] == "lease-lapsed" for r in recs if r["f"] == "deposed"), recs
    cut = next(r for r in recs if r["f"] == "fault" and r["kind"] == "partition_keeper")
    assert cut["term"] < terms[-1], "a standby of a later term took over"
    replaced = next(r for r in takeovers if r["term"] == cut["term"] + 1)
    later = [g for g in _generations(recs) if g["t"] > replaced["t"]]
    assert later and all(g.get("term") > cut["term"] for g in later), later
    heal = [r for r in recs if r["f"] == "fault" and r["kind"] == "heal" and r["t"] > cut["t"]]
    assert heal, "the cut is healed after for_s"
    return heal[0]


def _assert_failovers(s: dict[str, Any], recs: list[dict], kills: int) -> list[int]:
    """Each of ``kills`` keepers killed is replaced by a keeper of the next
    term; a keeper starved past its lease on a busy machine deposes itself
    (exit 3, its ``deposed`` record may miss the history) and costs one
    more term; nothing else replaces a keeper. Returns the terms."""
    terms = [r["term"] for r in recs if r["f"] == "takeover"]
    assert terms == list(range(1, len(terms) + 1)), terms
    assert s["keeper_failovers"] == len(terms) - 1, (s["keeper_failovers"], terms)
    deposed = [r for r in recs if r["f"] == "keeper_exit" and r["returncode"] == DEPOSED_EXIT]
    assert len(terms) - 1 == kills + len(deposed), (terms, deposed)
    return terms


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _users_cluster(tmp_path: Path, root_password: str) -> Any:
    """An etcd cluster standing for the user's: auth on, and a user
    ``trainer`` whose role may read and write only under ``/rollcall/``."""
    from real.etcd import EtcdCluster, gateway

    cluster = EtcdCluster(tmp_path / "users-etcd", members=3, secret=root_password).start(60)
    url = cluster.endpoints[0]
    token = gateway(url, "/auth/authenticate", {"name": "root", "password": root_password},
                    10)["token"]
    for path, body in [
            ("/auth/role/add", {"name": "trainers"}),
            ("/auth/role/grant", {"name": "trainers", "perm": {
                "permType": "READWRITE", "key": _b64("/rollcall/"), "range_end": _b64("/rollcall0")}}),
            ("/auth/user/add", {"name": "trainer", "password": "pw-of-the-trainer"}),
            ("/auth/user/grant", {"user": "trainer", "role": "trainers"})]:
        gateway(url, path, body, 10, token)
    return cluster, token


@skip_no_etcd
@pytest.mark.parametrize("links", ["launcher", pytest.param("direct", marks=pytest.mark.slow)])
def test_a_users_etcd_cluster_with_a_user_of_its_own(tmp_path: Path, links: str) -> None:
    """``keeper.etcd_endpoints``: the record lives in the user's cluster, as
    the user ``keeper.etcd_user`` (password in ``etcd_password_file``) whose
    role reaches only ``/rollcall/``. The keeper fails over through it, the
    run leaves none of its keys there, the cluster keeps running, and the
    password is in none of the run's files. With direct links each worker
    reads the leadership key as that user too (the file's path, never the
    password, in the run's ``keeper.json``)."""
    from real.etcd import gateway

    cluster, token = _users_cluster(tmp_path, "root-pw-of-the-user")
    try:
        pw = tmp_path / "etcd-password"
        pw.write_text("pw-of-the-trainer\n")
        urls = ", ".join(f'"{u}"' for u in cluster.endpoints)
        sc = _scenario("{at_step: 12, kill_keeper: active}", steps=40, keeper=(
            f", etcd_endpoints: [{urls}], etcd_user: trainer, etcd_password_file: '{pw}',"
            f" worker_links: {links}"))
        from rollcall.app.checks import keeper_problem

        assert keeper_problem(sc) is None, "the CLI's check lets these credentials through"
        s, recs = _run(sc, tmp_path / "run")
        assert s["completed"] and s["valid"], (s["end_reason"], s["violations"])
        terms = _assert_failovers(s, recs, kills=1)
        if links == "direct":
            deciding = {g["term"] for g in _generations(recs) if g.get("term")}
            for worker, linked in _links_of_workers(recs).items():
                assert linked == sorted(set(linked)), (worker, linked)
                assert deciding <= set(linked) <= set(terms), (worker, deciding, linked)
        assert all(cluster.pid(i) is not None for i in range(3)), "the user's cluster runs on"
        left = gateway(cluster.endpoints[0], "/kv/range", {
            "key": _b64("/rollcall/"), "range_end": _b64("/rollcall0"), "count_only": True},
            10, token)
        assert int(left.get("count", 0)) == 0, "the run deletes its keys from the user's cluster"
        for f in (tmp_path / "run").rglob("*"):
            if f.is_file():
                assert b"pw-of-the-trainer" not in f.read_bytes(), f"the password is in {f}"
    finally:
        cluster.stop()


@skip_no_etcd
@pytest.mark.parametrize("case, needle", [
    ("wrong-password", "refused"),
    ("no-password-file", "cannot read the etcd password file"),
    ("no-credentials", "refused"),
    ("unreachable", "no answer"),
])
def test_a_users_etcd_cluster_that_will_not_do_is_refused_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, needle: str) -> None:
    """Credentials the user's cluster refuses, a password file that cannot
    be read, or a cluster that does not answer: ``rollcall run`` says which
    in one line and exits 2 before it starts anything."""
    from real.etcd import free_ports
    from rollcall.app import cli

    cluster, _ = _users_cluster(tmp_path, "root-pw-of-the-user")
    try:
        pw = tmp_path / "etcd-password"
        pw.write_text("not-the-password" if case == "wrong-password" else "pw-of-the-trainer")
        urls = list(cluster.endpoints)
        if case == "unreachable":
            urls = [f"http://127.0.0.1:{p}" for p in free_ports(1)]
        keeper = f"etcd_endpoints: [{', '.join(repr(u) for u in urls)}]"
        if case != "no-credentials":
            path = tmp_path / "absent" if case == "no-password-file" else pw
            keeper += f", etcd_user: trainer, etcd_password_file: '{path}'"
        scenario = tmp_path / "s.yaml"
        scenario.write_text("name: k\ntarget: real\ncluster: {workers: 2}\n"
                            f"keeper: {{store: etcd, standbys: 1, {keeper}}}\n")
        code = cli.main(["run", str(scenario), "--out", str(tmp_path / "out")])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and needle in err[0], err
        assert not (tmp_path / "out" / "history.jsonl").exists()
    finally:
        cluster.stop()


def _netns_missing() -> str | None:
    from real.netns import netns_available

    return netns_available()


@skip_no_etcd
@pytest.mark.skipif(_netns_missing() is not None, reason=str(_netns_missing()))
def test_a_keeper_host_cut_off_from_etcd_by_nftables(tmp_path: Path) -> None:
    """Hosts mode: each keeper process and each etcd member is on a host
    (network namespace) of its own, and ``partition_keeper`` is an nftables
    partition of the active keeper's host from the etcd hosts, a cut in the
    kernel, not in a relay. The keeper still reaches the launcher, cannot
    renew, deposes itself when its lease ends (exit 3), and a standby takes
    over; the rules dropped packets; nothing of the run is left."""
    from test_real_hosts import assert_nothing_left

    sc = _scenario("{at_step: 12, partition_keeper: active, for_s: 2}", steps=200, workers=4)
    sc = sc.model_copy(update={"cluster": sc.cluster.model_copy(update={"workers_per_host": 2})})
    sc = Scenario.model_validate(sc.model_dump())
    s, recs = _run(sc, tmp_path)
    heal = _assert_the_cut_keeper_was_replaced(s, recs)
    assert heal.get("dropped_packets", 0) > 0, heal  # the kernel's rules did the cutting
    assert_nothing_left(tmp_path, s)


# --- keeper.worker_links: direct: the workers find the keeper in etcd themselves ----------


def _links_of_workers(recs: list[dict]) -> dict[int, list[int]]:
    """The terms each worker linked to, from its own ``keeper_link`` records
    (the launcher's carry ``process: driver``)."""
    out: dict[int, list[int]] = {}
    for r in recs:
        if r["f"] == "keeper_link" and isinstance(r["process"], int) and r["reason"] == "connected":
            out.setdefault(r["process"], []).append(r["term"])
    return out


@skip_no_etcd
def test_workers_find_each_new_keeper_in_etcd_themselves(tmp_path: Path) -> None:
    """Direct links: the active keeper killed twice and a worker once, as
    above. Each surviving worker read the leadership key itself and linked
    to the keeper of every term (1, 2, 3); the run is valid with the ledger."""
    sc = _scenario("{at_step: 12, kill_keeper: active}, {at_step: 25, kill: 1},"
                   " {at_step: 38, kill_keeper: active}", keeper=", worker_links: direct")
    s, recs = _run(sc, tmp_path)
    assert s["completed"] and s["valid"], (s["end_reason"], s["violations"])
    assert s["samples_duplicated"] == 0 and s["samples_skipped"] == 0
    # two kills, two failovers; a keeper starved past its 1 s lease (a busy
    # machine) deposes itself and costs one more, as in the first test
    lapses = [r for r in recs if r["f"] == "deposed" and r["reason"] == "lease-lapsed"]
    mid_run = sum(1 for r in lapses if r["gen"] > 0)
    assert s["keeper_failovers"] == 2 + len(lapses)
    gens = _generations(recs)
    assert [g["gen"] for g in gens] == sorted({g["gen"] for g in gens})
    assert [g["reason"] for g in gens if g["reason"] == "failover"] == ["failover"] * (2 + mid_run)
    terms = [r["term"] for r in recs if r["f"] == "takeover"]
    assert terms == list(range(1, 4 + len(lapses))), terms
    deciding = sorted({g["term"] for g in gens if g.get("term")})
    links = _links_of_workers(recs)
    for survivor in (0, 2):  # linked, in order, to every keeper that decided a generation
        assert links[survivor] == sorted(set(links[survivor])), links
        assert set(deciding) <= set(links[survivor]) <= set(terms), (deciding, links)
    # killed at step 25: linked to the keepers before that, not to the last one
    assert links[1] and links[1][-1] < terms[-1], links
    # the failovers' generations resume where every member held the step
    # (the keeper held the last ack of step 12 and 38 until the launcher had
    # killed it): the sim's cursors
    resumed = [g["cursor"][0] for g in gens if g["reason"] == "failover"]
    assert resumed == [12, 38] if not mid_run else {12, 38} <= set(resumed), resumed


@skip_no_etcd
def test_direct_links_move_off_a_keeper_cut_off_from_etcd(tmp_path: Path) -> None:
    """Direct links and ``partition_keeper``: the cut keeper still has its
    workers' links but not etcd; it deposes itself when its lease ends, and
    the workers, watching the key, link to the standby of term 2."""
    # more steps than above: the workers leave the cut keeper as soon as the
    # key changes, and the run must outlast its exit (it deposes itself once
    # its lease ends, then waits out its revoke until the heal)
    sc = _scenario("{at_step: 12, partition_keeper: active, for_s: 2}", steps=200,
                   keeper=", worker_links: direct")
    s, recs = _run(sc, tmp_path)
    _assert_the_cut_keeper_was_replaced(s, recs)
    links = _links_of_workers(recs)
    assert all(terms == [1, 2] for terms in links.values()) and len(links) == 3, links


@skip_no_etcd
def test_a_link_to_the_keeper_without_the_runs_key_is_dropped(tmp_path: Path) -> None:
    """A peer that finds the keeper's address (in etcd) and links to it with a
    hello under another key, or with garbage, is dropped; the run goes on."""
    import json
    import socket
    import threading

    from real import wire
    from real.keeper_store import KeeperStore, StoreUnavailable

    sc = _scenario("{at_step: 12, kill: 2}", steps=60, keeper=", worker_links: direct")
    seen: list[str] = []

    def intruder() -> None:
        real = tmp_path / "real"
        try:
            wait_for(lambda: (real / "keeper.json").exists() and (real / "secret").exists(),
                     60, "the run's keeper.json")
        except AssertionError:
            return
        doc = json.loads((real / "keeper.json").read_text())
        store = KeeperStore(doc["endpoints"], doc["prefix"],
                            secret=wire.read_secret(str(real / "secret")).hex())

        def leader() -> Any:
            try:
                return store.leader()
            except StoreUnavailable:
                return None

        try:
            lead = wait_for(leader, 60, "a keeper in etcd")
        except AssertionError:
            return
        host, port = lead[2].rsplit(":", 1)
        for payload in ("bad-key", "garbage"):
            with socket.create_connection((host, int(port)), timeout=30) as sock:
                challenge = wire.FrameReader(wire.KEEPER_TO_WORKER)
                frames: list = []
                while not frames:
                    frames = challenge.feed(sock.recv(4096))
                _, nonce, run = frames[0]
                if payload == "bad-key":
                    mac = wire.hello_mac(b"x" * 32, nonce, run, 0, 0, 1, False)
                    sock.sendall(wire.encode(("hello", 0, 0, 1, False, mac)))
                else:
                    sock.sendall(b"\x00\x00\x00\x05hello")
                seen.append(payload if sock.recv(4096) == b"" else f"{payload}: not dropped")
        store.close()

    t = threading.Thread(target=intruder, daemon=True)
    t.start()
    s, recs = _run(sc, tmp_path)
    t.join(timeout=60)
    assert seen == ["bad-key", "garbage"], seen
    assert s["completed"] and s["valid"], (s["end_reason"], s["violations"])
