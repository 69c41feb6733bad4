"""The answer of ``rollcall compare``: a verdict sentence, a table in human units, JSON.

Why a module of its own: :mod:`rollcall.compare` runs and tabulates (CSV,
seconds, machine-readable); this one says what the numbers mean to a person
(days rather than ``5621060.0``) and to a script (one JSON object).

The verdict decides on ``elapsed_s``, the time to finish the same work
(DECIDING_METRIC): both strategies of one seed meet the same failure trace,
so the paired difference ``elastic - checkpoint-restart`` per seed is the
sample, and the result is *significant* when its 95% Student-t interval over
seeds excludes 0. With one seed there is no interval and no claim. When a
run did not complete or is not valid there is no verdict at all: a job that
gave up has no time-to-finish to compare.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from rollcall.compare import STRATEGIES, Comparison

__all__ = ["DECIDING_METRIC", "EXIT_MEANING", "Verdict", "decide", "human_s",
           "human_table", "to_json", "unit_for"]

DECIDING_METRIC = "elapsed_s"
EXIT_MEANING = {0: "every run completed and held every invariant",
                1: "some run did not complete or is not valid (see problems)",
                2: "bad input (scenario or arguments), nothing run",
                130: "interrupted; the finished runs are in compare.csv"}
RATIOS = ("completed", "valid", "ettr", "goodput")
_UNITS = (("days", 86400.0), ("hours", 3600.0), ("min", 60.0), ("s", 1.0))


def unit_for(seconds: float) -> tuple[str, float]:
    """The largest unit of which ``seconds`` is at least two (days, hours, min, s):
    ``36 hours`` rather than ``1.50 days``, ``90 s`` rather than ``1.50 min``."""
    size = abs(seconds) if math.isfinite(seconds) else 0.0
    for name, unit_s in _UNITS:
        if size >= 2 * unit_s:
            return name, unit_s
    return "s", 1.0


def _decimals(scale: float) -> int:
    """Decimals that give about three significant digits at the magnitude ``scale``."""
    if not math.isfinite(scale) or scale == 0:
        return 2
    return max(0, min(6, 2 - math.floor(math.log10(abs(scale)))))


def _num(value: float, decimals: int) -> str:
    return "-" if not math.isfinite(value) else f"{value:.{decimals}f}"


def human_s(seconds: float) -> str:
    """``5621060.0`` -> ``"65.1 days"``; ``150`` -> ``"2.50 min"``; NaN -> ``"-"``."""
    if not math.isfinite(seconds):
        return "-"
    name, unit_s = unit_for(seconds)
    v = seconds / unit_s
    return f"{_num(v, _decimals(v))} {name}"


@dataclass(frozen=True)
class Verdict:
    """The sentence and what it rests on (``significant`` None: no claim possible)."""

    text: str
    metric: str
    significant: bool | None
    pairs: int

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text, "deciding_metric": self.metric,
                "significant": self.significant, "pairs": self.pairs}


def _interval(lo: float, hi: float, decimals: int) -> str:
    return f"[{_num(lo, decimals)}, {_num(hi, decimals)}]"


def decide(cmp: Comparison) -> Verdict:
    """The verdict sentence for a finished compare (see the module docstring)."""
    n = len(cmp.paired)
    if cmp.problems:
        return Verdict(f"no verdict: {len(cmp.problems)} of {len(cmp.runs)} runs did not "
                       f"complete or are not valid", DECIDING_METRIC, None, n)
    if DECIDING_METRIC not in cmp.paired_table.index:
        return Verdict(f"no verdict: no run reports {DECIDING_METRIC}", DECIDING_METRIC, None, n)
    d = cmp.paired_table.loc[DECIDING_METRIC]
    g = cmp.paired_table.loc["goodput"] if "goodput" in cmp.paired_table.index else None
    means = {s: cmp.table.loc[DECIDING_METRIC, (s, "mean")] for s in STRATEGIES}
    if not all(math.isfinite(v) for v in [d["mean"], *means.values()]):
        return Verdict("no verdict: elapsed_s is missing from some run", DECIDING_METRIC, None, n)
    winner, loser = ("elastic", "checkpoint-restart") if d["mean"] < 0 else (
        "checkpoint-restart", "elastic")
    unit, unit_s = unit_for(means[loser])
    k = _decimals(means[loser] / unit_s)
    sign = -1.0 if winner == "elastic" else 1.0  # the saving is -d for elastic
    saved = sign * d["mean"] / unit_s
    lo, hi = sorted((sign * d["lo"] / unit_s, sign * d["hi"] / unit_s))
    if d["mean"] == 0:
        head = f"neither strategy is faster: both take {_num(means[loser] / unit_s, k)} {unit}"
    elif n > 1:
        head = (f"{winner} saves {_num(saved, k)} {_interval(lo, hi, k)} of "
                f"{_num(means[loser] / unit_s, k)} {unit}")
    else:
        head = f"{winner} saves {_num(saved, k)} of {_num(means[loser] / unit_s, k)} {unit}"
    if g is not None:
        gp = f"goodput {g['mean']:+.3f}"
        head += f" (elastic {gp} {_interval(g['lo'], g['hi'], 3)})" if n > 1 else f" (elastic {gp})"
    if n == 1:
        return Verdict(f"{head} on one seed; no interval with one seed, so no significance "
                       f"claim (decided on {DECIDING_METRIC})", DECIDING_METRIC, None, 1)
    significant = bool(d["lo"] > 0 or d["hi"] < 0)
    why = "excludes" if significant else "includes"
    return Verdict(f"{head}; {'significant' if significant else 'not significant'} "
                   f"(decided on {DECIDING_METRIC}: the 95% interval of its paired difference "
                   f"over {n} seeds {why} 0)", DECIDING_METRIC, significant, n)


def _kind(metric: str) -> str:
    return "seconds" if metric.endswith("_s") else "ratio" if metric in RATIOS else "count"


def _cell(mean: float, half: float, metric: str, unit: tuple[str, float]) -> str:
    """``65.1 ± 0.3 days``, ``0.876 ± 0.004``, ``12.4 ± 1.2``; one value without ``±``."""
    scale = unit[1] if _kind(metric) == "seconds" else 1.0
    k = 3 if _kind(metric) == "ratio" else _decimals(mean / scale)
    text = _num(mean / scale, k)
    if math.isfinite(half):
        text += f" ± {_num(half / scale, k)}"
    return text + (f" {unit[0]}" if _kind(metric) == "seconds" and math.isfinite(mean) else "")


def _diff_cell(row: pd.Series, metric: str, unit: tuple[str, float], base: float) -> str:
    """``-8.0 [-8.8, -7.2] days``: the paired mean and its interval, in the row's unit."""
    scale = unit[1] if _kind(metric) == "seconds" else 1.0
    k = 3 if _kind(metric) == "ratio" else _decimals(base / scale)
    text = f"{row['mean'] / scale:+.{k}f}" if math.isfinite(row["mean"]) else "-"
    if math.isfinite(row["±95%"]):
        text += f" {_interval(row['lo'] / scale, row['hi'] / scale, k)}"
    return text + (f" {unit[0]}" if _kind(metric) == "seconds" and math.isfinite(row["mean"]) else "")


def human_table(cmp: Comparison) -> pd.DataFrame:
    """The printed table: per metric, each strategy's mean ± 95% half-width and the
    paired difference [95% interval], seconds in the unit that fits the row's
    largest mean (the CSVs keep seconds)."""
    strategies = [s for s in STRATEGIES if (s, "mean") in cmp.table.columns]
    cells: dict[str, dict[str, str]] = {}
    for metric in cmp.table.index:
        means = [cmp.table.loc[metric, (s, "mean")] for s in strategies]
        base = max((abs(v) for v in means if math.isfinite(v)), default=float("nan"))
        unit = unit_for(base)
        row = {s: _cell(cmp.table.loc[metric, (s, "mean")], cmp.table.loc[metric, (s, "±95%")],
                        metric, unit) for s in strategies}
        if metric in cmp.paired_table.index:
            row["elastic - checkpoint-restart"] = _diff_cell(
                cmp.paired_table.loc[metric], metric, unit, base)
        cells[metric] = row
    return pd.DataFrame.from_dict(cells, orient="index").fillna("")


def _finite(value: Any) -> Any:
    """JSON has no NaN: a missing number is null."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def to_json(cmp: Comparison, verdict: Verdict, interval: dict[str, Any],
            exit_status: int) -> dict[str, Any]:
    """The ``--json`` document: everything the printed output says, in seconds."""
    metrics: dict[str, Any] = {}
    for metric in cmp.table.index:
        entry: dict[str, Any] = {"kind": _kind(metric), "strategies": {}}
        for s in STRATEGIES:
            if (s, "mean") not in cmp.table.columns:
                continue
            m, h = float(cmp.table.loc[metric, (s, "mean")]), float(cmp.table.loc[metric, (s, "±95%")])
            entry["strategies"][s] = {"mean": _finite(m), "ci95_half": _finite(h),
                                      "ci95": [_finite(m - h), _finite(m + h)]}
        if metric in cmp.paired_table.index:
            p = cmp.paired_table.loc[metric]
            entry["paired"] = {"mean": _finite(float(p["mean"])),
                               "ci95_half": _finite(float(p["±95%"])),
                               "ci95": [_finite(float(p["lo"])), _finite(float(p["hi"]))],
                               "pairs": int(p["n"])}
        metrics[metric] = entry
    return {
        "seeds": sorted(int(s) for s in cmp.runs["seed"].unique()),
        "paired": "elastic - checkpoint-restart, per seed (same failure trace)",
        "metrics": metrics,
        "verdict": verdict.to_json(),
        "checkpoint_interval": interval,
        "problems": list(cmp.problems),
        "exit_status": exit_status,
        "exit_meaning": {str(k): v for k, v in EXIT_MEANING.items()},
    }
