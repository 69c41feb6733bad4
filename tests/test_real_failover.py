"""The record-keeper is not a single point of failure, on the real target (issue 20).

``keeper.store: etcd``: the run starts its own 3-member etcd cluster on
loopback, one active keeper process and a standby. The tests kill the
active keeper (twice, with a worker killed between), kill one etcd member,
and check what the issue asks: the run stays valid with the per-sample
ledger, no generation number is decided twice, terms only go up, one lost
etcd member changes nothing, and nothing the run started (workers, keepers,
etcd members) is left behind. Nothing sleeps to synchronise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psutil
import pytest

from polling import pid_running
from real_processes import REAL_PROCESSES
from rollcall.results import read_history
from rollcall.scenario import Scenario, parse_scenario

pytestmark = REAL_PROCESSES


def _etcd_missing() -> str | None:
    from real.etcd import etcd_binary

    return None if etcd_binary() else "no etcd binary (Debian's etcd-server)"


skip_no_etcd = pytest.mark.skipif(_etcd_missing() is not None, reason=str(_etcd_missing()))


def _scenario(faults: str, steps: int = 60, workers: int = 3, ttl_s: float = 1.0) -> Scenario:
    return parse_scenario(f"""
name: real-keeper-failover
target: real
cluster: {{workers: {workers}}}
workload: {{steps: {steps}, global_batch: 24, micro_batch: 4, dataset_samples: 480,
           model_params: 20000, lr: 0.05}}
detector: {{heartbeat_s: 0.1, timeout_s: 2.0}}
rendezvous: {{min_workers: 2, last_call_s: 0.2, join_timeout_s: 20.0}}
strategy: {{kind: elastic, checkpoint_interval_steps: 10}}
keeper: {{store: etcd, standbys: 1, lease_ttl_s: {ttl_s}}}
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
    assert s["keeper_failovers"] == 2 and len(s["keeper_failover_s"]) == 2
    gens = _generations(recs)
    numbers = [g["gen"] for g in gens]
    assert numbers == sorted(set(numbers)), "no generation number decided twice"
    terms = [g.get("term", 0) for g in gens]
    assert terms == sorted(terms) and terms[-1] == 3, terms
    assert [g["reason"] for g in gens if g["reason"] == "failover"] == ["failover"] * 2
    takeovers = [r for r in recs if r["f"] == "takeover"]
    assert [r["term"] for r in takeovers] == [1, 2, 3]


@skip_no_etcd
def test_one_etcd_member_lost_changes_nothing(tmp_path: Path) -> None:
    # the default lease (2 s) outlasts the election a lost etcd leader costs
    # (about half a second on loopback: real/etcd.py's raft timing)
    sc = _scenario("{at_step: 10, kill_etcd: 1}", steps=40, ttl_s=2.0)
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
    lost = [r["reason"] for r in recs if r["f"] == "keeper_link" and r["reason"] != "connected"]
    assert lost[:1] == ["superseded"], lost  # the launcher followed etcd to the new term
    gens = [g["gen"] for g in _generations(recs)]
    assert gens == sorted(set(gens))


@skip_no_etcd
def test_a_keeper_cut_off_from_etcd_stops_deciding(tmp_path: Path) -> None:
    """``partition_keeper``: the active keeper loses etcd (its relays to the
    members hold what it sends) but not its workers. It cannot renew, stops
    deciding when its lease ends on its own clock, and a standby of the next
    term takes over; nothing of the old term is decided after that."""
    sc = _scenario("{at_step: 12, partition_keeper: active, for_s: 2}", steps=80)
    s, recs = _run(sc, tmp_path)
    assert s["completed"] and s["valid"], (s["end_reason"], s["violations"])
    assert s["keeper_failovers"] == 1
    takeovers = [r for r in recs if r["f"] == "takeover"]
    assert [r["term"] for r in takeovers] == [1, 2]
    first = next(r["candidate"] for r in recs if r["f"] == "keeper_link")
    exits = {f"keeper-{r['candidate']}": r["returncode"] for r in recs if r["f"] == "keeper_exit"}
    assert exits.get(first) == 3, exits  # deposed: it could not renew
    later = [g for g in _generations(recs) if g["t"] > takeovers[1]["t"]]
    assert later and all(g.get("term") == 2 for g in later), later
    cut = next(r for r in recs if r["f"] == "fault" and r["kind"] == "partition_keeper")
    heal = [r for r in recs if r["f"] == "fault" and r["kind"] == "heal" and r["t"] > cut["t"]]
    assert heal, "the cut is healed after for_s"
