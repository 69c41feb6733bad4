"""What a directory given to ``rollcall report`` holds: a run, a compare or a sweep.

Why a module of its own: the report reads only what ``rollcall run``,
``compare`` and ``sweep`` wrote (``summary.json``, ``compare.csv``,
``sweep.csv``, ``point.json``, ``scenario.yaml``) and never runs anything, so
telling the three apart, refusing what is none of them, and turning the CSVs
back into the :class:`rollcall.app.comparison.Comparison` that the verdict reads are
done here, once, and tested without drawing.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pandas as pd

from rollcall.app import comparison as cmp_mod
from rollcall.app.comparison import Comparison
from rollcall.app.interval import IntervalChoice
from rollcall.results import HISTORY_FILE, SCENARIO_FILE, SUMMARY_FILE, read_summary
from rollcall.app.sweeps import CSV_FILE, POINT_FILE

__all__ = ["Kind", "ReportError", "Source", "comparison_of", "grid_keys", "kind_of", "load",
           "points"]

Kind = Literal["run", "compare", "sweep"]


class ReportError(ValueError):
    """A directory the report cannot be made from; ``str()`` is one line."""


def kind_of(path: str | Path) -> Kind:
    """Which of the three ``path`` is; ReportError (one line) for anything else."""
    d = Path(path)
    if not d.exists():
        raise ReportError(f"{d}: no such directory")
    if not d.is_dir():
        raise ReportError(f"{d}: not a directory (give a run, compare or sweep directory)")
    if (d / SUMMARY_FILE).is_file():
        return "run"
    if (d / cmp_mod.RUNS_FILE).is_file():
        return "compare"
    if (d / CSV_FILE).is_file():
        return "sweep"
    if (d / HISTORY_FILE).is_file():
        raise ReportError(f"{d}: an unfinished run ({HISTORY_FILE} but no {SUMMARY_FILE}: it "
                          f"is still running, or was killed before it could write one)")
    raise ReportError(f"{d}: not a rollcall run, compare or sweep directory (no {SUMMARY_FILE}, "
                      f"{cmp_mod.RUNS_FILE} or {CSV_FILE})")


@dataclass(frozen=True)
class Source:
    """A directory's contents as the report needs them.

    ``runs``: one row per run (strategy, seed, run_dir absolute, metrics,
    grid keys for a sweep); ``scenario_dir``: a run directory whose
    ``scenario.yaml`` stands for the whole (the theory curve is drawn for
    it); ``summary``: the run's own summary (a run only).
    """

    kind: Kind
    path: Path
    runs: pd.DataFrame
    keys: tuple[str, ...] = ()
    summary: dict[str, Any] = field(default_factory=dict)
    scenario_dir: Path | None = None
    notes: tuple[str, ...] = ()
    # a compare's checkpoint interval of each strategy, as it recorded them
    intervals: dict[str, IntervalChoice] = field(default_factory=dict)

    @property
    def interrupted(self) -> bool:
        return self.summary.get("result") == "interrupted"


def _read_csv(path: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(path)
    except (OSError, ValueError) as exc:  # pandas' EmptyDataError and ParserError are ValueErrors
        raise ReportError(f"{path}: cannot read it ({exc})") from None


def _load_run(d: Path) -> Source:
    try:
        summary = read_summary(d)
    except (OSError, ValueError) as exc:
        raise ReportError(f"{d / SUMMARY_FILE}: cannot read it ({exc})") from None
    if not (d / HISTORY_FILE).is_file():
        raise ReportError(f"{d}: {SUMMARY_FILE} but no {HISTORY_FILE}")
    row = {"strategy": summary.get("strategy"), "seed": summary.get("seed"), "run_dir": str(d)}
    row.update({k: summary.get(k) for k in cmp_mod.METRICS if k in summary})
    return Source("run", d, pd.DataFrame([row]), summary=summary,
                  scenario_dir=d if (d / SCENARIO_FILE).is_file() else None)


def _load_compare(d: Path) -> Source:
    runs = _read_csv(d / cmp_mod.RUNS_FILE)
    if runs.empty:
        raise ReportError(f"{d / cmp_mod.RUNS_FILE}: no finished run yet")
    # compare names each run <strategy>-seed<S>/ inside its out; run_dir was written
    # relative to the cwd of the compare, so it is found again from here instead
    runs = runs.assign(run_dir=[str(d / Path(str(r)).name) for r in runs["run_dir"]])
    notes = ()
    if not (d / cmp_mod.TABLE_FILE).is_file():
        notes = (f"unfinished compare: {cmp_mod.TABLE_FILE} is missing (interrupted?); "
                 f"this report covers the {len(runs)} finished runs",)
    scenario_dir = d if (d / SCENARIO_FILE).is_file() else Path(runs["run_dir"].iloc[0])
    return Source("compare", d, runs, scenario_dir=scenario_dir, notes=notes,
                  intervals=_intervals(d / cmp_mod.INTERVALS_FILE))


def _intervals(path: Path) -> dict[str, IntervalChoice]:
    """The intervals a compare recorded ({} where it recorded none: an older compare)."""
    if not path.is_file():
        return {}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        return {s: IntervalChoice.from_json(s, doc[s]) for s in cmp_mod.STRATEGIES}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ReportError(f"{path}: cannot read it ({exc})") from None


def grid_keys(sweep_dir: Path, runs: pd.DataFrame) -> tuple[str, ...]:
    """The sweep's grid keys, in grid order, from a point's ``point.json``."""
    for rel in runs["run_dir"]:
        try:
            meta = json.loads((sweep_dir / str(rel) / POINT_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        keys = tuple(meta.get("grid", {})) if isinstance(meta, dict) else ()
        return tuple(k for k in keys if k in runs.columns)
    return ()


def _load_sweep(d: Path) -> Source:
    runs = _read_csv(d / CSV_FILE)
    if runs.empty:
        raise ReportError(f"{d / CSV_FILE}: no finished point yet")
    keys = grid_keys(d, runs)
    runs = runs.assign(run_dir=[str(d / str(r)) for r in runs["run_dir"]])
    cr = runs[runs["strategy"] == "checkpoint-restart"]
    first = Path((cr if len(cr) else runs)["run_dir"].iloc[0])
    return Source("sweep", d, runs, keys=keys, scenario_dir=first)


def load(path: str | Path) -> Source:
    """Read ``path`` (see :func:`kind_of`); ReportError for what cannot be reported."""
    d = Path(path)
    kind = kind_of(d)
    return {"run": _load_run, "compare": _load_compare, "sweep": _load_sweep}[kind](d)


def comparison_of(runs: pd.DataFrame,
                  intervals: dict[str, IntervalChoice] | None = None) -> Comparison:
    """The :class:`Comparison` ``rollcall compare`` built from these rows (its CSV round
    trip) and the ``intervals`` it recorded.

    compare.csv keeps every float exactly (pandas writes the shortest
    repr that reads back equal), so the verdict made here is the sentence
    compare printed.
    """
    cols = [c for c in ("strategy", "seed", "run_dir", *cmp_mod.METRICS, "end_reason")
            if c in runs.columns]
    rows = runs[cols].reset_index(drop=True)
    diffs = cmp_mod.paired(rows)
    return Comparison(rows, cmp_mod.summarize(rows), diffs, cmp_mod.summarize_paired(diffs, rows),
                      cmp_mod.run_problems(rows), intervals or {})


def points(src: Source) -> list[tuple[dict[str, Any], pd.DataFrame]]:
    """A sweep's grid points in grid order: ``(values, rows of that point)``; one point otherwise."""
    if not src.keys:
        return [({}, src.runs)]
    out = []
    for values, grp in src.runs.groupby(list(src.keys), sort=True, dropna=False):
        values = values if isinstance(values, tuple) else (values,)
        out.append((dict(zip(src.keys, values)), grp))
    return out


def finite(value: Any) -> bool:
    """A number that is not NaN or infinite (a missing CSV cell is NaN)."""
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False
