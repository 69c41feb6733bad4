"""Both strategies on the same failure traces, on any target: ``compare(scenario, seeds, out_dir, run)``.

``rollcall compare`` for every target: :func:`rollcall.app.targets.compare`
hands in the target driver's ``run(scenario, out_dir) -> summary``; this
module never imports a target (``tests/test_purity.py``), so the loop, the
rows and the table are the same code for both.

For each seed the scenario runs once as ``checkpoint-restart`` and once as
``elastic``, each in its own run directory ``<strategy>-seed<S>/`` under
``out_dir``. After every run ``compare.csv`` (one row per finished run) is
rewritten atomically and one progress line goes to ``log``, so an
interrupted compare keeps every finished row and shows how far it got. At
the end ``compare-table.csv`` gets the side-by-side table (returned in a
:class:`Comparison` with the runs and the paired differences): per metric
and strategy the mean over seeds, the half-width ``±95%`` and the ends
``lo``/``hi`` of its 95% interval and the ``method`` that made it (one per
kind of metric, :mod:`rollcall.app.stats`), and ``compare-paired.csv`` the
paired differences: both strategies of one seed meet the same failure
trace, so per seed and metric ``elastic - checkpoint-restart`` is one sample
of the difference, and its paired interval over seeds is much narrower than
the two strategies' intervals side by side (``rollcall.app.verdict`` turns it
into a sentence).

Each strategy runs at its own checkpoint interval (:mod:`rollcall.app.interval`:
Daly's optimum for the events that send it back to its checkpoint), or both
at the scenario's with ``fixed_interval``; :attr:`Comparison.intervals`
says which and why. ``max_wall_s`` bounds each run's wall time: a run cut
short ends "wall limit: ..." (not completed), never a hang.

A metric that no run's summary has (a key that summaries kept from older
runs lack) is left out of both files and named in one
``log`` line; a value missing from only some runs (or ``None``) is an empty
cell in ``compare.csv`` and makes that strategy's mean and interval NaN.
Nothing is filled in.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pandas as pd

from rollcall.app import stats, targets
from rollcall.app.interval import IntervalChoice, at_its_interval, checkpoint_intervals
from rollcall.results import (
    HISTORY_FILE, SUMMARY_FILE, finished_summary, prepare_out_dir, scenario_hash,
)
from rollcall.scenario import Scenario
from rollcall.app.stats import t975

__all__ = [
    "INTERVALS_FILE", "METRICS", "PAIRED_FILE", "PAIRED_METRICS", "RUNS_FILE", "STRATEGIES",
    "TABLE_COLUMNS",
    "TABLE_FILE", "Comparison", "compare", "interval_table", "mean_ci", "on_target", "paired",
    "run_problems",
    "strategy_interval", "summarize", "summarize_paired", "t975", "with_strategy",
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
INTERVALS_FILE = "compare-intervals.json"  # each strategy's checkpoint interval and why
TABLE_FILE = "compare-table.csv"
PAIRED_FILE = "compare-paired.csv"
# the gates (completed, valid) are not differences anyone decides on
PAIRED_METRICS = tuple(m for m in METRICS if m not in ("completed", "valid"))
_ID_COLUMNS = ("strategy", "seed", "run_dir")

#: per strategy in compare-table.csv: the mean, the half-width, the interval and its method
TABLE_COLUMNS = ("mean", "±95%", "lo", "hi", "method")


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """Mean and half-width of the 95% Student-t interval (NaN half-width with one value; a
    NaN value makes both NaN): the interval of times and other unbounded metrics
    (:func:`rollcall.app.stats.mean_interval`)."""
    interval = stats.mean_interval(values, "number")
    return interval.mean, interval.half


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
    """The rows with a fixed column order (ids, then METRICS order, then why each
    run ended), whatever row came first."""
    return pd.DataFrame(list(rows),
                        columns=list(_ID_COLUMNS) + _metrics_present(rows) + ["end_reason"])


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
    """What a finished compare wrote: the runs, the side-by-side table of means and
    half-widths (full precision), the per-seed paired differences and their summary,
    and the runs that did not complete or are not valid (one line each). Each interval
    itself (its ends, its method) is :meth:`interval` and :meth:`paired_interval`."""

    runs: pd.DataFrame
    table: pd.DataFrame
    paired: pd.DataFrame
    paired_table: pd.DataFrame
    problems: tuple[str, ...]
    intervals: Mapping[str, IntervalChoice] = field(default_factory=dict)  # by strategy

    def rounded_table(self) -> pd.DataFrame:
        """Six significant digits, printed as plain numbers (a float column mixing
        1e-3 and 1e6 would otherwise print in scientific notation throughout)."""
        return self.table.map(lambda v: float(f"{v:.6g}")).astype(object)

    def interval(self, metric: str, strategy: str) -> stats.Interval:
        """The 95% interval of ``metric``'s mean over ``strategy``'s seeds (its row of
        ``compare-table.csv``)."""
        return strategy_interval(self.runs, metric, strategy)

    def paired_interval(self, metric: str) -> stats.Interval:
        """The 95% interval of the mean paired difference of ``metric`` (its row of
        :attr:`paired_table`)."""
        return _paired_interval(self.paired, metric, self.runs)


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
            log: LogFn = _stderr_line, *, fixed_interval: bool = False,
            max_wall_s: float | None = None, engine: Any = None) -> Comparison:
    """Run both strategies for every seed with ``run``; write the CSVs; return them.

    Each strategy at its own checkpoint interval, or both at the scenario's
    with ``fixed_interval`` (see the module docstring). ``run`` is handed
    each run's scenario and directory (and bounds it by ``max_wall_s`` itself);
    an ``engine``'s tasks get ``max_wall_s`` with each run.

    An exception out of ``run`` (KeyboardInterrupt included) propagates after
    the runs before it are in ``compare.csv``; the table and the paired file
    are written only when every run finished, so a partial table is never
    mistaken for a full one. The same compare into the same ``out_dir``
    resumes: a run whose directory holds its finished summary (see
    :func:`finished_summary`) is read back, not run again. With an
    ``engine`` (:mod:`rollcall.app.engines`) the runs not yet made go through it
    all at once, each written whole as it comes back; the rows are the same.
    """
    assert seeds, "compare needs at least one seed"
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plan = [(seed, strategy,
             at_its_interval(with_strategy(scenario, strategy, seed), fixed=fixed_interval),
             out / f"{strategy}-seed{seed}")
            for seed in seeds for strategy in STRATEGIES]
    choices = checkpoint_intervals(scenario, fixed=fixed_interval)
    text = json.dumps({s: c.to_json() for s, c in choices.items()}, indent=1, allow_nan=False)
    tmp = out / f".{INTERVALS_FILE}.tmp"
    tmp.write_text(text + "\n", encoding="utf-8")
    os.replace(tmp, out / INTERVALS_FILE)
    fresh = set() if engine is None else _through(engine, plan, out, log, max_wall_s)
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
    intervals = interval_table(runs)
    _write_atomically(intervals, out / TABLE_FILE, index=True)
    diffs = paired(runs)
    _write_atomically(diffs, out / PAIRED_FILE, index=False)
    return Comparison(runs, _means_and_halves(intervals), diffs, summarize_paired(diffs, runs),
                      run_problems(runs), choices)


def _row(seed: int, strategy: str, run_dir: Path, summary: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {"strategy": strategy, "seed": seed, "run_dir": str(run_dir)}
    row.update({k: summary[k] for k in METRICS if k in summary})
    row["end_reason"] = summary.get("end_reason")
    return row


def _through(engine: Any, plan: Sequence[tuple[int, str, Scenario, Path]], out: Path,
             log: LogFn, max_wall_s: float | None) -> set[int]:
    """Run the plan's unmade runs through ``engine``; ``compare.csv`` holds
    every finished run (in plan order) after each one. Which were made here."""
    from rollcall.results import staging_dir, store_run
    from rollcall.app.sweeps import POINT_TASK

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
                             "run_dir": str(staging_dir(plan[k][3])) if here else None,
                             "max_wall_s": max_wall_s}
                            for k in todo], done)
    return set(todo)


def _as_float(value: Any) -> float:
    """A cell as a number; a missing one (None, NaN) is NaN, so its mean is NaN too."""
    return float("nan") if value is None else float(value)


def strategy_interval(runs: pd.DataFrame, metric: str, strategy: str) -> stats.Interval:
    """The 95% interval of ``metric``'s mean over ``strategy``'s rows, by the metric's kind."""
    values = [_as_float(v) for v in runs.loc[runs["strategy"] == strategy, metric]]
    return stats.mean_interval(values, stats.kind_of(metric))


def interval_table(runs: pd.DataFrame) -> pd.DataFrame:
    """``compare-table.csv``: one row per metric in ``runs``; per strategy its mean, the
    half-width of its 95% interval, the interval's ends and the method that made it
    (columns ``(strategy, c)`` for ``c`` in TABLE_COLUMNS)."""
    metrics = [m for m in METRICS if m in runs.columns]
    columns: dict[tuple[str, str], dict[str, Any]] = {}
    for strategy in STRATEGIES:
        if not (runs["strategy"] == strategy).any():
            continue
        for metric in metrics:
            iv = strategy_interval(runs, metric, strategy)
            cells = (iv.mean, iv.half, iv.lo, iv.hi, iv.describe())
            for name, value in zip(TABLE_COLUMNS, cells):
                columns.setdefault((strategy, name), {})[metric] = value
    frame = pd.DataFrame(columns, index=metrics)
    frame.columns = pd.MultiIndex.from_tuples(frame.columns)
    frame.index.name = f"n={runs['seed'].nunique()} seeds"
    return frame


def _means_and_halves(intervals: pd.DataFrame) -> pd.DataFrame:
    return intervals[[c for c in intervals.columns if c[1] in ("mean", "±95%")]].astype(float)


def summarize(runs: pd.DataFrame) -> pd.DataFrame:
    """Side-by-side table: one row per metric in ``runs``; per strategy the mean and the
    half-width of its 95% interval (columns ``(strategy, "mean")`` and
    ``(strategy, "±95%")``; the ends and the method are :func:`interval_table`'s)."""
    return _means_and_halves(interval_table(runs))


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


def _paired_interval(diffs: pd.DataFrame, metric: str,
                     runs: pd.DataFrame | None) -> stats.Interval:
    """The interval of ``metric``'s mean paired difference; for a count, within the range
    the two strategies' counts in ``runs`` allow (:func:`rollcall.app.stats.count_difference_range`)."""
    kind = stats.kind_of(metric)
    allowed = None
    if kind == "count" and runs is not None:
        by_key = {(r["strategy"], r["seed"]): _as_float(r[metric]) for _, r in runs.iterrows()}
        seeds = list(diffs["seed"])
        allowed = stats.count_difference_range([by_key[("elastic", s)] for s in seeds],
                                               [by_key[("checkpoint-restart", s)] for s in seeds])
    return stats.difference_interval(list(diffs[metric]), kind, allowed)


def summarize_paired(diffs: pd.DataFrame, runs: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per metric: the mean paired difference, the half-width and the ends of its 95%
    interval, the number of pairs and the method (``lo``/``hi`` NaN with one pair).
    ``runs`` (the rows ``diffs`` came from) bounds the intervals of counts."""
    out: dict[str, dict[str, Any]] = {}
    for metric in [c for c in diffs.columns if c != "seed"]:
        iv = _paired_interval(diffs, metric, runs)
        out[metric] = {"mean": iv.mean, "±95%": iv.half, "lo": iv.lo, "hi": iv.hi,
                       "n": float(len(diffs)), "method": iv.describe()}
    return pd.DataFrame.from_dict(out, orient="index",
                                  columns=["mean", "±95%", "lo", "hi", "n", "method"])


def on_target(target: str) -> Callable[..., Comparison]:
    """Both strategies per seed on the target: :func:`compare` handed the
    target driver's ``run``; :class:`~rollcall.app.targets.NotBuilt` without a driver.

    The function returned takes ``(scenario, seeds, out_dir, stop=None,
    max_wall_s=None, **options)``: ``stop`` (a
    :class:`rollcall.interrupts.Stop`) and ``max_wall_s`` go to every run,
    and no run starts once ``stop`` holds a signal; ``options`` go to the
    comparison. A run that ends interrupted raises KeyboardInterrupt with
    its end reason, so the compare stops with the finished runs written.
    """
    run = targets.driver(target).run

    def both_strategies(scenario: Scenario, seeds: Sequence[int], out_dir: str | Path,
                        stop: Any = None, max_wall_s: float | None = None,
                        **options: Any) -> Comparison:
        def run_or_raise(sc: Scenario, run_dir: Path) -> dict[str, Any]:
            extra = {} if stop is None else {"stop": stop}
            signalled = None if stop is None else stop.reason()
            if signalled is not None:  # a signal between two runs
                raise KeyboardInterrupt(signalled)
            summary = run(sc, run_dir, max_wall_s=max_wall_s, **extra)
            if summary.get("result") == "interrupted":
                raise KeyboardInterrupt(summary.get("end_reason") or "interrupted")
            return summary

        return compare(scenario, seeds, out_dir, run_or_raise, max_wall_s=max_wall_s,
                       **options)

    return both_strategies
