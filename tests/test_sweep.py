"""rollcall.app.sweeps and `rollcall sweep`: grid expansion, resume, interruption, sweep.csv."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from rollcall.app import sweeps as sw
from rollcall.app.cli import main
from rollcall.results import SUMMARY_KEYS

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = str(ROOT / "scenarios" / "kill-pause-join.yaml")
# short workload so that each point takes milliseconds
SETS = ["workload.steps=60", "failures.schedule.0.at_step=20"]


def test_parse_and_expand_grid() -> None:
    grid = sw.parse_grid(["cluster.workers=4,8", "failures.worker_mtbf_s=null,3600.5", "strategy.batch=shrink"])
    assert grid == {"cluster.workers": [4, 8], "failures.worker_mtbf_s": [None, 3600.5],
                    "strategy.batch": ["shrink"]}
    points = sw.expand_grid(grid)
    assert len(points) == 4
    assert points[0] == {"cluster.workers": 4, "failures.worker_mtbf_s": None, "strategy.batch": "shrink"}
    assert points[-1]["cluster.workers"] == 8 and points[-1]["failures.worker_mtbf_s"] == 3600.5
    assert sw.expand_grid({}) == [{}]
    for bad in (["cluster.workers"], ["=1,2"], ["a=1", "a=2"], ["a=,"]):
        with pytest.raises(ValueError):
            sw.parse_grid(bad)


def test_plan_names_are_deterministic_and_distinct() -> None:
    grid = {"cluster.workers": [4, 8], "detector.timeout_s": [1.5, 3]}
    a = sw.plan(grid, [0, 1])
    b = sw.plan(grid, [0, 1])
    assert len(a) == 2 * 2 * 2 * 2
    assert [p.rel_dir for p in a] == [p.rel_dir for p in b]
    assert len({p.rel_dir for p in a}) == len(a)
    assert a[0].rel_dir == Path("checkpoint-restart/cluster.workers=4,detector.timeout_s=1.5/seed0")
    assert a[0].sets() == ["cluster.workers=4", "detector.timeout_s=1.5"]
    assert sw.Point({"failures.worker_mtbf_s": None}, "elastic", 0).sets() == ["failures.worker_mtbf_s=null"]


def test_sweep_resume_interrupt_and_csv(tmp_path: Path) -> None:
    grid = {"detector.timeout_s": [1.0, 3.0]}
    out = tmp_path / "sw"
    # "interrupted" after 3 of 8 points: what finished is kept and listed
    df = sw.sweep(SCENARIO, grid, seeds=2, sets=SETS, out=out, jobs=1, progress=False, limit=3)
    assert len(df) == 3
    assert len(list(out.rglob("summary.json"))) == 3
    # a run cut short mid-way leaves a directory without summary.json: it is redone
    pending = [p for p in sw.plan(grid, [0, 1]) if not (out / p.rel_dir / "summary.json").exists()]
    half = out / pending[0].rel_dir
    half.mkdir(parents=True)
    (half / "history.jsonl").write_text('{"torn": true}\n')
    before = {p: p.stat().st_mtime_ns for p in out.rglob("summary.json")}
    df = sw.sweep(SCENARIO, grid, seeds=2, sets=SETS, out=out, jobs=2, progress=False)
    assert len(df) == 8
    assert all(p.stat().st_mtime_ns == m for p, m in before.items())  # finished runs untouched
    assert '"torn"' not in (half / "history.jsonl").read_text()
    # a second run runs nothing
    before = {p: p.stat().st_mtime_ns for p in out.rglob("summary.json")}
    df2 = sw.sweep(SCENARIO, grid, seeds=2, sets=SETS, out=out, jobs=2, progress=False)
    assert {p: p.stat().st_mtime_ns for p in out.rglob("summary.json")} == before
    csv = pd.read_csv(out / "sweep.csv")
    assert len(csv) == len(df2) == 8
    assert list(csv.columns[: len(SUMMARY_KEYS)]) == list(SUMMARY_KEYS)
    assert {"detector.timeout_s", "run_dir"} <= set(csv.columns)
    assert set(csv.strategy) == {"elastic", "checkpoint-restart"}
    assert sorted(set(csv.seed)) == [0, 1]
    assert csv.valid.all() and csv.completed.all() and (csv.steps_target == 60).all()
    for row in csv.itertuples():
        assert (out / row.run_dir / "summary.json").exists()
    # the grid value really reached the scenario
    import yaml
    one = csv[csv["detector.timeout_s"] == 1.0].iloc[0]
    resolved = yaml.safe_load((out / one.run_dir / "scenario.yaml").read_text())
    assert resolved["detector"]["timeout_s"] == 1.0 and resolved["strategy"]["kind"] == one.strategy


def test_cli_sweep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli"
    args = ["sweep", SCENARIO, "--grid", "cluster.workers=4,6", "--seeds", "1", "--jobs", "1",
            "--out", str(out)] + [x for s in SETS for x in ("--set", s)]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "runs: 4  not completed: 0  invalid: 0" in text and f"csv: {out / 'sweep.csv'}" in text
    assert main(args + ["--strategy", "elastic"]) == 0
    assert len(pd.read_csv(out / "sweep.csv")) == 2


def test_cli_sweep_bad_grid(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["sweep", SCENARIO, "--grid", "cluster.workers", "--out", str(tmp_path)]) == 2
    assert "expected KEY=V1,V2" in capsys.readouterr().err
    # a value the schema refuses is the usual one-line scenario error, before anything runs
    assert main(["sweep", SCENARIO, "--grid", "workload.micro_batch=7", "--out", str(tmp_path / "b")]) == 2
    assert "micro_batch" in capsys.readouterr().err
    assert not (tmp_path / "b" / "sweep.csv").exists()


def _mtimes(out: Path) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in out.rglob("summary.json")}


def test_resumed_point_reruns_when_its_scenario_changed(tmp_path: Path) -> None:
    text = Path(SCENARIO).read_text()
    scenario = tmp_path / "s.yaml"
    scenario.write_text(text)
    grid = {"detector.timeout_s": [1.0]}
    out = tmp_path / "sw"
    df = sw.sweep(scenario, grid, seeds=1, sets=SETS, out=out, jobs=1, progress=False)
    assert len(df) == 2 and set(df.steps_target) == {60}
    before = _mtimes(out)
    # a comment changes no run: nothing reruns
    scenario.write_text("# a comment\n" + text)
    sw.sweep(scenario, grid, seeds=1, sets=SETS, out=out, jobs=1, progress=False)
    assert _mtimes(out) == before
    # the file is edited: same command, every point is stale and reruns
    scenario.write_text(text.replace("micro_batch_s: 0.1 ", "micro_batch_s: 0.2 "))
    df = sw.sweep(scenario, grid, seeds=1, sets=SETS, out=out, jobs=1, progress=False)
    after = _mtimes(out)
    assert len(df) == 2 and all(after[p] != m for p, m in before.items())
    # a --set that changes the run also makes it stale; one that does not change nothing
    df = sw.sweep(scenario, grid, seeds=1, sets=SETS + ["workload.steps=70"], out=out, jobs=1,
                  progress=False, strategies=("elastic",))
    assert list(df.steps_target) == [70]
    # the checkpoint-restart point, still of steps=60, is not listed as a run of steps=70
    assert len(pd.read_csv(out / "sweep.csv")) == 1


def test_runs_of_another_scenario_in_the_same_out_are_not_mixed_in(tmp_path: Path) -> None:
    grid = {"detector.timeout_s": [1.0]}
    out = tmp_path / "sw"
    sw.sweep(SCENARIO, grid, seeds=1, sets=SETS, out=out, jobs=1, progress=False, limit=1)
    other = tmp_path / "other.yaml"
    other.write_text(Path(SCENARIO).read_text().replace("micro_batch_s: 0.1 ", "micro_batch_s: 0.2 "))
    # limit=0: nothing runs; the first scenario's finished point is not this one's
    df = sw.sweep(other, grid, seeds=1, sets=SETS, out=out, jobs=1, progress=False, limit=0)
    assert len(df) == 0
    # the one rule compare resumes by too: the run's own scenario.yaml must
    # hash to the point's resolved scenario, and the run must not be interrupted
    done = next(out.rglob("point.json"))
    meta = json.loads(done.read_text())
    point, sha = sw.Point(meta["grid"], meta["strategy"], meta["seed"]), meta["scenario_sha256"]
    assert sw.is_done(out, point, sha) and not sw.is_done(out, point, "x")
    summary_path = done.parent / "summary.json"
    summary = json.loads(summary_path.read_text())
    summary_path.write_text(json.dumps({**summary, "result": "interrupted"}))
    assert not sw.is_done(out, point, sha)
    summary_path.write_text(json.dumps(summary))
    scenario_yaml = done.parent / "scenario.yaml"
    scenario_yaml.write_text(scenario_yaml.read_text() + "# edited\n")
    assert not sw.is_done(out, point, sha)


# --- adaptive replication (--rel-accuracy) -------------------------------------------

QUICK = str(ROOT / "scenarios" / "quickstart.yaml")
RANDOM = ["failures.worker_mtbf_s=400", "failures.schedule=[]"]  # elapsed_s varies by seed


def _adaptive(out: Path, jobs: int, rel: float, max_seeds: int, sets=RANDOM) -> pd.DataFrame:
    # at the scenario's interval: this is about seeds, not intervals
    return sw.sweep(QUICK, {"cluster.spares": [1, 3]}, seeds=2, first_seed=0,
                    strategies=["elastic"], sets=sets, out=out, jobs=jobs, progress=False,
                    rel_accuracy=rel, max_seeds=max_seeds, fixed_interval=True)


def test_adaptive_replication_adds_seeds_until_each_point_is_known(tmp_path: Path) -> None:
    from rollcall.app.analysis import mean_ci

    rel = 0.06
    df = _adaptive(tmp_path / "a", 1, rel, 20)
    counts = df.groupby("cluster.spares").seed.agg(["count", "max"])
    took = df.groupby("cluster.spares").seeds.agg(["min", "max"])
    assert (took["min"] == took["max"]).all() and (took["min"] == counts["count"]).all()
    assert list(counts["max"] + 1) == list(counts["count"])  # seeds 0..n-1, none skipped
    assert counts["count"].nunique() == 2, counts  # the two points needed different numbers
    for _, group in df.groupby("cluster.spares"):
        values = list(group.sort_values("seed").elapsed_s)
        mean, half = mean_ci(values)
        assert half <= rel * mean  # known to rel ...
        mean, half = mean_ci(values[:-1])
        assert not half <= rel * mean  # ... and not one seed earlier
    again = _adaptive(tmp_path / "b", 2, rel, 20)  # another pool size: the same rows
    cols = ["run_dir", "seed", "elapsed_s", "seeds"]
    assert df.sort_values("run_dir")[cols].values.tolist() == \
        again.sort_values("run_dir")[cols].values.tolist()


def test_adaptive_replication_stops_at_the_cap_and_at_no_variance(tmp_path: Path) -> None:
    capped = _adaptive(tmp_path / "cap", 1, 1e-6, 5)
    assert sorted(capped.seeds.unique()) == [5] and len(capped) == 10
    fixed = _adaptive(tmp_path / "fixed", 1, 1e-6, 5, sets=["failures.schedule=[]"])
    assert list(fixed.seeds) == [2, 2, 2, 2]  # no random failure: every seed agrees


def test_cli_adaptive_replication_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["sweep", QUICK, "--out", str(tmp_path / "o"), "--quiet", "--rel-accuracy", "0.1"]
    assert main(base + ["--seeds", "4", "--max-seeds", "3"]) == 2
    assert "--max-seeds 3 is below --seeds 4" in capsys.readouterr().err
    assert main(base + ["--metric", "nope"]) == 2
    assert "--metric 'nope' is not a summary key" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
