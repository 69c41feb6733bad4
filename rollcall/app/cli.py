"""The ``rollcall`` command: validate a scenario, run it on a target, build a report.

The commands of many runs (``compare``, ``sweep``, ``calibrate``) are
:mod:`rollcall.app.cli_studies`'; what every command shares (errors, loading,
run directories) is :mod:`rollcall.app.cli_common`'. The CLI is the only
part of the program that may read the wall clock (for the default run
directory name). It reaches a driver only through
:mod:`rollcall.app.targets`, when a command runs, so ``rollcall`` itself
never imports ``sim`` or ``real``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path
from typing import Any, Sequence

from rollcall import interrupts
from rollcall.app import targets

interrupts.quit_until_main("rollcall")  # before the slow imports: a signal there is one line

from rollcall.app import checks, cli_common  # noqa: E402
from rollcall.app.cli_common import (  # noqa: E402
    RunRefused, err, fmt, interrupt_code, load, make_dir,
)
from rollcall.app.cli_parser import Commands, build_parser  # noqa: E402
from rollcall.app.cli_studies import cmd_calibrate, cmd_compare, cmd_sweep  # noqa: E402
from rollcall.results import OutDirError, claim_out_dir, default_out_dir  # noqa: E402
from rollcall.scenario import Scenario, ScenarioError  # noqa: E402

__all__ = ["RunRefused", "main", "run_scenario"]


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
        ("steps", f"{fmt(summary.get('steps_committed'))}/{fmt(summary.get('steps_target'))}"),
        ("elapsed_s", summary.get("elapsed_s")),
        ("ettr", summary.get("ettr")),
        ("goodput", summary.get("goodput")),
        ("failures", summary.get("failures")),
        ("generations", summary.get("generations")),
        ("restarts", summary.get("restarts")),
        ("samples dup/skipped",
         f"{fmt(summary.get('samples_duplicated'))}/{fmt(summary.get('samples_skipped'))}"),
        ("wall_s", summary.get("wall_s")),
        ("out dir", str(out_dir)),
    ]
    for key, value in rows:
        table.add_row(key, fmt(value))
    violations = summary.get("violations") or []
    if violations:
        table.add_row("violations", "; ".join(str(v) for v in violations[:5]))
    class _Console(Console):
        def on_broken_pipe(self) -> None:  # rich's own exits 1; ours is the CLI's (141)
            raise BrokenPipeError

    _Console().print(table)


def _cmd_validate(args: argparse.Namespace) -> int:
    scenario = load(args)
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
    base = default_out_dir(scenario, cli_common.utc_stamp())
    path, n = base, 1
    while path.exists():  # two runs within one second of each other
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


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
        make_dir(out_dir, scenario)
        options: dict[str, Any] = dict(driver_options or {})
        if max_wall_s is not None:
            options["max_wall_s"] = max_wall_s
        if ledger:
            options["ledger"] = True
        # the sim polls the stop; the launcher's loop also wakes at a signal,
        # and a second one kills its processes
        summary = run(scenario, out_dir, stop=stop, **options)
    if summary.get("result") != "interrupted":  # the run decided: a later signal changes nothing
        return summary, out_dir, None
    return summary, out_dir, interrupt_code(stop, str(summary.get("end_reason", "")))


def _cmd_run(args: argparse.Namespace) -> int:
    # Until the run directory exists a signal ends the command at once (one line,
    # nothing written); from then on the first one asks the run to stop and the
    # summary says so, and once the run has ended it changes nothing (a second
    # one still ends the command: run_scenario, interrupts.catch).
    with interrupts.catch(immediate=True) as stop:
        scenario = load(args)
        try:
            summary, out_dir, code = run_scenario(
                scenario, out=args.out, force=args.force, ledger=args.ledger,
                max_wall_s=args.max_wall_s, max_history_mb=args.max_history_mb, stop=stop)
        except RunRefused as exc:
            err(str(exc))
            return 2
        if code is not None:
            err(f"{summary.get('end_reason') or 'interrupted'}; "
                 f"history and summary (result: {summary.get('result')}) in {out_dir}")
            return code
        if not args.quiet:
            _print_summary(summary, out_dir)
        print(_replay_line(args, scenario))
        return 0 if summary.get("completed") and summary.get("valid") else 1


def _cmd_keeper(args: argparse.Namespace) -> int:
    """``rollcall keeper`` (:mod:`rollcall.app.cli_hosts`): a real run whose hosts run apart."""
    from rollcall.app.cli_hosts import keeper_problem

    scenario = load(args)  # target real (the parser's default)
    problem = keeper_problem(scenario, args.bind, args.max_wall_s)
    if problem is not None:
        err(problem)
        return 2
    try:
        summary, out_dir, code = run_scenario(
            scenario, out=args.out, force=args.force, max_wall_s=args.max_wall_s,
            driver_options={"bind": args.bind, "external_hosts": True})
    except RunRefused as exc:
        err(str(exc))
        return 2
    if code is not None:
        return code
    _print_summary(summary, out_dir)
    return 0 if summary.get("completed") and summary.get("valid") else 1


def _cmd_report(args: argparse.Namespace) -> int:
    from rollcall.app.report import ReportError, build

    try:
        path = build(args.dir)
    except ReportError as exc:
        err(str(exc))
        return 2
    except OSError as exc:
        err(f"{args.dir}: cannot write the report: {exc.strerror or exc}")
        return 2
    print(path)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rollcall`` console script; returns the exit code."""
    args = build_parser(Commands(
        validate=_cmd_validate, run=_cmd_run, compare=cmd_compare, sweep=cmd_sweep,
        report=_cmd_report, keeper=_cmd_keeper, calibrate=cmd_calibrate)).parse_args(argv)
    try:
        with interrupts.catch(immediate=True):  # a command's own catch blocks refine this
            code = int(args.func(args))
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        interrupts.finish_on_signal("rollcall", code)  # decided and said: a signal now keeps it
        if args.func is _cmd_run:  # nothing of a run is left to tear down
            interrupts.exit_now("rollcall", code)
        return code
    except ScenarioError as exc:
        err(str(exc))
        return 2
    except BrokenPipeError:
        return _broken_pipe()
    except interrupts.Interrupted as exc:
        err(f"interrupted by {exc}")
        return exc.exit_code
    except KeyboardInterrupt:
        err("interrupted")
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
