"""Both strategies on the same failure traces: ``compare(scenario, seeds, out_dir)``.

For each seed the scenario runs once as ``checkpoint-restart`` and once as
``elastic``. The failure trace is drawn from streams that do not depend on
the strategy (``failures`` and ``node/<i>``, see :mod:`sim.driver`), so both
strategies meet the same crashes at the same simulated instants (scripted
``at_step`` faults and ``kill: random`` follow the job, by definition).

Writes one run directory per (strategy, seed) under ``out_dir``
(``<strategy>-seed<S>/``), ``compare.csv`` with one row per run, and
``compare-table.csv`` with the side-by-side table that is returned: per
metric and strategy the mean over seeds and the half-width of the 95%
Student-t interval.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import pandas as pd

from rollcall.results import prepare_out_dir
from rollcall.scenario import Scenario

from sim.driver import run

STRATEGIES = ("checkpoint-restart", "elastic")

METRICS = (
    "completed", "valid", "elapsed_s", "ettr", "goodput", "productive_s", "lost_work_s",
    "stall_s", "recovery_s", "checkpoint_s", "failures", "generations", "restarts",
    "lost_steps", "samples_duplicated", "samples_skipped", "global_batch_min", "wall_s",
)

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


def with_strategy(scenario: Scenario, strategy: str, seed: int) -> Scenario:
    data = scenario.to_dict()
    data["seed"] = seed
    data["strategy"]["kind"] = strategy
    return Scenario.model_validate(data)


def compare(scenario: Scenario, seeds: list[int], out_dir: str | Path) -> pd.DataFrame:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for seed in seeds:
        for strategy in STRATEGIES:
            sc = with_strategy(scenario, strategy, seed)
            run_dir = prepare_out_dir(out / f"{strategy}-seed{seed}", sc)
            summary = run(sc, run_dir)
            row = {"strategy": strategy, "seed": seed, "run_dir": str(run_dir)}
            row.update({k: summary.get(k) for k in METRICS})
            rows.append(row)
    runs = pd.DataFrame(rows)
    runs.to_csv(out / "compare.csv", index=False)
    table = summarize(runs)
    table.to_csv(out / "compare-table.csv")
    # six significant digits, printed as plain numbers (a float column mixing
    # 1e-3 and 1e6 would otherwise print in scientific notation throughout)
    return table.map(lambda v: float(f"{v:.6g}")).astype(object)


def summarize(runs: pd.DataFrame) -> pd.DataFrame:
    """Side-by-side table: one row per metric; per strategy the mean and the
    half-width of its 95% t-interval (columns ``(strategy, "mean")`` and
    ``(strategy, "±95%")``)."""
    columns: dict[tuple[str, str], dict[str, float]] = {}
    for strategy in STRATEGIES:
        sub = runs[runs["strategy"] == strategy]
        if sub.empty:
            continue
        for metric in METRICS:
            values = [float(v) for v in sub[metric]]
            m, h = mean_ci(values)
            if h == h and abs(h) < 1e-9 * max(1.0, abs(m)):
                h = 0.0  # identical values: no spread, not float noise
            columns.setdefault((strategy, "mean"), {})[metric] = m
            columns.setdefault((strategy, "±95%"), {})[metric] = h
    frame = pd.DataFrame(columns)
    frame.columns = pd.MultiIndex.from_tuples(frame.columns)
    frame.index.name = f"n={runs['seed'].nunique()} seeds"
    return frame
