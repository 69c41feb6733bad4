"""The numbers behind each part of the report, as frames, before anything is drawn.

Why apart from the figures: each number here is checked by a unit test
against the compare's own functions (paired differences, verdict) and the
analytic baselines (Young/Daly), so a figure only ever draws what was
tested.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from rollcall.app import analysis as an
from rollcall.app import stats
from rollcall.app import verdict as vd
from rollcall.app.interval import INTERVAL_KEY, checkpoint_intervals
from rollcall.app.report.source import Source, comparison_of, finite, points
from rollcall.results import SCENARIO_FILE
from rollcall.scenario import ScenarioError, load_scenario

__all__ = ["INTERVAL_KEY", "UCurve", "break_even", "measured_intervals", "per_strategy",
           "point_label", "sweep_sentence", "u_curve", "verdict_sentence"]

METRICS = ("goodput", "ettr", "elapsed_s")


def point_label(values: dict[str, Any]) -> str:
    """``cluster.workers=8, failures.worker_mtbf_s=3600`` (``base`` for no grid)."""
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in values.items()) or "base"


def per_strategy(src: Source) -> pd.DataFrame:
    """Per grid point and strategy: ``n`` and, of goodput, ettr and elapsed_s, the mean and
    its 95% interval (half-width, lo, hi, method: :func:`rollcall.app.analysis.summarize`)."""
    present = [m for m in METRICS if m in src.runs.columns]
    runs = src.runs.astype({m: float for m in present})
    return an.summarize(runs, list(src.keys) + ["strategy"], present)


def verdict_sentence(src: Source) -> str:
    """The one sentence: compare's own verdict; a sweep's tally; a run's outcome."""
    if src.kind == "compare":
        return vd.decide(comparison_of(src.runs, src.intervals)).text
    if src.kind == "sweep":
        return sweep_sentence(break_even(src))
    s = src.summary
    state = "was interrupted" if src.interrupted else (
        "completed" if s.get("completed") else "did not complete")
    return (f"one {s.get('strategy')} run {state}: {s.get('steps_committed')} of "
            f"{s.get('steps_target')} steps in {vd.human_s(float(s.get('elapsed_s') or 0.0))}, "
            f"goodput {float(s.get('goodput') or 0.0):.3f}, "
            f"{'valid' if s.get('valid') else 'NOT valid'}; a verdict needs both strategies "
            f"(rollcall compare)")


def break_even(src: Source) -> pd.DataFrame:
    """Per grid point: the paired ``elastic - checkpoint-restart`` elapsed_s and goodput.

    Columns: the grid keys, ``pairs``, ``d_mean, d_lo, d_hi`` (seconds),
    ``cr_mean`` (checkpoint-restart's mean elapsed), ``rel_pct, rel_lo_pct,
    rel_hi_pct`` (the difference in % of checkpoint-restart's time),
    ``g_mean, g_lo, g_hi`` (goodput, its paired logit t interval),
    ``significant`` (True/False; None when no claim is made: fewer than three
    seeds, no spread) and ``verdict`` (compare's sentence for that point).
    Points without both strategies are left out.
    """
    rows = []
    for values, grp in points(src):
        cmp = comparison_of(grp)
        table, pt = cmp.paired_table, cmp.table
        if "elapsed_s" not in table.index or ("checkpoint-restart", "mean") not in pt.columns:
            continue
        d = table.loc["elapsed_s"]
        if not d["n"] or ("elastic", "mean") not in pt.columns:
            continue
        cr = float(pt.loc["elapsed_s", ("checkpoint-restart", "mean")])
        g = table.loc["goodput"] if "goodput" in table.index else None
        decision = vd.decide(cmp)
        rows.append({**values, "pairs": int(d["n"]), "d_mean": d["mean"], "d_lo": d["lo"],
                     "d_hi": d["hi"], "cr_mean": cr,
                     **{f"rel{s}_pct": 100.0 * d[k] / cr if cr else float("nan")
                        for s, k in (("", "mean"), ("_lo", "lo"), ("_hi", "hi"))},
                     "g_mean": g["mean"] if g is not None else float("nan"),
                     "g_lo": g["lo"] if g is not None else float("nan"),
                     "g_hi": g["hi"] if g is not None else float("nan"),
                     "significant": decision.significant, "verdict": decision.text})
    cols = list(src.keys) + ["pairs", "d_mean", "d_lo", "d_hi", "cr_mean", "rel_pct",
                             "rel_lo_pct", "rel_hi_pct", "g_mean", "g_lo", "g_hi",
                             "significant", "verdict"]
    return pd.DataFrame(rows, columns=cols)


def sweep_sentence(be: pd.DataFrame) -> str:
    """A sweep's verdict in one sentence: where each strategy is faster, and how surely."""
    if be.empty:
        return ("no verdict: no grid point has runs of both strategies "
                "(sweep with both, the default, to compare them)")
    decided = be[be["verdict"].str.startswith("no verdict") == False]  # noqa: E712
    el = decided[decided["d_mean"] < 0]
    cr = decided[decided["d_mean"] > 0]
    sig = decided["significant"].astype(object) == True  # noqa: E712
    text = (f"over {len(be)} grid points: elastic is faster at {len(el)} "
            f"({int(sig[el.index].sum())} significant), checkpoint-restart at {len(cr)} "
            f"({int(sig[cr.index].sum())} significant)")
    if len(decided) < len(be):
        text += f"; no verdict at {len(be) - len(decided)} (runs that did not complete)"
    return text + (f" (decided on elapsed_s by a paired t over seeds; a significance claim "
                   f"needs at least {stats.MIN_PAIRS} seeds and some spread)")


class UCurve:
    """Daly's expected wall time of checkpoint-restart against the checkpoint interval.

    ``frame``: ``tau_s, wall_s``; ``marks``: name -> interval in seconds
    (Young, Daly's formula, the curve's minimum, the interval
    ``rollcall compare`` gives checkpoint-restart, the scenario's own).
    """

    def __init__(self, params: dict[str, float], chosen_s: float | None, chosen_why: str) -> None:
        self.params = params
        m, delta = params["M"], params["delta"]
        assert math.isfinite(m) and m > 0, m
        young, daly = an.young_interval(delta, m), an.daly_interval(delta, m)
        lo = max(params["step_s"], min(young, params["tau"]) / 30.0)
        hi = max(lo * 10, min(params["T_s"], 30.0 * max(young, params["tau"])))
        taus = np.logspace(math.log10(lo), math.log10(hi), 400)
        self.frame = pd.DataFrame({"tau_s": taus, "wall_s": [self.wall_s(t) for t in taus]})
        best = self.frame.loc[self.frame["wall_s"].idxmin()]
        self.marks = {"Young": young, "Daly": daly, "minimum": float(best["tau_s"]),
                      "scenario": params["tau"]}
        if chosen_s is not None:
            self.marks["compare"] = chosen_s
        self.chosen_why = chosen_why

    def wall_s(self, tau_s: float) -> float:
        """Expected wall time at interval ``tau_s`` (inf where the exponent overflows)."""
        p = self.params
        try:
            return an.daly_wall_time(p["T_s"], tau_s, p["delta"], p["M"], p["R"])
        except OverflowError:
            return float("inf")


def u_curve(src: Source) -> UCurve | str:
    """The U-curve for the scenario that stands for ``src``, or why there is none (one line)."""
    if src.scenario_dir is None:
        return "no scenario.yaml to draw the checkpoint-interval curve for"
    try:
        scenario = load_scenario(src.scenario_dir / SCENARIO_FILE)
    except (ScenarioError, OSError) as exc:
        return f"{src.scenario_dir / SCENARIO_FILE}: cannot read it ({exc})"
    params = an.daly_params(scenario.to_dict())
    if not math.isfinite(params["M"]):
        return ("no random failures (failures.worker_mtbf_s unset): no failure rate, so no "
                "checkpoint-interval trade-off to draw; only the writes cost time")
    choice = checkpoint_intervals(scenario)["checkpoint-restart"]
    return UCurve(params, choice.steps * choice.step_s, choice.why)


def measured_intervals(src: Source, curve: UCurve) -> pd.DataFrame:
    """Checkpoint-restart's measured elapsed_s per swept interval: ``tau_s, n, mean, ci, lo, hi``.

    Only when the sweep varied the interval; rows of other grid keys are
    kept at their first value (the point the curve is drawn for).
    """
    cols = ["tau_s", "n", "mean", "ci", "lo", "hi"]
    if src.kind != "sweep" or INTERVAL_KEY not in src.keys:
        return pd.DataFrame(columns=cols)
    runs = src.runs[src.runs["strategy"] == "checkpoint-restart"]
    for key in src.keys:
        if key != INTERVAL_KEY and len(runs):
            runs = runs[runs[key] == runs[key].iloc[0]]
    if runs.empty:
        return pd.DataFrame(columns=cols)
    s = an.summarize(runs.astype({"elapsed_s": float}), INTERVAL_KEY, "elapsed_s")
    out = pd.DataFrame({"tau_s": s[INTERVAL_KEY].astype(float) * curve.params["step_s"],
                        "n": s["n"], "mean": s["elapsed_s_mean"], "ci": s["elapsed_s_ci"],
                        "lo": s["elapsed_s_lo"], "hi": s["elapsed_s_hi"]})
    return out[[finite(v) for v in out["mean"]]].reset_index(drop=True)
