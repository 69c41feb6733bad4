"""The sim's model of keeper failover (:mod:`sim.failover`).

With ``keeper.store: etcd`` the core keeper writes every generation to the
store before announcing it; a keeper that dies (a ``kill_keeper`` fault, or
``keeper.mtbf_s``) is replaced ``keeper.takeover_s`` later by a standby of
the next term, rebuilt from the last record, which holds a roll call.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from rollcall.core.history import members_of
from rollcall.scenario import parse_scenario
from sim.driver import run


def _scenario(strategy: str = "elastic", faults: str = "", keeper: str = "",
              steps: int = 80, extra: str = "") -> object:
    return parse_scenario(f"""
name: failover
seed: 3
cluster: {{workers: 4, spares: 1, repair_s: 5}}
workload: {{steps: {steps}, micro_batch_s: 0.01, dataset_samples: 2048}}
detector: {{heartbeat_s: 0.25, timeout_s: 1.0}}
strategy: {{kind: {strategy}, checkpoint_interval_steps: 10, restart_s: 1.0,
           checkpoint_write_s: 0.05, checkpoint_read_s: 0.05}}
keeper: {{store: etcd, standbys: 1, lease_ttl_s: 2.0{keeper}}}
failures:
  schedule: [{faults}]
{extra}""")


def _records(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "history.jsonl").read_text().splitlines()]


def _gens(recs: list[dict]) -> list[tuple]:
    return [(r["gen"], r["reason"], r.get("term", 0), members_of(r))
            for r in recs if r["f"] == "generation" and r["type"] == "ok"]


@pytest.mark.parametrize("strategy", ["elastic", "checkpoint-restart"])
def test_a_killed_keeper_is_replaced_and_the_job_carries_on(tmp_path: Path,
                                                            strategy: str) -> None:
    sc = _scenario(strategy, "{at_step: 20, kill_keeper: active}")
    s = run(sc, tmp_path)
    assert s["completed"] and s["valid"], s["violations"]
    assert s["keeper_failovers"] == 1 and s["restarts"] == 0
    assert s["samples_duplicated"] == 0 and s["samples_skipped"] == 0
    recs = _records(tmp_path)
    gens = _gens(recs)
    assert gens[0][:3] == (1, "start", 0)
    assert gens[1][1:] == ("failover", 1, (0, 1, 2, 3)), "every member answers the new term"
    kill = next(r for r in recs if r["f"] == "fault" and r["kind"] == "kill_keeper")
    takeover = next(r for r in recs if r["f"] == "takeover")
    assert takeover["t"] == pytest.approx(kill["t"] + sc.keeper.takeover_s)
    assert takeover["term"] == 1
    # steps committed before the death stay committed: the new generation resumes after them
    before = [r for r in recs if r["f"] == "commit" and r["t"] <= kill["t"]]
    resumed = next(r for r in recs if r["f"] == "generation" and r["reason"] == "failover")
    assert resumed["cursor"][0] == before[-1]["last"] + 1


def test_the_outage_costs_the_takeover_and_the_steps_in_flight(tmp_path: Path) -> None:
    quiet = run(_scenario(), tmp_path / "quiet")
    killed = run(_scenario(faults="{at_step: 20, kill_keeper: active}"), tmp_path / "killed")
    extra = killed["elapsed_s"] - quiet["elapsed_s"]
    sc = _scenario()
    # the outage, give or take the step in flight and a checkpoint write the
    # failover generation shifts (checkpoints count from each generation's resume)
    step, write = sc.ideal_step_s, sc.strategy.checkpoint_write_s
    slack = 3 * step + write + 0.01
    assert abs(extra - sc.keeper.takeover_s) <= slack, (extra, step)
    longer = run(_scenario(faults="{at_step: 20, kill_keeper: active}",
                           keeper=", failover_s: 5.0"), tmp_path / "longer")
    assert longer["elapsed_s"] - killed["elapsed_s"] == pytest.approx(3.0, abs=2 * step)


def test_a_keeper_killed_during_a_roll_call_and_a_restart(tmp_path: Path) -> None:
    """Deaths while a round is open: the successor's roll call replaces it."""
    for strategy in ("elastic", "checkpoint-restart"):
        sc = _scenario(strategy, "{at_step: 20, kill: [1]}, {at_step: 20, kill_keeper: active},"
                                 " {at_s: 4.0, kill: [2]}, {at_s: 4.3, kill_keeper: active}")
        s = run(sc, tmp_path / strategy)
        assert s["completed"] and s["valid"], (strategy, s["violations"])
        assert s["keeper_failovers"] == 2
        gens = [g for g, *_ in _gens(_records(tmp_path / strategy))]
        assert gens == sorted(set(gens)), "no generation number decided twice"


def test_random_keeper_failures_come_from_their_own_stream(tmp_path: Path) -> None:
    sc = _scenario(keeper=", mtbf_s: 3.0", steps=1000)
    a = run(sc, tmp_path / "a")
    b = run(sc, tmp_path / "b")
    assert a["valid"] and a["completed"] and a["keeper_failovers"] >= 2
    assert hashlib.sha256((tmp_path / "a" / "history.jsonl").read_bytes()).digest() == \
        hashlib.sha256((tmp_path / "b" / "history.jsonl").read_bytes()).digest()
    # the nodes' failure trace does not move when the keeper fails too
    nodes = _scenario(steps=200, extra="  worker_mtbf_s: 20\n")
    with_keeper = _scenario(keeper=", mtbf_s: 3.0", steps=200, extra="  worker_mtbf_s: 20\n")
    r1, r2 = run(nodes, tmp_path / "n1"), run(with_keeper, tmp_path / "n2")
    crashes = [sorted((r["t"], r["workers"]) for r in _records(tmp_path / d)
                      if r["f"] == "fault" and r["kind"] == "crash")[:1] for d in ("n1", "n2")]
    assert r1["crashes"] >= 1 and crashes[0] == crashes[1]


def test_the_memory_store_writes_no_term_and_no_failover(tmp_path: Path) -> None:
    sc = parse_scenario("name: plain\ncluster: {workers: 3}\nworkload: {steps: 20}\n")
    s = run(sc, tmp_path)
    assert s["keeper_failovers"] == 0
    assert not any("term" in r for r in _records(tmp_path))


@settings(max_examples=25, deadline=None)
@given(kills=st.lists(st.floats(0.1, 6.0), min_size=1, max_size=3),
       worker_kills=st.lists(st.tuples(st.floats(0.1, 6.0), st.integers(0, 4)), max_size=3),
       strategy=st.sampled_from(["elastic", "checkpoint-restart"]))
def test_keeper_deaths_anywhere_keep_the_history_valid(tmp_path_factory, kills, worker_kills,
                                                        strategy) -> None:
    faults = ", ".join([f"{{at_s: {t:.3f}, kill_keeper: active}}" for t in kills] +
                       [f"{{at_s: {t:.3f}, kill: [{w}]}}" for t, w in worker_kills])
    sc = _scenario(strategy, faults)
    s = run(sc, tmp_path_factory.mktemp("f"))
    assert s["valid"], (faults, s["violations"])
    assert s["completed"], (faults, s["end_reason"])


def test_a_keeper_cut_off_from_etcd_decides_until_its_lease_ends(tmp_path: Path) -> None:
    """``partition_keeper`` on the sim: the job commits on while the cut
    keeper's lease holds (90% of the TTL from its last renewal, on its own
    clock: ``Keeper.hold``, as on real; it renewed every quarter TTL since
    the run began), the keeper deposes itself when it lapses, then a
    standby takes over ``takeover_s`` after the cut."""
    sc = _scenario(faults="{at_step: 20, partition_keeper: active, for_s: 5}")
    s = run(sc, tmp_path)
    assert s["completed"] and s["valid"], s["violations"]
    assert s["keeper_failovers"] == 1
    recs = _records(tmp_path)
    cut = next(r for r in recs if r["f"] == "fault" and r["kind"] == "partition_keeper")
    takeover = next(r for r in recs if r["f"] == "takeover")
    assert takeover["t"] == pytest.approx(cut["t"] + sc.keeper.takeover_s)
    ttl_s = sc.keeper.lease_ttl_s
    renewed = math.floor(cut["t"] / (ttl_s / 4)) * (ttl_s / 4)  # the first keeper's
    assert cut["t"] - ttl_s / 4 < renewed <= cut["t"]
    stop = renewed + 0.9 * ttl_s
    commits = [r["t"] for r in recs if r["f"] == "commit" and cut["t"] < r["t"] <= takeover["t"]]
    assert commits and max(commits) < stop, "it decides while its lease holds, not after"
    (deposed,) = [r for r in recs if r["f"] == "deposed"]
    assert deposed["t"] == pytest.approx(stop) and deposed["reason"] == "lease-lapsed"
    assert deposed["term"] == cut["term"]


TAKEOVER_REPORT = """
name: takeover-report
cluster: {workers: 6, workers_per_host: 2}
workload: {steps: 400, global_batch: 12, micro_batch: 1}
detector: {heartbeat_s: 0.1, timeout_s: 1.0}
rendezvous: {min_workers: 2, join_timeout_s: null}
keeper: {store: etcd, standbys: 1, lease_ttl_s: 2.0}
failures:
  schedule:
  - {at_s: 1.0, kill_keeper: active}
  - {at_s: 1.5, kill: 1}
  - {at_s: 1.6, lose_host: 2}
"""


def test_the_new_keeper_hears_of_exits_seen_and_detects_a_lost_host(tmp_path: Path) -> None:
    """While no keeper serves, worker 1 is killed (its host saw the exit)
    and host 2 is lost with workers 4 and 5 (nobody saw anything). The
    report the new keeper takes over with is the real launcher's: the exit
    evicts worker 1 at the takeover; the lost host's workers are the
    detector's, one timeout later (they were once reported as exits)."""
    summary = run(parse_scenario(TAKEOVER_REPORT), tmp_path)
    assert summary["completed"] and summary["valid"], summary["violations"]
    recs = [json.loads(x) for x in (tmp_path / "history.jsonl").read_text().splitlines()]
    (takeover,) = [r["t"] for r in recs if r["f"] == "takeover"]
    evictions = [(r["worker"], r["reason"], r["t"]) for r in recs if r["f"] == "evict"]
    assert evictions == [(1, "exited", takeover), (4, "timeout", takeover + 1.0),
                         (5, "timeout", takeover + 1.0)]
    (formed,) = [r for r in recs if r["f"] == "generation" and r["gen"] == 2]
    assert members_of(formed) == (0, 2, 3) and formed["reason"] == "failover"
