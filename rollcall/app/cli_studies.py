"""The ``rollcall`` commands of many runs: ``compare``, ``sweep`` and ``calibrate``.

Each reaches a driver only through :mod:`rollcall.app.targets` (or an
engine), when it runs; what every command shares is
:mod:`rollcall.app.cli_common`'s.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Callable

from rollcall import interrupts
from rollcall.app import checks, cli_common, targets
from rollcall.app.cli_common import (
    RUNS_ROOT, RunRefused, err, fmt, interrupt_code, interrupt_reason, link_latest,
    load, make_dir, read_calibration, warn,
)
from rollcall.scenario import Scenario, load_scenario

__all__ = ["cmd_calibrate", "cmd_compare", "cmd_sweep", "prepare_compare"]


def compare_output(args: argparse.Namespace, scenario: Scenario, cmp: Any,
                    out_dir: Path) -> int:
    """Print the compare's answer (table, intervals, verdict; or one JSON object); the exit code."""
    import json

    from rollcall.app import verdict as vd
    from rollcall.app.interval import describe

    code = 1 if cmp.problems else 0
    for line in cmp.problems:
        err(f"compare: {line}")
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
    out_dir = Path(out) if out else RUNS_ROOT / scenario.name / f"{cli_common.utc_stamp()}-compare"
    make_dir(out_dir, scenario)
    return compare, out_dir


def cmd_compare(args: argparse.Namespace) -> int:
    from rollcall.app.interval import checkpoint_intervals, describe

    scenario = load(args)
    try:
        compare, out_dir = prepare_compare(scenario, args.out, max_history_mb=args.max_history_mb,
                                           force=args.force)
    except RunRefused as exc:
        err(str(exc))
        return 2
    first = scenario.seed if args.seed is None else args.seed
    seeds = list(range(first, first + args.seeds))
    err(describe(checkpoint_intervals(scenario, fixed=args.fixed_interval)))
    options: dict[str, Any] = {"fixed_interval": args.fixed_interval,
                               "max_wall_s": args.max_wall_s}
    from rollcall.app.engines import EngineError

    engine, started = None, False
    stop = interrupts.Stop()  # rebound by the block; here for a signal before it is entered
    try:
        with interrupts.catch() as stop:
            engine = open_engine(args, scenario, out_dir, os.cpu_count() or 1)
            started = True
            options["stop"] = stop  # every run of the compare polls it
            if engine is not None:
                options["engine"] = engine
            cmp = compare(scenario, seeds, out_dir, **options)
    except KeyboardInterrupt as exc:
        err(f"interrupted; the finished runs are in {out_dir / 'compare.csv'} "
             f"({interrupt_reason(stop, exc)}; run the same command to resume)")
        return interrupt_code(stop, str(exc))
    except EngineError as exc:
        return engine_failed("compare", exc, out_dir, started)
    finally:
        if engine is not None:
            engine.close()
    return compare_output(args, scenario, cmp, out_dir)


def sweep_problem(args: argparse.Namespace, scenario: Scenario) -> str | None:
    """Why ``sweep`` cannot run as asked (one line), or None."""
    from rollcall.results import SUMMARY_KEYS

    if args.rel_accuracy is not None and args.max_seeds < args.seeds:
        return f"sweep: --max-seeds {args.max_seeds} is below --seeds {args.seeds}"
    if args.metric not in SUMMARY_KEYS:
        return (f"sweep: --metric {args.metric!r} is not a summary key (e.g. elapsed_s, goodput, "
                f"ettr)")
    return checks.run_problem(scenario, False, False, args.max_history_mb, args.force)


def sweep_dir(args: argparse.Namespace, scenario: Scenario) -> Path:
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


def cmd_sweep(args: argparse.Namespace) -> int:
    from rollcall.app import sweeps
    from rollcall.app.engines import EngineError

    try:
        grid = sweeps.parse_grid(args.grid)
    except ValueError as exc:
        err(str(exc))
        return 2
    scenario = load_scenario(args.scenario, args.set, target=args.target)
    warn(args.scenario, scenario)
    calibration = read_calibration(args, scenario)
    problem = sweep_problem(args, scenario)
    if problem is not None:
        err(problem)
        return 2
    out_dir = sweep_dir(args, scenario)
    strategies = tuple(args.strategy) if args.strategy else sweeps.STRATEGIES
    jobs = args.jobs
    if scenario.target == "real" and jobs > 1:
        # each real point is a whole process group; two at once share the CPUs and time out
        err(f"sweep --target real: one run at a time (not --jobs {jobs})")
        jobs = 1
    engine, started = None, False
    stop = interrupts.Stop()  # rebound by the block; here for a signal before it is entered
    try:
        with interrupts.catch(immediate=True) as stop:
            engine = open_engine(args, scenario, out_dir, jobs)
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
            link_latest(out_dir)
        err(f"interrupted; finished runs kept in {out_dir} "
             f"({interrupt_reason(stop, exc)}; run the same command to resume)")
        return interrupt_code(stop, str(exc))
    except EngineError as exc:
        if out_dir.is_dir():
            link_latest(out_dir)
        return engine_failed("sweep", exc, out_dir, started)
    finally:
        if engine is not None:
            engine.close()
    link_latest(out_dir)
    return sweep_outcome(args, list(grid), df, out_dir)


def sweep_outcome(args: argparse.Namespace, grid: list[str], df: Any, out_dir: Path) -> int:
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
            err(f"sweep: {out_dir / str(run_dir)} {what}")
    print(f"runs: {len(df)}  not completed: {len(incomplete)}  invalid: {len(invalid)}")
    print(f"out: {out_dir}")
    print(f"csv: {out_dir / sweeps.CSV_FILE}")
    return 1 if len(incomplete) or len(invalid) else 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from rollcall.app import calibrate

    if args.suite:
        return cmd_calibrate_suite(args)
    if args.run_dir is None:
        err("calibrate: give RUN_DIR (one real run) or --suite --out FILE")
        return 2
    run_dir = Path(args.run_dir)
    try:
        cal = calibrate.measure(run_dir)
    except (OSError, ValueError) as exc:
        err(f"{run_dir}: {exc}")
        return 2
    out = Path(args.out) if args.out else run_dir / calibrate.CALIBRATION_FILE
    calibrate.write_calibration(cal, out)
    for key, value in calibrate.overrides(cal).items():
        print(f"{key}={fmt(value)}")
    print(f"out: {out}")
    return 0


def engine_failed(command: str, exc: Exception, out_dir: Path, started: bool) -> int:
    """One line; exit 2 when the engine could not start (bad input), 1 when a
    run failed on it (the others are kept, and the same command resumes)."""
    err(f"{command}: {exc}" + (f" (finished runs kept in {out_dir}; run the same command to "
                                f"resume)" if started else ""))
    return 1 if started else 2


def open_engine(args: argparse.Namespace, scenario: Scenario, out_dir: Path, jobs: int) -> Any:
    """The engine the flags ask for (None: the command's own default), or
    EngineError with the one line that says why not."""
    from rollcall.app.engines import EngineError, open_engine

    if args.engine is None or (args.engine == "local" and args.func is cmd_sweep):
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


def cmd_calibrate_suite(args: argparse.Namespace) -> int:
    import time

    from rollcall.app import suite

    if args.out is None:
        err("calibrate --suite: give --out FILE (the calibration file to write)")
        return 2
    out = Path(args.out)
    if out.is_dir():
        err(f"calibrate --suite: {out} is a directory; --out names the file to write")
        return 2
    runs = Path(args.runs) if args.runs else out.with_name(out.name + ".runs")
    t0 = time.monotonic()
    stop = interrupts.Stop()
    try:
        with interrupts.catch() as stop:
            dirs = suite.run(runs, say=lambda line: err(f"calibrate --suite: {line}"))
    except KeyboardInterrupt as exc:
        err(f"calibrate --suite: interrupted; the finished runs are in {runs}")
        return interrupt_code(stop, str(exc))
    except RuntimeError as exc:
        err(f"calibrate --suite: {exc}")
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
