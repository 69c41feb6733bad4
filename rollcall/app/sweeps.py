"""Sweeps: a scenario over a cartesian grid of keys x both strategies x seeds.

Why a module and not a shell loop: a sweep must be resumable (a 100k-GPU grid
takes a while, and Ctrl-C must not throw away finished runs), deterministic
in its directory names (so re-running finds what is done) and tidy in its
output (``sweep.csv``, one row per run, what the notebooks read).

Layout under ``out``::

    out/<strategy>/<key>=<value>,<key>=<value>/seed<S>/   one run directory per point
        scenario.yaml history.jsonl summary.json point.json
    out/sweep.csv                                         every summary key + grid keys

A point is done when its ``summary.json`` exists (drivers write it last and
atomically) and its ``point.json`` records the SHA-256 of the very scenario
the point resolves to now; a directory without a summary is a run cut short,
one with another hash is stale (the scenario file or ``--set`` changed, or
another scenario wrote to the same ``out``), and both are redone from
scratch. ``sweep.csv`` lists only points that are done in that sense.

Points run here one by one, or through an engine (:mod:`rollcall.app.engines`:
a local process pool, Ray, Slurm): the engine gets each point's resolved
scenario as YAML text; the run is written into the point's staging
directory (by the task itself where it sees this file system, else from the
files it sends back as text) and renamed in place when whole
(:func:`store_point`), so a point is on disk whole or not at all, wherever
it ran. The driver is loaded when a point runs, through
:mod:`rollcall.app.targets` as the CLI does, so importing this module loads none.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import pandas as pd
import yaml

from rollcall.app import stats, targets
from rollcall.app.engines import Engine
from rollcall.app.interval import INTERVAL_KEY, at_its_interval
from rollcall.results import (
    SUMMARY_FILE, SUMMARY_KEYS, finished_summary, prepare_out_dir, read_summary, scenario_hash,
    staging_dir, store_run, yaml_hash,
)
from rollcall.scenario import Scenario, load_scenario

__all__ = ["POINT_TASK", "STRATEGIES", "Point", "expand_grid", "is_done", "parse_grid", "plan",
           "point_task", "resolve", "run_point", "store_point", "sweep", "write_csv"]

STRATEGIES: tuple[str, ...] = ("checkpoint-restart", "elastic")
CSV_FILE = "sweep.csv"
POINT_FILE = "point.json"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.=+,-]")


def _yaml_value(text: str) -> Any:
    """A grid value is YAML, like ``--set`` values: ``3600`` is an int, ``null`` is None."""
    return yaml.safe_load(text) if text.strip() else text


def parse_grid(items: Iterable[str]) -> dict[str, list[Any]]:
    """``["cluster.workers=8,64", "failures.worker_mtbf_s=3600,86400"]`` -> ordered dict of lists.

    Raises ValueError (with the item) on a missing ``=``, an empty value list or a
    key given twice.
    """
    grid: dict[str, list[Any]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--grid {item!r}: expected KEY=V1,V2,...")
        if key in grid:
            raise ValueError(f"--grid {item!r}: key {key!r} given twice")
        vals = [_yaml_value(v) for v in values.split(",") if v.strip()]
        if not vals:
            raise ValueError(f"--grid {item!r}: no values")
        grid[key] = vals
    return grid


def expand_grid(grid: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """Cartesian product, first key slowest; an empty grid is one empty point."""
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]


def _fmt(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return _UNSAFE.sub("_", text)


@dataclass(frozen=True)
class Point:
    """One run of a sweep: grid values, strategy and seed; ``rel_dir`` names its directory."""

    grid: dict[str, Any] = field(hash=False)
    strategy: str
    seed: int

    @property
    def rel_dir(self) -> Path:
        name = ",".join(f"{k}={_fmt(v)}" for k, v in self.grid.items()) or "base"
        return Path(self.strategy) / name / f"seed{self.seed}"

    def sets(self) -> list[str]:
        """``--set`` items for the grid values (YAML-encoded, so types survive)."""
        return [f"{k}={yaml.safe_dump(v, default_flow_style=True).strip().removesuffix('...').strip()}"
                for k, v in self.grid.items()]


def plan(grid: Mapping[str, Sequence[Any]], seeds: Sequence[int],
         strategies: Sequence[str] = STRATEGIES) -> list[Point]:
    """Every point in a stable order: grid point, then strategy, then seed."""
    return [Point(g, s, seed) for g in expand_grid(grid) for s in strategies for seed in seeds]


def resolve(scenario_path: str, sets: Sequence[str], point: Point, target: str | None,
            calibration: Mapping[str, Any] | None = None, *,
            fixed_interval: bool = False) -> Scenario:
    """The scenario one point runs: the file, ``--set`` items, then the point's
    grid, seed, strategy; then a calibration's costs at that point's size; then
    the point's strategy at its checkpoint interval, as ``compare`` runs it
    (:func:`rollcall.app.interval.at_its_interval`: the grid's where the grid sets
    it, the scenario's with ``fixed_interval``)."""
    sc = load_scenario(scenario_path, list(sets) + point.sets(), seed=point.seed,
                       target=target, strategy=point.strategy)
    if calibration is not None:
        from rollcall.app.suite import calibrated

        sc = calibrated(sc, calibration)
    return at_its_interval(sc, fixed=fixed_interval, grid=INTERVAL_KEY in point.grid)


def is_done(out_root: str | Path, point: Point, sha256: str) -> bool:
    """Whether the point's run directory holds a finished run of exactly this
    scenario (:func:`rollcall.results.finished_summary`, as compare resumes)."""
    return finished_summary(Path(out_root) / point.rel_dir, sha256) is not None


def run_point(scenario_path: str, sets: Sequence[str], point: Point, target: str | None,
              out_root: str, calibration: Mapping[str, Any] | None = None, *,
              fixed_interval: bool = False, max_wall_s: float | None = None) -> dict[str, Any]:
    """Run one point in this process, into its directory; returns its summary.

    A leftover directory without ``summary.json`` (a run cut short) is wiped
    first: history files are appended to, so a half history must not stay.
    ``max_wall_s`` bounds the run's wall time (it ends "wall limit: ...").
    """
    out = Path(out_root) / point.rel_dir
    if out.exists():
        shutil.rmtree(out)
    sc = resolve(scenario_path, sets, point, target, calibration, fixed_interval=fixed_interval)
    prepare_out_dir(out, sc)
    (out / POINT_FILE).write_text(_point_text(point, scenario_hash(sc)), encoding="utf-8")
    return targets.driver(sc.target).run(sc, out, max_wall_s=max_wall_s)


def _point_text(point: Point, sha256: str) -> str:
    return json.dumps({"grid": point.grid, "strategy": point.strategy, "seed": point.seed,
                       "scenario_sha256": sha256}, sort_keys=True) + "\n"


#: the task an engine runs per point (:mod:`rollcall.app.engines`)
POINT_TASK = "rollcall.app.sweeps:point_task"


def point_task(payload: dict[str, Any]) -> dict[str, Any]:
    """Run one point wherever an engine put it: the resolved scenario comes in
    as YAML text. With ``run_dir`` (an engine whose tasks see this file
    system) the run is written there as it goes, as a run here would be,
    and its path is the answer; without, it runs in a scratch directory and
    its files go out as text, so a remote worker needs nothing of this
    machine's file system."""
    from rollcall.scenario import parse_scenario

    sc = parse_scenario(payload["scenario"], source=payload.get("name", "<sweep point>"))
    driver = targets.driver(sc.target)
    max_wall_s = payload.get("max_wall_s")
    if payload.get("run_dir") is not None:
        out = Path(payload["run_dir"])
        if out.exists():  # a try cut short: its history must not be appended to
            shutil.rmtree(out)
        driver.run(sc, prepare_out_dir(out, sc), max_wall_s=max_wall_s)
        return {"run_dir": str(out)}
    with tempfile.TemporaryDirectory(prefix="rollcall-point-") as tmp:
        out = prepare_out_dir(Path(tmp) / "run", sc)
        driver.run(sc, out, max_wall_s=max_wall_s)
        files = {p.relative_to(out).as_posix(): p.read_text(encoding="utf-8")
                 for p in sorted(out.rglob("*")) if p.is_file()}
    return {"files": files}


def store_point(root: Path, point: Point, sha256: str, result: Mapping[str, Any]) -> None:
    """Write a point that ran through an engine (:func:`rollcall.results.store_run`),
    its ``point.json`` with it."""
    store_run(root / point.rel_dir, result, {POINT_FILE: _point_text(point, sha256)})


def _row(point: Point, summary: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {k: summary.get(k) for k in SUMMARY_KEYS}
    row.update({k: v for k, v in summary.items() if k not in row})
    for k, v in list(row.items()):
        if isinstance(v, (list, dict)):
            row[k] = json.dumps(v, sort_keys=True)
    for k, v in point.grid.items():
        row[k] = v
    row["run_dir"] = str(point.rel_dir)
    return row


def write_csv(points: Sequence[Point], out_root: str | Path,
              hashes: Mapping[Point, str] | None = None,
              seeds: Mapping[str, int] | None = None) -> pd.DataFrame:
    """Write ``sweep.csv`` from every finished point's ``summary.json``; returns the frame.

    Columns: the SUMMARY_KEYS first, then the drivers' extra keys, then the
    grid keys and ``run_dir`` (relative to ``out_root``). Unfinished points
    are left out, and with ``hashes`` (point -> scenario SHA-256) so are
    stale ones, so the file is always true to what is on disk. ``seeds``
    (run_dir -> how many seeds its point took) adds the column ``seeds``.
    """
    root = Path(out_root)
    rows = [_row(p, read_summary(root / p.rel_dir)) for p in points
            if (root / p.rel_dir / SUMMARY_FILE).exists()
            and (hashes is None or is_done(root, p, hashes[p]))]
    df = pd.DataFrame(rows)
    if seeds is not None and not df.empty:
        df["seeds"] = [seeds[d] for d in df["run_dir"]]
    if df.empty:
        df = pd.DataFrame(columns=list(SUMMARY_KEYS) + [k for k in (points[0].grid if points else {})] + ["run_dir"])
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{CSV_FILE}.tmp"
    df.to_csv(tmp, index=False)
    os.replace(tmp, root / CSV_FILE)
    return df


def _progress(enabled: bool, total: int) -> tuple[Any, Callable[[], None]]:
    """A rich progress bar (or a no-op) and its advance function."""
    if not enabled:
        return None, lambda: None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    bar = Progress(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    task = bar.add_task("runs", total=total)
    return bar, lambda: bar.advance(task)


def sweep(scenario_path: str | Path, grid: Mapping[str, Sequence[Any]], *, seeds: int = 1,
          first_seed: int | None = None, strategies: Sequence[str] = STRATEGIES,
          target: str | None = None, sets: Sequence[str] = (), out: str | Path,
          jobs: int = 1, progress: bool = True, limit: int | None = None,
          calibration: Mapping[str, Any] | None = None, rel_accuracy: float | None = None,
          max_seeds: int = 100, metric: str = "elapsed_s",
          engine: Engine | None = None, fixed_interval: bool = False,
          max_wall_s: float | None = None) -> pd.DataFrame:
    """Run every point not yet done; write and return ``sweep.csv`` (all finished points).

    ``first_seed`` defaults to the scenario's seed. ``engine`` runs the points
    (:mod:`rollcall.app.engines`; the caller opens and closes it); without one,
    ``jobs`` > 1 runs them in a local process pool and ``jobs == 1`` here (no
    pool start-up, easier to debug). Every engine gives the same rows.
    ``limit`` runs at most that many pending points (an interruption on
    purpose, for tests and for sampling a grid). On KeyboardInterrupt the
    pool is cancelled, ``sweep.csv`` is written for the finished runs and the
    interrupt propagates.

    ``rel_accuracy`` (adaptive replication, as AIReSim's): after ``seeds``
    seeds, each grid point and strategy gets one more seed per round until
    the half-width of its ``metric``'s 95% interval (:mod:`rollcall.app.stats`:
    Student t for times) is at most ``rel_accuracy`` of its mean, or it has
    ``max_seeds``. A round adds the same next seed to every point still
    short of it, so the rows do not depend on ``jobs``; column ``seeds``
    says how many each point took.

    Each strategy runs at its own checkpoint interval, as ``compare`` runs it
    (:func:`resolve`): a sweep row equals the compare run of the same point
    and seed. ``fixed_interval`` keeps the scenario's for both, and a grid
    that sets ``strategy.checkpoint_interval_steps`` keeps the grid's.
    ``max_wall_s`` bounds each run's wall time: a run cut short ends "wall
    limit: ..." (not completed) and is a row like any other.
    """
    scenario_path = str(scenario_path)
    base = load_scenario(scenario_path, list(sets), target=target)  # fail fast on a bad file
    first = base.seed if first_seed is None else first_seed
    assert rel_accuracy is None or (rel_accuracy > 0 and max_seeds >= seeds), (rel_accuracy, max_seeds)
    points = plan(grid, list(range(first, first + seeds)), strategies)
    root = Path(out)
    own = None
    if engine is None and jobs > 1:
        from rollcall.app.engines.local import LocalEngine

        engine = own = LocalEngine(jobs)
    run = _Runner(scenario_path, list(sets), target, root, calibration, engine, fixed_interval,
                  max_wall_s)
    # every point resolved up front: a bad grid value fails before anything
    # runs, and each point's hash tells a finished run from a stale one
    hashes = {p: run.hash(p) for p in points}
    todo, taken = points, {_group(p): seeds for p in points}
    try:
        while todo:
            limit = _run_round(todo, hashes, limit, progress, run)
            if rel_accuracy is None or limit == 0:
                break
            todo = _short_of(points, root, hashes, taken, metric, rel_accuracy, max_seeds)
            points = points + todo
    finally:
        if own is not None:
            own.close()
        df = write_csv(points, root, hashes,
                       seeds={str(p.rel_dir): taken[_group(p)] for p in points})
    return df


def _group(p: Point) -> tuple[str, str]:
    """A point's grid values and strategy: the rows whose seeds are pooled."""
    return p.strategy, json.dumps(p.grid, sort_keys=True)


@dataclass
class _Runner:
    """How this sweep's points run: here, one by one, or through an engine."""

    scenario_path: str
    sets: list[str]
    target: str | None
    root: Path
    calibration: Mapping[str, Any] | None
    engine: Engine | None
    fixed_interval: bool = False
    max_wall_s: float | None = None
    # with an engine: each point's resolved YAML from hashing it until it is
    # sent, so a point is resolved (a file read and a validation) once
    texts: dict[Point, str] = field(default_factory=dict)

    def resolve(self, p: Point) -> Scenario:
        return resolve(self.scenario_path, self.sets, p, self.target, self.calibration,
                       fixed_interval=self.fixed_interval)

    def hash(self, p: Point) -> str:
        """The point's :func:`~rollcall.results.scenario_hash`."""
        text = self.resolve(p).to_yaml()
        if self.engine is not None:
            self.texts[p] = text
        return yaml_hash(text)

    def __call__(self, pending: Sequence[Point], hashes: Mapping[Point, str],
                 advance: Callable[[], None]) -> None:
        if self.engine is None:
            for p in pending:
                run_point(self.scenario_path, self.sets, p, self.target, str(self.root),
                          self.calibration, fixed_interval=self.fixed_interval,
                          max_wall_s=self.max_wall_s)
                advance()
            return
        here = self.engine.local_files  # its tasks write into the sweep's directory
        payloads = [{"scenario": self.texts.get(p) or self.resolve(p).to_yaml(),
                     "name": str(p.rel_dir),
                     "run_dir": str(staging_dir(self.root / p.rel_dir)) if here else None,
                     "max_wall_s": self.max_wall_s}
                    for p in pending]
        self.texts.clear()  # the done points' are not needed either

        def done(i: int, result: dict[str, Any]) -> None:
            store_point(self.root, pending[i], hashes[pending[i]], result)
            advance()

        self.engine.map(POINT_TASK, payloads, done)


def _run_round(points: Sequence[Point], hashes: dict[Point, str], limit: int | None,
               progress: bool, run: _Runner) -> int | None:
    """Run the points not yet done; what is left of ``limit``."""
    hashes.update({p: run.hash(p) for p in points if p not in hashes})
    pending = [p for p in points if not is_done(run.root, p, hashes[p])]
    if limit is not None:
        pending, limit = pending[:limit], max(0, limit - len(pending))
    bar, advance = _progress(progress and bool(pending), len(pending))
    try:
        if bar is not None:
            bar.start()
        run(pending, hashes, advance)
    finally:
        if bar is not None:
            bar.stop()
    return limit


def _short_of(points: Sequence[Point], root: Path, hashes: Mapping[Point, str],
              taken: dict[tuple[str, str], int], metric: str, rel_accuracy: float,
              max_seeds: int) -> list[Point]:
    """The next seed of every group whose ``metric`` is not yet known to
    ``rel_accuracy`` (and that has fewer than ``max_seeds``)."""
    values: dict[tuple[str, str], list[float]] = {}
    example: dict[tuple[str, str], Point] = {}
    last: dict[tuple[str, str], int] = {}
    for p in points:
        g = _group(p)
        example.setdefault(g, p)
        last[g] = max(last.get(g, p.seed), p.seed)
        if is_done(root, p, hashes[p]):
            v = read_summary(root / p.rel_dir).get(metric)
            if isinstance(v, (int, float)):
                values.setdefault(g, []).append(float(v))
    more = []
    for g, p in example.items():
        interval = stats.mean_interval(values.get(g, []), stats.kind_of(metric))
        known = (interval.n >= 2 and interval.mean != 0
                 and interval.half <= rel_accuracy * abs(interval.mean))
        if not known and taken[g] < max_seeds:
            taken[g] += 1
            more.append(Point(p.grid, p.strategy, last[g] + 1))
    return more
