"""Pieces of the real target that need no process: framing, fault plan, accounting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollcall.config import fault_plan
from rollcall.core import Due
from rollcall.scenario import parse_scenario

from real.driver import merge_history, recoveries


@pytest.mark.timeout(30)
def test_fault_plan_orders_by_time_and_step_and_is_seeded() -> None:
    sc = parse_scenario("""
name: t
cluster: {workers: 4}
failures:
  worker_mtbf_s: 100
  schedule:
    - {at_s: 2.0, kill: 1}
    - {at_step: 5, pause: 2, for_s: 1}
    - {at_s: 1.0, join: 1}
    - {at_step: 3, kill: random}
""")
    plan = fault_plan(sc)
    assert [d.kind for d in plan.due_by_time(1.5)] == ["join"]
    assert [d.kind for d in plan.due_by_step(4)] == ["kill"]
    assert [d.kind for d in plan.due_by_step(10)] == ["pause"]
    assert [d.targets for d in plan.due_by_time(2.0)] == [(1,)]
    # random crashes: the core's (seed, node, k) draw, the sim's too
    from rollcall.config import failure_model

    plan.node_up(2, 5.0)
    plan.node_up(3, 1.0)
    plan.node_up(3, 4.0)  # relaunched by a restart: the same hardware life
    model = failure_model(sc)
    plan.node_down(2)
    plan.node_up(2, 9.0)  # repaired: its next hardware life
    crash_at = {2: 9.0 + model.lifetime(2, 1), 3: 1.0 + model.lifetime(3, 0)}
    # a lifetime's end is the machine's: fault kind crash, as on the sim
    t, w = min((t, w) for w, t in crash_at.items())
    assert plan.next_time() == t
    assert plan.due_by_time(t) == [Due("crash", (w,), origin="mtbf")]
    assert plan.next_time() == max(crash_at.values())


@pytest.mark.timeout(30)
def test_recovery_is_measured_to_the_first_commit_of_a_new_generation() -> None:
    recs = [
        {"t": 1.0, "f": "commit", "gen": 1, "step": 9},
        {"t": 2.0, "f": "fault", "kind": "kill", "workers": [1], "gen": 1},
        {"t": 2.01, "f": "commit", "gen": 1, "step": 10},   # the old generation's last step
        {"t": 2.30, "f": "commit", "gen": 2, "step": 11},
        {"t": 5.0, "f": "fault", "kind": "pause", "workers": [2], "gen": 2, "for_s": 0.1},
        {"t": 5.05, "f": "commit", "gen": 2, "step": 50},   # no new generation: next commit
    ]
    out = recoveries(recs)
    assert [r["kill_to_resume_s"] for r in out] == [pytest.approx(0.3), pytest.approx(0.05)]
    assert out[0]["resumed_gen"] == 2


@pytest.mark.timeout(30)
def test_merge_history_sorts_by_time_and_drops_a_torn_line(tmp_path: Path) -> None:
    lines = [json.dumps({"t": t, "f": "x", "i": i}) for i, t in enumerate([0.3, 0.1, 0.2, 0.1])]
    (tmp_path / "history.jsonl").write_text("\n".join(lines) + "\n{\"t\": 0.5, \"f\n")
    recs = merge_history(tmp_path)
    assert [(r["t"], r["i"]) for r in recs] == [(0.1, 1), (0.1, 3), (0.2, 2), (0.3, 0)]
    assert len((tmp_path / "history.jsonl").read_text().splitlines()) == 4


def test_a_direct_caller_is_refused_hosts_the_machine_cannot_make(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``real.driver.run`` (the benchmarks', the API's path past the CLI)
    refuses a hosts scenario in one line before any process starts when
    namespaces or nft are missing, as the CLI does (exit 2), instead of a
    launcher error at its first network fault."""
    import real.driver as driver

    monkeypatch.setattr(driver, "netns_available", lambda: "nft not found (test)")
    root = Path(__file__).resolve().parent.parent
    sc = parse_scenario((root / "scenarios" / "real-partition.yaml").read_text())
    assert sc.cluster.workers_per_host is not None
    with pytest.raises(ValueError, match="hosts as network namespaces: nft not found"):
        driver.run(sc, tmp_path / "run")
    assert not (tmp_path / "run").exists()  # nothing started, nothing written
