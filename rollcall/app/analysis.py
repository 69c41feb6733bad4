"""Readers of run directories, returning pandas DataFrames, plus the analytic baselines.

Notebooks, sweeps and benchmarks read results only through these helpers, so
the history format (see :mod:`rollcall.core.history`) is interpreted in one place
and never re-parsed by hand in a notebook. Nothing here decides anything
about membership: it reads what both targets wrote in the same format.

Times: history ``t`` is target-specific (the sim starts at 0; the real target
counts from the launcher's start, ~40 s of process start-up before training).
Every frame carries ``t`` as written and ``t_rel = t - origin`` where origin
is the first ``generation`` record (training start), the same clock zero the
drivers use for ``elapsed_s``, so the two targets can be drawn on one axis.

The intervals over seeds (:func:`summarize`, :func:`mean_ci`, :func:`ci95`)
are :mod:`rollcall.app.stats`'s, one method per kind of metric.

The analytic helpers are Young (1974) and Daly (2006) for periodic
checkpointing with exponential failures (Young 1974, Daly 2006: the optimum interval and the expected wall time).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from rollcall.app import stats
from rollcall.app.decisions import KILL_KINDS
from rollcall.results import SCENARIO_FILE, SUMMARY_FILE, read_history, read_summary
from rollcall.core.types import from_ranges
from rollcall.app.stats import t975

# fault kinds after which the survivors wait on a silent peer (a stall)
SILENCING = KILL_KINDS + ("pause",)

__all__ = [
    "ci95",
    "daly_goodput",
    "daly_interval",
    "daly_params",
    "daly_wall_time",
    "error_bars",
    "events",
    "generations",
    "ideal_step_s",
    "load_history",
    "load_summaries",
    "load_summary",
    "mean_ci",
    "member_spans",
    "origin",
    "plot_timeline",
    "step_times",
    "summarize",
    "t975",
    "timeline",
    "young_interval",
]


# --------------------------------------------------------------------------- statistics

def _present(values: Iterable[float]) -> list[float]:
    """The values that are there (None and NaN left out)."""
    return [float(v) for v in values if v is not None and not _isnan(v)]


def ci95(values: Iterable[float]) -> float:
    """Half-width of the 95% Student-t interval of the mean (nan with < 2 values); the
    interval of times and other unbounded metrics (:mod:`rollcall.app.stats`)."""
    return stats.mean_interval(_present(values), "number").half


def mean_ci(values: Iterable[float]) -> tuple[float, float]:
    """``(mean, half-width of the 95% t interval)``; nan mean for no values."""
    interval = stats.mean_interval(_present(values), "number")
    return interval.mean, interval.half


def summarize(df: pd.DataFrame, by: Sequence[str] | str, metrics: Sequence[str] | str,
              kinds: Mapping[str, stats.Kind] | None = None,
              differences: bool = False) -> pd.DataFrame:
    """Per group: ``n`` and for each metric ``<m>_mean``, ``<m>_ci`` (half the interval's
    width), ``<m>_lo``, ``<m>_hi`` (its 95% interval) and ``<m>_method``.

    The tidy frame a sweep produces has one row per seed; this is the one
    reduction every plot with error bars needs. Each metric's interval is its
    kind's (:func:`rollcall.app.stats.kind_of`, or ``kinds[m]`` for a column of
    another name): t for times, logit t for ratios (inside [0, 1]), root t for
    counts (never below 0). ``differences``: each metric column holds paired
    differences (one per seed), which get the paired intervals (ratios inside
    [-1, 1]). Missing values are left out; one value: ``lo == hi == mean``.
    """
    by = [by] if isinstance(by, str) else list(by)
    metrics = [metrics] if isinstance(metrics, str) else list(metrics)
    kinds = kinds or {}
    rows = []
    for key, grp in df.groupby(by, sort=True, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        row: dict[str, Any] = dict(zip(by, key))
        row["n"] = len(grp)
        for m in metrics:
            kind = kinds.get(m) or stats.kind_of(m)
            values = _present(pd.to_numeric(grp[m], errors="coerce"))
            iv = (stats.difference_interval(values, kind) if differences
                  else stats.mean_interval(values, kind))
            one = iv.n < 2
            row[f"{m}_mean"], row[f"{m}_ci"] = iv.mean, iv.half
            row[f"{m}_lo"] = iv.mean if one else iv.lo
            row[f"{m}_hi"] = iv.mean if one else iv.hi
            row[f"{m}_method"] = iv.method
        rows.append(row)
    return pd.DataFrame(rows)


def error_bars(summary: pd.DataFrame, metric: str, scale: float = 1.0) -> Any:
    """``yerr`` for matplotlib's ``errorbar`` from :func:`summarize`'s columns: the
    distances from each mean down to ``<m>_lo`` and up to ``<m>_hi`` (in units of
    ``scale``), 0 where there is no interval. Ratio and count intervals are not
    centred on the mean, so a symmetric ``± <m>_ci`` would misdraw them."""
    mean = summary[f"{metric}_mean"].astype(float).to_numpy()
    lower = (mean - summary[f"{metric}_lo"].astype(float).to_numpy()) / scale
    upper = (summary[f"{metric}_hi"].astype(float).to_numpy() - mean) / scale
    return np.nan_to_num(np.vstack([lower, upper]), nan=0.0)


def _isnan(v: Any) -> bool:
    try:
        return math.isnan(float(v))
    except (TypeError, ValueError):
        return False


# --------------------------------------------------------------------------- theory

def young_interval(delta: float, mtbf: float) -> float:
    """Young (1974): optimum compute time between checkpoints, ``sqrt(2 delta M)``.

    ``delta`` is the checkpoint write time, ``mtbf`` the *job's* mean time
    between failures (per-node MTBF / nodes).
    """
    return math.sqrt(2.0 * delta * mtbf)


def daly_interval(delta: float, mtbf: float) -> float:
    """Daly (2006) higher-order optimum compute time between checkpoints.

    ``sqrt(2 delta M) [1 + sqrt(delta/(2M))/3 + delta/(18 M)] - delta`` for
    ``delta < 2M``, else ``M``.
    """
    if delta >= 2.0 * mtbf:
        return mtbf
    x = delta / (2.0 * mtbf)
    return math.sqrt(2.0 * delta * mtbf) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - delta


def daly_wall_time(solve_s: float, tau: float, delta: float, mtbf: float, restart: float) -> float:
    """Daly's expected wall time ``T_w = M e^(R/M) (e^((tau+delta)/M) - 1) T_s / tau``.

    ``solve_s`` (T_s) is the failure-free compute time, ``tau`` the compute
    time between checkpoints, ``delta`` the checkpoint write time, ``restart``
    (R) everything from a failure's detection to computing again (detection,
    restart, checkpoint read), ``mtbf`` (M) the job's mean time between
    failures. Exponential failures that may also strike during R.
    """
    m = float(mtbf)
    return m * math.exp(restart / m) * (math.exp((tau + delta) / m) - 1.0) * solve_s / tau


def ideal_step_s(scenario: Mapping[str, Any]) -> float:
    """Failure-free step time of the full initial cluster, as the sim's cost model has it.

    Shards (global_batch / micro_batch) are spread over the workers, the
    slowest worker computes ceil(shards / workers) micro-batches, then one
    allreduce.
    """
    w, wl = scenario["cluster"]["workers"], scenario["workload"]
    shards = wl["global_batch"] // wl["micro_batch"]
    return math.ceil(shards / w) * wl["micro_batch_s"] + wl["allreduce_s"]


def _silence_s(det: Mapping[str, Any]) -> float:
    """The detector's silence at the nominal cadence (the core's rule)."""
    from rollcall.core.detector import make_detector

    return make_detector(det.get("kind", "timeout"), det["heartbeat_s"], det["timeout_s"],
                         det.get("phi_threshold", 8.0)).silence_s()


def daly_params(scenario: Mapping[str, Any] | str | Path) -> dict[str, float]:
    """Daly's M, R, delta, tau, T_s for a checkpoint-restart scenario (a dict or a run dir).

    The mapping tests/test_sim_daly.py verifies against the sim: M =
    worker_mtbf_s / workers (hot spares keep the job full); R = expected
    detection (timeout + heartbeat/2 + latency) + restart + checkpoint read +
    two more message latencies; delta = checkpoint write; tau = interval x
    step; T_s = steps x step.
    """
    if not isinstance(scenario, Mapping):
        import yaml

        scenario = yaml.safe_load((Path(scenario) / SCENARIO_FILE).read_text(encoding="utf-8"))
    step = ideal_step_s(scenario)
    det, st, net = scenario["detector"], scenario["strategy"], scenario["network"]
    mtbf = scenario["failures"]["worker_mtbf_s"]
    return {
        "M": float("inf") if mtbf is None else mtbf / scenario["cluster"]["workers"],
        "R": _silence_s(det) + det["heartbeat_s"] / 2 + 3 * net["latency_s"]
        + st["restart_s"] + st["checkpoint_read_s"],
        "delta": st["checkpoint_write_s"],
        "tau": st["checkpoint_interval_steps"] * step,
        "T_s": scenario["workload"]["steps"] * step,
        "step_s": step,
    }


def daly_goodput(p: Mapping[str, float]) -> float:
    """Daly's expected goodput ``T_s / T_w`` for :func:`daly_params` output (1 - overhead)."""
    if math.isinf(p["M"]):
        return p["tau"] / (p["tau"] + p["delta"])
    try:
        return p["T_s"] / daly_wall_time(p["T_s"], p["tau"], p["delta"], p["M"], p["R"])
    except OverflowError:
        return 0.0


# --------------------------------------------------------------------------- readers

def _run_dirs(paths: Iterable[str | Path] | str | Path) -> list[Path]:
    if isinstance(paths, (str, Path)):
        root = Path(paths)
        if (root / SUMMARY_FILE).exists():
            return [root]
        return sorted(p.parent for p in root.rglob(SUMMARY_FILE))
    return [Path(p) for p in paths]


def load_summary(run_dir: str | Path) -> pd.Series:
    """One run's ``summary.json`` as a Series (plus ``run_dir``)."""
    data = read_summary(run_dir)
    data["run_dir"] = str(run_dir)
    return pd.Series(data)


def load_summaries(paths: Iterable[str | Path] | str | Path) -> pd.DataFrame:
    """One row per run: a list of run dirs, or a root searched for ``summary.json``.

    A ``point.json`` beside the summary (written by :mod:`rollcall.app.sweeps`)
    adds the sweep's grid values as columns, so grid keys survive without
    ``sweep.csv``. List-valued keys (``violations``) are kept as JSON text so
    the frame stays flat and CSV-safe.
    """
    rows = []
    for d in _run_dirs(paths):
        row = read_summary(d)
        point = d / "point.json"
        if point.exists():
            row.update(json.loads(point.read_text(encoding="utf-8")).get("grid", {}))
        for k, v in list(row.items()):
            if isinstance(v, (list, dict)):
                row[k] = json.dumps(v, sort_keys=True)
        row["run_dir"] = str(d)
        rows.append(row)
    return pd.DataFrame(rows)


def origin(records: Sequence[dict[str, Any]]) -> float:
    """Training start: ``t`` of the first ``generation`` record (0 if none)."""
    for r in records:
        if r.get("f") == "generation":
            return float(r["t"])
    return 0.0


def load_history(run_dir: str | Path) -> pd.DataFrame:
    """Every ``history.jsonl`` record as a row; columns are the union of fields plus ``t_rel``.

    Rows keep file order (both targets write in time order). ``members``
    stays in its run-length form; :func:`generations` expands it.
    """
    records = list(read_history(run_dir))
    df = pd.DataFrame.from_records(records)
    if df.empty:
        return pd.DataFrame(columns=["t", "type", "f", "process", "t_rel"])
    df["t_rel"] = df["t"].astype(float) - origin(records)
    return df


def _records(run_dir: str | Path) -> list[dict[str, Any]]:
    return list(read_history(run_dir))


def generations(run_dir: str | Path) -> pd.DataFrame:
    """One row per generation: ``gen, t, t_rel, t_round, t_end, members, size, reason, source, step, sample``.

    ``t_round`` is when the roll call that formed it opened (``round``
    invoke), so ``t - t_round`` is the roll call's length; ``t_end`` is when
    the next generation formed or the run ended. ``members`` is a tuple of
    worker ids, the list sim-vs-real agreement compares.
    """
    recs = _records(run_dir)
    t0 = origin(recs)
    opened: dict[int, float] = {}
    rows: list[dict[str, Any]] = []
    end_t = max((float(r["t"]) for r in recs), default=0.0)
    for r in recs:
        if r.get("f") == "round" and r.get("type") == "invoke":
            opened.setdefault(int(r["gen"]), float(r["t"]))
        elif r.get("f") == "generation":
            gen = int(r["gen"])
            members = tuple(from_ranges(r["members"]))
            cursor = r.get("cursor") or [None, None]
            rows.append({
                "gen": gen, "t": float(r["t"]), "t_round": opened.get(gen, float(r["t"])),
                "members": members, "size": len(members), "reason": r.get("reason"),
                "source": r.get("source"), "step": cursor[0], "sample": cursor[1],
            })
        elif r.get("f") == "end":
            end_t = float(r["t"])
    for i, row in enumerate(rows):
        row["t_end"] = rows[i + 1]["t"] if i + 1 < len(rows) else end_t
        for k in ("t", "t_round", "t_end"):
            row[f"{k}_rel" if k != "t" else "t_rel"] = row[k] - t0
    cols = ["gen", "t", "t_rel", "t_round", "t_round_rel", "t_end", "t_end_rel", "members",
            "size", "reason", "source", "step", "sample"]
    return pd.DataFrame(rows, columns=cols)


def step_times(run_dir: str | Path) -> pd.DataFrame:
    """One row per ``commit`` record: ``gen, step, last, steps, t0, t, step_s, batch, size`` (+ ``_rel`` times).

    The sim commits ranges of steps in one record, the real target one step
    per record; ``step_s`` is the mean step time over the record's range, so
    both read the same. ``size`` is the generation's member count.
    """
    recs = _records(run_dir)
    t0 = origin(recs)
    sizes = {int(r["gen"]): len(from_ranges(r["members"])) for r in recs if r.get("f") == "generation"}
    rows = []
    for r in recs:
        if r.get("f") != "commit":
            continue
        n = int(r["last"]) - int(r["step"]) + 1
        start, end = float(r["t0"]), float(r["t"])
        rows.append({
            "gen": int(r["gen"]), "step": int(r["step"]), "last": int(r["last"]), "steps": n,
            "t0": start, "t": end, "t0_rel": start - t0, "t_rel": end - t0,
            "step_s": (end - start) / n if n else float("nan"),
            "batch": r.get("batch"), "size": sizes.get(int(r["gen"])),
        })
    cols = ["gen", "step", "last", "steps", "t0", "t", "t0_rel", "t_rel", "step_s", "batch", "size"]
    return pd.DataFrame(rows, columns=cols).sort_values("t", kind="stable").reset_index(drop=True)


def timeline(run_dir: str | Path) -> pd.DataFrame:
    """Intervals to draw, one row each: ``kind, worker, gen, start, end`` (relative times).

    kinds:
    - ``member``: worker ``worker`` was a member of generation ``gen``
      from its formation until the next one (one bar per worker per generation);
    - ``roll_call``: a round was open (``round`` invoke to ``generation``), job-wide;
    - ``stall``: from a fault that silences a worker (kill, kill_rack,
      crash, pause) to the round it caused (the survivors waiting on a dead
      or paused peer until its exit notice or the detector), job-wide;
    - ``restart``: a whole-job restart (``restart`` record to the next generation);
    - ``fault``: an instant (start == end) per faulted worker, with ``what``
      the fault kind (kill, kill_rack, crash, pause, resume, join).

    A row per member per generation is ~900,000 rows for a 2,048-worker
    54-day run; :func:`member_spans` is the compact form that plots use.
    """
    gens = generations(run_dir)
    rows: list[dict[str, Any]] = []
    for g in gens.itertuples(index=False):
        for w in g.members:
            rows.append({"kind": "member", "worker": w, "gen": g.gen,
                         "start": g.t_rel, "end": g.t_end_rel, "what": g.reason})
    rows += _event_rows(run_dir, gens)
    return pd.DataFrame(rows, columns=["kind", "worker", "gen", "start", "end", "what"])


def member_spans(run_dir: str | Path) -> pd.DataFrame:
    """One row per generation per run of consecutive member ids: ``gen, lo, hi, start, end``.

    Why: the history stores members as id runs (``[[0, 2047]]``), and a
    timeline drawn from them costs a rectangle per run, not per worker, so a
    2,048-worker run with hundreds of generations draws in a second.
    ``lo``/``hi`` are inclusive; times are relative to training start.
    """
    recs = _records(run_dir)
    t0 = origin(recs)
    end_t = max((float(r["t"]) for r in recs), default=0.0)
    gens: list[tuple[int, float, list[list[int]]]] = []
    for r in recs:
        if r.get("f") == "generation":
            gens.append((int(r["gen"]), float(r["t"]), r["members"]))
        elif r.get("f") == "end":
            end_t = float(r["t"])
    rows = []
    for i, (gen, t, runs) in enumerate(gens):
        t_end = gens[i + 1][1] if i + 1 < len(gens) else end_t
        for lo, hi in runs:
            assert int(lo) <= int(hi), (gen, lo, hi)
            rows.append((gen, int(lo), int(hi), t - t0, t_end - t0))
    return pd.DataFrame(rows, columns=["gen", "lo", "hi", "start", "end"])


def _event_rows(run_dir: str | Path, gens: pd.DataFrame) -> list[dict[str, Any]]:
    """The timeline rows that are not membership: roll calls, faults, stalls, restarts."""
    recs = _records(run_dir)
    t0 = origin(recs)
    rows: list[dict[str, Any]] = []
    for g in gens.itertuples(index=False):
        if g.t_round_rel < g.t_rel:
            rows.append({"kind": "roll_call", "worker": None, "gen": g.gen,
                         "start": g.t_round_rel, "end": g.t_rel, "what": g.reason})
    rounds = sorted(float(r["t"]) - t0 for r in recs if r.get("f") == "round" and r.get("type") == "invoke")
    gen_ts = sorted(gens["t_rel"].tolist())
    for r in recs:
        f = r.get("f")
        t = float(r["t"]) - t0
        if f in ("fault", "resume"):  # the real target logs a pause's end as f=resume
            kind = r.get("kind", "resume")
            for w in r.get("workers") or [None]:
                rows.append({"kind": "fault", "worker": w, "gen": r.get("gen"), "start": t, "end": t, "what": kind})
            if kind in SILENCING:
                nxt = next((x for x in rounds if x >= t), None)
                if nxt is not None and nxt > t:
                    rows.append({"kind": "stall", "worker": None, "gen": r.get("gen"),
                                 "start": t, "end": nxt, "what": kind})
        elif f == "restart":
            nxt = next((x for x in gen_ts if x >= t), None)
            rows.append({"kind": "restart", "worker": None, "gen": r.get("gen"), "start": t,
                         "end": nxt if nxt is not None else t, "what": r.get("reason")})
    return rows


def events(run_dir: str | Path) -> pd.DataFrame:
    """:func:`timeline` without the ``member`` rows (roll calls, stalls, restarts, faults)."""
    rows = _event_rows(run_dir, generations(run_dir))
    return pd.DataFrame(rows, columns=["kind", "worker", "gen", "start", "end", "what"])


#: at most this many generation labels (g1, g2, ...) and per-worker y ticks on a timeline
_LABELS_MAX = 32
_SHADE = {"stall": ("tab:red", 0.15), "roll_call": ("grey", 0.35), "restart": ("black", 0.15)}
_MARKERS = {"kill": ("x", "red"), "kill_rack": ("x", "red"), "lose_host": ("X", "darkred"), "crash": ("X", "darkred"),
            "pause": ("v", "orange"), "resume": ("^", "green"), "join": ("*", "blue"),
            "repair": (".", "black"), "blame": ("x", "purple")}
#: a time axis longer than two of a unit is labelled in that unit
_TIME_UNITS = (("days", 86400.0), ("hours", 3600.0), ("min", 60.0))


def plot_timeline(run_dir: str | Path, ax: Any = None, title: str | None = None) -> Any:
    """Draw the timeline on ``ax``: member id runs coloured by generation, faults marked,
    stalls (red) and roll calls / restarts (grey) shaded. Returns the axes.

    One ``broken_barh`` per id run (all its generations in one call), one
    for each shaded kind and one marker line per fault kind, so the cost
    grows with the runs and generations, not with workers x generations.
    matplotlib is imported here, lazily, so reading results does not need it.
    """
    import matplotlib.pyplot as plt

    spans = member_spans(run_dir)
    ev = events(run_dir)
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 3))
    cmap = plt.get_cmap("tab10")
    tiny = 1e-9 * max(1.0, float(spans.end.max()) if len(spans) else 1.0)
    for (lo, hi), grp in spans.groupby(["lo", "hi"], sort=False):
        ax.broken_barh([(s, max(e - s, tiny)) for s, e in zip(grp.start, grp.end)],
                       (lo - 0.4, hi - lo + 0.8),
                       facecolors=[cmap((int(g) - 1) % 10) for g in grp.gen], edgecolor="none")
    for kind, (colour, alpha) in _SHADE.items():
        sel = ev[ev.kind == kind]
        if len(sel):
            ax.broken_barh(list(zip(sel.start, sel.end - sel.start)), (0, 1), color=colour,
                           alpha=alpha, lw=0, label=kind.replace("_", " "),
                           transform=ax.get_xaxis_transform())
    faults = ev[ev.kind == "fault"]
    size = 9 if len(spans) == 0 or int(spans.hi.max()) < 4 * _LABELS_MAX else 4
    for what, grp in faults.groupby("what", sort=True):
        marker, colour = _MARKERS.get(str(what), ("o", "k"))
        ys = [w if w is not None and w == w else -1 for w in grp.worker]
        ax.plot(list(grp.start), ys, marker=marker, color=colour, ms=size, ls="none",
                label=str(what))
    _label_timeline(ax, spans)
    if title:
        ax.set_title(title)
    return ax


def _label_timeline(ax: Any, spans: pd.DataFrame) -> None:
    """Axis labels, and per-generation and per-worker labels where there are few enough to read."""
    from matplotlib.ticker import FuncFormatter

    length = float(spans.end.max()) if len(spans) else 0.0
    name, unit_s = next(((n, u) for n, u in _TIME_UNITS if length >= 2 * u), ("s", 1.0))
    if unit_s != 1.0:  # ticks at round numbers of the unit, not of seconds
        from matplotlib.ticker import MaxNLocator

        ticks = MaxNLocator(nbins=8, steps=[1, 2, 5, 10]).tick_values(0.0, length / unit_s)
        ax.set_xticks([t * unit_s for t in ticks if 0 <= t <= length / unit_s])
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x / unit_s:g}"))
    ax.set_xlabel(f"time since training start ({name})")
    ax.set_ylabel("worker")
    if len(spans) == 0:
        return
    top = int(spans.hi.max())
    firsts = spans.drop_duplicates("gen")
    if len(firsts) <= _LABELS_MAX:
        for g in firsts.itertuples(index=False):
            ax.text(g.start, top + 0.6, f"g{int(g.gen)}", fontsize=7)
    if top - int(spans.lo.min()) < _LABELS_MAX:
        ax.set_yticks(range(int(spans.lo.min()), top + 1))
    ax.legend(loc="upper right", fontsize=7, ncol=3)
