"""The sim target through the command line, as a user runs it."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

from rollcall.results import SUMMARY_KEYS

ROOT = Path(__file__).resolve().parent.parent


def _rollcall(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rollcall", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=240)


def test_run_quickstart(tmp_path: Path) -> None:
    out = tmp_path / "tmp"
    p = _rollcall("run", str(ROOT / "scenarios" / "quickstart.yaml"), "--out", str(out), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "replay: rollcall run" in p.stdout and "--seed 0" in p.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert set(SUMMARY_KEYS) <= summary.keys()
    assert summary["target"] == "sim" and summary["valid"] and summary["completed"]
    assert summary["samples_skipped"] == 0 and summary["samples_duplicated"] == 0
    assert 0 < summary["ettr"] <= 1 and 0 < summary["goodput"] <= 1
    assert (out / "history.jsonl").stat().st_size > 0
    assert (out / "scenario.yaml").exists()


def test_compare_three_seeds(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    p = _rollcall("compare", str(ROOT / "scenarios" / "quickstart.yaml"), "--seeds", "3",
                  "--set", "failures.worker_mtbf_s=60", "--set", "cluster.repair_s=10",
                  "--set", "strategy.restart_s=5", "--out", str(out), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    header = p.stdout.splitlines()[0]
    assert "checkpoint-restart" in header and "elastic - checkpoint-restart" in header
    goodput = next(line for line in p.stdout.splitlines() if line.startswith("goodput "))
    # two means and a difference, each with its interval; the methods named
    assert goodput.count("[") == 3 and "logit t" in goodput and "ettr" in p.stdout
    assert [line for line in p.stdout.splitlines() if line.startswith("verdict: ")]
    rows = list(csv.DictReader((out / "compare.csv").open()))
    assert sorted((r["strategy"], r["seed"]) for r in rows) == sorted(
        (s, str(seed)) for s in ("checkpoint-restart", "elastic") for seed in (0, 1, 2))
    assert all(r["valid"] == "True" and r["completed"] == "True" for r in rows)
    for r in rows:
        assert (Path(r["run_dir"]) / "history.jsonl").exists()
    # same seed, same crash trace for both strategies (up to the shorter run's end)
    def crashes(d: Path) -> list:
        recs = [json.loads(x) for x in (d / "history.jsonl").read_text().splitlines()]
        return [(r["t"], r["workers"]) for r in recs if r["f"] == "fault" and r["kind"] == "crash"]
    shared = 0
    for seed in (0, 1, 2):
        a = crashes(out / f"elastic-seed{seed}")
        b = crashes(out / f"checkpoint-restart-seed{seed}")
        k = min(len(a), len(b))
        assert a[:k] == b[:k]
        shared += k
    assert shared > 0
