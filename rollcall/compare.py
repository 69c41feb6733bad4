"""Both strategies on the same failure traces, on any target: ``compare(scenario, seeds, out_dir, run)``.

The target-independent half of ``rollcall compare``. A target's
``compare`` module (``sim.compare``, ``real.compare``) hands in its driver's
``run(scenario, out_dir) -> summary``; this module never imports a target
(``tests/test_purity.py``), so the loop, the rows and the table are the same
code for both.

For each seed the scenario runs once as ``checkpoint-restart`` and once as
``elastic``, each in its own run directory ``<strategy>-seed<S>/`` under
``out_dir``. After every run ``compare.csv`` (one row per finished run) is
rewritten atomically and one progress line goes to ``log``, so an
interrupted compare keeps every finished row and shows how far it got. At
the end ``compare-table.csv`` gets the side-by-side table (returned in a
:class:`Comparison` with the runs and the paired differences):
per metric and strategy the mean over seeds and the half-width of the 95%
Student-t interval, and ``compare-paired.csv`` the paired differences: both
strategies of one seed meet the same failure trace, so per seed and metric
``elastic - checkpoint-restart`` is one sample of the difference, and its
t-interval over seeds is much narrower than the two strategies' intervals
side by side (``rollcall.verdict`` turns it into a sentence).

``checkpoint_interval_steps`` replaces the checkpoint-restart runs' interval
(``rollcall.interval`` picks Young's optimum); elastic runs keep the
scenario's.

A metric that no run's summary has (``checkpoint_s`` on the real target,
which does not time checkpoints) is left out of both files and named in one
``log`` line; a value missing from only some runs (or ``None``) is an empty
cell in ``compare.csv`` and makes that strategy's mean and interval NaN.
Nothing is filled in.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd

from rollcall.results import (
    HISTORY_FILE, SUMMARY_FILE, finished_summary, prepare_out_dir, scenario_hash,
)
from rollcall.scenario import Scenario

__all__ = [
    "METRICS", "PAIRED_FILE", "PAIRED_METRICS", "RUNS_FILE", "STRATEGIES", "TABLE_FILE",
    "Comparison", "compare", "mean_ci", "paired", "run_problems", "summarize",
    "summarize_paired", "t975", "with_strategy",
]

RunFn = Callable[[Scenario, Path], dict[str, Any]]
LogFn = Callable[[str], None]

STRATEGIES = ("checkpoint-restart", "elastic")

METRICS = (
    "completed", "valid", "elapsed_s", "ettr", "goodput", "productive_s", "lost_work_s",
    "stall_s", "recovery_s", "checkpoint_s", "failures", "generations", "restarts",
    "lost_steps", "samples_duplicated", "samples_skipped", "global_batch_min", "wall_s",
)

RUNS_FILE = "compare.csv"
TABLE_FILE = "compare-table.csv"
PAIRED_FILE = "compare-paired.csv"
# the gates (completed, valid) are not differences anyone decides on
PAIRED_METRICS = tuple(m for m in METRICS if m not in ("completed", "valid"))
_ID_COLUMNS = ("strategy", "seed", "run_dir")

# two-sided 95% Student-t quantiles t_{0.975, df}
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
         9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131,
         16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086, 21: 2.080, 22: 2.074,
         23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048, 29: 2.045,
         30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}


def t975(df: int) -> float:
    """The 97.5% quantile of Student's t with ``df`` degrees of freedom."""
    if df < 1:
        return float("nan")
    if df in _T975:
        return _T975[df]
    keys = sorted(_T975)
    for lo, hi in zip(keys, keys[1:]):
        if lo < df < hi:  # interpolate in 1/df, which is close to linear here
            a, b = 1 / lo, 1 / hi
            x = (1 / df - b) / (a - b)
            return _T975[hi] + x * (_T975[lo] - _T975[hi])
    return 1.960 + 2.4 / df  # df > 120


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """Mean and half-width of the 95% t-interval (nan with one value)."""
    xs = [float(v) for v in values]
    n = len(xs)
    if n == 0:
        return float("nan"), float("nan")
    m = sum(xs) / n
    if n == 1:
        return m, float("nan")
    var = sum((x - m) ** 2 for x in xs) / (n - 1)
    return m, t975(n - 1) * math.sqrt(var / n)


def with_strategy(scenario: Scenario, strategy: str, seed: int,
                  interval_steps: int | None = None) -> Scenario:
    """The scenario with ``seed`` and ``strategy.kind`` (and, if given, the
    checkpoint interval) replaced, validated again."""
    data = scenario.to_dict()
    data["seed"] = seed
    data["strategy"]["kind"] = strategy
    if interval_steps is not None:
        data["strategy"]["checkpoint_interval_steps"] = interval_steps
    return Scenario.model_validate(data)


def _stderr_line(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _fmt(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _progress_line(done: int, total: int, row: dict[str, Any]) -> str:
    """One line per finished run: which run, did it hold, how long (sim or real seconds)."""
    state = "completed" if row.get("completed") else "NOT completed"
    state += ", valid" if row.get("valid") else ", INVALID"
    return (f"compare [{done}/{total}] {row['strategy']} seed {row['seed']}: {state}, "
            f"elapsed_s {_fmt(row.get('elapsed_s'))}, wall_s {_fmt(row.get('wall_s'))} "
            f"-> {row['run_dir']}")


def _metrics_present(rows: Sequence[dict[str, Any]]) -> list[str]:
    return [m for m in METRICS if any(m in r for r in rows)]


def _runs_frame(rows: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """The rows with a fixed column order (ids, then METRICS order), whatever row came first."""
    return pd.DataFrame(list(rows), columns=list(_ID_COLUMNS) + _metrics_present(rows))


def _write_atomically(frame: pd.DataFrame, path: Path, index: bool) -> None:
    """Write beside the file and rename: a reader never sees half a file."""
    tmp = path.parent / f".{path.name}.tmp"
    frame.to_csv(tmp, index=index)
    os.replace(tmp, path)


def _write_runs(out: Path, rows: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """Rewrite ``compare.csv`` (after every run)."""
    runs = _runs_frame(rows)
    _write_atomically(runs, out / RUNS_FILE, index=False)
    return runs


@dataclass(frozen=True)
class Comparison:
    """What a finished compare wrote: the runs, the side-by-side table (full
    precision), the per-seed paired differences and their summary, and the
    runs that did not complete or are not valid (one line each)."""

    runs: pd.DataFrame
    table: pd.DataFrame
    paired: pd.DataFrame
    paired_table: pd.DataFrame
    problems: tuple[str, ...]
    interval_steps: int | None = None

    def rounded_table(self) -> pd.DataFrame:
        """Six significant digits, printed as plain numbers (a float column mixing
        1e-3 and 1e6 would otherwise print in scientific notation throughout)."""
        return self.table.map(lambda v: float(f"{v:.6g}")).astype(object)


def _run_one(sc: Scenario, run_dir: Path, run: RunFn) -> tuple[dict[str, Any], bool]:
    """The run's summary, made now or found finished in ``run_dir``; and whether it was found."""
    found = finished_summary(run_dir, scenario_hash(sc))
    if found is not None:
        return found, True
    # an old summary must never sit beside the history of the run that replaces it
    for name in (SUMMARY_FILE, HISTORY_FILE):
        (run_dir / name).unlink(missing_ok=True)
    return run(sc, prepare_out_dir(run_dir, sc)), False


def compare(scenario: Scenario, seeds: Sequence[int], out_dir: str | Path, run: RunFn,
            log: LogFn = _stderr_line, *,
            checkpoint_interval_steps: int | None = None, engine: Any = None) -> Comparison:
    """Run both strategies for every seed with ``run``; write the CSVs; return them.

    An exception out of ``run`` (KeyboardInterrupt included) propagates after
    the runs before it are in ``compare.csv``; the table and the paired file
    are written only when every run finished, so a partial table is never
    mistaken for a full one. The same compare into the same ``out_dir``
    resumes: a run whose directory holds its finished summary (see
    :func:`finished_summary`) is read back, not run again. With an
    ``engine`` (:mod:`rollcall.engines`) the runs not yet made go through it
    all at once, each written whole as it comes back; the rows are the same.
    """
    assert seeds, "compare needs at least one seed"
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plan = [(seed, strategy,
             with_strategy(scenario, strategy, seed,
                           checkpoint_interval_steps if strategy == "checkpoint-restart" else None),
             out / f"{strategy}-seed{seed}")
            for seed in seeds for strategy in STRATEGIES]
    fresh = set() if engine is None else _through(engine, plan, out, log)
    rows: list[dict[str, Any]] = []
    for k, (seed, strategy, sc, run_dir) in enumerate(plan):
        summary, found = _run_one(sc, run_dir, run)
        row = _row(seed, strategy, run_dir, summary)
        rows.append(row)
        runs = _write_runs(out, rows)
        if k not in fresh:
            log(_progress_line(len(rows), len(plan), row) + (" (done before, kept)" if found else ""))
    absent = [m for m in METRICS if m not in runs.columns]
    if absent:
        log(f"compare: not in any {scenario.target} summary, left out: {', '.join(absent)}")
    table = summarize(runs)
    _write_atomically(table, out / TABLE_FILE, index=True)
    diffs = paired(runs)
    _write_atomically(diffs, out / PAIRED_FILE, index=False)
    return Comparison(runs, table, diffs, summarize_paired(diffs), run_problems(runs),
                      checkpoint_interval_steps)


def _row(seed: int, strategy: str, run_dir: Path, summary: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {"strategy": strategy, "seed": seed, "run_dir": str(run_dir)}
    row.update({k: summary[k] for k in METRICS if k in summary})
    return row


def _through(engine: Any, plan: Sequence[tuple[int, str, Scenario, Path]], out: Path,
             log: LogFn) -> set[int]:
    """Run the plan's unmade runs through ``engine``; ``compare.csv`` holds
    every finished run (in plan order) after each one. Which were made here."""
    from rollcall.results import staging_dir, store_run
    from rollcall.sweep import POINT_TASK

    have = {k: s for k, (_, _, sc, d) in enumerate(plan)
            if (s := finished_summary(d, scenario_hash(sc))) is not None}
    todo = [k for k in range(len(plan)) if k not in have]

    def done(i: int, result: dict[str, Any]) -> None:
        k = todo[i]
        seed, strategy, _, run_dir = plan[k]
        store_run(run_dir, result)
        have[k] = finished_summary(run_dir, scenario_hash(plan[k][2])) or {}
        _write_runs(out, [_row(plan[j][0], plan[j][1], plan[j][3], have[j]) for j in sorted(have)])
        log(_progress_line(len(have), len(plan), _row(seed, strategy, run_dir, have[k])))

    here = engine.local_files  # its tasks write into the compare's directory
    engine.map(POINT_TASK, [{"scenario": plan[k][2].to_yaml(), "name": plan[k][3].name,
                             "run_dir": str(staging_dir(plan[k][3])) if here else None}
                            for k in todo], done)
    return set(todo)


def _as_float(value: Any) -> float:
    """A cell as a number; a missing one (None, NaN) is NaN, so its mean is NaN too."""
    return float("nan") if value is None else float(value)


def summarize(runs: pd.DataFrame) -> pd.DataFrame:
    """Side-by-side table: one row per metric in ``runs``; per strategy the mean and the
    half-width of its 95% t-interval (columns ``(strategy, "mean")`` and
    ``(strategy, "±95%")``)."""
    metrics = [m for m in METRICS if m in runs.columns]
    columns: dict[tuple[str, str], dict[str, float]] = {}
    for strategy in STRATEGIES:
        sub = runs[runs["strategy"] == strategy]
        if sub.empty:
            continue
        for metric in metrics:
            m, h = mean_ci([_as_float(v) for v in sub[metric]])
            if h == h and abs(h) < 1e-9 * max(1.0, abs(m)):
                h = 0.0  # identical values: no spread, not float noise
            columns.setdefault((strategy, "mean"), {})[metric] = m
            columns.setdefault((strategy, "±95%"), {})[metric] = h
    frame = pd.DataFrame(columns)
    frame.columns = pd.MultiIndex.from_tuples(frame.columns)
    frame.index.name = f"n={runs['seed'].nunique()} seeds"
    return frame


def _passed(value: Any) -> bool:
    """A gate cell (completed, valid) as read from a row or a CSV: only True passes."""
    return value is True or str(value) == "True"


def run_problems(runs: pd.DataFrame) -> tuple[str, ...]:
    """One line per run that did not complete or is not valid, naming its run directory."""
    lines = []
    for _, row in runs.iterrows():
        bad = [what for what, key in (("did not complete", "completed"), ("is not valid", "valid"))
               if not _passed(row.get(key))]
        if bad:
            lines.append(f"{row['strategy']} seed {row['seed']} {' and '.join(bad)} "
                         f"({row['run_dir']})")
    return tuple(lines)


def paired(runs: pd.DataFrame) -> pd.DataFrame:
    """Per seed that has both strategies: ``elastic - checkpoint-restart`` per metric.

    Columns ``seed`` then the PAIRED_METRICS present, in that order; a
    missing value on either side is NaN (nothing filled in).
    """
    metrics = [m for m in PAIRED_METRICS if m in runs.columns]
    by_key = {(r["strategy"], r["seed"]): r for _, r in runs.iterrows()}
    rows = []
    for seed in sorted({s for _, s in by_key}):
        cr, el = by_key.get(("checkpoint-restart", seed)), by_key.get(("elastic", seed))
        if cr is None or el is None:
            continue
        row: dict[str, Any] = {"seed": seed}
        for m in metrics:
            row[m] = _as_float(el[m]) - _as_float(cr[m])
        rows.append(row)
    return pd.DataFrame(rows, columns=["seed"] + metrics)


def summarize_paired(diffs: pd.DataFrame) -> pd.DataFrame:
    """Per metric: mean paired difference, half-width of its 95% t-interval,
    the interval's ends and the number of pairs (``lo``/``hi`` NaN with one)."""
    out: dict[str, dict[str, float]] = {}
    for metric in [c for c in diffs.columns if c != "seed"]:
        m, h = mean_ci(list(diffs[metric]))
        if h == h and abs(h) < 1e-9 * max(1.0, abs(m)):
            h = 0.0  # the same difference on every seed: no spread, not float noise
        out[metric] = {"mean": m, "±95%": h, "lo": m - h, "hi": m + h, "n": float(len(diffs))}
    return pd.DataFrame.from_dict(out, orient="index", columns=["mean", "±95%", "lo", "hi", "n"])
