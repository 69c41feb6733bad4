"""The calibration suite (:mod:`rollcall.app.suite`) and ``--calibration FILE``.

A calibration models costs only: evaluated at each scenario's own size, it
sets the sim's cost keys and never what the scenario means (its faults, its
detector timeout, its sizes). The suite's real runs are one slow test; the
rest uses a hand-written model.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from real_processes import REAL_PROCESSES
from rollcall.app import calibrate, suite
from rollcall.app.cli import main
from rollcall.scenario import load_scenario

ROOT = Path(__file__).resolve().parent.parent
KILL_ONE = ROOT / "scenarios" / "real-kill-one.yaml"

# step = 1 ms + 2 ms per member + 0.5 ms per micro-batch on each core
MODEL = {
    "kind": suite.KIND, "version": 1, "machine": {"cpus": 2},
    "step": {"features": list(suite.STEP_FEATURES), "coef": [0.001, 0.002, 0.0, 0.0, 0.0005],
             "cpus": 2, "points": []},
    "checkpoint_write": {"base_s": 0.01, "per_byte_s": 1e-9, "points": []},
    "checkpoint_read": {"base_s": 0.02, "per_byte_s": 0.0, "points": []},
    "state_copy": {"base_s": 0.005, "per_byte_s": 2e-9, "points": []},
    "exit_notice_s": 0.01, "roll_call_s": 0.002, "restart_s": 1.5, "warmup_s": 0.03,
    "timeout_detection": {"measured_s": 0.9, "expected_s": 0.95},
}


def _write(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / "cal.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def test_the_model_is_evaluated_at_the_scenarios_size() -> None:
    sc = load_scenario(KILL_ONE, ["workload.model_params=1000000"])
    keys = suite.overrides(MODEL, sc)
    shards = sc.workload.global_batch // sc.workload.micro_batch  # 8
    table = keys["workload.step_s_by_workers"]
    assert sorted(table) == list(range(1, sc.rendezvous.max_workers + 1))
    for m, step in table.items():
        assert step == pytest.approx(0.001 + 0.002 * m + 0.0005 * shards / min(m, 2))
    nbytes = 1e6 * sc.workload.bytes_per_param
    assert keys["strategy.checkpoint_write_s"] == pytest.approx(0.01 + 1e-9 * nbytes)
    assert keys["strategy.checkpoint_read_s"] == pytest.approx(0.02)
    assert keys["network.bandwidth_Bps"] == pytest.approx(5e8)
    assert keys["network.latency_s"] == pytest.approx(0.001)
    assert keys["strategy.restart_s"] == 1.5 and keys["detector.exit_notice_s"] == 0.01
    assert not any(k.startswith("detector.") and k != "detector.exit_notice_s" for k in keys)
    bigger = suite.overrides(MODEL, load_scenario(KILL_ONE, ["workload.model_params=4000000"]))
    assert bigger["strategy.checkpoint_write_s"] > keys["strategy.checkpoint_write_s"]


def test_the_keepers_failover_is_its_lease_plus_the_machines_time() -> None:
    """etcd grants whole seconds: a 1.5 s lease is 2 s; the suite's measured
    time beyond the lease is added. A keeper in memory gets no failover key."""
    model = {**MODEL, "keeper_failover_beyond_lease_s": 0.4}
    etcd = load_scenario(KILL_ONE, ["keeper.store=etcd", "keeper.standbys=1",
                                    "keeper.lease_ttl_s=1.5"])
    assert suite.overrides(model, etcd)["keeper.failover_s"] == pytest.approx(2.4)
    assert "keeper.failover_s" not in suite.overrides(model, load_scenario(KILL_ONE))
    assert "keeper.failover_s" not in suite.overrides(MODEL, etcd)


def test_a_relayed_keepers_step_and_a_fresh_process_start_are_applied() -> None:
    model = {**MODEL, "keeper_relay_step_s": 0.025, "launch_s": 2.001}
    etcd = load_scenario(ROOT / "scenarios" / "real-keeper-failover.yaml")
    plain, relayed = suite.overrides(MODEL, etcd), suite.overrides(model, etcd)
    for m, step in plain["workload.step_s_by_workers"].items():
        assert relayed["workload.step_s_by_workers"][m] == pytest.approx(step + 0.025)
    local = suite.overrides(model, load_scenario(KILL_ONE))  # an in-process keeper: no relay
    assert local["workload.step_s_by_workers"] == suite.overrides(MODEL, load_scenario(KILL_ONE))[
        "workload.step_s_by_workers"]
    assert local["cluster.launch_s"] == pytest.approx(2.0)  # less the Join's one way (1 ms)
    assert "cluster.launch_s" not in plain


def test_a_measured_shape_takes_the_suites_own_steps_over_the_fit() -> None:
    sc = load_scenario(KILL_ONE)  # 8 micro-batches of a 20k-parameter model
    shards, params_m = sc.workload.global_batch // sc.workload.micro_batch, 0.02
    points = [[4, shards, params_m, 30, 0.012, 0.010],  # 4 members: two generations
              [4, shards, params_m, 10, 0.016, 0.010],
              [3, shards, 2.0, 50, 0.500, 0.400]]       # another model size: not this shape
    model = {**MODEL, "step": {**MODEL["step"], "points": points}}
    table = suite.overrides(model, sc)["workload.step_s_by_workers"]
    assert table[4] == pytest.approx((30 * 0.012 + 10 * 0.016) / 40)  # weighted by steps
    fitted = suite.overrides(MODEL, sc)["workload.step_s_by_workers"]
    assert table[3] == fitted[3] and table[2] == fitted[2]  # unmeasured counts: the fit
    old = {**MODEL, "step": {**MODEL["step"], "points": [[4, shards, params_m, 0.02, 0.01]]}}
    assert suite.overrides(old, sc)["workload.step_s_by_workers"][4] == 0.02  # version 1


# A suite's measured steps on this 2-core machine: (members,
# micro-batches, 1e6 params, steps, mean step s), two model sizes 100x apart
MEASURED_STEPS = [
    (4, 8, 0.02, 39, 0.011109), (3, 8, 0.02, 39, 0.007094), (2, 8, 0.02, 79, 0.005156),
    (3, 8, 0.02, 65, 0.006916), (4, 8, 0.02, 73, 0.009499), (4, 24, 2.0, 9, 0.075364),
    (3, 24, 2.0, 22, 0.095942), (4, 24, 2.0, 66, 0.082017), (3, 6, 0.02, 24, 0.006241),
    (2, 6, 0.02, 39, 0.006069), (3, 6, 2.0, 24, 0.041752), (2, 6, 2.0, 39, 0.037984),
]


def test_the_step_fit_minds_the_small_steps_as_much_as_the_large() -> None:
    points = [(m, s, p, y, n) for m, s, p, n, y in MEASURED_STEPS]
    coef = suite.fit_step(points, cpus=2)
    worst = max(abs(suite._step(coef, m, s, p, 2) / y - 1) for m, s, p, y, _ in points)
    assert worst < 0.25, worst  # fitted on absolute seconds: 53%, the small model's 2-member step
    absolute = suite._nnls([[math.sqrt(n) * x for x in suite._features(m, s, p, 2)]
                            for m, s, p, _, n in points],
                           [math.sqrt(n) * y for *_, y, n in points])
    assert worst < max(abs(suite._step(absolute, m, s, p, 2) / y - 1)
                       for m, s, p, y, _ in points) - 0.2
    # a step timed at 0 (two commits in one clock tick) is left out, not weighed infinitely
    assert suite.fit_step(points + [(2, 8, 0.02, 0.0, 5)], cpus=2) == coef


def test_the_step_fit_keeps_every_cost_non_negative() -> None:
    # y = 2 + 3 x1 exactly, plus a second feature that noise would buy negative
    rows = [[1.0, x, x * x] for x in (0.0, 1.0, 2.0, 3.0, 4.0)]
    ys = [2.0, 5.1, 7.9, 11.2, 13.8]
    free = suite._lstsq(rows, ys)
    assert free[2] < 0  # what an unconstrained fit makes of the noise
    coef = suite._nnls(rows, ys)
    assert all(c >= 0 for c in coef) and coef[2] == 0.0, coef
    assert coef[:2] == pytest.approx(suite._lstsq([r[:2] for r in rows], ys))
    assert suite._nnls([[1.0, 0.0], [0.0, 1.0]], [-1.0, 2.0]) == pytest.approx([0.0, 2.0])


def test_a_fresh_process_start_is_measured_from_a_real_history() -> None:
    def gen(g: int, t: float, members: list, reason: str) -> list[dict]:
        return [{"f": "round", "type": "invoke", "gen": g, "t": t - 0.2, "reason": reason},
                {"f": "generation", "type": "ok", "gen": g, "t": t, "members": members,
                 "reason": reason, "cursor": [0, 0], "source": 0, "stale": 0}]

    recs = [*gen(1, 0.0, [[0, 2]], "start"),
            {"f": "fault", "kind": "kill", "workers": [2], "t": 1.0},
            *gen(2, 1.3, [[0, 1]], "failure"),
            {"f": "fault", "kind": "repair", "workers": [2], "t": 2.0},
            *gen(3, 4.7, [[0, 2]], "growth"),  # its round opened at 4.5: 2.5 s of start-up
            {"f": "fault", "kind": "pull", "workers": [3], "t": 6.0},
            {"f": "fault", "kind": "kill", "workers": [0], "t": 6.5},
            # a round in between that leaves it out: its join came later (one
            # that comes while a round is open enters that round)
            *gen(4, 7.0, [[1, 2]], "failure"),
            *gen(5, 9.0, [[1, 3]], "growth"),  # opened at 8.8: 2.8 s
            {"f": "fault", "kind": "pull", "workers": [4], "t": 10.0},
            {"f": "fault", "kind": "kill", "workers": [1], "t": 12.0},
            # a round of another reason admits it: its join may have come at
            # any time the round was open, so it measures nothing
            *gen(6, 13.0, [[2, 4]], "failure")]
    assert calibrate._launch_costs(calibrate._History.of(recs)) == [pytest.approx(2.5),
                                                                    pytest.approx(2.8)]


def test_a_calibrated_scenario_keeps_what_it_means() -> None:
    sc = load_scenario(KILL_ONE)
    cal = suite.calibrated(sc, MODEL)
    assert cal.target == "sim"
    assert cal.failures == sc.failures and cal.detector.timeout_s == sc.detector.timeout_s
    assert cal.detector.heartbeat_s == sc.detector.heartbeat_s
    assert (cal.cluster, cal.rendezvous) == (sc.cluster, sc.rendezvous)
    assert cal.workload.steps == sc.workload.steps and cal.strategy.kind == sc.strategy.kind


def test_one_runs_calibration_no_longer_rewrites_the_timeout() -> None:
    cal = {"micro_batch_s": 0.01, "allreduce_s": 0.0, "heartbeat_s": 0.1,
           "pause_detection_s": 0.9, "kill_detection_s": 0.02, "model_bytes": 1.0}
    keys = calibrate.overrides(cal)
    assert keys["detector.exit_notice_s"] == 0.02
    assert "detector.timeout_s" not in keys and "detector.heartbeat_s" not in keys


def test_run_with_a_calibration_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, MODEL)
    out = tmp_path / "run"
    assert main(["run", str(KILL_ONE), "--target", "sim", "--calibration", str(path),
                 "--out", str(out), "--quiet"]) == 0
    replay = capsys.readouterr().out
    assert f"--calibration {path}" in replay
    resolved = load_scenario(out / "scenario.yaml")
    assert resolved.strategy.restart_s == 1.5 and resolved.workload.step_s_by_workers[4] == \
        pytest.approx(0.001 + 0.008 + 0.0005 * 4)


@pytest.mark.parametrize("doc, target, says", [
    (MODEL, "real", "the target is real"),
    ({"kind": "something else"}, "sim", "not a calibration file"),
    (dict(MODEL, step={"coef": [1.0]}), "sim", "step model missing or malformed"),
])
def test_bad_calibration_input_is_one_line_and_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], doc: dict, target: str,
        says: str) -> None:
    path = _write(tmp_path, doc)
    code = main(["run", str(KILL_ONE), "--target", target, "--calibration", str(path),
                 "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


def test_a_sweep_evaluates_the_calibration_at_each_points_size(tmp_path: Path) -> None:
    path = _write(tmp_path, MODEL)
    out = tmp_path / "sweep"
    assert main(["sweep", str(KILL_ONE), "--target", "sim", "--calibration", str(path),
                 "--grid", "workload.model_params=1000000,8000000", "--seeds", "1",
                 "--strategy", "checkpoint-restart", "--jobs", "1", "--out", str(out),
                 "--quiet"]) == 0
    writes = sorted(load_scenario(p).strategy.checkpoint_write_s
                    for p in out.rglob("scenario.yaml"))
    assert len(writes) == 2
    assert writes == pytest.approx([0.01 + 1e-9 * 12e6, 0.01 + 1e-9 * 96e6])


def _real_processes(test):
    for mark in REAL_PROCESSES:
        test = mark(test)
    return test


@pytest.mark.slow
@pytest.mark.timeout(300)
@_real_processes
def test_the_suite_measures_every_cost_on_real_processes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "suite.yaml"
    assert main(["calibrate", "--suite", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "real runs in" in printed
    model = suite.read(out)
    assert len(model["runs"]) == len(suite.runnable())
    if len(suite.runnable()) > len(suite.MICRO):  # etcd here: the keeper's failover measured
        beyond = model["keeper_failover_beyond_lease_s"]
        assert beyond is not None and math.isfinite(beyond), beyond
    step = model["step"]
    assert len(step["points"]) >= 8  # generations of 2, 3 and 4 members at two sizes
    assert all(math.isfinite(c) for c in step["coef"]), step["coef"]
    # how well it fits is timing (a test beside other load sees noisy steps):
    # only what holds with a wide margin is asserted, a 100x model costs more
    keys = {p: suite.overrides(model, load_scenario(KILL_ONE, [f"workload.model_params={p}"]))
            for p in (20_000, 2_000_000)}
    small, big = (keys[p]["workload.step_s_by_workers"][3] for p in (20_000, 2_000_000))
    assert big > small > 0, (small, big)
    for key in ("checkpoint_write", "checkpoint_read", "state_copy"):
        assert model[key] is not None and len(model[key]["points"]) >= 2, key
    assert model["checkpoint_write"]["per_byte_s"] > 0  # 100x the bytes cost more
    for key in ("exit_notice_s", "roll_call_s", "restart_s"):
        assert model[key] is not None and model[key] > 0, key
    assert model["warmup_s"] is not None and model["warmup_s"] >= 0
    assert model["launch_s"] is not None and model["launch_s"] > 0  # the pulled spare's start
    assert model["timeout_detection"]["measured_s"] > 0.5  # a 1 s timeout, measured
    sim = tmp_path / "sim"
    assert main(["run", str(KILL_ONE), "--target", "sim", "--calibration", str(out),
                 "--out", str(sim), "--quiet"]) == 0
    assert math.isfinite(load_scenario(sim / "scenario.yaml").network.bandwidth_Bps)
