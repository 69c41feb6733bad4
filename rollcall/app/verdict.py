"""The answer of ``rollcall compare``: a verdict sentence, a table in human units, JSON.

Why a module of its own: :mod:`rollcall.app.comparison` runs and tabulates (CSV,
seconds, machine-readable); this one says what the numbers mean to a person
(days rather than ``5621060.0``) and to a script (one JSON object).

The verdict decides on ``elapsed_s``, the time to finish the same work
(DECIDING_METRIC): both strategies of one seed meet the same failure trace,
so the paired difference ``elastic - checkpoint-restart`` per seed is the
sample, and the result is *significant* when its paired t interval over
seeds excludes 0 (:func:`rollcall.app.stats.significance`). There is no claim
either way (``significant`` None) with fewer than three pairs ("too few
seeds") or when every seed gave the same difference ("no spread"). Every
interval printed is made by its metric's method (:mod:`rollcall.app.stats`),
and the sentence and the table name it, and the checkpoint interval each
strategy ran at (:mod:`rollcall.app.interval`). When a run did not complete or
is not valid there is no time-to-finish to compare, so no paired verdict:
but where one strategy completed on every seed and the keeper ended the
other's runs as not expected to finish (:mod:`rollcall.core.progress`),
that is the answer, said as such (``winner`` set, no significance claim).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from rollcall.app import stats
from rollcall.app.comparison import STRATEGIES, Comparison
from rollcall.core import NOT_EXPECTED

__all__ = ["DECIDING_METRIC", "EXIT_MEANING", "Verdict", "decide", "human_s",
           "human_table", "to_json", "unit_for"]

DECIDING_METRIC = "elapsed_s"
EXIT_MEANING = {0: "every run completed and held every invariant",
                1: "some run did not complete or is not valid (see problems)",
                2: "bad input (scenario or arguments), nothing run",
                130: "interrupted; the finished runs are in compare.csv"}
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
    """The sentence and what it rests on (``significant`` None: no claim made), and the
    method of the deciding interval (``"paired t over 5 seeds"``)."""

    text: str
    metric: str
    significant: bool | None
    pairs: int
    method: str = ""
    winner: str | None = None  # the faster strategy, or the only one expected to finish

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text, "deciding_metric": self.metric, "winner": self.winner,
                "significant": self.significant, "pairs": self.pairs, "method": self.method}


def _interval(lo: float, hi: float, decimals: int) -> str:
    return f"[{_num(lo, decimals)}, {_num(hi, decimals)}]"


def _shown(interval: stats.Interval) -> bool:
    """Whether an interval is worth printing: it exists and has some width."""
    return (not interval.no_spread and math.isfinite(interval.lo)
            and math.isfinite(interval.hi))


def _saving(d: stats.Interval, means: dict[str, float]) -> str:
    """``elastic saves 8.0 [6.8, 9.2] of 65.0 days``: the paired difference as a saving,
    in the unit of the slower strategy's mean time."""
    winner, loser = ("elastic", "checkpoint-restart") if d.mean < 0 else (
        "checkpoint-restart", "elastic")
    unit, unit_s = unit_for(means[loser])
    k = _decimals(means[loser] / unit_s)
    of = f"{_num(means[loser] / unit_s, k)} {unit}"
    if d.mean == 0:
        if _shown(d):
            return (f"neither strategy is faster on average: both take {of}, the difference "
                    f"{_interval(d.lo / unit_s, d.hi / unit_s, k)} {unit}")
        return f"neither strategy is faster: both take {of}" + (
            " on every seed" if d.no_spread else "")
    sign = -1.0 if winner == "elastic" else 1.0  # the saving is -d for elastic
    text = f"{winner} saves {_num(sign * d.mean / unit_s, k)}"
    if _shown(d):
        text += " " + _interval(*sorted((sign * d.lo / unit_s, sign * d.hi / unit_s)), k)
    text += f" of {of}"
    if d.no_spread:
        text += " on every seed"
    elif d.n == 1:
        text += " on one seed"
    return text


def _goodput(g: stats.Interval) -> str:
    """`` (elastic goodput +0.117 [0.102, 0.131], paired logit t)``."""
    text = f" (elastic goodput {g.mean:+.3f}"
    if _shown(g):
        text += f" {_interval(g.lo, g.hi, 3)}, {g.method}"
    return text + ")"


def _intervals(cmp: Comparison) -> str:
    """``; checkpoints: checkpoint-restart every 1116 s (Daly's optimum), elastic ...``."""
    if not cmp.intervals:
        return ""
    first, second = (cmp.intervals[s].short() for s in STRATEGIES)
    if first.removeprefix(STRATEGIES[0]) == second.removeprefix(STRATEGIES[1]):
        return "; checkpoints: both" + first.removeprefix(STRATEGIES[0])
    return f"; checkpoints: {first}, {second}"


def _finished(runs: pd.DataFrame, strategy: str) -> bool:
    """Whether every run of ``strategy`` completed and is valid."""
    rows = runs[runs["strategy"] == strategy]
    return len(rows) > 0 and all(str(r["completed"]) == "True" and str(r["valid"]) == "True"
                                 for _, r in rows.iterrows())


def _not_expected(runs: pd.DataFrame, strategy: str) -> list[str]:
    """The end reasons of ``strategy``'s valid runs the keeper ended as not expected to finish."""
    rows = runs[runs["strategy"] == strategy]
    return [str(r["end_reason"]) for _, r in rows.iterrows()
            if str(r["valid"]) == "True" and NOT_EXPECTED in str(r.get("end_reason") or "")]


def _only_one_finishes(cmp: Comparison) -> Verdict | None:
    """The verdict where one strategy completed every run and the other was not
    expected to finish on some seeds (and never invalid nor cut short otherwise)."""
    for winner, loser in (STRATEGIES, STRATEGIES[::-1]):
        hopeless = _not_expected(cmp.runs, loser)
        rows = cmp.runs[cmp.runs["strategy"] == loser]
        others_fine = all(str(r["completed"]) == "True" and str(r["valid"]) == "True"
                          for _, r in rows.iterrows() if NOT_EXPECTED not in str(r["end_reason"]))
        if hopeless and others_fine and _finished(cmp.runs, winner):
            mean = cmp.interval(DECIDING_METRIC, winner).mean
            text = (f"{winner}: {loser} is not expected to finish on {len(hopeless)} of "
                    f"{len(rows)} seeds ({hopeless[0].removeprefix('job failed: ')}); {winner} "
                    f"finishes in {human_s(mean)} on average; no significance claim: decided "
                    f"on which strategy finishes, not on a paired difference" + _intervals(cmp))
            return Verdict(text, DECIDING_METRIC, None, len(cmp.paired), winner=winner)
    return None


def decide(cmp: Comparison) -> Verdict:
    """The verdict sentence for a finished compare (see the module docstring)."""
    n = len(cmp.paired)
    if cmp.problems:
        only = _only_one_finishes(cmp) if "end_reason" in cmp.runs.columns else None
        if only is not None:
            return only
        return Verdict(f"no verdict: {len(cmp.problems)} of {len(cmp.runs)} runs did not "
                       f"complete or are not valid" + _intervals(cmp), DECIDING_METRIC, None, n)
    if DECIDING_METRIC not in cmp.paired_table.index:
        return Verdict(f"no verdict: no run reports {DECIDING_METRIC}", DECIDING_METRIC, None, n)
    d = cmp.paired_interval(DECIDING_METRIC)
    means = {s: cmp.table.loc[DECIDING_METRIC, (s, "mean")] for s in STRATEGIES}
    if not all(math.isfinite(v) for v in [d.mean, *means.values()]):
        return Verdict("no verdict: elapsed_s is missing from some run", DECIDING_METRIC, None, n)
    text = _saving(d, means)
    if "goodput" in cmp.paired_table.index:
        text += _goodput(cmp.paired_interval("goodput"))
    significant, why = stats.significance(d)
    if significant is None:
        text += f"; no significance claim: {why} (decided on {DECIDING_METRIC}, {d.describe()})"
    else:
        text += (f"; {'significant' if significant else 'not significant'} (decided on "
                 f"{DECIDING_METRIC} by a {d.describe()}: {why})")
    winner = None if d.mean == 0 else "elastic" if d.mean < 0 else "checkpoint-restart"
    return Verdict(text + _intervals(cmp), DECIDING_METRIC, significant, n, d.describe(), winner)


def _kind(metric: str) -> str:
    """A metric's kind as the JSON names it: seconds, ratio, count or number."""
    kind = stats.kind_of(metric)
    return "seconds" if kind == "time" else kind


def _cell(interval: stats.Interval, metric: str, unit: tuple[str, float]) -> str:
    """``65.1 ± 0.3 days`` (a t interval), ``0.876 [0.850, 0.897]`` (a ratio or a count,
    whose intervals are not centred), ``1.000 (no spread)``; one seed: the mean alone."""
    seconds = _kind(metric) == "seconds"
    scale = unit[1] if seconds else 1.0
    k = 3 if _kind(metric) == "ratio" else _decimals(interval.mean / scale)
    text = _num(interval.mean / scale, k)
    if _shown(interval) and stats.kind_of(metric) in ("time", "number"):
        text += f" ± {_num(interval.half / scale, k)}"
    elif _shown(interval):
        text += f" {_interval(interval.lo / scale, interval.hi / scale, k)}"
    text += f" {unit[0]}" if seconds and math.isfinite(interval.mean) else ""
    return text + (" (no spread)" if interval.no_spread else "")


def _diff_cell(d: stats.Interval, metric: str, unit: tuple[str, float], base: float) -> str:
    """``-8.0 [-8.8, -7.2] days``: the paired mean and its interval, in the row's unit."""
    seconds = _kind(metric) == "seconds"
    scale = unit[1] if seconds else 1.0
    k = 3 if _kind(metric) == "ratio" else _decimals(base / scale)
    text = f"{d.mean / scale:+.{k}f}" if math.isfinite(d.mean) else "-"
    if _shown(d):
        text += f" {_interval(d.lo / scale, d.hi / scale, k)}"
    text += f" {unit[0]}" if seconds and math.isfinite(d.mean) else ""
    return text + (" (no spread)" if d.no_spread else "")


def _methods(intervals: list[stats.Interval]) -> str:
    """``t, paired t over 3 seeds``: the methods of a row's intervals."""
    n = max((iv.n for iv in intervals), default=0)
    if n < 2:
        return intervals[0].describe() if intervals else ""
    names = list(dict.fromkeys(iv.method for iv in intervals))
    return f"{', '.join(names)} over {n} seeds"


def human_table(cmp: Comparison) -> pd.DataFrame:
    """The printed table: per metric, each strategy's mean and 95% interval, the paired
    difference and its interval, and the methods that made them (column ``95%
    interval``); seconds in the unit that fits the row's largest mean (the CSVs keep
    seconds)."""
    strategies = [s for s in STRATEGIES if (s, "mean") in cmp.table.columns]
    cells: dict[str, dict[str, str]] = {}
    for metric in cmp.table.index:
        intervals = [cmp.interval(metric, s) for s in strategies]
        base = max((abs(iv.mean) for iv in intervals if math.isfinite(iv.mean)),
                   default=float("nan"))
        unit = unit_for(base)
        row = {s: _cell(iv, metric, unit) for s, iv in zip(strategies, intervals)}
        if metric in cmp.paired_table.index:
            d = cmp.paired_interval(metric)
            row["elastic - checkpoint-restart"] = _diff_cell(d, metric, unit, base)
            intervals.append(d)
        row["95% interval"] = _methods(intervals)
        cells[metric] = row
    order = strategies + ["elastic - checkpoint-restart", "95% interval"]
    frame = pd.DataFrame.from_dict(cells, orient="index")
    return frame[[c for c in order if c in frame.columns]].fillna("")


def _finite(value: Any) -> Any:
    """JSON has no NaN: a missing number is null."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _interval_json(interval: stats.Interval) -> dict[str, Any]:
    return {"mean": _finite(interval.mean), "ci95_half": _finite(interval.half),
            "ci95": [_finite(interval.lo), _finite(interval.hi)], "method": interval.describe()}


def to_json(cmp: Comparison, verdict: Verdict, exit_status: int) -> dict[str, Any]:
    """The ``--json`` document: everything the printed output says, in seconds. Each
    interval is ``ci95`` (its ends), ``ci95_half`` (half its width) and ``method``."""
    metrics: dict[str, Any] = {}
    for metric in cmp.table.index:
        entry: dict[str, Any] = {"kind": _kind(metric), "strategies": {}}
        for s in STRATEGIES:
            if (s, "mean") in cmp.table.columns:
                entry["strategies"][s] = _interval_json(cmp.interval(metric, s))
        if metric in cmp.paired_table.index:
            d = cmp.paired_interval(metric)
            entry["paired"] = {**_interval_json(d), "pairs": d.n}
        metrics[metric] = entry
    return {
        "seeds": sorted(int(s) for s in cmp.runs["seed"].unique()),
        "paired": "elastic - checkpoint-restart, per seed (same failure trace)",
        "metrics": metrics,
        "verdict": verdict.to_json(),
        "checkpoint_intervals": {s: c.to_json() for s, c in cmp.intervals.items()},
        "problems": list(cmp.problems),
        "exit_status": exit_status,
        "exit_meaning": {str(k): v for k, v in EXIT_MEANING.items()},
    }
