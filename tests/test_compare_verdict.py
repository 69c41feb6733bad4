"""``compare`` decides: paired differences, the verdict, human units, --json, the
checkpoint-restart interval and the exit codes of ``compare`` and ``sweep``.

The paired statistics are checked against numbers worked out by hand from
small synthetic tables (a target's ``run`` function handed to the shared
loop returns them, the way ``sim.compare`` hands in the sim driver), and
with hypothesis against the definition (mean of the per-seed differences,
Student-t over seeds). The interval and the exit codes use tiny sim runs.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any, Mapping

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from rollcall import cli
from rollcall.compare import PAIRED_FILE, Comparison, compare, mean_ci, paired, summarize_paired
from rollcall.interval import checkpoint_interval
from rollcall.scenario import Scenario, load_scenario
from rollcall.verdict import decide, human_s, human_table, unit_for

ROOT = Path(__file__).resolve().parent.parent
QUICK = ROOT / "scenarios" / "quickstart.yaml"
LLAMA = ROOT / "scenarios" / "llama3-54d.yaml"
BELOW_MIN = ROOT / "scenarios" / "real-below-min.yaml"
DAY_S = 86400.0


def _synthetic(tmp: Path, table: Mapping[tuple[str, int], dict[str, Any]]) -> Comparison:
    """The shared compare loop over a target whose summaries are ``table[(strategy, seed)]``."""
    seeds = sorted({seed for _, seed in table})

    def run(sc: Scenario, run_dir: Path) -> dict[str, Any]:
        return {"completed": True, "valid": True, **table[(sc.strategy.kind, sc.seed)]}

    return compare(load_scenario(QUICK), seeds, tmp, run, log=lambda _: None)


def _days(cr: list[float], el: list[float], goodput_cr: list[float],
          goodput_el: list[float]) -> dict[tuple[str, int], dict[str, Any]]:
    table = {}
    for seed, (a, b, ga, gb) in enumerate(zip(cr, el, goodput_cr, goodput_el)):
        table[("checkpoint-restart", seed)] = {"elapsed_s": a * DAY_S, "goodput": ga}
        table[("elastic", seed)] = {"elapsed_s": b * DAY_S, "goodput": gb}
    return table


def test_paired_difference_and_interval_by_hand(tmp_path: Path) -> None:
    # elapsed (days): cr 60, 65, 70; elastic 52, 57.5, 61.5 -> d = -8, -7.5, -8.5
    cmp = _synthetic(tmp_path, _days([60, 65, 70], [52, 57.5, 61.5],
                                     [0.80, 0.75, 0.70], [0.92, 0.87, 0.81]))
    d = cmp.paired_table.loc["elapsed_s"]
    # mean -8; sample sd 0.5; half-width t_{0.975,2} * 0.5 / sqrt(3) = 4.303 * 0.288675
    assert d["mean"] == pytest.approx(-8 * DAY_S)
    assert d["±95%"] == pytest.approx(4.303 * 0.5 / math.sqrt(3) * DAY_S)
    assert d["lo"] == pytest.approx((-8 - 1.242168) * DAY_S, rel=1e-6)
    assert d["n"] == 3
    g = cmp.paired_table.loc["goodput"]  # d = 0.12, 0.12, 0.11: mean 0.116667, sd 0.005774
    assert g["mean"] == pytest.approx(0.116667, abs=1e-6)
    assert g["±95%"] == pytest.approx(4.303 * 0.0057735 / math.sqrt(3), rel=1e-4)
    with open(tmp_path / PAIRED_FILE, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["seed"] for r in rows] == ["0", "1", "2"]
    assert [float(r["elapsed_s"]) / DAY_S for r in rows] == pytest.approx([-8, -7.5, -8.5])
    assert "completed" not in rows[0] and "valid" not in rows[0]


def test_verdict_significant(tmp_path: Path) -> None:
    cmp = _synthetic(tmp_path, _days([60, 65, 70], [52, 57.5, 61.5],
                                     [0.80, 0.75, 0.70], [0.92, 0.87, 0.81]))
    v = decide(cmp)
    # 8 days saved of the 65.0-day checkpoint-restart mean; the saving's interval [6.76, 9.24]
    assert v.text.startswith("elastic saves 8.0 [6.8, 9.2] of 65.0 days "
                             "(elastic goodput +0.117 [0.102, 0.131]); significant")
    assert v.significant is True and v.metric == "elapsed_s" and v.pairs == 3
    assert "excludes 0" in v.text


def test_verdict_not_significant_and_checkpoint_restart_ahead(tmp_path: Path) -> None:
    # d = -2, +5, +0.5 days: mean +1.167, sd 3.547, half-width 4.303 * 3.547 / sqrt(3)
    # = 8.81 -> [-7.65, 9.98]; elastic's mean 11.17 days is the one saved from
    cmp = _synthetic(tmp_path, _days([10, 10, 10], [8, 15, 10.5],
                                     [0.5, 0.5, 0.5], [0.6, 0.3, 0.5]))
    v = decide(cmp)
    assert v.text.startswith("checkpoint-restart saves 1.2 [-7.6, 10.0] of 11.2 days "
                             "(elastic goodput -0.033 [")
    assert "; not significant" in v.text
    assert "includes 0" in v.text and v.significant is False


def test_verdict_one_seed_makes_no_claim(tmp_path: Path) -> None:
    cmp = _synthetic(tmp_path, _days([65.1], [57.1], [0.80], [0.917]))
    v = decide(cmp)
    assert v.text == ("elastic saves 8.0 of 65.1 days (elastic goodput +0.117) on one seed; "
                      "no interval with one seed, so no significance claim (decided on elapsed_s)")
    assert v.significant is None and v.pairs == 1


def test_no_verdict_when_a_run_did_not_complete(tmp_path: Path) -> None:
    table = _days([60, 65], [50, 55], [0.8, 0.8], [0.9, 0.9])
    table[("elastic", 1)]["completed"] = False
    cmp = _synthetic(tmp_path, table)
    assert cmp.problems == (f"elastic seed 1 did not complete ({tmp_path / 'elastic-seed1'})",)
    v = decide(cmp)
    assert v.text == "no verdict: 1 of 4 runs did not complete or are not valid"
    assert v.significant is None


finite = st.floats(min_value=-1e7, max_value=1e7, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(finite, finite), min_size=1, max_size=8))
def test_paired_is_the_mean_and_t_interval_of_the_differences(
    pairs: list[tuple[float, float]]
) -> None:
    import pandas as pd

    rows = []
    for seed, (cr, el) in enumerate(pairs):
        rows.append({"strategy": "checkpoint-restart", "seed": seed, "elapsed_s": cr})
        rows.append({"strategy": "elastic", "seed": seed, "elapsed_s": el})
    diffs = paired(pd.DataFrame(rows))
    assert list(diffs["elapsed_s"]) == [el - cr for cr, el in pairs]
    row = summarize_paired(diffs).loc["elapsed_s"]
    m, h = mean_ci([el - cr for cr, el in pairs])
    assert row["mean"] == pytest.approx(m, abs=1e-6)
    assert row["lo"] <= row["mean"] <= row["hi"] or len(pairs) == 1
    if len(pairs) > 1 and h > 1e-9 * max(1.0, abs(m)):
        assert row["±95%"] == pytest.approx(h)


@pytest.mark.parametrize("seconds, text", [
    (5621060.0, "65.1 days"), (2 * DAY_S, "2.00 days"), (1.5 * DAY_S, "36.0 hours"),
    (7200.0, "2.00 hours"), (150.0, "2.50 min"), (90.0, "90.0 s"), (0.055, "0.0550 s"),
    (-691200.0, "-8.00 days"), (float("nan"), "-"),
])
def test_human_units(seconds: float, text: str) -> None:
    assert human_s(seconds) == text


@given(st.floats(min_value=0, max_value=1e9, allow_nan=False))
def test_the_unit_is_the_largest_with_two_of_it(seconds: float) -> None:
    name, unit_s = unit_for(seconds)
    assert seconds / unit_s >= 2 or name == "s"
    bigger = {"s": 60.0, "min": 3600.0, "hours": DAY_S, "days": math.inf}[name]
    assert seconds < 2 * bigger


def test_human_table_shows_units_and_ratios(tmp_path: Path) -> None:
    cmp = _synthetic(tmp_path, _days([60, 65, 70], [52, 57.5, 61.5],
                                     [0.80, 0.75, 0.70], [0.92, 0.87, 0.81]))
    table = human_table(cmp)
    assert list(table.columns) == ["checkpoint-restart", "elastic", "elastic - checkpoint-restart"]
    assert table.loc["elapsed_s", "checkpoint-restart"] == "65.0 ± 12.4 days"
    assert table.loc["elapsed_s", "elastic - checkpoint-restart"] == "-8.0 [-9.2, -6.8] days"
    # goodput 0.92, 0.87, 0.81: sd 0.05508, half-width 4.303 * 0.05508 / sqrt(3) = 0.1368
    assert table.loc["goodput", "elastic"] == "0.867 ± 0.137"
    assert table.loc["completed", "elastic - checkpoint-restart"] == ""


# --------------------------------------------------------------------------- interval

def test_young_interval_of_a_known_case() -> None:
    # quickstart, worker MTBF 60 s over 8 workers: M = 7.5 s; write 1 s;
    # tau = sqrt(2 * 1 * 7.5) = 3.873 s; step = 1 shard x 0.05 + 0.005 = 0.055 s
    # -> 70.4 -> 70 steps
    sc = load_scenario(QUICK, ["failures.worker_mtbf_s=60"])
    choice = checkpoint_interval(sc)
    assert (choice.steps, choice.source) == (70, "young")
    assert choice.young_s == pytest.approx(math.sqrt(15.0))
    assert choice.job_mtbf_s == pytest.approx(7.5)
    assert checkpoint_interval(sc, fixed=True).steps == 50
    # Llama-3: M = 22,736,842 / 2,048 = 11,102 s, write 60 s: tau = 1,154 s / 9 s = 128
    assert checkpoint_interval(load_scenario(LLAMA)).steps == 128
    free = load_scenario(QUICK, ["failures.worker_mtbf_s=60", "strategy.checkpoint_write_s=0"])
    assert checkpoint_interval(free).steps == 1  # a free checkpoint: every step
    scripted = checkpoint_interval(load_scenario(QUICK))
    assert (scripted.steps, scripted.source) == (50, "no-random-failures")
    assert "no random failures" in scripted.why


def _interval_of(run_dir: Path) -> int:
    data = yaml.safe_load((run_dir / "scenario.yaml").read_text(encoding="utf-8"))
    return int(data["strategy"]["checkpoint_interval_steps"])


TINY = ["--set", "failures.worker_mtbf_s=60", "--set", "cluster.repair_s=10",
        "--set", "workload.steps=100"]


def test_json_carries_the_answer_and_the_interval(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cmp"
    assert cli.main(["compare", str(QUICK), "--seeds", "2", "--json", "--out", str(out), *TINY]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["exit_status"] == 0 and doc["problems"] == [] and doc["seeds"] == [0, 1]
    assert set(doc["exit_meaning"]) == {"0", "1", "2", "130"}
    cr = doc["checkpoint_interval"]["checkpoint-restart"]
    assert (cr["steps"], cr["source"]) == (70, "young")
    assert doc["checkpoint_interval"]["elastic"] == {"steps": 50, "source": "scenario"}
    elapsed = doc["metrics"]["elapsed_s"]
    assert elapsed["kind"] == "seconds" and elapsed["paired"]["pairs"] == 2
    with open(out / "compare.csv", newline="", encoding="utf-8") as fh:
        rows = {(r["strategy"], r["seed"]): float(r["elapsed_s"]) for r in csv.DictReader(fh)}
    d = [rows[("elastic", s)] - rows[("checkpoint-restart", s)] for s in ("0", "1")]
    assert elapsed["paired"]["mean"] == pytest.approx(sum(d) / 2)
    assert elapsed["strategies"]["elastic"]["mean"] == pytest.approx(
        (rows[("elastic", "0")] + rows[("elastic", "1")]) / 2)
    assert doc["verdict"]["deciding_metric"] == "elapsed_s" and doc["verdict"]["text"]
    assert _interval_of(out / "checkpoint-restart-seed0") == 70
    assert _interval_of(out / "elastic-seed0") == 50


def test_fixed_interval_keeps_the_scenarios(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cmp"
    argv = ["compare", str(QUICK), "--seeds", "1", "--fixed-interval", "--out", str(out), *TINY]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert "checkpoint interval: checkpoint-restart 50 steps" in text
    assert "the scenario's (--fixed-interval)" in text and "verdict: " in text
    assert _interval_of(out / "checkpoint-restart-seed0") == 50


# --------------------------------------------------------------------------- exit codes

def test_compare_exits_1_and_names_the_runs_that_did_not_complete(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cmp"
    argv = ["compare", str(BELOW_MIN), "--target", "sim", "--seeds", "1",
            "--set", "workload.steps=20", "--out", str(out)]
    assert cli.main(argv) == 1
    captured = capsys.readouterr()
    for strategy in ("checkpoint-restart", "elastic"):
        assert f"compare: {strategy} seed 4 did not complete ({out / (strategy + '-seed4')})" \
            in captured.err
    assert "verdict: no verdict: 2 of 2 runs did not complete" in captured.out
    # the same job with room to lose a worker completes: exit 0
    argv[-2:] = ["--set", "rendezvous.min_workers=2", "--out", str(tmp_path / "ok")]
    assert cli.main(argv) == 0


def test_sweep_exits_1_when_a_run_did_not_complete(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["sweep", str(BELOW_MIN), "--target", "sim", "--seeds", "1", "--jobs", "1",
            "--set", "workload.steps=20", "--quiet"]
    assert cli.main(base + ["--grid", "rendezvous.min_workers=3", "--out", str(tmp_path / "a")]) == 1
    captured = capsys.readouterr()
    assert "runs: 2  not completed: 2  invalid: 0" in captured.out
    assert captured.err.count("did not complete") == 2
    assert cli.main(base + ["--grid", "rendezvous.min_workers=2", "--out", str(tmp_path / "b")]) == 0
    assert "runs: 2  not completed: 0  invalid: 0" in capsys.readouterr().out
