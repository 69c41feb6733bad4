"""``rollcall validate --plan``: what a scenario will do, read from it alone."""

from __future__ import annotations

import math
from pathlib import Path

import yaml

from rollcall.app import cli
from rollcall.app.plan import format_plan, plan
from rollcall.scenario import load_scenario

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"


def test_the_plan_of_a_scripted_scenario() -> None:
    sc = load_scenario(SCENARIOS / "kill-pause-join.yaml")
    p = plan(sc)
    w = sc.cluster.workers
    assert p["ids"][0] == {"ids": [0, w - 1], "what": "initial workers"}
    joins = [f for f in p["timeline"] if f["action"] == "join"]
    assert [d["ids"] for d in p["ids"] if d["what"].startswith("newcomers")] == \
        [f["workers"] for f in joins]
    assert p["worker_id_limit"] == sc.worker_id_limit
    when = [(f["trigger"], f["when"]) for f in p["timeline"]]
    assert when == sorted(when) and len(when) == len(sc.failures.schedule)
    steps, k = sc.workload.steps, sc.strategy.checkpoint_interval_steps
    written = len([s for s in range(k, steps, k)])  # no checkpoint after the last step
    assert p["checkpoints"] == written
    assert math.isclose(p["failure_free_s"], steps * sc.ideal_step_s
                        + written * sc.strategy.checkpoint_write_s)
    assert p["expected_random_failures"] is None


def test_expected_random_failures_over_the_failure_free_time() -> None:
    sc = load_scenario(SCENARIOS / "llama3-54d.yaml")
    p = plan(sc)
    want = sc.cluster.workers * p["failure_free_s"] / sc.failures.worker_mtbf_s
    assert math.isclose(p["expected_random_failures"], want)
    text = format_plan(p)
    assert f"expected random failures: {want:.3g}" in text and "faults: none scripted" in text


def test_validate_plan_prints_the_resolved_scenario_and_the_plan(capsys) -> None:
    path = SCENARIOS / "kill-pause-join.yaml"
    assert cli.main(["validate", str(path), "--plan"]) == 0
    out = capsys.readouterr().out
    head, _, rest = out.partition("\nplan: ")
    resolved = yaml.safe_load(head.split("\n", 1)[1])
    assert resolved == load_scenario(path).to_dict()
    assert "ids:" in rest and "failure-free time:" in rest
    assert "\nwall time (sim, an estimate): ~" in rest and "segments x" in rest
    assert cli.main(["validate", str(path)]) == 0
    assert "plan:" not in capsys.readouterr().out


# --------------------------------------------------------------------------
# The wall-time estimate: its arithmetic on given unit costs (tests time
# nothing; benchmarks/plan_estimate.py compares it with measured runs).

from rollcall.app.plan import (  # noqa: E402
    UnitCosts, calibrate, expected_run, real_wall_estimate, sim_wall_estimate, sim_work,
    wall_estimate,
)
from rollcall.scenario import parse_scenario  # noqa: E402

COSTS = UnitCosts(start_s=0.5, segment_s=0.25, record_s=0.125, failure_s=2.0, basis="given")


def test_sim_work_counts_segments_records_and_failures() -> None:
    sc = load_scenario(SCENARIOS / "kill-pause-join.yaml")
    p = plan(sc)
    w = sc.workload
    work = sim_work(sc, p, ledger_samples=w.steps * w.global_batch + w.dataset_samples)
    assert work["segments"] == -(-w.steps // sc.strategy.checkpoint_interval_steps)
    assert work["records"] == w.steps * sc.cluster.workers  # small: the per-sample ledger
    assert work["failures"] == len(sc.failures.schedule)  # no random failures
    # beyond the driver's ledger bound the run writes the compact ledger: no per-step records
    assert sim_work(sc, p, ledger_samples=w.steps * w.global_batch - 1)["records"] == 0
    est = sim_wall_estimate(work, COSTS)
    want = 0.5 + work["segments"] * 0.25 + work["records"] * 0.125 + work["failures"] * 2.0
    assert math.isclose(est["wall_s"], want)
    assert f"{work['segments']:.0f} segments x 2.5e+05 us" in est["basis"] and "given" in est["basis"]


def test_a_fault_that_never_fires_costs_nothing() -> None:
    sc = parse_scenario("name: a\nworkload: {steps: 10}\nfailures:\n  schedule:\n"
                        "    - {at_step: 5, kill: 0}\n    - {at_step: 50, kill: 1}\n"
                        "    - {at_s: 1.0e9, join: 1}\n")
    # a time trigger may fire in a longer run; a step beyond the end never does
    assert sim_work(sc, plan(sc), ledger_samples=0)["failures"] == 2


def test_failures_lengthen_the_run_they_are_counted_over() -> None:
    sc = load_scenario(SCENARIOS / "llama3-54d.yaml")
    p = plan(sc)
    run = expected_run(sc, p)
    rate = (sc.cluster.workers + sc.cluster.spares) / sc.failures.worker_mtbf_s
    # the fixed point: the run lasts its failure-free time plus each failure's cost,
    # and sees the failures of that whole time (spares' included)
    assert math.isclose(run["elapsed_s"], p["failure_free_s"] + run["failures"] * run["per_failure_s"])
    assert math.isclose(run["failures"], rate * run["elapsed_s"])
    assert run["failures"] > p["expected_random_failures"] and not run["saturated"]
    work = sim_work(sc, p, ledger_samples=1_000_000)
    assert work["records"] == 0 and work["failures"] == run["failures"]
    double = load_scenario(SCENARIOS / "llama3-54d.yaml", ["failures.per_1000_node_days=7.6"])
    more = sim_work(double, plan(double), ledger_samples=1_000_000)
    assert more["failures"] > 2 * work["failures"]  # and each makes the run longer still
    gap = sim_wall_estimate(more, COSTS)["wall_s"] - sim_wall_estimate(work, COSTS)["wall_s"]
    assert math.isclose(gap, (more["failures"] - work["failures"]) * COSTS.failure_s)


def test_failures_faster_than_recovery_fall_back_to_the_floor() -> None:
    sc = load_scenario(SCENARIOS / "llama3-54d.yaml", ["strategy.restart_s=1e9"],
                       strategy="checkpoint-restart")
    p = plan(sc)
    run = expected_run(sc, p)
    rate = (sc.cluster.workers + sc.cluster.spares) / sc.failures.worker_mtbf_s
    assert run["saturated"] and math.isclose(run["failures"], rate * p["failure_free_s"])
    work = sim_work(sc, p, ledger_samples=0)
    assert "may never finish" in sim_wall_estimate(work, COSTS)["basis"]
    assert "may never finish" in real_wall_estimate(sc, p)["basis"]


def test_real_estimate_is_the_job_time_plus_each_failure() -> None:
    for kind in ("elastic", "checkpoint-restart"):
        sc = load_scenario(SCENARIOS / "llama3-54d.yaml", ["target=real"], strategy=kind)
        p = plan(sc)
        est = real_wall_estimate(sc, p)
        st, det = sc.strategy, sc.detector
        if kind == "checkpoint-restart":
            per = (det.timeout_s + st.restart_s + st.checkpoint_read_s
                   + st.checkpoint_interval_steps * sc.ideal_step_s / 2)
        else:
            per = (det.timeout_s + sc.rendezvous.last_call_s
                   + sc.workload.model_params * sc.workload.bytes_per_param / sc.network.bandwidth_Bps)
        rate = (sc.cluster.workers + sc.cluster.spares) / sc.failures.worker_mtbf_s
        assert math.isclose(est["per_failure_s"], per)
        assert math.isclose(est["wall_s"], sc.workload.warmup_s + p["failure_free_s"] / (1 - rate * per))
        assert wall_estimate(sc, p) == est  # the real target runs nothing to estimate
        assert "days" in format_plan({**p, "wall_estimate": est}).splitlines()[-1]
    # scripted faults: their count and their time, on top
    sc = load_scenario(SCENARIOS / "kill-pause-join.yaml", ["target=real"])
    p, est = plan(sc), real_wall_estimate(sc, plan(sc))
    assert est["failures"] == len(sc.failures.schedule)
    assert math.isclose(est["wall_s"], sc.workload.warmup_s + p["failure_free_s"]
                        + len(sc.failures.schedule) * est["per_failure_s"])


def test_calibration_gives_usable_unit_costs() -> None:
    sc = load_scenario(SCENARIOS / "quickstart.yaml")
    costs = calibrate(sc)  # UnitCosts itself asserts each cost is finite and >= 0
    assert "4 tiny sim runs" in costs.basis and "at 64 workers, elastic" in costs.basis
    est = wall_estimate(sc, plan(sc))
    assert est["wall_s"] >= costs.start_s and "4 tiny sim runs" in est["basis"]
