"""The report's figures: matplotlib ``Figure`` objects, drawn without pyplot.

Why no pyplot: the report is made inside the CLI (and in tests beside other
plots); a ``Figure`` made directly has no global state and renders with
Agg whatever backend the process has. Each function takes the frames
:mod:`rollcall.app.report.data` computed and returns the figure, so a test can
look at what was drawn.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure

from rollcall.app import analysis as an
from rollcall.app import verdict as vd
from rollcall.app.report.data import UCurve, point_label

__all__ = ["COLOURS", "break_even_heatmap", "break_even_line", "metrics", "save",
           "timelines", "u_curve"]

COLOURS = {"checkpoint-restart": "tab:red", "elastic": "tab:blue"}
_DPI = 100
# under a break-even cell: nothing when significant; n.s. when the interval holds 0;
# "no claim" with fewer than three seeds or no spread (rollcall.app.stats.significance)
_SURE = {False: "\nn.s.", None: "\nno claim"}


def save(fig: Figure, path: Path) -> Path:
    """Write ``fig`` as PNG at ``path`` (Agg, fixed dpi); returns the path."""
    fig.savefig(path, dpi=_DPI, format="png")
    return path


def timelines(runs: Sequence[tuple[str, Path]]) -> Figure:
    """One timeline per ``(title, run_dir)``, stacked, per-worker rows coloured by generation."""
    assert runs, "nothing to draw"
    fig = Figure(figsize=(12, 3.6 * len(runs)), layout="constrained")
    axes = fig.subplots(len(runs), 1, squeeze=False)[:, 0]
    for ax, (title, run_dir) in zip(axes, runs):
        an.plot_timeline(run_dir, ax=ax, title=title)
    return fig


def _errorbars(ax: Any, x: Sequence[float], frame: pd.DataFrame, metric: str, scale: float,
               colour: str, label: str) -> None:
    ax.errorbar(x, frame[f"{metric}_mean"].astype(float) / scale,
                yerr=an.error_bars(frame, metric, scale), marker="o", capsize=4, color=colour,
                label=label, ls="-" if len(x) > 1 else "none")


def metrics(stats: pd.DataFrame, keys: Sequence[str]) -> Figure:
    """Goodput, ETTR and elapsed time per strategy with 95% intervals (one panel each):
    logit t for goodput and ETTR (inside [0, 1]), t for elapsed (:mod:`rollcall.app.stats`).

    x is the grid point (its values in order; a compare is one point).
    """
    present = [m for m in ("goodput", "ettr", "elapsed_s") if f"{m}_mean" in stats.columns]
    fig = Figure(figsize=(4.2 * len(present), 3.8), layout="constrained")
    axes = fig.subplots(1, len(present), squeeze=False)[0]
    labels = [point_label(dict(zip(keys, row))) for row in
              stats[list(keys)].drop_duplicates().itertuples(index=False)] if keys else ["all seeds"]
    where = {lab: i for i, lab in enumerate(labels)}
    elapsed_max = float(stats["elapsed_s_mean"].abs().max()) if "elapsed_s" in present else 1.0
    unit, unit_s = vd.unit_for(elapsed_max)
    for ax, metric in zip(axes, present):
        scale = unit_s if metric == "elapsed_s" else 1.0
        for i, (strategy, sub) in enumerate(stats.groupby("strategy", sort=True)):
            pts = [point_label(dict(zip(keys, r))) if keys else "all seeds"
                   for r in sub[list(keys)].itertuples(index=False)]
            x = [where[p] + (i - 0.5) * 0.08 for p in pts]
            _errorbars(ax, x, sub, metric, scale, COLOURS.get(str(strategy), "k"), str(strategy))
        ax.set_xticks(range(len(labels)), labels, rotation=30 if len(labels) > 2 else 0,
                      ha="right" if len(labels) > 2 else "center", fontsize=7)
        ax.set_xlim(-0.5, len(labels) - 0.5)
        ax.set_title({"elapsed_s": f"elapsed ({unit})"}.get(metric, metric))
        if metric != "elapsed_s":
            ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("mean over seeds, 95% intervals (goodput, ETTR: logit t; elapsed: t)",
                 fontsize=9)
    return fig


def _fmt_value(v: Any) -> str:
    return f"{v:g}" if isinstance(v, (int, float, np.number)) else str(v)


def break_even_heatmap(be: pd.DataFrame, keys: Sequence[str]) -> Figure:
    """Paired elastic - checkpoint-restart elapsed (% of checkpoint-restart) over two grid keys.

    Blue: elastic faster; red: checkpoint-restart faster; the black line is
    the zero contour (break-even), drawn where the sign changes inside the
    grid; "n.s." marks a cell whose 95% interval includes 0, "no claim" one with
    fewer than three seeds or the same difference on every seed.
    """
    kx, ky = keys[0], keys[1]
    xs, ys = sorted(be[kx].unique()), sorted(be[ky].unique())
    z = np.full((len(ys), len(xs)), np.nan)
    note = np.full((len(ys), len(xs)), "", dtype=object)
    for _, r in be.iterrows():  # keys hold dots, which itertuples' names cannot
        i, j = ys.index(r[ky]), xs.index(r[kx])
        z[i, j] = r["rel_pct"]
        note[i, j] = f"{r['rel_pct']:+.1f}%" + _SURE.get(r["significant"], "")
    fig = Figure(figsize=(max(5.0, 1.3 * len(xs) + 2.5), max(3.5, 0.9 * len(ys) + 2.0)),
                 layout="constrained")
    ax = fig.subplots()
    finite_z = z[np.isfinite(z)]
    span = max(1e-9, float(np.abs(finite_z).max())) if finite_z.size else 1.0
    im = ax.imshow(z, cmap="RdBu_r", norm=TwoSlopeNorm(0.0, -span, span), origin="lower",
                   aspect="auto")
    for i in range(len(ys)):
        for j in range(len(xs)):
            dark = np.isfinite(z[i, j]) and abs(z[i, j]) > span / 2
            ax.text(j, i, note[i, j], ha="center", va="center", fontsize=8,
                    color="white" if dark else "black")
    if len(xs) > 1 and len(ys) > 1 and finite_z.size and finite_z.min() < 0 < finite_z.max():
        ax.contour(np.arange(len(xs)), np.arange(len(ys)), np.nan_to_num(z), levels=[0.0],
                   colors="black", linewidths=2)
        ax.plot([], [], color="black", lw=2, label="break-even (0)")
        ax.legend(loc="upper left", fontsize=8)
    ax.set_xticks(range(len(xs)), [_fmt_value(v) for v in xs])
    ax.set_yticks(range(len(ys)), [_fmt_value(v) for v in ys])
    ax.set_xlabel(kx)
    ax.set_ylabel(ky)
    fig.colorbar(im, ax=ax, label="elastic - checkpoint-restart elapsed (%)")
    ax.set_title("break-even: paired difference in time to finish (blue: elastic faster)",
                 fontsize=9)
    return fig


def break_even_line(be: pd.DataFrame, key: str) -> Figure:
    """Paired elastic - checkpoint-restart elapsed (%) against one grid key, with 95% intervals."""
    be = be.sort_values(key)
    fig = Figure(figsize=(7, 3.8), layout="constrained")
    ax = fig.subplots()
    numeric = all(isinstance(v, (int, float, np.number)) for v in be[key])
    x = be[key].astype(float) if numeric else np.arange(len(be))
    lo = (be["rel_pct"] - be["rel_lo_pct"]).fillna(0.0)
    hi = (be["rel_hi_pct"] - be["rel_pct"]).fillna(0.0)
    ax.errorbar(x, be["rel_pct"], yerr=[lo, hi], marker="o", capsize=4, color="tab:purple",
                label="elastic - checkpoint-restart")
    ax.axhline(0.0, color="black", lw=1, label="break-even (0)")
    if numeric and len(be) > 1 and float(be[key].min()) > 0 and \
            float(be[key].max()) / float(be[key].min()) > 20:
        ax.set_xscale("log")
    if not numeric:
        ax.set_xticks(x, [str(v) for v in be[key]])
    ax.set_xlabel(key)
    ax.set_ylabel("elapsed difference (% of checkpoint-restart)")
    ax.set_title("break-even: below 0 elastic finishes sooner", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def u_curve(curve: UCurve, measured: pd.DataFrame) -> Figure:
    """Daly's expected wall time of checkpoint-restart against the interval; optimum marked.

    Vertical lines: Young's sqrt(2 delta M), Daly's higher-order optimum,
    the interval ``rollcall compare`` gives checkpoint-restart and the
    scenario's own; measured sweep points (mean, 95% interval) on top.
    """
    frame = curve.frame[[math.isfinite(v) for v in curve.frame["wall_s"]]]
    unit, unit_s = vd.unit_for(float(frame["wall_s"].min()))
    fig = Figure(figsize=(8, 4.2), layout="constrained")
    ax = fig.subplots()
    ax.plot(frame["tau_s"], frame["wall_s"] / unit_s, "k-", lw=1.5,
            label="Daly: expected wall time, checkpoint-restart")
    best = curve.marks["minimum"]
    ax.plot([best], [curve.wall_s(best) / unit_s], "o", color="gold", mec="black", ms=10,
            label=f"optimum {best:.4g} s")
    styles = {"Young": ":", "Daly": "-.", "compare": "--", "scenario": (0, (1, 4))}
    for name, style in styles.items():
        if name in curve.marks:
            ax.axvline(curve.marks[name], color="grey", ls=style, lw=1,
                       label=f"{name} interval {curve.marks[name]:.4g} s")
    if len(measured):
        lower = (measured["mean"] - measured["lo"]).astype(float).fillna(0.0) / unit_s
        upper = (measured["hi"] - measured["mean"]).astype(float).fillna(0.0) / unit_s
        ax.errorbar(measured["tau_s"], measured["mean"] / unit_s, yerr=[lower, upper], marker="s",
                    capsize=4, ls="none", color=COLOURS["checkpoint-restart"],
                    label="measured (sim sweep), 95% interval")
    ax.set_xscale("log")
    ax.set_xlabel("checkpoint interval (s of work between checkpoints)")
    ax.set_ylabel(f"wall time to finish ({unit})")
    p = curve.params
    ax.set_title(f"checkpoint-interval U-curve: job MTBF {vd.human_s(p['M'])}, write "
                 f"{vd.human_s(p['delta'])}, restart {vd.human_s(p['R'])}", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    return fig
