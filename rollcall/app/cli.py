"""The ``rollcall`` command: validate a scenario, run it on a target, compare strategies.

The CLI is the only part of the core that may read the wall clock (for the
default run directory name). It reaches a driver only through
:mod:`rollcall.app.targets`, when a command runs, so ``rollcall`` itself never
imports ``sim`` or ``real``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

from rollcall import interrupts
from rollcall.app import targets

interrupts.quit_until_main("rollcall")  # before the slow imports: a signal there is one line

from rollcall.app import checks  # noqa: E402
from rollcall.app.cli_parser import Commands, build_parser  # noqa: E402
from rollcall.results import (  # noqa: E402
    OutDirError, claim_out_dir, default_out_dir, prepare_out_dir, update_latest,
)
from rollcall.scenario import Scenario, ScenarioError, load_scenario  # noqa: E402



def _utc_stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def _err(message: str) -> None:
    print(f"rollcall: {message}", file=sys.stderr)


def _load(args: argparse.Namespace) -> Scenario:
    scenario = load_scenario(
        args.scenario,
        args.set,
        seed=getattr(args, "seed", None),
        target=getattr(args, "target", None),
        strategy=getattr(args, "strategy", None),
    )
    _warn(args.scenario, scenario)
    doc = _calibration(args, scenario)
    if doc is not None:
        from rollcall.app import suite

        scenario = suite.calibrated(scenario, doc)
    return scenario


def _calibration(args: argparse.Namespace, scenario: Scenario) -> dict[str, Any] | None:
    """The ``--calibration`` file's contents, or None; a bad file or a real
    target is bad input (ScenarioError: one line, exit 2)."""
    path = getattr(args, "calibration", None)
    if path is None:
        return None
    if scenario.target != "sim":
        raise ScenarioError(path, None, "a calibration gives the sim a machine's costs; "
                                        f"the target is {scenario.target}")
    from rollcall.app import suite

    try:
        return suite.read_any(path)
    except ValueError as exc:
        raise ScenarioError(path, None, str(exc)) from None


def _warn(source: str, scenario: Scenario) -> None:
    """Say what the scenario will not do although it says so (a fault that never fires)."""
    for field, message in scenario.warnings():
        _err(f"warning: {source}: {field}: {message}")


# an epoch's data order is a permutation of the dataset, built in memory
LEDGER_DATASET_LIMIT = 10_000_000


def _replay_line(args: argparse.Namespace, scenario: Scenario) -> str:
    parts = [
        "rollcall", "run", str(args.scenario),
        "--target", scenario.target,
        "--seed", str(scenario.seed),
        "--strategy", scenario.strategy.kind,
    ]
    for item in args.set:
        parts += ["--set", item]
    if getattr(args, "calibration", None):
        parts += ["--calibration", str(args.calibration)]
    if getattr(args, "ledger", False):
        parts.append("--ledger")
    return "replay: " + " ".join(shlex.quote(p) for p in parts)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "-" if value is None else str(value)


def _print_summary(summary: dict[str, Any], out_dir: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{summary.get('scenario', '?')} ({summary.get('target', '?')})", show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value")
    rows = [
        ("strategy", summary.get("strategy")),
        ("completed", summary.get("completed")),
        ("valid", summary.get("valid")),
        ("steps", f"{_fmt(summary.get('steps_committed'))}/{_fmt(summary.get('steps_target'))}"),
        ("elapsed_s", summary.get("elapsed_s")),
        ("ettr", summary.get("ettr")),
        ("goodput", summary.get("goodput")),
        ("failures", summary.get("failures")),
        ("generations", summary.get("generations")),
        ("restarts", summary.get("restarts")),
        ("samples dup/skipped",
         f"{_fmt(summary.get('samples_duplicated'))}/{_fmt(summary.get('samples_skipped'))}"),
        ("wall_s", summary.get("wall_s")),
        ("out dir", str(out_dir)),
    ]
    for key, value in rows:
        table.add_row(key, _fmt(value))
    violations = summary.get("violations") or []
    if violations:
        table.add_row("violations", "; ".join(str(v) for v in violations[:5]))
    class _Console(Console):
        def on_broken_pipe(self) -> None:  # rich's own exits 1; ours is the CLI's (141)
            raise BrokenPipeError

    _Console().print(table)


#: the default root of run, compare and sweep directories (its ``latest`` link is kept)
RUNS_ROOT = Path("runs")


def _link_latest(out_dir: Path) -> None:
    """``runs/latest`` -> ``out_dir`` when it lies under runs/; a failure is a warning only."""
    try:
        update_latest(out_dir, RUNS_ROOT)
    except OSError as exc:
        _err(f"warning: {RUNS_ROOT / 'latest'}: cannot update the link: {exc.strerror or exc}")


def _cmd_validate(args: argparse.Namespace) -> int:
    scenario = _load(args)
    print(f"ok: {scenario.name} ({scenario.target}, {scenario.strategy.kind})")
    if args.plan:
        from rollcall.app.plan import format_plan, plan, wall_estimate

        print(scenario.to_yaml().rstrip())
        p = plan(scenario)
        print(format_plan({**p, "wall_estimate": wall_estimate(scenario, p)}))
    return 0


def _run_out_dir(out: str | Path | None, force: bool, scenario: Scenario) -> Path:
    """``out`` (claimed: refused if it holds another run, unless ``force``), or a fresh default."""
    if out:
        return claim_out_dir(out, force)
    base = default_out_dir(scenario, _utc_stamp())
    path, n = base, 1
    while path.exists():  # two runs within one second of each other
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


class RunRefused(Exception):
    """A run that must not start as asked (too large for the machine or the disk, an
    ``--out`` in use); ``str()`` is one line. The CLI prints it and exits 2."""


def run_scenario(scenario: Scenario, *, out: str | Path | None = None, force: bool = False,
                 ledger: bool = False, max_wall_s: float | None = None,
                 max_history_mb: int | None = None, driver_options: dict[str, Any] | None = None,
                 stop: interrupts.Stop | None = None,
                 ) -> tuple[dict[str, Any], Path, int | None]:
    """Run one resolved scenario on its target: what ``rollcall run`` does, minus the printing.

    One code path for the command and for :func:`rollcall.run`. Returns the
    summary, the run directory and, when a signal ended the run, its exit
    status (130/143; else None). Raises :class:`RunRefused` before anything
    runs when the run cannot be made as asked. ``stop``: the caller's signal
    record (:func:`interrupts.catch`); from the run directory on, a first
    signal only asks the run to stop (its summary says interrupted).
    """
    try:
        run = targets.driver(scenario.target).run
    except targets.NotBuilt as exc:
        raise RunRefused(str(exc)) from None
    if ledger and scenario.workload.dataset_samples > LEDGER_DATASET_LIMIT:
        raise RunRefused(f"--ledger: the data order of a {scenario.workload.dataset_samples}-sample "
                         f"dataset is too large to list (at most {LEDGER_DATASET_LIMIT}); run "
                         f"without --ledger for the compact ledger")
    problem = checks.run_problem(scenario, bool((driver_options or {}).get("external_hosts")),
                                 ledger, max_history_mb, force)
    if problem is not None:
        raise RunRefused(problem)
    with interrupts.catch(stop=stop) as stop:
        stop.immediate = False  # the run directory may exist from here on: it gets a summary
        try:
            out_dir = _run_out_dir(out, force, scenario)
        except OutDirError as exc:
            raise RunRefused(str(exc)) from None
        _make_dir(out_dir, scenario)
        options: dict[str, Any] = dict(driver_options or {})
        if max_wall_s is not None:
            options["max_wall_s"] = max_wall_s
        if scenario.target == "sim":
            if ledger:
                options["ledger"] = True
            options["stop"] = stop.reason
        else:  # the launcher's loop wakes at a signal; a second one kills its processes
            options["stop"] = stop
        summary = run(scenario, out_dir, **options)
    if scenario.target != "sim":  # the launcher decided: a signal after its end changes nothing
        if summary.get("result") != "interrupted":
            return summary, out_dir, None
        return summary, out_dir, _interrupt_code(stop, str(summary.get("end_reason", "")))
    return summary, out_dir, _interrupted_code(stop, summary)


def _cmd_run(args: argparse.Namespace) -> int:
    # Until the run directory exists a signal ends the command at once (one line,
    # nothing written); from then on the first one asks the run to stop and the
    # summary says so, and once the run has ended it changes nothing (a second
    # one still ends the command: run_scenario, interrupts.catch).
    with interrupts.catch(immediate=True) as stop:
        scenario = _load(args)
        try:
            summary, out_dir, code = run_scenario(
                scenario, out=args.out, force=args.force, ledger=args.ledger,
                max_wall_s=args.max_wall_s, max_history_mb=args.max_history_mb, stop=stop)
        except RunRefused as exc:
            _err(str(exc))
            return 2
        if code is not None:
            _err(f"{summary.get('end_reason') or 'interrupted'}; "
                 f"history and summary (result: {summary.get('result')}) in {out_dir}")
            return code
        if not args.quiet:
            _print_summary(summary, out_dir)
        print(_replay_line(args, scenario))
        return 0 if summary.get("completed") and summary.get("valid") else 1


def _cmd_keeper(args: argparse.Namespace) -> int:
    """``rollcall keeper`` (:mod:`rollcall.app.cli_hosts`): a real run whose hosts run apart."""
    from rollcall.app.cli_hosts import keeper_problem

    scenario = _load(args)  # target real (the parser's default)
    problem = keeper_problem(scenario, args.bind, args.max_wall_s)
    if problem is not None:
        _err(problem)
        return 2
    try:
        summary, out_dir, code = run_scenario(
            scenario, out=args.out, force=args.force, max_wall_s=args.max_wall_s,
            driver_options={"bind": args.bind, "external_hosts": True})
    except RunRefused as exc:
        _err(str(exc))
        return 2
    if code is not None:
        return code
    _print_summary(summary, out_dir)
    return 0 if summary.get("completed") and summary.get("valid") else 1


def _interrupted_code(stop: interrupts.Stop, summary: dict[str, Any]) -> int | None:
    """The exit status of a run a signal ended (130 SIGINT, 143 SIGTERM), or None.

    A signal that came after the run's end (during its checks) still
    stops the command with the signal's status; the summary then says how
    the run really ended.
    """
    if stop.exit_code is not None or summary.get("result") == "interrupted":  # or real's launcher
        return _interrupt_code(stop, str(summary.get("end_reason", "")))
    return None


def _compare_output(args: argparse.Namespace, scenario: Scenario, cmp: Any,
                    out_dir: Path) -> int:
    """Print the compare's answer (table, intervals, verdict; or one JSON object); the exit code."""
    import json

    from rollcall.app import verdict as vd
    from rollcall.app.interval import describe

    code = 1 if cmp.problems else 0
    for line in cmp.problems:
        _err(f"compare: {line}")
    decision = vd.decide(cmp)
    if args.json:
        doc = {"scenario": scenario.name, "target": scenario.target, "out": str(out_dir),
               **vd.to_json(cmp, decision, code)}
        print(json.dumps(doc, indent=1, allow_nan=False))
        return code
    print(vd.human_table(cmp).to_string())
    print(describe(cmp.intervals))
    print(f"verdict: {decision.text}")
    print(f"out: {out_dir}")
    return code


def prepare_compare(scenario: Scenario, out: str | Path | None = None, *,
                    max_history_mb: int | None = None,
                    force: bool = False) -> tuple[Callable[..., Any], Path]:
    """What ``rollcall compare`` does before its runs, for the command and for
    :func:`rollcall.compare`: the target's ``compare`` and the compare directory,
    made. Raises :class:`RunRefused` (one line) when it cannot run as asked."""
    from rollcall.app import comparison

    try:
        compare = comparison.on_target(scenario.target)
    except targets.NotBuilt as exc:
        raise RunRefused(str(exc)) from None
    problem = checks.run_problem(scenario, False, False, max_history_mb, force)
    if problem is not None:
        raise RunRefused(problem)
    out_dir = Path(out) if out else RUNS_ROOT / scenario.name / f"{_utc_stamp()}-compare"
    _make_dir(out_dir, scenario)
    return compare, out_dir


def _make_dir(out_dir: Path, scenario: Scenario) -> None:
    """Make a run or compare directory (its scenario.yaml) and point runs/latest at
    it; RunRefused when it cannot be made."""
    try:
        prepare_out_dir(out_dir, scenario)
    except OSError as exc:
        raise RunRefused(f"{out_dir}: cannot create the run directory: "
                         f"{exc.strerror or exc}") from None
    _link_latest(out_dir)


def _cmd_compare(args: argparse.Namespace) -> int:
    from rollcall.app.interval import checkpoint_intervals, describe

    scenario = _load(args)
    try:
        compare, out_dir = prepare_compare(scenario, args.out, max_history_mb=args.max_history_mb,
                                           force=args.force)
    except RunRefused as exc:
        _err(str(exc))
        return 2
    first = scenario.seed if args.seed is None else args.seed
    seeds = list(range(first, first + args.seeds))
    _err(describe(checkpoint_intervals(scenario, fixed=args.fixed_interval)))
    options: dict[str, Any] = {"fixed_interval": args.fixed_interval,
                               "max_wall_s": args.max_wall_s}
    from rollcall.app.engines import EngineError

    engine, started = None, False
    stop = interrupts.Stop()  # rebound by the block; here for a signal before it is entered
    try:
        with interrupts.catch() as stop:
            engine = _open_engine(args, scenario, out_dir, os.cpu_count() or 1)
            started = True
            if scenario.target == "sim":
                options["stop"] = stop.reason
            if engine is not None:
                options["engine"] = engine
            cmp = compare(scenario, seeds, out_dir, **options)
    except KeyboardInterrupt as exc:
        _err(f"interrupted; the finished runs are in {out_dir / 'compare.csv'} "
             f"({_interrupt_reason(stop, exc)}; run the same command to resume)")
        return _interrupt_code(stop, str(exc))
    except EngineError as exc:
        return _engine_failed("compare", exc, out_dir, started)
    finally:
        if engine is not None:
            engine.close()
    return _compare_output(args, scenario, cmp, out_dir)


def _sweep_problem(args: argparse.Namespace, scenario: Scenario) -> str | None:
    """Why ``sweep`` cannot run as asked (one line), or None."""
    from rollcall.results import SUMMARY_KEYS

    if args.rel_accuracy is not None and args.max_seeds < args.seeds:
        return f"sweep: --max-seeds {args.max_seeds} is below --seeds {args.seeds}"
    if args.metric not in SUMMARY_KEYS:
        return (f"sweep: --metric {args.metric!r} is not a summary key (e.g. elapsed_s, goodput, "
                f"ettr)")
    return checks.run_problem(scenario, False, False, args.max_history_mb, args.force)


def _sweep_dir(args: argparse.Namespace, scenario: Scenario) -> Path:
    """``--out``, or one named by the scenario, the target and the overrides:
    deterministic, so that running the same sweep again resumes it."""
    import hashlib
    import json

    if args.out:
        return Path(args.out)
    name = f"sweep-{scenario.target}"
    if args.set:
        name += "-" + hashlib.sha1(json.dumps(sorted(args.set)).encode()).hexdigest()[:8]
    return Path("runs") / scenario.name / name


def _cmd_sweep(args: argparse.Namespace) -> int:
    from rollcall.app import sweeps
    from rollcall.app.engines import EngineError

    try:
        grid = sweeps.parse_grid(args.grid)
    except ValueError as exc:
        _err(str(exc))
        return 2
    scenario = load_scenario(args.scenario, args.set, target=args.target)
    _warn(args.scenario, scenario)
    calibration = _calibration(args, scenario)
    problem = _sweep_problem(args, scenario)
    if problem is not None:
        _err(problem)
        return 2
    out_dir = _sweep_dir(args, scenario)
    strategies = tuple(args.strategy) if args.strategy else sweeps.STRATEGIES
    jobs = args.jobs
    if scenario.target == "real" and jobs > 1:
        # each real point is a whole process group; two at once share the CPUs and time out
        _err(f"sweep --target real: one run at a time (not --jobs {jobs})")
        jobs = 1
    engine, started = None, False
    stop = interrupts.Stop()  # rebound by the block; here for a signal before it is entered
    try:
        with interrupts.catch(immediate=True) as stop:
            engine = _open_engine(args, scenario, out_dir, jobs)
            started = True
            df = sweeps.sweep(
                args.scenario, grid, seeds=args.seeds, first_seed=args.seed,
                strategies=strategies, target=args.target, sets=args.set, out=out_dir,
                jobs=jobs, progress=not args.quiet and sys.stderr.isatty(),
                calibration=calibration, rel_accuracy=args.rel_accuracy,
                max_seeds=args.max_seeds, metric=args.metric, engine=engine,
                fixed_interval=args.fixed_interval, max_wall_s=args.max_wall_s,
            )
    except KeyboardInterrupt as exc:
        if out_dir.is_dir():
            _link_latest(out_dir)
        _err(f"interrupted; finished runs kept in {out_dir} "
             f"({_interrupt_reason(stop, exc)}; run the same command to resume)")
        return _interrupt_code(stop, str(exc))
    except EngineError as exc:
        if out_dir.is_dir():
            _link_latest(out_dir)
        return _engine_failed("sweep", exc, out_dir, started)
    finally:
        if engine is not None:
            engine.close()
    _link_latest(out_dir)
    return _sweep_outcome(args, list(grid), df, out_dir)


def _sweep_outcome(args: argparse.Namespace, grid: list[str], df: Any, out_dir: Path) -> int:
    """Print the sweep's table (unless ``--quiet``), name each run that did
    not complete or is not valid; exit 1 if there is one, else 0."""
    from rollcall.app import analysis, sweeps

    if not args.quiet and len(df):
        table = analysis.summarize(df, grid + ["strategy"], ["goodput", "ettr", "elapsed_s"])
        cols = grid + ["strategy", "n", "goodput_mean", "goodput_ci", "ettr_mean", "ettr_ci",
                       "elapsed_s_mean"]
        print(table[cols].to_string(index=False))
    incomplete = df[df["completed"].astype(str) != "True"] if len(df) else df
    invalid = df[df["valid"].astype(str) != "True"] if len(df) else df
    for what, bad in (("did not complete", incomplete), ("is not valid", invalid)):
        for run_dir in bad["run_dir"]:
            _err(f"sweep: {out_dir / str(run_dir)} {what}")
    print(f"runs: {len(df)}  not completed: {len(incomplete)}  invalid: {len(invalid)}")
    print(f"out: {out_dir}")
    print(f"csv: {out_dir / sweeps.CSV_FILE}")
    return 1 if len(incomplete) or len(invalid) else 0


def _interrupt_reason(stop: interrupts.Stop, exc: KeyboardInterrupt) -> str:
    """``interrupted (SIGINT)``: the signal we caught, or the one a real launcher named."""
    return f"interrupted ({signal.Signals(_interrupt_code(stop, str(exc)) - 128).name})"


def _interrupt_code(stop: interrupts.Stop, named: str) -> int:
    """130 or 143: the signal we caught, else the one ``named`` (a real launcher's reason)."""
    if stop.exit_code is not None:
        return stop.exit_code
    return interrupts.exit_code_of_reason(named)


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from rollcall.app import calibrate

    if args.suite:
        return _cmd_calibrate_suite(args)
    if args.run_dir is None:
        _err("calibrate: give RUN_DIR (one real run) or --suite --out FILE")
        return 2
    run_dir = Path(args.run_dir)
    try:
        cal = calibrate.measure(run_dir)
    except (OSError, ValueError) as exc:
        _err(f"{run_dir}: {exc}")
        return 2
    out = Path(args.out) if args.out else run_dir / calibrate.CALIBRATION_FILE
    calibrate.write_calibration(cal, out)
    for key, value in calibrate.overrides(cal).items():
        print(f"{key}={_fmt(value)}")
    print(f"out: {out}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from rollcall.app.report import ReportError, build

    try:
        path = build(args.dir)
    except ReportError as exc:
        _err(str(exc))
        return 2
    except OSError as exc:
        _err(f"{args.dir}: cannot write the report: {exc.strerror or exc}")
        return 2
    print(path)
    return 0


def _engine_failed(command: str, exc: Exception, out_dir: Path, started: bool) -> int:
    """One line; exit 2 when the engine could not start (bad input), 1 when a
    run failed on it (the others are kept, and the same command resumes)."""
    _err(f"{command}: {exc}" + (f" (finished runs kept in {out_dir}; run the same command to "
                                f"resume)" if started else ""))
    return 1 if started else 2


def _open_engine(args: argparse.Namespace, scenario: Scenario, out_dir: Path, jobs: int) -> Any:
    """The engine the flags ask for (None: the command's own default), or
    EngineError with the one line that says why not."""
    from rollcall.app.engines import EngineError, open_engine

    if args.engine is None or (args.engine == "local" and args.func is _cmd_sweep):
        if args.address or args.engine_opt:
            raise EngineError("--address and --engine-opt go with --engine ray or slurm")
        return None
    if scenario.target != "sim":
        raise EngineError(f"--engine {args.engine}: real runs start processes on this machine, "
                          f"one at a time; engines run sim runs")
    if args.retries < 0:
        raise EngineError(f"--retries {args.retries}: must be 0 or more")
    if args.address and args.engine != "ray":
        raise EngineError("--address goes with --engine ray")
    if args.engine_opt and args.engine != "slurm":
        raise EngineError("--engine-opt goes with --engine slurm")
    import yaml

    options = {}
    for item in args.engine_opt:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise EngineError(f"--engine-opt {item!r}: expected KEY=VALUE")
        try:
            options[key.strip()] = yaml.safe_load(value) if value.strip() else value
        except yaml.YAMLError:
            raise EngineError(f"--engine-opt {item!r}: the value is not YAML") from None
    out_dir.mkdir(parents=True, exist_ok=True)
    return open_engine(args.engine, jobs=jobs, address=args.address, options=options,
                       folder=str(out_dir / "submitit"), log_path=str(out_dir / "engine.log"),
                       retries=args.retries)


def _cmd_calibrate_suite(args: argparse.Namespace) -> int:
    import time

    from rollcall.app import suite

    if args.out is None:
        _err("calibrate --suite: give --out FILE (the calibration file to write)")
        return 2
    out = Path(args.out)
    if out.is_dir():
        _err(f"calibrate --suite: {out} is a directory; --out names the file to write")
        return 2
    runs = Path(args.runs) if args.runs else out.with_name(out.name + ".runs")
    t0 = time.monotonic()
    stop = interrupts.Stop()
    try:
        with interrupts.catch() as stop:
            dirs = suite.run(runs, say=lambda line: _err(f"calibrate --suite: {line}"))
    except KeyboardInterrupt as exc:
        _err(f"calibrate --suite: interrupted; the finished runs are in {runs}")
        return _interrupt_code(stop, str(exc))
    except RuntimeError as exc:
        _err(f"calibrate --suite: {exc}")
        return 1
    model = suite.fit(dirs)
    suite.write(model, out)
    step = model["step"]
    worst = max(abs(f / y - 1.0) for *_, y, f in step["points"])  # fit() keeps no 0 s step
    print(f"suite: {len(dirs)} real runs in {time.monotonic() - t0:.1f} s ({runs})")
    print(f"step time: {len(step['points'])} generations fitted, worst error {worst:.0%}")
    for key in ("exit_notice_s", "roll_call_s", "restart_s", "warmup_s",
                "keeper_failover_beyond_lease_s"):
        if model.get(key) is not None:
            print(f"{key}: {model[key]:.4g}")
    for key in ("checkpoint_write", "checkpoint_read", "state_copy"):
        line = model.get(key)
        if line is not None:
            print(f"{key}: {line['base_s']:.4g} s + {line['per_byte_s'] * 1e9:.4g} s/GB")
    print(f"out: {out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rollcall`` console script; returns the exit code."""
    args = build_parser(Commands(
        validate=_cmd_validate, run=_cmd_run, compare=_cmd_compare, sweep=_cmd_sweep,
        report=_cmd_report, keeper=_cmd_keeper, calibrate=_cmd_calibrate)).parse_args(argv)
    try:
        with interrupts.catch(immediate=True):  # a command's own catch blocks refine this
            code = int(args.func(args))
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        interrupts.finish_on_signal("rollcall", code)  # decided and said: a signal now keeps it
        if args.func is _cmd_run:  # nothing of a run is left to tear down
            interrupts.exit_now("rollcall", code)
        return code
    except ScenarioError as exc:
        _err(str(exc))
        return 2
    except BrokenPipeError:
        return _broken_pipe()
    except interrupts.Interrupted as exc:
        _err(f"interrupted by {exc}")
        return exc.exit_code
    except KeyboardInterrupt:
        _err("interrupted")
        return 130


#: exit status of a command whose reader went away (``rollcall run ... | head -1``)
BROKEN_PIPE_EXIT = 128 + 13  # SIGPIPE's


def _broken_pipe() -> int:
    """The reader of stdout is gone: nothing more can be said there, so stop quietly.

    stdout is pointed at /dev/null so that the interpreter's own flush at
    exit does not fail again and print "Exception ignored".
    """
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return BROKEN_PIPE_EXIT


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
