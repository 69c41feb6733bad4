"""``compare`` decides: paired differences, the verdict, human units, --json, the
checkpoint-restart interval and the exit codes of ``compare`` and ``sweep``.

The paired statistics are checked against numbers worked out by hand from
small synthetic tables (a target's ``run`` function handed to the shared
loop returns them, the way ``rollcall.app.targets.compare`` hands in a driver's run), and
with hypothesis against the definition (mean of the per-seed differences,
Student-t over seeds). The verdict's rules (no claim without spread or
with fewer than three pairs) are checked on comparisons built from rows
directly. The interval and the exit codes use tiny sim runs.
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

from rollcall.app import cli
from rollcall.app.comparison import PAIRED_FILE, Comparison, compare, mean_ci, paired, summarize_paired
from rollcall.app.interval import checkpoint_intervals
from rollcall.app.report.source import comparison_of
from rollcall.scenario import Scenario, load_scenario
from rollcall.app.verdict import decide, human_s, human_table, to_json, unit_for

ROOT = Path(__file__).resolve().parent.parent
QUICK = ROOT / "scenarios" / "quickstart.yaml"
LLAMA = ROOT / "scenarios" / "llama3-54d.yaml"
BELOW_MIN = ROOT / "scenarios" / "real-below-min.yaml"
DAY_S = 86400.0


# the intervals of a compare of QUICK (scripted faults only): the scenario's, for both
QUICK_CHECKPOINTS = "; checkpoints: both every 2.75 s (the scenario's: no random failures to " \
    "optimise for)"


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
    assert d["method"] == "paired t over 3 seeds"
    g = cmp.paired_table.loc["goodput"]  # d = 0.12, 0.12, 0.11: mean 0.116667, sd 0.005774
    assert g["mean"] == pytest.approx(0.116667, abs=1e-6)
    # a goodput difference lies in [-1, 1]: the t interval on the logit scale of (d + 1) / 2
    u, se_u = (1 + 0.116667) / 2, 0.0057735 / math.sqrt(3) / 2
    centre, half = math.log(u / (1 - u)), 4.303 * se_u / (u * (1 - u))
    assert g["lo"] == pytest.approx(2 / (1 + math.exp(half - centre)) - 1, rel=1e-4)
    assert g["hi"] == pytest.approx(2 / (1 + math.exp(-half - centre)) - 1, rel=1e-4)
    assert g["method"] == "paired logit t over 3 seeds"
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
    assert v.text == ("elastic saves 8.0 [6.8, 9.2] of 65.0 days (elastic goodput +0.117 "
                      "[0.102, 0.131], paired logit t); significant (decided on elapsed_s by a "
                      "paired t over 3 seeds: its 95% interval excludes 0)" + QUICK_CHECKPOINTS)
    assert v.winner == "elastic"
    assert v.significant is True and v.metric == "elapsed_s" and v.pairs == 3
    assert v.method == "paired t over 3 seeds"


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
    assert v.text == ("elastic saves 8.0 of 65.1 days on one seed (elastic goodput +0.117); "
                      "no significance claim: too few seeds: 1 pair, a significance claim needs "
                      "at least 3 (decided on elapsed_s, one seed: no interval)" + QUICK_CHECKPOINTS)
    assert v.significant is None and v.pairs == 1


def _rows(table: Mapping[tuple[str, int], dict[str, Any]]) -> Comparison:
    """The Comparison of compare.csv rows (``table[(strategy, seed)]``), built directly."""
    import pandas as pd

    rows = [{"strategy": strategy, "seed": seed, "run_dir": f"{strategy}-seed{seed}",
             "completed": True, "valid": True, **metrics}
            for (strategy, seed), metrics in sorted(table.items(), key=lambda kv: kv[0][1])]
    return comparison_of(pd.DataFrame(rows))


def test_identical_seeds_have_no_spread_and_no_claim() -> None:
    # no random failures: every seed runs the same, 27.4 days saved on each
    table = _days([93.0] * 5, [65.6] * 5, [0.70] * 5, [0.98] * 5)
    v = decide(_rows(table))
    assert v.text == ("elastic saves 27.4 of 93.0 days on every seed (elastic goodput +0.280); "
                      "no significance claim: no spread: every seed gave the same result "
                      "(decided on elapsed_s, paired t over 5 seeds)")
    assert v.significant is None and "[27.4, 27.4]" not in v.text
    assert "significant" not in v.text.replace("significance", "")
    assert to_json(_rows(table), v, 0)["verdict"]["significant"] is None
    cells = human_table(_rows(table))
    assert cells.loc["elapsed_s", "elastic - checkpoint-restart"] == "-27.4 days (no spread)"


def test_two_seeds_are_too_few_and_goodput_stays_in_its_range() -> None:
    # a 2-seed real compare: elapsed differs by 100 and 101 s (a t interval that excludes
    # 0) and goodput by 0.609 and 0.896 (whose t interval was [-1.071, 2.575])
    table: dict[tuple[str, int], dict[str, Any]] = {}
    for seed, (cr, el, gcr, gel, restarts) in enumerate([(400.0, 300.0, 0.10, 0.709, 2),
                                                         (420.0, 319.0, 0.05, 0.946, 3)]):
        table[("checkpoint-restart", seed)] = {"elapsed_s": cr, "goodput": gcr,
                                               "restarts": restarts}
        table[("elastic", seed)] = {"elapsed_s": el, "goodput": gel, "restarts": 0}
    cmp = _rows(table)
    v = decide(cmp)
    assert v.significant is None and v.pairs == 2
    assert "no significance claim: too few seeds: 2 pairs, a significance claim needs at " \
           "least 3 (decided on elapsed_s, paired t over 2 seeds)" in v.text
    g = cmp.paired_table.loc["goodput"]
    assert -1.0 <= g["lo"] <= g["mean"] <= g["hi"] <= 1.0
    doc = to_json(cmp, v, 0)
    assert doc["verdict"]["significant"] is None
    assert doc["verdict"]["method"] == "paired t over 2 seeds"
    assert doc["metrics"]["goodput"]["paired"]["method"] == "paired logit t over 2 seeds"
    lo, hi = doc["metrics"]["goodput"]["paired"]["ci95"]
    assert -1.0 <= lo <= hi <= 1.0
    # elastic never restarts: the restarts difference cannot be above 0, nor a count below 0
    r = cmp.paired_table.loc["restarts"]
    assert r["hi"] <= 0.0 and r["lo"] < r["mean"] == -2.5
    assert cmp.interval("restarts", "checkpoint-restart").lo >= 0.0


def test_no_verdict_when_a_run_did_not_complete(tmp_path: Path) -> None:
    table = _days([60, 65], [50, 55], [0.8, 0.8], [0.9, 0.9])
    table[("elastic", 1)]["completed"] = False
    cmp = _synthetic(tmp_path, table)
    assert cmp.problems == (f"elastic seed 1 did not complete ({tmp_path / 'elastic-seed1'})",)
    v = decide(cmp)
    assert v.text == "no verdict: 1 of 4 runs did not complete or are not valid" + QUICK_CHECKPOINTS
    assert v.significant is None and v.winner is None


def test_a_strategy_not_expected_to_finish_loses_to_one_that_finishes(tmp_path: Path) -> None:
    """The keeper ended checkpoint-restart's runs as not expected to finish
    (valid histories, not completed); elastic completed every seed: the
    verdict names elastic, says why, and claims no paired significance."""
    table = _days([60, 65, 70], [50, 55, 60], [0.1, 0.1, 0.1], [0.9, 0.9, 0.9])
    reason = ("job failed: not expected to finish: over the last 64 recoveries failures "
              "interrupted the job every 176 s on average, and none completed")
    for seed in range(3):
        table[("checkpoint-restart", seed)].update(completed=False, end_reason=reason)
    cmp = _synthetic(tmp_path, table)
    assert len(cmp.problems) == 3
    v = decide(cmp)
    assert v.winner == "elastic" and v.significant is None
    assert v.text.startswith("elastic: checkpoint-restart is not expected to finish on 3 of 3 "
                             "seeds (not expected to finish: over the last 64 recoveries")
    assert "elastic finishes in 55.0 days on average" in v.text
    # one invalid elastic run: no verdict at all
    table[("elastic", 2)]["valid"] = False
    assert decide(_synthetic(tmp_path / "again", table)).text.startswith("no verdict: 4 of 6")


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
    assert list(table.columns) == ["checkpoint-restart", "elastic", "elastic - checkpoint-restart",
                                   "95% interval"]
    assert table.loc["elapsed_s", "checkpoint-restart"] == "65.0 ± 12.4 days"
    assert table.loc["elapsed_s", "elastic - checkpoint-restart"] == "-8.0 [-9.2, -6.8] days"
    assert table.loc["elapsed_s", "95% interval"] == "t, paired t over 3 seeds"
    # goodput 0.92, 0.87, 0.81: mean 0.8667, se 0.0318; on the logit scale 1.874 +- 4.303 *
    # 0.0318 / (0.8667 * 0.1333) = 1.874 +- 1.185 -> [0.665, 0.955], inside [0, 1]
    assert table.loc["goodput", "elastic"] == "0.867 [0.665, 0.955]"
    assert table.loc["goodput", "95% interval"] == "logit t, paired logit t over 3 seeds"
    assert table.loc["completed", "elastic"] == "1.000 (no spread)"
    assert table.loc["completed", "elastic - checkpoint-restart"] == ""


# --------------------------------------------------------------------------- interval

def test_each_strategys_interval_in_known_cases() -> None:
    # quickstart, worker MTBF 60 s over 8 workers: M = 7.5 s; write 1 s; Daly's
    # optimum solves e^((tau+1)/7.5) (1 - tau/7.5) = 1: tau = 3.237 s (Young's
    # first-order sqrt(2 x 1 x 7.5) = 3.873 s); step = 1 shard x 0.05 + 0.005 =
    # 0.055 s -> 58.9 -> 59 steps. Elastic, replicated, 7 of 9 nodes to spare
    # with 10 s repairs, goes back to its checkpoint about once in 38,000 s:
    # its optimum is past the 16.5 s job, so it checkpoints only at the end.
    sc = load_scenario(QUICK, ["failures.worker_mtbf_s=60", "cluster.repair_s=10"])
    choices = checkpoint_intervals(sc)
    cr, el = choices["checkpoint-restart"], choices["elastic"]
    assert (cr.steps, cr.source) == (59, "daly") and cr.mtbf_s == pytest.approx(7.5)
    assert (el.steps, el.source) == (300, "whole-job")
    assert {c.steps for c in checkpoint_intervals(sc, fixed=True).values()} == {50}
    # Llama-3: M = 22,736,842 / 2,048 = 11,102 s, write 60 s: tau = 1,114.6 s / 9 s = 124
    llama = checkpoint_intervals(load_scenario(LLAMA))
    assert llama["checkpoint-restart"].steps == 124 and llama["elastic"].source == "whole-job"
    free = load_scenario(QUICK, ["failures.worker_mtbf_s=60", "strategy.checkpoint_write_s=0"])
    assert checkpoint_intervals(free)["checkpoint-restart"].steps == 1  # free: every step
    scripted = checkpoint_intervals(load_scenario(QUICK))
    assert {(c.steps, c.source) for c in scripted.values()} == {(50, "no-random-failures")}
    assert "no random failures" in scripted["elastic"].why


def _interval_of(run_dir: Path) -> int:
    data = yaml.safe_load((run_dir / "scenario.yaml").read_text(encoding="utf-8"))
    return int(data["strategy"]["checkpoint_interval_steps"])


# failures every 7.5 s against 5 s restarts: busy, yet both strategies finish
TINY = ["--set", "failures.worker_mtbf_s=60", "--set", "cluster.repair_s=10",
        "--set", "workload.steps=100", "--set", "strategy.restart_s=5"]


def test_json_carries_the_answer_and_the_interval(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cmp"
    assert cli.main(["compare", str(QUICK), "--seeds", "2", "--json", "--out", str(out), *TINY]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["exit_status"] == 0 and doc["problems"] == [] and doc["seeds"] == [0, 1]
    assert set(doc["exit_meaning"]) == {"0", "1", "2", "130"}
    cr = doc["checkpoint_intervals"]["checkpoint-restart"]
    assert (cr["steps"], cr["source"]) == (59, "daly") and cr["mtbf_s"] == pytest.approx(7.5)
    el = doc["checkpoint_intervals"]["elastic"]
    assert (el["steps"], el["source"]) == (100, "whole-job") and "no checkpoint" in el["why"]
    elapsed = doc["metrics"]["elapsed_s"]
    assert elapsed["kind"] == "seconds" and elapsed["paired"]["pairs"] == 2
    assert elapsed["paired"]["method"] == "paired t over 2 seeds"
    assert doc["verdict"]["significant"] is None  # two pairs: too few seeds for a claim
    with open(out / "compare.csv", newline="", encoding="utf-8") as fh:
        rows = {(r["strategy"], r["seed"]): float(r["elapsed_s"]) for r in csv.DictReader(fh)}
    d = [rows[("elastic", s)] - rows[("checkpoint-restart", s)] for s in ("0", "1")]
    assert elapsed["paired"]["mean"] == pytest.approx(sum(d) / 2)
    assert elapsed["strategies"]["elastic"]["mean"] == pytest.approx(
        (rows[("elastic", "0")] + rows[("elastic", "1")]) / 2)
    assert doc["verdict"]["deciding_metric"] == "elapsed_s" and doc["verdict"]["text"]
    assert _interval_of(out / "checkpoint-restart-seed0") == 59
    assert _interval_of(out / "elastic-seed0") == 100


def test_fixed_interval_keeps_the_scenarios(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cmp"
    argv = ["compare", str(QUICK), "--seeds", "1", "--fixed-interval", "--out", str(out), *TINY]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert "checkpoint intervals: both strategies 50 steps" in text
    assert "the scenario's (--fixed-interval)" in text and "verdict: " in text
    assert _interval_of(out / "checkpoint-restart-seed0") == 50
    assert _interval_of(out / "elastic-seed0") == 50


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
