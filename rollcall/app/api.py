"""The Python API for notebooks: ``rollcall.run``, ``rollcall.compare``, ``rollcall.sweep``.

Why a function and not ``subprocess.run(["rollcall", "run", ...])``: a
notebook wants the numbers as attributes and the history as a DataFrame,
and a sweep of its own in a ``for`` loop. It is the very code of ``rollcall
run`` (:func:`rollcall.app.cli.run_scenario`: the same checks, the same run
directory, the same driver, loaded lazily by target name), not a second
runner, so a result made here is one the CLI, ``rollcall report`` and the
analysis helpers read like any other.

Files: like the command, every run writes its directory (``scenario.yaml``,
``history.jsonl``, ``summary.json``): ``out=`` names it, and by default it
is ``runs/<name>/<utc>-seed<S>/`` under the working directory, as for
``rollcall run``. A driver writes its history as it goes, so "no files" is
not an option: pass a temporary directory for a throw-away run.

:func:`compare` and :func:`sweep` are ``rollcall compare`` and ``rollcall
sweep`` (the same checks, directories, intervals and verdict) and return
the tables the commands print, with the frames they are made from.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import yaml

from rollcall.results import SUMMARY_KEYS
from rollcall.scenario import Scenario, ScenarioDumper, load_scenario, parse_scenario

if TYPE_CHECKING:  # pandas is imported by .history(), compare() and sweep() only
    import pandas as pd

    from rollcall.app.comparison import Comparison
    from rollcall.app.verdict import Verdict

__all__ = ["Compared", "Summary", "Swept", "compare", "resolve", "run", "sweep"]


@dataclass(frozen=True)
class Summary:
    """A run's ``summary.json``: the keys every target writes, typed, as attributes.

    The driver's other keys (the sim's ``events``, the real target's
    ``processes``...) are in :attr:`extras` and readable as attributes too.
    :attr:`dir` is the run directory; :meth:`history` reads its history.
    """

    scenario: str
    target: str
    strategy: str
    seed: int
    valid: bool
    violations: list[str]
    completed: bool
    steps_target: int
    steps_committed: int
    samples_consumed: int
    samples_duplicated: int
    samples_skipped: int
    global_batch_min: int | None
    global_batch_max: int | None
    elapsed_s: float
    productive_s: float
    ettr: float
    goodput: float
    lost_work_s: float
    stall_s: float
    recovery_s: float
    failures: int
    generations: int
    restarts: int
    wall_s: float
    result: str
    end_reason: str
    dir: Path
    extras: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, summary: Mapping[str, Any], run_dir: str | Path) -> "Summary":
        """From a driver's summary mapping (every key of ``SUMMARY_KEYS`` present)."""
        missing = [k for k in SUMMARY_KEYS if k not in summary]
        if missing:
            raise ValueError(f"{run_dir}: summary lacks {', '.join(missing)}")
        extras = {k: v for k, v in summary.items() if k not in SUMMARY_KEYS}
        return cls(**{k: summary[k] for k in SUMMARY_KEYS}, dir=Path(run_dir), extras=extras)

    def __getattr__(self, name: str) -> Any:
        # only reached for names that are not fields: the driver's extra keys
        extras = self.__dict__.get("extras", {})
        if name in extras:
            return extras[name]
        raise AttributeError(f"{type(self).__name__} has no key {name!r} "
                             f"(extras: {', '.join(sorted(extras)) or 'none'})")

    def to_dict(self) -> dict[str, Any]:
        """The summary as ``summary.json`` holds it (extras included, no ``dir``)."""
        return {**{k: getattr(self, k) for k in SUMMARY_KEYS}, **self.extras}

    def history(self) -> "pd.DataFrame":
        """Every ``history.jsonl`` record as a row (see :func:`rollcall.app.analysis.load_history`)."""
        from rollcall.app.analysis import load_history

        return load_history(self.dir)


# the summary keys and the dataclass agree, so no key is silently left out
assert [f.name for f in fields(Summary)][: len(SUMMARY_KEYS)] == list(SUMMARY_KEYS)


def _yaml_value(value: Any) -> str:
    """A Python value as the YAML text of a ``--set`` item (types survive: 3600 stays an int)."""
    text = yaml.dump(value, Dumper=ScenarioDumper, default_flow_style=True, allow_unicode=False)
    return text.strip().removesuffix("...").strip()


def _override_items(set: Mapping[str, Any] | None, kwargs: Mapping[str, Any]) -> list[str]:
    """``set={"a.b": v}`` then ``a__b=v`` keyword arguments, as ``--set`` items, in that order."""
    items = dict(set or {})
    for key, value in kwargs.items():
        items[key.replace("__", ".")] = value
    return [f"{key}={_yaml_value(value)}" for key, value in items.items()]


def resolve(scenario_or_path: Scenario | Mapping[str, Any] | str | Path, *,
            set: Mapping[str, Any] | None = None, target: str | None = None,
            seed: int | None = None, strategy: str | None = None,
            **overrides: Any) -> Scenario:
    """The scenario :func:`run` would run: validated, overrides applied, scale helpers resolved.

    Raises :class:`rollcall.scenario.ScenarioError` (one line) on any problem.
    """
    items = _override_items(set, overrides)
    options = {"seed": seed, "target": target, "strategy": strategy}
    if isinstance(scenario_or_path, (str, Path)):
        return load_scenario(scenario_or_path, items, **options)
    if isinstance(scenario_or_path, Scenario):
        text, source = scenario_or_path.to_yaml(), f"<Scenario {scenario_or_path.name}>"
    elif isinstance(scenario_or_path, Mapping):
        try:
            text = yaml.dump(dict(scenario_or_path), Dumper=ScenarioDumper, sort_keys=False)
        except yaml.YAMLError as exc:
            raise TypeError(f"the scenario mapping holds a value YAML cannot write: {exc}") from None
        source = "<dict>"
    else:
        raise TypeError("expected a Scenario, a mapping or a path, got "
                        f"{type(scenario_or_path).__name__}")
    return parse_scenario(text, source, items, **options)


def run(scenario_or_path: Scenario | Mapping[str, Any] | str | Path, *,
        set: Mapping[str, Any] | None = None, target: str | None = None,
        seed: int | None = None, strategy: str | None = None,
        out: str | Path | None = None, force: bool = False, ledger: bool = False,
        max_wall_s: float | None = None, **overrides: Any) -> Summary:
    """Run a scenario as ``rollcall run`` does and return its :class:`Summary`.

    ``scenario_or_path``: a :class:`~rollcall.scenario.Scenario`, a mapping
    of scenario keys, or a YAML file. Overrides are dotted keys, as
    ``--set`` takes them: ``set={"failures.worker_mtbf_s": 3600}`` and/or
    keyword arguments with ``__`` for each dot (``failures__worker_mtbf_s=3600``,
    ``cluster__gpus=64``); the keywords come after ``set``. ``target``,
    ``seed`` and ``strategy`` are the flags of the same names. ``out``: the
    run directory (refused when it holds files, unless ``force``; default
    ``runs/<name>/<utc>-seed<S>/``). ``ledger`` and ``max_wall_s`` are
    ``--ledger`` and ``--max-wall-s``.

    Raises ScenarioError for a bad scenario and :class:`rollcall.app.cli.RunRefused`
    for a run that cannot start as asked (both one line, what the CLI
    prints before exiting 2). Warnings (a fault that never fires) are
    Python warnings. A Ctrl-C ends the run cleanly: the Summary comes back
    with ``result == "interrupted"`` (a second Ctrl-C raises KeyboardInterrupt).
    """
    from rollcall.app.cli import run_scenario

    scenario = resolve(scenario_or_path, set=set, target=target, seed=seed, strategy=strategy,
                       **overrides)
    for where, message in scenario.warnings():
        warnings.warn(f"{scenario.name}: {where}: {message}", stacklevel=2)
    summary, out_dir, _ = run_scenario(scenario, out=out, force=force, ledger=ledger,
                                       max_wall_s=max_wall_s)
    return Summary.of(summary, out_dir)


@dataclass(frozen=True)
class Compared:
    """What ``rollcall compare`` prints, and what it is made of: :attr:`table`
    (the printed table, human units), :attr:`intervals` (the line naming each
    strategy's checkpoint interval), :attr:`verdict`; :attr:`comparison` has
    the runs, the paired differences and every interval; :attr:`dir` the
    compare directory (its CSVs and run directories)."""

    table: "pd.DataFrame"
    intervals: str
    verdict: "Verdict"
    comparison: "Comparison"
    dir: Path

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` document of ``rollcall compare``."""
        from rollcall.app import verdict as vd

        return vd.to_json(self.comparison, self.verdict, 1 if self.comparison.problems else 0)


def compare(scenario_or_path: Scenario | Mapping[str, Any] | str | Path, *, seeds: int = 5,
            seed: int | None = None, set: Mapping[str, Any] | None = None,
            target: str | None = None, out: str | Path | None = None,
            fixed_interval: bool = False, max_wall_s: float | None = None,
            **overrides: Any) -> Compared:
    """Run both strategies on ``seeds`` seeds from ``seed`` (default the
    scenario's) as ``rollcall compare`` does; overrides as for :func:`run`.
    Each strategy at its own checkpoint interval (``fixed_interval``: both at
    the scenario's); ``max_wall_s`` bounds each run. Raises ScenarioError or
    RunRefused (one line) where the command exits 2."""
    from rollcall.app import verdict as vd
    from rollcall.app.cli_studies import prepare_compare
    from rollcall.app.interval import describe

    scenario = resolve(scenario_or_path, set=set, target=target, **overrides)
    run_compare, out_dir = prepare_compare(scenario, out)
    first = scenario.seed if seed is None else seed
    cmp = run_compare(scenario, list(range(first, first + seeds)), out_dir,
                      fixed_interval=fixed_interval, max_wall_s=max_wall_s)
    return Compared(vd.human_table(cmp), describe(cmp.intervals), vd.decide(cmp), cmp, out_dir)


@dataclass(frozen=True)
class Swept:
    """What ``rollcall sweep`` prints and writes: :attr:`table` (per grid point
    and strategy, goodput, ETTR and elapsed_s with their intervals), :attr:`runs`
    (``sweep.csv``, one row per run), :attr:`dir` the sweep directory."""

    table: "pd.DataFrame"
    runs: "pd.DataFrame"
    dir: Path


def sweep(scenario_path: str | Path, grid: Mapping[str, Any], *, seeds: int = 3,
          seed: int | None = None, set: Mapping[str, Any] | None = None,
          target: str | None = None, out: str | Path, jobs: int = 1,
          fixed_interval: bool = False, max_wall_s: float | None = None,
          **overrides: Any) -> Swept:
    """``rollcall sweep`` over ``grid`` (dotted key -> list of values), resumable
    in ``out``; overrides as for :func:`run`. Each strategy runs at its own
    checkpoint interval, as :func:`compare` runs it, unless the grid sets it or
    ``fixed_interval``; ``max_wall_s`` bounds each run."""
    from rollcall.app import analysis
    from rollcall.app import sweeps

    items = _override_items(set, overrides)
    df = sweeps.sweep(scenario_path, {k: list(v) for k, v in grid.items()}, seeds=seeds,
                      first_seed=seed, target=target, sets=items, out=out, jobs=jobs,
                      progress=False, fixed_interval=fixed_interval, max_wall_s=max_wall_s)
    table = analysis.summarize(df, list(grid) + ["strategy"], ["goodput", "ettr", "elapsed_s"]) \
        if len(df) else df
    return Swept(table, df, Path(out))
