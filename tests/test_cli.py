"""The ``rollcall`` command around a driver (a stand-in driver, so no target is needed)."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from rollcall.app import cli, cli_common
from rollcall.results import SUMMARY_KEYS, read_summary, write_summary
from rollcall.scenario import Scenario, parse_scenario

ROOT = Path(__file__).resolve().parent.parent
QUICK = str(ROOT / "scenarios" / "quickstart.yaml")


def _fake_driver(monkeypatch: pytest.MonkeyPatch, target: str, completed: bool = True) -> list[Any]:
    seen: list[Any] = []

    def run(scenario: Scenario, out_dir: Path, **options: Any) -> dict[str, Any]:
        # options: the sim's ledger, max_wall_s and stop (the CLI's interrupt flag)
        seen.append((scenario, Path(out_dir)))
        summary = {k: 0 for k in SUMMARY_KEYS}
        summary.update(scenario=scenario.name, target=scenario.target, strategy=scenario.strategy.kind,
                       seed=scenario.seed, valid=True, completed=completed, violations=[], ettr=0.93)
        write_summary(out_dir, summary)
        return summary

    module = types.ModuleType(f"{target}.driver")
    module.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, f"{target}.driver", module)
    return seen


def test_run_calls_driver_and_prints_replay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen = _fake_driver(monkeypatch, "real")
    out = tmp_path / "run"
    # --force: quickstart's 10 worker ids may be more real processes than this machine holds
    code = cli.main(["run", QUICK, "--target", "real", "--seed", "5", "--strategy", "checkpoint-restart",
                     "--set", "workload.steps=10", "--set", "description=a b", "--out", str(out),
                     "--force"])
    assert code == 0
    scenario, out_dir = seen[0]
    assert (scenario.target, scenario.seed, scenario.strategy.kind, scenario.workload.steps) == (
        "real", 5, "checkpoint-restart", 10)
    assert out_dir == out
    assert parse_scenario((out / "scenario.yaml").read_text()) == scenario
    assert read_summary(out)["seed"] == 5
    stdout = capsys.readouterr().out
    assert "ettr" in stdout and "0.93" in stdout
    assert stdout.splitlines()[-1] == (
        f"replay: rollcall run {QUICK} --target real --seed 5 --strategy checkpoint-restart"
        " --set workload.steps=10 --set 'description=a b'"
    )


def test_run_exit_1_when_not_completed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_driver(monkeypatch, "sim", completed=False)
    assert cli.main(["run", QUICK, "--out", str(tmp_path), "--quiet"]) == 1
    assert capsys.readouterr().out.startswith("replay: rollcall run")


def test_run_default_out_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen = _fake_driver(monkeypatch, "sim")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli_common, "utc_stamp", lambda: "20250102T030405Z")
    assert cli.main(["run", QUICK, "--seed", "3", "--quiet"]) == 0
    assert seen[0][1] == Path("runs/quickstart/20250102T030405Z-seed3")
    assert (tmp_path / "runs/quickstart/20250102T030405Z-seed3/summary.json").exists()


def test_stamp_format() -> None:
    import re

    assert re.fullmatch(r"\d{8}T\d{6}Z", cli_common.utc_stamp())


def test_target_not_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # a driver module without `run` counts as not built, and nothing is written
    monkeypatch.setitem(sys.modules, "real.driver", types.ModuleType("real.driver"))
    out = tmp_path / "never"
    assert cli.main(["run", QUICK, "--target", "real", "--out", str(out)]) == 2
    assert capsys.readouterr().err == "rollcall: target 'real' is not built yet\n"
    assert not out.exists()


def test_compare_calls_target_compare(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = []

    def run(scenario: Scenario, run_dir: Path, max_wall_s: Any = None,
            stop: Any = None) -> dict[str, object]:
        """A target whose elastic runs take 90 s and checkpoint-restart 100 s + (seed - 10)."""
        assert stop.reason() is None  # every run polls the CLI's record of signals
        calls.append((scenario.strategy.kind, scenario.seed, run_dir.relative_to(tmp_path),
                      max_wall_s))
        cr = scenario.strategy.kind == "checkpoint-restart"
        return {"completed": True, "valid": True,
                "elapsed_s": 90.0 + scenario.seed if cr else 90.0, "goodput": 0.9}

    module = types.ModuleType("sim.driver")
    module.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sim.driver", module)
    assert cli.main(["compare", QUICK, "--seeds", "3", "--seed", "10", "--out", str(tmp_path)]) == 0
    # one run per seed and strategy, each in its own directory, in that order
    assert calls == [(kind, seed, Path(f"{kind}-seed{seed}"), None) for seed in (10, 11, 12)
                     for kind in ("checkpoint-restart", "elastic")]
    out = capsys.readouterr().out
    # d = -10, -11, -12 s: mean -11, half-width 4.303 * 1 / sqrt(3) = 2.48
    assert "verdict: elastic saves 11 [9, 13] of 101 s" in out and "; significant" in out
    assert (tmp_path / "scenario.yaml").exists()


def test_python_dash_m_validate() -> None:
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "rollcall", "validate", QUICK],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "ok: quickstart (sim, elastic)\n", "")


@pytest.mark.parametrize("command", ["run", "compare", "sweep"])
@pytest.mark.parametrize("case, needle", [
    ("endpoints", "keeper.etcd_endpoints: refused at http://127.0.0.1:2379"),
    ("no-etcd", "needs the etcd server"),
])
def test_an_etcd_keeper_that_cannot_run_here_is_refused_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        command: str, case: str, needle: str) -> None:
    """keeper.store: etcd on real: a user's cluster that will not do (its
    own check, real/keeper_store.cluster_problem, which
    tests/test_real_failover.py runs against real clusters), or no etcd
    binary, is refused before anything starts (exit 2, one line), by every
    command."""
    seen = _fake_driver(monkeypatch, "real")
    extra = ["--set", "keeper.etcd_endpoints=[http://127.0.0.1:2379]"] if case == "endpoints" else []
    if case == "endpoints":
        import real.keeper_store

        asked: list[tuple] = []
        monkeypatch.setattr(real.keeper_store, "cluster_problem", lambda *a: asked.append(a) or
                            f"keeper.etcd_endpoints: refused at {a[0][0]}")
    if case == "no-etcd":
        import real.etcd

        monkeypatch.setattr(real.etcd, "etcd_binary", lambda: None)
    path = tmp_path / "s.yaml"
    path.write_text("name: k\ntarget: real\ncluster: {workers: 2}\n"
                    "keeper: {store: etcd, standbys: 1}\n")
    args = [command, str(path), *extra, "--out", str(tmp_path / "out")]
    code = cli.main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and needle in err[0], err
    assert not seen
    if case == "endpoints":
        assert asked == [(("http://127.0.0.1:2379",), None, None)]
