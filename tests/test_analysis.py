"""rollcall.app.analysis: readers over small sim runs made here, and the analytic baselines."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import pandas as pd
import pytest

from rollcall.app import analysis as an
from rollcall.results import SUMMARY_KEYS, prepare_out_dir
from rollcall.scenario import load_scenario

ROOT = Path(__file__).resolve().parent.parent


def _run(out: Path, strategy: str, seed: int = 0) -> Path:
    from sim.driver import run

    sc = load_scenario(ROOT / "scenarios" / "kill-pause-join.yaml", [], seed=seed, strategy=strategy)
    prepare_out_dir(out, sc)
    run(sc, out)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    return {s: _run(root / s, s) for s in ("elastic", "checkpoint-restart")}


def test_load_summaries_has_every_summary_key(runs: dict[str, Path]) -> None:
    df = an.load_summaries(runs.values())
    assert len(df) == 2
    assert set(SUMMARY_KEYS) <= set(df.columns)
    assert set(df.strategy) == {"elastic", "checkpoint-restart"}
    # a root directory is searched for summaries too
    root_df = an.load_summaries(next(iter(runs.values())).parent)
    assert len(root_df) == 2
    s = an.load_summary(runs["elastic"])
    assert s["completed"] and s["run_dir"] == str(runs["elastic"])


def test_generations_of_the_scripted_scenario(runs: dict[str, Path]) -> None:
    g = an.generations(runs["elastic"])
    assert list(g.gen) == [1, 2, 3, 4, 5]
    assert list(g.members) == [(0, 1, 2, 3), (0, 1, 3), (0, 3), (0, 2, 3), (0, 2, 3, 4)]
    assert g.t_rel.iloc[0] == 0.0
    assert (g.t_round <= g.t).all() and (g.t_end >= g.t).all()
    assert list(g.reason) == ["start", "failure", "failure", "growth", "growth"]


def test_history_frame_and_relative_time(runs: dict[str, Path]) -> None:
    h = an.load_history(runs["elastic"])
    assert {"t", "type", "f", "process", "t_rel"} <= set(h.columns)
    assert (h.f == "generation").sum() == 5
    first_gen = h[h.f == "generation"].iloc[0]
    assert first_gen.t_rel == 0.0


def test_step_times_cover_every_step_and_show_shrinking(runs: dict[str, Path]) -> None:
    st = an.step_times(runs["elastic"])
    assert st.steps.sum() == 200
    by_size = st.groupby("size").step_s.mean()
    # constant batch: fewer workers, longer steps
    assert by_size[2] > by_size[3] > by_size[4]
    assert set(st.batch) == {64}


def test_timeline_intervals(runs: dict[str, Path]) -> None:
    tl = an.timeline(runs["elastic"])
    assert set(tl.kind) >= {"member", "roll_call", "stall", "fault"}
    faults = tl[tl.kind == "fault"]
    assert set(faults.what) == {"kill", "pause", "resume", "join"}
    stalls = tl[tl.kind == "stall"]
    # the pause stalls the survivors until the 3 s timeout fires, the kill
    # until its host's exit notice (one latency) opens the round
    assert sorted(stalls.what) == ["kill", "pause"]
    length = dict(zip(stalls.what, stalls.end - stalls.start))
    assert length["pause"] == pytest.approx(3.0, abs=0.01) and length["kill"] <= 0.01
    members = tl[tl.kind == "member"]
    assert (members.end >= members.start).all()
    assert set(members[members.gen == 5].worker) == {0, 2, 3, 4}
    cr = an.timeline(runs["checkpoint-restart"])
    assert (cr.kind == "restart").sum() == 2


def test_a_crash_and_a_rack_stall_the_survivors_too(tmp_path: Path) -> None:
    import json

    def r(t: float, f: str, process: str, **fields: object) -> dict:
        return {"t": t, "type": "info", "f": f, "process": process, **fields}

    recs = [r(0.0, "generation", "keeper", type="ok", gen=1, members=[[0, 5]], reason="start"),
            r(1.0, "fault", "nemesis", kind="crash", workers=[1]),
            r(3.0, "round", "keeper", type="invoke", gen=2),
            r(3.01, "generation", "keeper", type="ok", gen=2, members=[[0, 0], [2, 5]],
              reason="failure"),
            r(4.0, "fault", "nemesis", kind="kill_rack", rack=1, workers=[4, 5]),
            r(4.001, "round", "keeper", type="invoke", gen=3),
            r(4.01, "generation", "keeper", type="ok", gen=3, members=[[0, 0], [2, 3]],
              reason="failure"),
            r(5.0, "end", "driver", completed=False, cursor=[0, 0])]
    (tmp_path / "history.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))
    stalls = an.timeline(tmp_path).query("kind == 'stall'")
    assert list(zip(stalls.what, stalls.start, stalls.end)) == [("crash", 1.0, 3.0),
                                                                ("kill_rack", 4.0, 4.001)]


def test_plot_timeline_draws(runs: dict[str, Path], tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    ax = an.plot_timeline(runs["elastic"], title="t")
    ax.figure.savefig(tmp_path / "t.png")
    plt.close(ax.figure)
    assert (tmp_path / "t.png").stat().st_size > 1000


def test_ci95_and_summarize() -> None:
    assert math.isnan(an.ci95([1.0]))
    assert an.ci95([1.0, 1.0, 1.0]) == 0.0
    # n=2: t=12.706, sd=sqrt(2)/... -> half = 12.706 * 1/sqrt(2) * sqrt(2)/sqrt(2)
    assert an.ci95([0.0, 2.0]) == pytest.approx(12.706 * math.sqrt(2.0) / math.sqrt(2.0))
    assert an.t975(1000) == pytest.approx(1.962, abs=0.002)
    assert 2.06 < an.t975(22) < 2.086
    df = pd.DataFrame({"k": [1, 1, 1, 2], "x": [1.0, 2.0, 3.0, 5.0]})
    s = an.summarize(df, "k", "x")
    assert list(s.n) == [3, 1]
    assert s.x_mean.tolist() == [2.0, 5.0]
    assert s.x_lo.iloc[0] < 2.0 < s.x_hi.iloc[0]
    assert s.x_lo.iloc[1] == 5.0  # one value: no interval, lo == hi == mean
    assert list(s.x_method) == ["t", "t"]


def test_summarize_uses_each_kinds_method() -> None:
    df = pd.DataFrame({"k": [1] * 4, "goodput": [0.97, 0.99, 0.995, 1.0],
                       "elapsed_s": [10.0, 12.0, 11.0, 13.0], "restarts": [0, 0, 1, 0],
                       "speedup": [0.1, 0.2, 0.15, 0.3]})
    s = an.summarize(df, "k", ["goodput", "elapsed_s", "restarts", "speedup"],
                     kinds={"speedup": "ratio"}).iloc[0]
    assert (s.goodput_method, s.elapsed_s_method, s.restarts_method, s.speedup_method) == (
        "logit t", "t", "root t", "logit t")
    assert 0.0 <= s.goodput_lo < s.goodput_mean < s.goodput_hi <= 1.0
    assert s.elapsed_s_ci == pytest.approx(an.ci95(df.elapsed_s))
    assert s.restarts_lo == 0.0 < s.restarts_mean < s.restarts_hi
    # the paired differences of a ratio: inside [-1, 1]
    d = an.summarize(pd.DataFrame({"k": [1, 1], "diff": [0.609, 0.896]}), "k", "diff",
                     kinds={"diff": "ratio"}, differences=True).iloc[0]
    assert d.diff_method == "paired logit t" and -1.0 <= d.diff_lo <= d.diff_hi <= 1.0


def test_count_intervals_in_notebooks_stay_at_or_above_0() -> None:
    # fallbacks per run over 3 seeds: the t interval was [-1.10, 1.77]
    runs = pd.DataFrame({"replicas": [1, 1, 1, 2, 2, 2], "fallbacks": [0, 0, 1, 0, 0, 0],
                         "steps_lost_to_fallback": [0, 0, 40, 0, 0, 0]})
    s = an.summarize(runs, "replicas", ["fallbacks", "steps_lost_to_fallback"])
    for m in ("fallbacks", "steps_lost_to_fallback"):
        assert (s[f"{m}_lo"] >= 0).all() and (s[f"{m}_lo"] <= s[f"{m}_mean"]).all()
        low, high = an.error_bars(s, m)
        assert (s[f"{m}_mean"] - low >= 0).all() and (high >= 0).all()
    assert list(s.fallbacks_lo) == [0.0, 0.0] and s.fallbacks_hi.iloc[1] == 0.0  # no spread


def test_young_and_daly() -> None:
    assert an.young_interval(2.0, 100.0) == pytest.approx(20.0)
    # Daly's optimum approaches Young's minus delta for delta << M
    d = an.daly_interval(1.0, 1e6)
    assert d == pytest.approx(an.young_interval(1.0, 1e6) - 1.0, rel=1e-3)
    assert an.daly_interval(10.0, 4.0) == 4.0
    # no failures (M -> inf): T_w -> T_s (tau + delta) / tau
    assert an.daly_wall_time(1000.0, 100.0, 1.0, 1e12, 0.0) == pytest.approx(1010.0, rel=1e-6)
    # the wall time is minimised near Daly's interval
    m, delta, r, ts = 3600.0, 30.0, 60.0, 1e5
    taus = [10.0 * i for i in range(5, 200)]
    best = min(taus, key=lambda tau: an.daly_wall_time(ts, tau, delta, m, r))
    assert abs(best - an.daly_interval(delta, m)) <= 10.0


def test_daly_params_of_a_scenario(runs: dict[str, Path]) -> None:
    p = an.daly_params(runs["checkpoint-restart"])
    # kill-pause-join: 4 workers, 8 shards of 0.1 s -> 2 per worker, + 0.005 allreduce
    assert p["step_s"] == pytest.approx(0.205)
    assert p["tau"] == pytest.approx(50 * 0.205) and p["T_s"] == pytest.approx(200 * 0.205)
    assert math.isinf(p["M"])
    assert an.daly_goodput(p) == pytest.approx(p["tau"] / (p["tau"] + p["delta"]))
    finite = dict(p, M=100.0)
    assert 0.0 < an.daly_goodput(finite) < an.daly_goodput(p)


def _synthetic_real_run(d: Path) -> Path:
    """A real-target-like history: one commit per step, a kill then a pause."""
    import json

    from rollcall.results import prepare_out_dir
    from rollcall.scenario import parse_scenario

    sc = parse_scenario("""
name: synth
target: real
cluster: {workers: 4}
workload: {steps: 30, global_batch: 32, micro_batch: 4, model_params: 1000, bytes_per_param: 12}
detector: {heartbeat_s: 0.1, timeout_s: 1.0}
""")
    prepare_out_dir(d, sc)
    recs: list[dict] = []

    def r(t: float, type_: str, f: str, process: object, **kw: object) -> None:
        recs.append({"t": t, "type": type_, "f": f, "process": process, **kw})

    r(9.999, "invoke", "round", "keeper", gen=1, reason="start")
    r(10.0, "ok", "generation", "keeper", gen=1, members=[[0, 3]], cursor=[0, 0], reason="start", source=None, stale=0)
    t = 10.0
    for s in range(10):  # 4 members: 2 shards each, 0.02 s per step
        t += 0.02
        r(round(t, 6), "ok", "commit", 0, gen=1, step=s, last=s, sample=32 * s, stop=32 * s + 32, batch=32, t0=t - 0.015)
    r(10.21, "info", "fault", "nemesis", kind="kill", workers=[1])
    r(10.26, "invoke", "round", "keeper", gen=2, reason="step-failed")
    r(10.264, "ok", "generation", "keeper", gen=2, members=[[0, 0], [2, 3]], cursor=[10, 320],
      reason="step-failed", source=0, stale=0)
    t = 10.264
    for s in range(10, 20):  # 3 members: 3 shards each, 0.03 s per step
        t += 0.03
        r(round(t, 6), "ok", "commit", 0, gen=2, step=s, last=s, sample=32 * s, stop=32 * s + 32, batch=32, t0=t - 0.02)
    r(10.6, "info", "fault", "nemesis", kind="pause", workers=[2], for_s=2.0)
    r(11.6, "info", "evict", "keeper", worker=2, incarnation=0, reason="timeout")
    r(11.6, "invoke", "round", "keeper", gen=3, reason="failure")
    r(11.602, "ok", "generation", "keeper", gen=3, members=[[0, 0], [3, 3]], cursor=[20, 640],
      reason="failure", source=0, stale=0)
    t = 11.602
    for s in range(20, 30):  # 2 members: 4 shards each, 0.04 s per step
        t += 0.04
        r(round(t, 6), "ok", "commit", 0, gen=3, step=s, last=s, sample=32 * s, stop=32 * s + 32, batch=32, t0=t - 0.03)
    (d / "history.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))
    return d


def test_calibrate_measures_and_maps(tmp_path: Path) -> None:
    from rollcall.app import calibrate
    from rollcall.scenario import load_scenario

    run = _synthetic_real_run(tmp_path / "run")
    cal = calibrate.measure(run)
    assert cal["micro_batch_s"] == pytest.approx(0.01, rel=1e-3)
    assert cal["allreduce_s"] == pytest.approx(0.0, abs=1e-6)
    assert cal["kill_detection_s"] == pytest.approx(0.05)
    assert cal["pause_detection_s"] == pytest.approx(1.0)
    assert cal["roll_call_s"] == pytest.approx(0.003)
    assert cal["checkpoint_write_s"] == 0.0  # elastic: the real target writes none
    assert cal["restart_s"] is None
    ov = calibrate.overrides(cal)
    assert ov["workload.micro_batch_s"] == pytest.approx(0.01, rel=1e-3)
    assert "detector.timeout_s" not in ov  # the scenario's meaning, not a cost
    assert ov["network.latency_s"] == pytest.approx(0.0015)
    assert "strategy.restart_s" not in ov
    # a kill is an exit notice on both targets: it times the notice, not the detector
    assert ov["detector.exit_notice_s"] == pytest.approx(0.05)
    assert "detector.heartbeat_s" not in ov
    path = calibrate.write_calibration(cal, tmp_path / "calibration.yaml")
    sc = calibrate.apply(load_scenario(run / "scenario.yaml", []), calibrate.read_calibration(path))
    assert sc.target == "sim" and sc.detector.timeout_s == load_scenario(
        run / "scenario.yaml", []).detector.timeout_s
    assert sc.workload.global_batch == 32  # untouched keys stay


def test_cli_calibrate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rollcall.app.cli import main

    run = _synthetic_real_run(tmp_path / "run")
    assert main(["calibrate", str(run)]) == 0
    out = capsys.readouterr().out
    assert "detector.exit_notice_s=" in out and "detector.timeout_s" not in out
    assert (run / "calibration.yaml").exists()
    assert main(["calibrate", str(tmp_path / "nope")]) == 2


def test_calibrate_refuses_a_sim_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A sim run's timings are its scenario's own model: calibrating on them
    would write a calibration 75x off. One line, exit 2, nothing written."""
    from rollcall.app.cli import main

    run = tmp_path / "sim"
    assert main(["run", str(ROOT / "scenarios" / "quickstart.yaml"), "--out", str(run),
                 "--quiet"]) == 0
    capsys.readouterr()
    assert main(["calibrate", str(run)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "a sim run" in err, err
    assert not (run / "calibration.yaml").exists()
