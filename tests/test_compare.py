"""``rollcall compare`` on both targets through the command line.

The real compare runs a tiny shipped scenario (3 gloo workers, 30 steps, one
scripted kill) for both strategies and 2 seeds, and its rows are checked
against the run directories' own histories (re-checked here with the core's
checker), not against numbers written down in the test. The sim compare is
checked against the loop it had before it moved into ``rollcall.app.comparison``
(one ``sim.driver.run`` per strategy and seed, the columns it wrote) and
against means and t-intervals computed here from those runs. The Ctrl-C
test interrupts a real compare in its second run and checks that the
finished rows stay and no worker outlives it.
"""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path

import pandas as pd
import psutil
import pytest

from rollcall.app import cli
from rollcall.app.comparison import STRATEGIES
from rollcall.config import data_spec
from rollcall.core import check, time_account
from rollcall.core.accounting import TIME_KEYS
from rollcall.results import read_history, read_jsonl_so_far, read_summary
from rollcall.scenario import load_scenario
from rollcall.app.stats import kind_of
from real_processes import needs_pidfd, one_real_run_at_a_time
from polling import pid_running, wait_for

ROOT = Path(__file__).resolve().parent.parent
TINY_REAL = ROOT / "scenarios" / "real-checkpoint-restart.yaml"
QUICK = ROOT / "scenarios" / "quickstart.yaml"
# failures every 7.5 s against 5 s restarts: busy, yet both strategies finish
SIM_SETS = ["failures.worker_mtbf_s=60", "cluster.repair_s=10", "strategy.restart_s=5"]
# compare.csv's metric columns of the sim's own loop, before the one loop for both targets
SIM_METRICS_BEFORE = (
    "completed", "valid", "elapsed_s", "ettr", "goodput", "productive_s", "lost_work_s",
    "stall_s", "recovery_s", "checkpoint_s", "failures", "generations", "restarts",
    "lost_steps", "samples_duplicated", "samples_skipped", "global_batch_min", "wall_s",
)


def _rows(out: Path) -> list[dict[str, str]]:
    with open(out / "compare.csv", newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _workers_of(out: Path) -> list[int]:
    """PIDs of live worker processes started for any run under ``out`` (their --run-dir)."""
    pids = []
    for p in psutil.process_iter(["cmdline", "status"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "real.worker" in cmd and str(out) in cmd and p.info["status"] != psutil.STATUS_ZOMBIE:
            pids.append(p.pid)
    return pids



def _assert_row_is_its_history(row: dict[str, str]) -> None:
    run_dir = Path(row["run_dir"])
    sc = load_scenario(run_dir / "scenario.yaml")
    assert (sc.target, sc.strategy.kind, sc.seed) == ("real", row["strategy"], int(row["seed"]))
    recs = list(read_history(run_dir))
    report = check(recs, data_spec(sc))
    end = recs[-1]
    assert end["f"] == "end"
    assert row["completed"] == str(end["completed"]) and row["valid"] == str(report.valid)
    assert int(row["restarts"]) == report.restarts
    assert int(row["failures"]) == sum(r["f"] == "fault" and r["kind"] != "join" for r in recs)
    assert read_summary(run_dir)["result"] == "completed"
    account = time_account(recs, report.lineage, end["completed"])
    for key in TIME_KEYS:  # the core's definition, read from the history
        assert float(row[key]) == pytest.approx(getattr(account, key), abs=1e-6), key


@pytest.mark.slow
@pytest.mark.timeout(240)
@needs_pidfd
@one_real_run_at_a_time
def test_real_compare_rows_come_from_the_real_histories(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cmp"
    code = cli.main(["compare", str(TINY_REAL), "--target", "real", "--seeds", "2", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    rows = _rows(out)
    first = load_scenario(TINY_REAL).seed
    assert sorted((r["strategy"], r["seed"]) for r in rows) == sorted(
        (s, str(seed)) for s in STRATEGIES for seed in (first, first + 1))
    for row in rows:
        assert row["completed"] == "True" and row["valid"] == "True", row
        _assert_row_is_its_history(row)
    assert {r["restarts"] for r in rows if r["strategy"] == "elastic"} == {"0"}
    assert {r["restarts"] for r in rows if r["strategy"] == "checkpoint-restart"} == {"1"}
    assert "left out" not in captured.err
    table = pd.read_csv(out / "compare-table.csv", header=[0, 1], index_col=0)
    assert "checkpoint_s" in table.index and "ettr" in table.index
    assert table.loc["checkpoint_s", ("checkpoint-restart", "mean")] > 0
    assert {s for s, _ in table.columns} == set(STRATEGIES)
    assert table.loc["completed", ("elastic", "mean")] == 1.0
    progress = [line for line in captured.err.splitlines() if line.startswith("compare [")]
    assert [line.split("]")[0] for line in progress] == [f"compare [{k}/4" for k in (1, 2, 3, 4)]
    header = captured.out.splitlines()[0]
    assert "checkpoint-restart" in header and "elastic" in header
    assert not _workers_of(out)


def _old_compare_csv(seeds: list[int], out: Path) -> pd.DataFrame:
    """What compare.csv was before the loop moved: one sim run per (seed, strategy)."""
    from sim.driver import run

    from rollcall.results import prepare_out_dir

    rows = []
    for seed in seeds:
        for strategy in STRATEGIES:
            sc = load_scenario(QUICK, SIM_SETS, seed=seed, strategy=strategy)
            run_dir = prepare_out_dir(out / f"{strategy}-seed{seed}", sc)
            summary = run(sc, run_dir)
            rows.append({"strategy": strategy, "seed": seed, "run_dir": str(run_dir),
                         **{k: summary.get(k) for k in SIM_METRICS_BEFORE},
                         "end_reason": summary.get("end_reason")})
    return pd.DataFrame(rows)


def _without_wall_s(path: Path, root: Path) -> list[list[str]]:
    """The CSV's rows without the column wall_s (host time) and with ``root`` as DIR."""
    rows = list(csv.reader(path.read_text(encoding="utf-8").replace(str(root), "DIR").splitlines()))
    drop = rows[0].index("wall_s")
    return [row[:drop] + row[drop + 1:] for row in rows]


def test_sim_compare_is_the_old_loop_and_its_intervals(tmp_path: Path) -> None:
    out, old = tmp_path / "new", tmp_path / "old"
    # --fixed-interval: the old loop ran checkpoint-restart at the scenario's interval
    argv = ["compare", str(QUICK), "--seeds", "3", "--seed", "4", "--fixed-interval",
            "--out", str(out)]
    for item in SIM_SETS:
        argv += ["--set", item]
    assert cli.main(argv) == 0
    expected = _old_compare_csv([4, 5, 6], old)
    expected.to_csv(tmp_path / "old.csv", index=False)
    assert _without_wall_s(out / "compare.csv", out) == _without_wall_s(tmp_path / "old.csv", old)
    table = pd.read_csv(out / "compare-table.csv", header=[0, 1], index_col=0)
    assert list(table.index) == list(SIM_METRICS_BEFORE)
    assert [c for s, c in table.columns if s == "elastic"] == ["mean", "±95%", "lo", "hi", "method"]
    for strategy in STRATEGIES:
        sub = expected[expected["strategy"] == strategy]
        for metric in SIM_METRICS_BEFORE[:-1]:  # wall_s is host time
            xs = [float(v) for v in sub[metric]]
            row = table.loc[metric, strategy]
            assert row["mean"] == pytest.approx(statistics.fmean(xs))
            kind = kind_of(metric)
            if len(set(xs)) == 1:  # no spread: the interval is the value
                assert row["lo"] == row["hi"] == pytest.approx(xs[0]) and row["±95%"] == 0.0
            elif kind == "time":
                half = 4.303 * statistics.stdev(xs) / math.sqrt(3)  # t_{0.975, 2}
                assert row["±95%"] == pytest.approx(half, abs=1e-9)
                assert row["method"] == "t over 3 seeds"
            else:  # ratios inside [0, 1], counts never below 0
                assert row["method"] == {"ratio": "logit t", "count": "root t"}[kind] + \
                    " over 3 seeds"
                assert 0.0 <= float(row["lo"]) <= row["mean"] <= float(row["hi"])
                assert kind == "count" or float(row["hi"]) <= 1.0


def test_a_metric_no_kept_summary_has_is_left_out_and_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cmp"
    argv = ["compare", str(QUICK), "--seeds", "2", "--fixed-interval", "--out", str(out)]
    for item in SIM_SETS:
        argv += ["--set", item]
    assert cli.main(argv) == 0
    for path in out.glob("*/summary.json"):  # as runs written before the key existed
        summary = json.loads(path.read_text(encoding="utf-8"))
        del summary["checkpoint_s"]
        path.write_text(json.dumps(summary), encoding="utf-8")
    capsys.readouterr()
    assert cli.main(argv) == 0  # the runs are kept, not redone
    err = capsys.readouterr().err
    assert "left out: checkpoint_s" in err and err.count("(done before, kept)") == 4
    assert "checkpoint_s" not in _rows(out)[0]
    table = pd.read_csv(out / "compare-table.csv", header=[0, 1], index_col=0)
    assert "checkpoint_s" not in table.index and "ettr" in table.index


@pytest.mark.slow
@pytest.mark.timeout(240)
@needs_pidfd
@one_real_run_at_a_time
def test_ctrl_c_keeps_finished_rows_and_leaves_no_process(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    first = load_scenario(TINY_REAL).seed
    cmd = [sys.executable, "-m", "rollcall", "compare", str(TINY_REAL), "--target", "real",
           "--seeds", "2", "--set", "workload.steps=300", "--out", str(out)]
    err = tmp_path / "stderr.txt"
    with open(err, "wb") as fh:  # a new session: Ctrl-C signals the whole group, workers too
        proc = subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                                stdout=subprocess.DEVNULL, stderr=fh, start_new_session=True)
    seen: set[int] = set()
    try:
        wait_for(lambda: "compare [1/4]" in err.read_text(), 150, "the first finished run")

        def training() -> bool:
            seen.update(c.pid for c in psutil.Process(proc.pid).children(recursive=True))
            recs = read_jsonl_so_far(out / f"elastic-seed{first}" / "history.jsonl")
            return sum(r["f"] == "commit" for r in recs) >= 3

        wait_for(training, 120, "the second run training")
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = err.read_text()
    assert proc.returncode == 130, text[-2000:]
    assert "interrupted; the finished runs are in" in text and "Traceback" not in text
    assert seen and not [pid for pid in seen if pid_running(pid)], text[-2000:]
    assert not _workers_of(out)
    finished = {str(d) for d in out.iterdir()
                if (d / "summary.json").exists() and read_summary(d)["result"] == "completed"}
    rows = _rows(out)
    assert rows and {r["run_dir"] for r in rows} == finished
    assert all(r["completed"] == "True" and r["valid"] == "True" for r in rows)
    assert not (out / "compare-table.csv").exists()


@pytest.mark.parametrize("argv, says", [
    (["--seeds", "0"], "argument --seeds: must be >= 1, got 0"),
    (["--target", "gpu"], "argument --target: invalid choice: 'gpu'"),
])
def test_bad_compare_arguments_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    out = tmp_path / "never"
    with pytest.raises(SystemExit) as exc:
        cli.main(["compare", str(QUICK), *argv, "--out", str(out)])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.count("\n") == 1 and err.startswith("rollcall compare: error: ") and says in err
    assert not out.exists()


def test_unknown_target_in_the_scenario_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "never"
    assert cli.main(["compare", str(QUICK), "--set", "target=gpu", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "target" in err and "'gpu'" in err
    assert not out.exists()
