"""`rollcall run/compare/sweep` refuse what would silently go wrong or grow without bound.

An existing ``--out``, a history too large to write, more real processes than
the machine holds, ``--max-wall-s``: each gives one line and exit 2, or for
``--max-wall-s`` a run ended on time with its summary and history kept.
"""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from rollcall.app import checks, cli, cli_common
from rollcall.results import SUMMARY_KEYS, claim_out_dir, OutDirError, read_history, write_summary
from rollcall.scenario import Scenario, parse_scenario

ROOT = Path(__file__).resolve().parent.parent
QUICK = str(ROOT / "scenarios" / "quickstart.yaml")
REAL_FOUR = str(ROOT / "scenarios" / "real-kill-one.yaml")


def _fake_real(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """A stand-in ``real.driver`` (no process is started) that records where it ran."""
    seen: list[Path] = []

    def run(scenario: Scenario, out_dir: Path, **options: Any) -> dict[str, Any]:
        seen.append(Path(out_dir))
        summary = {k: 0 for k in SUMMARY_KEYS}
        summary.update(scenario=scenario.name, target="real", strategy=scenario.strategy.kind,
                       seed=scenario.seed, valid=True, completed=True, violations=[])
        write_summary(out_dir, summary)
        return summary

    module = types.ModuleType("real.driver")
    module.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "real.driver", module)
    return seen


def _one_error(capsys: pytest.CaptureFixture[str], fragment: str) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("rollcall: ") and fragment in lines[0], lines[0]
    return lines[0]


# ------------------------------------------------------------------ --out and --force


def test_existing_out_is_refused_unless_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    argv = ["run", QUICK, "--set", "workload.steps=20", "--out", str(out), "--quiet"]
    assert cli.main(argv) == 0
    capsys.readouterr()
    first = (out / "history.jsonl").read_bytes()
    (out / "notes.txt").write_text("mine")
    assert cli.main(argv) == 2
    _one_error(capsys, f"{out}: exists and is not empty; pass --force")
    assert (out / "history.jsonl").read_bytes() == first  # untouched
    assert cli.main(argv + ["--force"]) == 0
    assert (out / "history.jsonl").read_bytes() == first  # same run, fresh history
    assert (out / "notes.txt").read_text() == "mine"  # --force removes only the results


def test_force_removes_the_stale_summary_first(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "summary.json").write_text("{}")
    (out / "history.jsonl").write_text('{"old": 1}\n')
    with pytest.raises(OutDirError):
        claim_out_dir(out, force=False)
    claim_out_dir(out, force=True)
    assert not (out / "summary.json").exists() and not (out / "history.jsonl").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert claim_out_dir(empty, force=False) == empty
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutDirError, match="not a directory"):
        claim_out_dir(tmp_path / "file", force=True)


def test_default_out_dir_is_never_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli_common, "utc_stamp", lambda: "20260101T000000Z")
    argv = ["run", QUICK, "--set", "workload.steps=20", "--quiet"]
    assert cli.main(argv) == 0 and cli.main(argv) == 0
    runs = sorted(p.name for p in (tmp_path / "runs" / "quickstart").iterdir())
    assert runs == ["20260101T000000Z-seed0", "20260101T000000Z-seed0-2"]


# ------------------------------------------------------------------ sizes


def test_steps_whose_history_is_too_large_are_refused(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "big"
    assert cli.main(["run", QUICK, "--set", "workload.steps=1000000000000", "--out", str(out)]) == 2
    _one_error(capsys, "workload.steps=1000000000000 would write a history of at least")
    assert not out.exists()
    for command in ("compare", "sweep"):
        assert cli.main([command, QUICK, "--set", "workload.steps=1000000000000",
                         "--out", str(out)]) == 2
        _one_error(capsys, "more than --max-history-mb 1024")
    assert not out.exists()


def test_max_history_mb_moves_the_bound() -> None:
    sc = parse_scenario("name: h\nworkload: {steps: 100000000}\nstrategy: {checkpoint_interval_steps: 50}\n")
    # 2 records per 50 steps, 120 B each: about 458 MiB
    assert checks.size_problem(sc, False, 1024, False) is None
    assert "more than --max-history-mb 100" in str(checks.size_problem(sc, False, 100, False))
    # the per-sample ledger writes a record per member per step
    assert checks.size_problem(sc, True, 1024, False) is not None


def test_huge_steps_subprocess_is_one_line_and_quick(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "rollcall", "run", QUICK, "--set",
                           "workload.steps=1000000000000", "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1 and "history" in proc.stderr


def test_real_target_refuses_more_workers_than_the_machine_holds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    seen = _fake_real(monkeypatch)
    monkeypatch.setattr(checks, "real_capacity", lambda: 3)
    out = tmp_path / "r"
    assert cli.main(["run", REAL_FOUR, "--out", str(out), "--quiet"]) == 2
    _one_error(capsys, "the real target would start 4 worker processes")
    assert cli.main(["compare", REAL_FOUR, "--out", str(out)]) == 2
    _one_error(capsys, "pass --force to run anyway")
    assert seen == [] and not out.exists()
    assert cli.main(["run", REAL_FOUR, "--out", str(out), "--quiet", "--force"]) == 0
    assert seen == [out]


def test_real_capacity_is_bounded_by_cpus() -> None:
    import os
    assert 1 <= checks.real_capacity() <= checks.REAL_WORKERS_PER_CPU * (os.cpu_count() or 1)


def test_sweep_on_real_runs_one_job_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    # the stand-in driver exists only in this process: a pool of jobs would not find it
    seen = _fake_real(monkeypatch)
    out = tmp_path / "sw"
    code = cli.main(["sweep", REAL_FOUR, "--seeds", "1", "--jobs", "4", "--out", str(out), "--quiet"])
    assert code == 0
    assert "one run at a time (not --jobs 4)" in capsys.readouterr().err
    assert len(seen) == 2


# ------------------------------------------------------------------ --max-wall-s


def test_max_wall_s_ends_the_sim_with_summary_and_history(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    # a billion failure-free steps: far more than a fraction of a second of wall runs
    out = tmp_path / "w"
    code = cli.main(["run", QUICK, "--set", "workload.steps=1000000000", "--set", "failures.schedule=[]",
                     "--max-history-mb", "1000000", "--max-wall-s", "0.2", "--out", str(out), "--quiet"])
    assert code == 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] is False and summary["valid"] is True
    assert summary["end_reason"] == "wall limit: --max-wall-s 0.2 reached"
    assert 0 < summary["steps_committed"] < 1_000_000_000
    # a run that did not complete took until it was stopped, from the start of training
    records = list(read_history(out))
    started = next(r["t"] for r in records if r["f"] == "generation")
    assert summary["elapsed_s"] == pytest.approx(summary["end_s"] - started)
    assert summary["elapsed_s"] > 0
    assert summary["end_s"] == records[-1]["t"]
    assert records[-1]["f"] == "end" and records[-1]["completed"] is False
    times = [r["t"] for r in records if r.get("f") != "contribute"]
    assert times == sorted(times)


def test_max_wall_s_does_not_change_a_run_that_ends_in_time(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    assert cli.main(["run", QUICK, "--out", str(a), "--quiet"]) == 0
    assert cli.main(["run", QUICK, "--out", str(b), "--quiet", "--max-wall-s", "600"]) == 0
    assert (a / "history.jsonl").read_bytes() == (b / "history.jsonl").read_bytes()


def test_max_wall_s_is_positive(capsys: pytest.CaptureFixture[str]) -> None:
    for bad in ("0", "-1", "nan", "inf", "x"):
        with pytest.raises(SystemExit) as info:
            cli.main(["run", QUICK, "--max-wall-s", bad])
        assert info.value.code == 2
        assert len(capsys.readouterr().err.splitlines()) == 1


# ------------------------------------------------------------------ goodput


def test_goodput_of_a_calibrated_sim_run_is_at_most_one(tmp_path: Path) -> None:
    # measured step times where seven workers step 10x faster than eight
    # (CPU workers sharing cores): steps x ideal / elapsed is 1.13 here
    out = tmp_path / "cal"
    assert cli.main(["run", QUICK, "--set", "workload.step_s_by_workers={8: 0.2, 7: 0.02, 6: 0.02, 9: 0.2}",
                     "--out", str(out), "--quiet"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["steps_committed"] * s["ideal_step_s"] / s["elapsed_s"] > 1
    assert s["goodput"] == 1.0


def test_goodput_of_a_run_cut_short_counts_its_committed_steps(tmp_path: Path) -> None:
    out = tmp_path / "w"
    cli.main(["run", QUICK, "--set", "workload.steps=1000000000", "--set", "failures.schedule=[]",
              "--max-history-mb", "1000000", "--max-wall-s", "0.2", "--out", str(out), "--quiet"])
    s = json.loads((out / "summary.json").read_text())
    assert s["completed"] is False
    assert s["goodput"] == pytest.approx(s["steps_committed"] * s["ideal_step_s"] / s["elapsed_s"])
    assert 0 < s["goodput"] <= 1


@pytest.mark.parametrize("fault", ["partition: [1]", "isolate_keeper: 1", "loss: 1, rate: 0.1"])
def test_rollcall_keeper_refuses_a_link_fault(tmp_path: Path, fault: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """``rollcall keeper`` serves hosts it does not run: their links are not its
    to cut (a ``delay`` is: the host agents' relay holds it). One line, exit 2,
    nothing started."""
    out = tmp_path / "k"
    assert cli.main(["keeper", REAL_FOUR, "--bind", "127.0.0.1", "--out", str(out),
                     "--set", "cluster.workers_per_host=2",
                     "--set", f"failures.schedule=[{{at_s: 1.0, {fault}, for_s: 2.0}}]"]) == 2
    assert "use rollcall run" in _one_error(capsys, "rollcall keeper cannot")
    assert not out.exists()
