"""Assemble the report: read the directory, compute, draw, write ``report.html`` and PNGs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from rollcall.app import verdict as vd
from rollcall.app.report import data, figures
from rollcall.app.report.page import Section, render
from rollcall.app.report.source import Source, comparison_of, finite, load, points

__all__ = ["REPORT_FILE", "build"]

REPORT_FILE = "report.html"
#: the PNGs a report may write beside report.html (older ones are removed first)
PNG_FILES = ("timeline.png", "metrics.png", "break-even.png", "u-curve.png")


def _timeline_runs(src: Source) -> list[tuple[str, Path]]:
    """The runs whose timelines are drawn: the run; else one seed of each strategy."""
    if src.kind == "run":
        s = src.summary
        return [(f"{s.get('strategy')} seed {s.get('seed')}", src.path)]
    _, rows = points(src)[0]
    out = []
    for strategy in ("elastic", "checkpoint-restart"):
        sub = rows[rows["strategy"] == strategy].sort_values("seed")
        if len(sub):
            r = sub.iloc[0]
            out.append((f"{strategy} seed {r['seed']}", Path(str(r["run_dir"]))))
    return out


def _timeline(src: Source, out: Path) -> Section:
    runs = [(t, d) for t, d in _timeline_runs(src) if (d / "history.jsonl").is_file()]
    if not runs:
        return Section("Timeline", ["no history.jsonl to draw"], css_class="note")
    figures.save(figures.timelines(runs), out / "timeline.png")
    return Section("Timeline", [
        "One row per worker id, coloured by generation; x: kill, v: pause, ^: resume, "
        "*: join; red shading: survivors stalled on a dead or paused peer; grey: roll "
        "calls; dark: whole-job restarts."], [("timeline.png", "per-worker timeline")])


def _metrics(src: Source, out: Path) -> Section:
    if src.kind == "run":
        s = src.summary
        keys = ["completed", "valid", "result", "steps_committed", "steps_target", "elapsed_s",
                "goodput", "ettr", "failures", "generations", "restarts", "stall_s",
                "recovery_s", "lost_work_s", "end_reason"]
        table = pd.DataFrame({"value": [s.get(k) for k in keys]}, index=keys)
        return Section("Goodput and ETTR", [
            "One run: no interval (a compare or a sweep over seeds gives 95% intervals)."],
            tables=[table])
    stats = data.per_strategy(src)
    figures.save(figures.metrics(stats, src.keys), out / "metrics.png")
    tables = [vd.human_table(comparison_of(src.runs))] if src.kind == "compare" else [
        stats.drop(columns=[c for c in stats.columns if c.endswith("_ci")])]
    return Section("Goodput and ETTR", [
        "goodput: committed work at the full cluster's pace over elapsed time; ETTR: time "
        "on steps that were finally committed over elapsed time; elapsed: the time to "
        "finish. Means over seeds with 95% intervals: logit t for goodput and ETTR (they "
        "stay inside [0, 1]), t for times, root t for counts (never below 0); each "
        "table names its method."],
        [("metrics.png", "goodput, ETTR and elapsed per strategy")], tables)


def _cell_statement(be: pd.DataFrame) -> str:
    r = be.iloc[0]
    interval = (f" [{r['rel_lo_pct']:+.1f}%, {r['rel_hi_pct']:+.1f}%]"
                if finite(r["rel_lo_pct"]) and r["pairs"] > 1 else "")
    return (f"one cell (this compare): elastic - checkpoint-restart elapsed is "
            f"{vd.human_s(r['d_mean'])}, {r['rel_pct']:+.1f}%{interval} of checkpoint-restart's "
            f"{vd.human_s(r['cr_mean'])}, paired t over {r['pairs']} seeds; below 0 elastic "
            f"finishes sooner. A sweep over scale and MTBF draws the whole map.")


def _break_even(src: Source, out: Path) -> Section:
    title = "Break-even map"
    if src.kind == "run":
        return Section(title, ["a single run has no break-even: run rollcall compare or "
                               "rollcall sweep"], css_class="note")
    be = data.break_even(src)
    if be.empty:
        return Section(title, ["no grid point has both strategies: nothing to pair"],
                       css_class="note")
    if src.kind == "compare" or not src.keys:
        return Section(title, [_cell_statement(be)])
    notes, keys = [], list(src.keys)
    for k in keys[2:]:  # more than two keys: the map at the first value of the rest
        notes.append(f"{k} held at {be[k].iloc[0]} (the map draws the first two grid keys)")
        be = be[be[k] == be[k].iloc[0]]
    many = len(keys) >= 2 and be[keys[0]].nunique() > 1 and be[keys[1]].nunique() > 1
    fig = figures.break_even_heatmap(be, keys[:2]) if many else figures.break_even_line(
        be, keys[0] if len(keys) == 1 or be[keys[0]].nunique() > 1 else keys[1])
    figures.save(fig, out / "break-even.png")
    shown = be[keys + ["pairs", "rel_pct", "rel_lo_pct", "rel_hi_pct", "g_mean", "verdict"]]
    return Section(title, ["Paired elastic - checkpoint-restart time to finish, in % of "
                           "checkpoint-restart's, per grid point (same failure trace per seed)."]
                   + notes, [("break-even.png", "break-even map")], [shown])


def _u_curve(src: Source, out: Path) -> Section:
    title = "Checkpoint interval: U-curve (Young/Daly)"
    curve = data.u_curve(src)
    if isinstance(curve, str):
        return Section(title, [curve], css_class="note")
    measured = data.measured_intervals(src, curve)
    figures.save(figures.u_curve(curve, measured), out / "u-curve.png")
    marks = pd.DataFrame({"interval_s": curve.marks, "expected wall": {
        k: vd.human_s(curve.wall_s(v)) for k, v in curve.marks.items()}})
    text = [f"Daly's expected wall time of checkpoint-restart for {src.scenario_dir}/"
            f"scenario.yaml; rollcall compare gives checkpoint-restart {curve.chosen_why}."]
    if len(measured):
        text.append(f"Squares: the sweep's checkpoint-restart runs over "
                    f"{data.INTERVAL_KEY} (mean elapsed, 95% interval).")
    return Section(title, text, [("u-curve.png", "checkpoint-interval U-curve")],
                   [marks, measured] if len(measured) else [marks])


def _banners(src: Source) -> list[str]:
    out = list(src.notes)
    if src.interrupted:
        out.append(f"INTERRUPTED: this run was stopped before its end "
                   f"({src.summary.get('end_reason')}); the numbers describe the run so far")
    if src.kind != "run":
        problems = comparison_of(src.runs).problems
        if problems:
            out.append(f"{len(problems)} runs did not complete or are not valid: "
                       + "; ".join(problems[:5]) + (" ..." if len(problems) > 5 else ""))
    return out


def build(path: str | Path) -> Path:
    """Write ``report.html`` (and its PNGs) into the run, compare or sweep directory ``path``.

    Returns the report's path; ReportError (one line) when ``path`` is not
    something to report on. PNGs of an older report that this one does not
    draw are removed, so the page never sits beside a stale picture.
    """
    src = load(path)
    out = src.path
    for name in PNG_FILES:
        (out / name).unlink(missing_ok=True)
    sections = [Section("Verdict", [data.verdict_sentence(src)], css_class="verdict"),
                _metrics(src, out), _timeline(src, out), _break_even(src, out),
                _u_curve(src, out)]
    name = _scenario_name(src)
    page = render(f"rollcall report: {name} ({src.kind})",
                  f"{out.resolve()}: {len(src.runs)} run(s)", _banners(src), sections)
    target = out / REPORT_FILE
    tmp = out / f".{REPORT_FILE}.tmp"
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, target)
    return target


def _scenario_name(src: Source) -> Any:
    """The scenario's name: the summary's, sweep.csv's, else the resolved scenario.yaml's."""
    if src.kind == "run":
        return src.summary.get("scenario", "?")
    if "scenario" in src.runs.columns:
        return src.runs["scenario"].iloc[0]
    try:
        doc = yaml.safe_load((src.path / "scenario.yaml").read_text(encoding="utf-8"))
        return doc.get("name", src.path.name) if isinstance(doc, dict) else src.path.name
    except (OSError, yaml.YAMLError):
        return src.path.name
