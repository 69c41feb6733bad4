"""Same scenario and seed -> byte-identical history.jsonl; another seed -> another history."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollcall.scenario import load_scenario
from sim.driver import run

ROOT = Path(__file__).resolve().parent.parent
QUICK = ROOT / "scenarios" / "quickstart.yaml"
# failures every few seconds, against restarts of 5 s: busy, yet each strategy finishes
RANDOM = ["failures.worker_mtbf_s=40", "cluster.repair_s=5", "failures.distribution=weibull",
          "workload.steps=600", "strategy.restart_s=5"]


def _history(tmp_path: Path, name: str, seed: int, strategy: str) -> bytes:
    sc = load_scenario(QUICK, RANDOM, seed=seed, strategy=strategy)
    summary = run(sc, tmp_path / name)
    assert summary["valid"] and summary["completed"], summary["violations"]
    assert summary["failures"] > 1  # the random failure process is really on
    return (tmp_path / name / "history.jsonl").read_bytes()


@pytest.mark.parametrize("strategy", ["elastic", "checkpoint-restart"])
def test_same_seed_byte_identical_other_seed_differs(tmp_path: Path, strategy: str) -> None:
    a = _history(tmp_path, "a", 7, strategy)
    b = _history(tmp_path, "b", 7, strategy)
    c = _history(tmp_path, "c", 8, strategy)
    assert a == b
    assert a != c


def test_failure_trace_does_not_depend_on_strategy(tmp_path: Path) -> None:
    """compare runs both strategies on the same failure draws."""
    crashes = {}
    for strategy in ("elastic", "checkpoint-restart"):
        sc = load_scenario(QUICK, RANDOM + ["failures.schedule=[]"], seed=3, strategy=strategy)
        run(sc, tmp_path / strategy)
        lines = (tmp_path / strategy / "history.jsonl").read_text().splitlines()
        faults = [json.loads(x) for x in lines if '"fault"' in x]
        end = min(json.loads(lines[-1])["t"], 10**9)
        crashes[strategy] = [(r["t"], r["workers"]) for r in faults if r["kind"] == "crash"]
        crashes[strategy + "_end"] = end
    horizon = min(crashes["elastic_end"], crashes["checkpoint-restart_end"])
    a = [c for c in crashes["elastic"] if c[0] <= horizon]
    b = [c for c in crashes["checkpoint-restart"] if c[0] <= horizon]
    assert a and a == b


def test_byte_identical_across_processes(tmp_path: Path) -> None:
    """No dependence on hash randomization or process state: two interpreters, same bytes."""
    import os
    import subprocess
    import sys

    outs = []
    for hashseed in ("1", "2"):
        out = tmp_path / f"p{hashseed}"
        args = [sys.executable, "-m", "rollcall", "run", str(QUICK), "--seed", "5", "--quiet",
                "--out", str(out)]
        for item in RANDOM:
            args += ["--set", item]
        env = dict(os.environ, PYTHONHASHSEED=hashseed)
        p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
        assert p.returncode == 0, p.stderr
        assert "--seed 5" in p.stdout
        outs.append((out / "history.jsonl").read_bytes())
    assert outs[0] == outs[1]


@pytest.mark.parametrize("strategy", ["elastic", "checkpoint-restart"])
def test_checked_records_are_the_written_history(tmp_path: Path, strategy: str) -> None:
    """The driver checks the records it keeps in memory; they must be exactly
    what history.jsonl holds, so a re-read gives the same verdict."""
    from rollcall.config import data_spec
    from rollcall.core.checkers import check, summarize_report
    from rollcall.results import read_history
    from sim.driver import Simulation

    sc = load_scenario(QUICK, RANDOM, seed=4, strategy=strategy)
    sim = Simulation(sc, tmp_path)
    summary = sim.run()
    written = list(read_history(tmp_path))
    assert json.loads(json.dumps(sim.records)) == written
    again = summarize_report(check(written, data_spec(sc)))
    assert again == {k: summary[k] for k in again}
    assert summary["generations"] > 1
