"""The shipped scripted scenario: kill one of four, pause one past the timeout, join one.

scenarios/kill-pause-join.yaml: 4 workers, worker 1 killed when step 50 is
committed, worker 2 paused for 10 s at 8 s (detector timeout 3 s), one
newcomer (id 4) at 20 s, 200 steps, elastic with a constant batch.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollcall.core.history import members_of
from rollcall.scenario import load_scenario
from sim.driver import run

ROOT = Path(__file__).resolve().parent.parent
KPJ = ROOT / "scenarios" / "kill-pause-join.yaml"


def _records(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "history.jsonl").read_text().splitlines()]


def test_kill_pause_join_generations(tmp_path: Path) -> None:
    sc = load_scenario(KPJ)
    summary = run(sc, tmp_path)
    assert summary["completed"] and summary["valid"], summary["violations"]
    assert summary["samples_skipped"] == 0 and summary["samples_duplicated"] == 0
    assert summary["steps_committed"] == 200
    assert summary["samples_consumed"] == 200 * 64
    assert summary["restarts"] == 0
    recs = _records(tmp_path)
    gens = [(r["gen"], r["reason"], members_of(r)) for r in recs if r["f"] == "generation"]
    assert gens == [
        (1, "start", (0, 1, 2, 3)),
        (2, "failure", (0, 1, 3)),    # 2 paused at 8 s, evicted by the timeout at ~11 s
        (3, "failure", (0, 3)),       # 1 killed at step 50, evicted on its exit notice
        (4, "growth", (0, 2, 3)),     # 2 wakes at 18 s, is refused, rejoins as a newcomer
        (5, "growth", (0, 2, 3, 4)),  # the newcomer of 20 s
    ]
    evicts = [(r["worker"], r["reason"]) for r in recs if r["f"] == "evict"]
    assert evicts == [(2, "timeout"), (1, "exited")]
    # the paused worker learns it was evicted from the keeper, through its own agent
    refused = [r for r in recs if r["f"] == "refuse"]
    assert [(r["worker"], r["what"], r["reason"]) for r in refused] == [(2, "heartbeat", "not-member")]
    fenced = [r for r in recs if r["f"] == "fenced"]
    assert [(r["process"], r["gen"]) for r in fenced] == [(2, 1)]
    assert fenced[0]["t"] >= 18.0
    # the kill landed as the keeper committed the 50 steps it was scripted
    # for (their vote reached it, one latency after the members' step ended)
    kill = next(r for r in recs if r["f"] == "fault" and r["kind"] == "kill")
    commit50 = next(r for r in recs if r["f"] == "commit" and r["last"] == 49)
    assert kill["t"] == commit50["t"]
    assert recs.index(commit50) < recs.index(kill)
    # its host reports the exit: the keeper evicts it one latency after the
    # kill, long before the detector's timeout_s
    exited = next(r for r in recs if r["f"] == "evict" and r["worker"] == 1)
    assert exited["t"] == round(kill["t"] + sc.network.latency_s, 9)
    # the stale generation-4 newcomer copies the state from a survivor
    g4 = next(r for r in recs if r["f"] == "generation" and r["gen"] == 4)
    assert g4["source"] == 0 and g4["stale"] == 1


def test_kill_pause_join_checkpoint_restart(tmp_path: Path) -> None:
    summary = run(load_scenario(KPJ, strategy="checkpoint-restart"), tmp_path)
    assert summary["completed"] and summary["valid"], summary["violations"]
    assert summary["samples_skipped"] == 0 and summary["samples_duplicated"] == 0
    assert summary["restarts"] == 2  # the pause (evicted) and the kill each restart the job
    assert summary["lost_steps"] > 0
    recs = _records(tmp_path)
    gens = [r for r in recs if r["f"] == "generation"]
    assert [g["reason"] for g in gens] == ["start", "restart", "restart"]
    # a restart resumes from the keeper's checkpoint (none yet: the origin) and loads it
    assert all(g["source"] is None for g in gens)


def test_a_killed_workers_exit_notice_takes_exit_notice_s(tmp_path: Path) -> None:
    """``detector.exit_notice_s`` (a calibrated host's notice) replaces the
    default one latency; the kill is still evicted ``exited``, not by timeout."""
    sc = load_scenario(KPJ, ["detector.exit_notice_s=0.25"])
    summary = run(sc, tmp_path)
    assert summary["completed"] and summary["valid"], summary["violations"]
    recs = _records(tmp_path)
    kill = next(r for r in recs if r["f"] == "fault" and r["kind"] == "kill")
    evict = next(r for r in recs if r["f"] == "evict" and r["worker"] == 1)
    assert evict["reason"] == "exited" and evict["t"] == round(kill["t"] + 0.25, 9)


def test_a_lost_host_takes_all_its_workers_and_reports_no_exit(tmp_path: Path) -> None:
    """``lose_host: random`` on 8 workers in hosts of 4, checkpoint-restart:
    the seeded pick is a host holding a live member, its four nodes
    go down at once, the detector evicts the first (no exit notice), whose
    loss restarts the job: one restart tears the other three down with every
    member (their verdicts, due in the same tick, are not losses in the
    restarting group), and it relaunches only the other host's workers."""
    sc = load_scenario(Path(__file__).resolve().parent.parent / "scenarios" / "quickstart.yaml",
                       ["cluster.workers=8", "cluster.workers_per_host=4", "failures.schedule="
                        "[{at_step: 20, lose_host: random}]", "strategy.kind=checkpoint-restart"])
    summary = run(sc, tmp_path)
    recs = _records(tmp_path)
    (lost,) = [r for r in recs if r["f"] == "fault" and r["kind"] == "lose_host"]
    host = lost["host"]
    assert lost["workers"] == list(range(4 * host, 4 * host + 4))
    evicted = [r for r in recs if r["f"] == "evict"]
    assert [r["worker"] for r in evicted] == [4 * host], evicted
    assert all(r["reason"] == "timeout" for r in evicted), evicted
    assert [r["reason"] for r in recs if r["f"] == "restart"] == ["failure"]
    assert summary["restarts"] == 1
    (relaunch,) = [r for r in recs if r["f"] == "relaunch"]
    assert relaunch["not_relaunched"] == [[4 * host, 4 * host + 3]]
    assert summary["failures"] == 4 and summary["crashes"] == 4 and summary["kills"] == 0
    assert summary["valid"] and summary["completed"], summary["violations"]


def _cut_for_6_s(tmp_path: Path, fault: str) -> tuple[dict, list[dict], dict, dict]:
    """kill-pause-join in hosts of 2 with ``fault`` at 5 s for 6 s instead of
    its schedule: the summary, the records, and the fault's and heal's records."""
    sc = load_scenario(KPJ, ["cluster.workers_per_host=2",
                             f"failures.schedule=[{{at_s: 5.0, {fault}, for_s: 6.0}}]"])
    summary = run(sc, tmp_path)
    recs = _records(tmp_path)
    kind = fault.split(":")[0]
    (cut,) = [r for r in recs if r["f"] == "fault" and r["kind"] == kind]
    (heal,) = [r for r in recs if r["f"] == "fault" and r["kind"] == "heal"]
    return summary, recs, cut, heal


def test_a_partitioned_host_never_commits_and_comes_back_as_a_newcomer(tmp_path: Path) -> None:
    """``partition: [1]`` for 6 s past a 3 s timeout, hosts of 2: the keeper
    evicts the cut-off workers for their silence, the rest (min_workers 2)
    go on, nothing the cut-off side did counts, and after the heal they are
    fenced and rejoin in a later generation."""
    summary, recs, cut, heal = _cut_for_6_s(tmp_path, "partition: [1]")
    assert cut["workers"] == heal["workers"] == [2, 3] and heal["t"] == cut["t"] + 6.0
    evicted = {r["worker"]: r["reason"] for r in recs if r["f"] == "evict"}
    assert evicted == {2: "timeout", 3: "timeout"}, evicted
    gens = [r for r in recs if r["f"] == "generation"]
    during = [g for g in gens if cut["t"] < g["t"] < heal["t"]]
    assert during and all(members_of(g) == (0, 1) for g in during)
    assert any(set(members_of(g)) >= {2, 3} for g in gens if g["t"] > heal["t"])
    assert not [r for r in recs if r["f"] in ("commit", "contribute") and r["t"] > cut["t"]
                and r["t"] < heal["t"] and r["process"] in (2, 3)]
    assert summary["failures"] == 2 and summary["pauses"] == 0
    assert summary["valid"] and summary["completed"], summary["violations"]


def test_isolating_a_host_from_the_keeper_stalls_the_job_after_the_step_in_flight(
        tmp_path: Path) -> None:
    """``isolate_keeper: 1`` for 6 s past a 3 s timeout, hosts of 2: the
    isolated workers' peers still reach them, so the step in flight is done
    and committed through the other members' votes; then they wait for
    commit answers that cannot come, as real workers do, and the job stalls
    until the detector evicts them. It goes on without them, and after the
    heal they are fenced and rejoin."""
    summary, recs, cut, heal = _cut_for_6_s(tmp_path, "isolate_keeper: 1")
    assert cut["host"] == 1 and cut["workers"] == heal["workers"] == [2, 3]
    evicted = [r for r in recs if r["f"] == "evict"]
    assert {(r["worker"], r["reason"]) for r in evicted} == {(2, "timeout"), (3, "timeout")}
    first_evict = min(r["t"] for r in evicted)
    (commit,) = [r for r in recs if r["f"] == "commit" and cut["t"] < r["t"] < first_evict]
    step_s, latency_s = summary["ideal_step_s"], load_scenario(KPJ).network.latency_s
    assert commit["t"] <= cut["t"] + step_s + latency_s + 1e-9  # the step in flight, no later one
    assert commit["process"] not in (2, 3)
    # stalled from that step's end until the eviction's roll call
    assert summary["stall_s"] == pytest.approx(first_evict - (commit["t"] - latency_s), abs=2e-3)
    gens = [r for r in recs if r["f"] == "generation"]
    (after_cut,) = [g for g in gens if first_evict <= g["t"] < heal["t"]]
    assert members_of(after_cut) == (0, 1) and after_cut["cursor"][0] == commit["last"] + 1
    assert any(set(members_of(g)) >= {2, 3} for g in gens if g["t"] > heal["t"])
    assert summary["failures"] == 2 and summary["valid"] and summary["completed"]


def test_a_pause_still_stalls_the_job(tmp_path: Path) -> None:
    """The same 6 s as a pause of both workers: their collective hangs (stall)."""
    sc = load_scenario(KPJ, ["cluster.workers_per_host=2", "failures.schedule=["
                             "{at_s: 5.0, pause: 2, for_s: 6.0}, {at_s: 5.0, pause: 3, for_s: 6.0}]"])
    assert run(sc, tmp_path)["stall_s"] > 1.0


STEP_FAULTS = """
name: step-faults
cluster: {workers: 3}
workload: {steps: 12, global_batch: 2, micro_batch: 1}
strategy: {kind: elastic, checkpoint_interval_steps: 4, checkpoint_write_s: 0.5}
rendezvous: {min_workers: 1}
failures:
  schedule:
  - {at_step: 0, kill: 2}
  - {at_step: 5, slow: 0, factor: 2.0, for_s: 100}
"""


def test_step_faults_act_where_the_core_plan_says(tmp_path: Path) -> None:
    """The sim takes its step-scripted faults from the core's FaultPlan, as
    real does: ``at_step: 0`` lands with the first commit (no answer comes
    before it: it never fired), and a slow of fixed targets, which the plan
    hands out a step early (at the checkpoint after step 4 here), acts from
    step 5 on."""
    from rollcall.scenario import parse_scenario

    summary = run(parse_scenario(STEP_FAULTS), tmp_path)
    assert summary["completed"] and summary["valid"], summary["violations"]
    recs = _records(tmp_path)
    kill, slow = [r for r in recs if r["f"] == "fault"]
    first, *_ = [r for r in recs if r["f"] == "commit"]
    assert kill["kind"] == "kill" and kill["workers"] == [2]
    assert first["last"] == 0 and kill["t"] == first["t"]  # as step 0's vote reached the keeper
    assert recs.index(first) < recs.index(kill)
    (step5,) = [r for r in recs if r["f"] == "commit" and r["step"] == 5]
    (checkpoint4,) = [r for r in recs if r["f"] == "checkpoint" and r["cursor"][0] == 4]
    assert slow["kind"] == "slow" and slow["workers"] == [0]
    assert checkpoint4["t"] < slow["t"] == step5["t0"]  # not at the checkpoint: at step 5
