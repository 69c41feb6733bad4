"""``rollcall.run(...)``: the Python API for notebooks, on the sim target.

It must be the same run as ``rollcall run`` (byte-identical history for the
same scenario and seed), take its overrides as dotted keys, and keep
``import rollcall`` cheap.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import rollcall
from rollcall.app import cli
from rollcall.app.api import Summary
from rollcall.app.cli import RunRefused
from rollcall.results import SUMMARY_KEYS
from rollcall.scenario import ScenarioError, load_scenario

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"


def test_import_rollcall_loads_no_driver_and_no_heavy_package() -> None:
    code = ("import sys, rollcall; heavy = {'pydantic', 'pandas', 'yaml', 'sim', 'real', 'numpy'};"
            "print(sorted(heavy & set(sys.modules))); rollcall.run; print('pydantic' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["[]", "True"]  # the API itself arrives on first use


def test_run_is_the_cli_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s = rollcall.run(QUICKSTART, out=tmp_path / "api", failures__worker_mtbf_s=3600,
                     set={"workload.steps": 120})
    assert cli.main(["run", str(QUICKSTART), "--out", str(tmp_path / "cli"), "--quiet",
                     "--set", "failures.worker_mtbf_s=3600", "--set", "workload.steps=120"]) == 0
    capsys.readouterr()
    for name in ("history.jsonl", "scenario.yaml"):
        assert (tmp_path / "api" / name).read_bytes() == (tmp_path / "cli" / name).read_bytes()
    on_disk = json.loads((tmp_path / "api" / "summary.json").read_text())
    assert isinstance(s, Summary) and s.dir == tmp_path / "api"
    assert s.to_dict() == on_disk
    assert {k: getattr(s, k) for k in SUMMARY_KEYS} == {k: on_disk[k] for k in SUMMARY_KEYS}
    assert s.completed and s.valid and s.steps_target == 120 and s.target == "sim"
    assert s.events == on_disk["events"]  # a driver's extra key, as an attribute
    with pytest.raises(AttributeError, match="no key 'nope'"):
        _ = s.nope
    history = s.history()
    lines = (tmp_path / "api" / "history.jsonl").read_text().splitlines()
    assert len(history) == len(lines) and list(history["f"][:1]) == ["start"]
    resolved = yaml.safe_load((tmp_path / "api" / "scenario.yaml").read_text())
    assert resolved["failures"]["worker_mtbf_s"] == 3600 and resolved["workload"]["steps"] == 120


def test_a_dict_a_scenario_and_the_flags(tmp_path: Path) -> None:
    raw = {"name": "api-dict", "cluster": {"gpus": 4}, "workload": {"steps": 30}}
    a = rollcall.run(raw, out=tmp_path / "a", seed=3, strategy="checkpoint-restart",
                     rendezvous__min_workers="50%")
    assert (a.scenario, a.seed, a.strategy, a.completed) == ("api-dict", 3, "checkpoint-restart", True)
    resolved = load_scenario(tmp_path / "a" / "scenario.yaml")
    assert resolved.cluster.workers == 4 and resolved.rendezvous.min_workers == 2
    # a resolved Scenario runs again to the same history
    b = rollcall.run(resolved, out=tmp_path / "b")
    assert (tmp_path / "a" / "history.jsonl").read_bytes() == (tmp_path / "b" / "history.jsonl").read_bytes()
    assert b.elapsed_s == a.elapsed_s
    # keywords come after set=: the later word wins
    sc = rollcall.resolve(raw, set={"workload.steps": 10}, workload__steps=20)
    assert sc.workload.steps == 20 and rollcall.resolve(raw, target="real").target == "real"


def test_default_out_is_the_cli_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    s = rollcall.run({"name": "api-default", "workload": {"steps": 10}})
    assert s.dir.parent == Path("runs") / "api-default" and s.dir.name.endswith("-seed0")
    assert (tmp_path / s.dir / "summary.json").exists()


def test_errors_are_the_cli_ones(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=r"cluster.workers \(from --set\): expected an integer"):
        rollcall.run(QUICKSTART, cluster__workers="x", out=tmp_path / "x")
    assert not (tmp_path / "x").exists()
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "keep.txt").write_text("mine")
    with pytest.raises(RunRefused, match="exists and is not empty"):
        rollcall.run(QUICKSTART, out=tmp_path / "used")
    with pytest.raises(RunRefused, match="would write a history of at least"):
        rollcall.run(QUICKSTART, workload__steps=10**12, out=tmp_path / "huge")
    assert not (tmp_path / "huge").exists()
    with pytest.raises(TypeError, match="expected a Scenario, a mapping or a path"):
        rollcall.run(42)  # type: ignore[arg-type]
    with pytest.warns(UserWarning, match="never fires"):
        s = rollcall.run({"name": "late", "workload": {"steps": 10},
                          "failures": {"schedule": [{"at_step": 50, "kill": 0}]}},
                         out=tmp_path / "late")
    assert s.failures == 0


# failures every 7.5 s against 5 s restarts: each strategy finishes, at its own interval
BUSY = {"failures.worker_mtbf_s": 60, "cluster.repair_s": 10, "strategy.restart_s": 5,
        "workload.steps": 100}


def _interval_of(run_dir: Path) -> int:
    data = yaml.safe_load((run_dir / "scenario.yaml").read_text(encoding="utf-8"))
    return int(data["strategy"]["checkpoint_interval_steps"])


def test_compare_returns_the_tables_the_command_prints(tmp_path: Path) -> None:
    from rollcall.app import verdict as vd

    got = rollcall.compare(QUICKSTART, seeds=2, out=tmp_path / "cmp", set=BUSY)
    assert isinstance(got, rollcall.Compared) and got.dir == tmp_path / "cmp"
    assert list(got.table.columns)[:3] == ["checkpoint-restart", "elastic",
                                           "elastic - checkpoint-restart"]
    assert got.table.equals(vd.human_table(got.comparison))
    assert got.intervals.startswith("checkpoint intervals: checkpoint-restart 59 steps")
    assert "elastic 100 steps" in got.intervals
    assert got.verdict.text == vd.decide(got.comparison).text
    assert got.to_json()["checkpoint_intervals"]["elastic"]["source"] == "whole-job"
    assert _interval_of(got.dir / "checkpoint-restart-seed0") == 59
    assert _interval_of(got.dir / "elastic-seed0") == 100


def test_a_sweep_row_equals_the_compare_run_of_the_same_point_and_seed(tmp_path: Path) -> None:
    """One fair comparison: the sweep's point cluster.repair_s=10 is the
    compare's scenario, and each (strategy, seed) runs the same scenario at
    the same interval, to the same summary."""
    sets = {k: v for k, v in BUSY.items() if k != "cluster.repair_s"}
    swept = rollcall.sweep(QUICKSTART, {"cluster.repair_s": [10]}, seeds=2, seed=0,
                           out=tmp_path / "sweep", set=sets)
    compared = rollcall.compare(QUICKSTART, seeds=2, seed=0, out=tmp_path / "cmp", set=BUSY)
    assert len(swept.runs) == 4 and set(swept.table["strategy"]) == {"checkpoint-restart",
                                                                     "elastic"}
    rows = compared.comparison.runs
    for _, row in swept.runs.iterrows():
        mine = rows[(rows["strategy"] == row["strategy"]) & (rows["seed"] == row["seed"])]
        for metric in ("elapsed_s", "goodput", "restarts", "failures"):
            assert float(mine[metric].iloc[0]) == pytest.approx(float(row[metric]), rel=1e-12)
        sweep_dir = tmp_path / "sweep" / str(row["run_dir"])
        compare_dir = Path(str(mine["run_dir"].iloc[0]))
        assert _interval_of(sweep_dir) == _interval_of(compare_dir)
        assert (sweep_dir / "history.jsonl").read_bytes() == \
            (compare_dir / "history.jsonl").read_bytes()


def test_a_grid_that_sets_the_interval_keeps_it_for_both(tmp_path: Path) -> None:
    swept = rollcall.sweep(QUICKSTART, {"strategy.checkpoint_interval_steps": [7]}, seeds=1,
                           out=tmp_path / "sweep", set=BUSY)
    assert {_interval_of(tmp_path / "sweep" / str(d)) for d in swept.runs["run_dir"]} == {7}
