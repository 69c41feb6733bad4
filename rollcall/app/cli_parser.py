"""The ``rollcall`` command line: each command's arguments, and nothing it does.

:func:`build_parser` is handed the function of each command
(:class:`Commands`, :mod:`rollcall.app.cli`'s), so this module imports no
command and the CLI imports it, never the other way round. The ``keeper``
and ``host`` commands' arguments are :mod:`rollcall.app.cli_hosts`'.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Callable, NamedTuple

from rollcall.app import cli_hosts, targets
from rollcall.app.checks import MAX_HISTORY_MB
from rollcall.cli_args import OneLineParser

__all__ = ["Commands", "STRATEGIES", "TARGETS", "build_parser"]

TARGETS = targets.TARGETS
STRATEGIES = ("elastic", "checkpoint-restart")

Command = Callable[[argparse.Namespace], int]


class Commands(NamedTuple):
    """The function that runs each command."""

    validate: Command
    run: Command
    compare: Command
    sweep: Command
    report: Command
    keeper: Command
    calibrate: Command


def build_parser(commands: Commands) -> argparse.ArgumentParser:
    """The ``rollcall`` parser; each command's namespace holds its function as ``func``."""
    parser = OneLineParser(
        prog="rollcall",
        description="Fault-injection and simulation testbed for elastic data-parallel training.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _validate(sub, commands.validate)
    _run(sub, commands.run)
    _compare(sub, commands.compare)
    _sweep(sub, commands.sweep)
    _report(sub, commands.report)
    cli_hosts.add_commands(sub, scenario_options, keeper=commands.keeper)
    _calibrate(sub, commands.calibrate)
    return parser


def scenario_options(p: argparse.ArgumentParser) -> None:
    """The scenario file and its overrides, common to the commands that load one."""
    p.add_argument("scenario", metavar="SCENARIO", help="scenario YAML file")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="override a scenario key, e.g. --set failures.worker_mtbf_s=3600 (value is YAML)",
    )
    p.add_argument(
        "--gpus", action=_GpusAction, dest="set", type=_positive_int, metavar="N",
        help="shorthand for --set cluster.gpus=N: N / cluster.gpus_per_worker workers "
             "(replaces the scenario's cluster.workers)",
    )


def _validate(sub: Any, command: Command) -> None:
    p = sub.add_parser("validate", help="check a scenario file and print its resolved identity")
    scenario_options(p)
    p.add_argument("--plan", action="store_true",
                   help="also print the resolved scenario, the worker id ranges, the fault "
                        "timeline, the failure-free time, the expected random failures and a "
                        "wall-time estimate (sim: unit costs timed by tiny runs, ~0.3 s)")
    p.set_defaults(func=command)


def _run(sub: Any, command: Command) -> None:
    p = sub.add_parser("run", help="run a scenario on a target")
    scenario_options(p)
    p.add_argument("--target", choices=TARGETS, help="override the scenario's target")
    p.add_argument("--seed", type=int, help="override the scenario's seed")
    p.add_argument("--strategy", choices=STRATEGIES, help="override strategy.kind")
    p.add_argument("--out", metavar="DIR",
                   help="run directory (default runs/<name>/<utc>-seed<S>/); refused when it "
                        "holds files, unless --force")
    p.add_argument("--quiet", action="store_true", help="print only the replay line")
    p.add_argument("--ledger", action="store_true",
                   help="sim: write the per-sample ledger whatever the run's size "
                        "(the real target always writes it)")
    p.add_argument("--max-wall-s", type=_positive_float, metavar="S",
                   help="end the run after S seconds of wall clock (completed: false, "
                        "end_reason 'wall limit: ...', history and summary kept; exit 1)")
    _size_options(p)
    _calibration_option(p)
    p.set_defaults(func=command)


def _compare(sub: Any, command: Command) -> None:
    p = sub.add_parser(
        "compare", help="run both strategies on the same seeds and decide which is faster",
        description="Run checkpoint-restart and elastic for seeds S..S+N-1 (same failure trace "
                    "per seed) on the sim or on real processes, print the table in human units, "
                    "the paired difference elastic - checkpoint-restart with its 95% interval "
                    "and a verdict. Exit 0 when every run completed and is valid, 1 when some "
                    "run did not (named on stderr), 2 on bad input, 130 on Ctrl-C.")
    scenario_options(p)
    p.add_argument("--seeds", type=_positive_int, default=5, metavar="N", help="number of seeds (default 5)")
    p.add_argument("--seed", type=int, help="first seed (default: the scenario's seed)")
    p.add_argument("--target", choices=TARGETS,
                   help="override the scenario's target: sim, or real (torch.distributed gloo "
                        "processes on this machine, one run at a time)")
    _interval_options(p)
    p.add_argument("--json", action="store_true",
                   help="print one JSON object on stdout (means, intervals, paired differences, "
                        "verdict, checkpoint interval, exit status) instead of the table")
    p.add_argument("--out", metavar="DIR", help="output directory (default runs/<name>/<utc>-compare/)")
    _size_options(p)
    _calibration_option(p)
    _engine_options(p)
    p.set_defaults(func=command)


def _sweep(sub: Any, command: Command) -> None:
    p = sub.add_parser("sweep", help="run a grid of keys x both strategies x seeds, resumable "
                                     "(exit 1 when some run did not complete or is not valid)")
    scenario_options(p)
    p.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                   help="a key and its values (YAML each), repeatable: the cartesian product is run")
    p.add_argument("--seeds", type=_positive_int, default=3, metavar="N", help="seeds per point (default 3)")
    p.add_argument("--seed", type=int, help="first seed (default: the scenario's seed)")
    p.add_argument("--jobs", type=_positive_int, default=os.cpu_count() or 1, metavar="J",
                   help="parallel processes (default: CPU count; 1 with --target real)")
    p.add_argument("--target", choices=TARGETS, help="override the scenario's target (default sim)")
    p.add_argument("--strategy", choices=STRATEGIES, action="append",
                   help="only this strategy (repeatable; default both)")
    p.add_argument("--rel-accuracy", type=_positive_float, metavar="R",
                   help="adaptive replication: after --seeds, add seeds to each point until the "
                        "95%% interval half-width of --metric is at most R of its mean (or "
                        "--max-seeds); sweep.csv's column seeds says how many each took")
    p.add_argument("--max-seeds", type=_positive_int, default=100, metavar="N",
                   help="with --rel-accuracy: at most N seeds per point (default 100)")
    p.add_argument("--metric", default="elapsed_s", metavar="KEY",
                   help="with --rel-accuracy: the summary key it is about (default elapsed_s)")
    p.add_argument("--out", metavar="DIR", help="sweep directory (default runs/<name>/sweep-<target>/)")
    p.add_argument("--quiet", action="store_true", help="no progress bar or table")
    _interval_options(p)
    _size_options(p)
    _calibration_option(p)
    _engine_options(p)
    p.set_defaults(func=command)


def _report(sub: Any, command: Command) -> None:
    p = sub.add_parser(
        "report", help="write DIR/report.html (and PNGs): timeline, goodput/ETTR, break-even, "
                       "checkpoint-interval U-curve, verdict",
        description="Draw a run, compare or sweep directory into one self-contained HTML page "
                    "(DIR/report.html, PNGs beside it; nothing fetched from the network) and "
                    "print its path. Exit 2 when DIR is missing, not a rollcall directory or an "
                    "unfinished run.")
    p.add_argument("dir", metavar="DIR", help="a run, compare or sweep directory (runs/latest: "
                                              "the last one written under runs/)")
    p.set_defaults(func=command)


def _calibrate(sub: Any, command: Command) -> None:
    p = sub.add_parser(
        "calibrate", help="measure a real run's costs (RUN_DIR), or this machine's with "
                          "the calibration suite (--suite --out FILE)")
    p.add_argument("run_dir", metavar="RUN_DIR", nargs="?",
                   help="a run directory of the real target")
    p.add_argument("--suite", action="store_true",
                   help="run the calibration suite: four short real runs, each cost measured "
                        "on its own and fitted by size (rollcall/app/suite.py); --out is its file")
    p.add_argument("--runs", metavar="DIR",
                   help="--suite: where its real runs go (default FILE's name + .runs/)")
    p.add_argument("--out", metavar="FILE",
                   help="output file (default RUN_DIR/calibration.yaml; required with --suite)")
    p.set_defaults(func=command)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def _size_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-history-mb", type=_positive_int, default=MAX_HISTORY_MB, metavar="MB",
                   help=f"refuse a run whose failure-free history.jsonl would be larger "
                        f"(default {MAX_HISTORY_MB})")
    p.add_argument("--force", action="store_true",
                   help="real target: start more worker processes than this machine seems to "
                        "hold (4 per CPU, 512 MiB each)" + (
                            "; and reuse a non-empty --out (its summary.json and history.jsonl "
                            "are removed first)" if p.prog.endswith(" run") else ""))


class _GpusAction(argparse.Action):
    """``--gpus N``: appends ``cluster.gpus=N`` to the ``--set`` items, in command-line order
    (so the replay line, the sweep's directory name and a later ``--set`` all see it)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        items = list(getattr(namespace, self.dest, None) or [])  # a copy: the default is shared
        setattr(namespace, self.dest, items + [f"cluster.gpus={values}"])


def _interval_options(p: argparse.ArgumentParser) -> None:
    """How compare and sweep choose each strategy's checkpoint interval, and their wall bound."""
    p.add_argument("--fixed-interval", action="store_true",
                   help="both strategies keep strategy.checkpoint_interval_steps (default: each "
                        "its own Daly optimum for the events that send it back to a checkpoint; "
                        "the scenario's when it has no random failures, the grid's when a sweep's "
                        "grid sets it)")
    p.add_argument("--max-wall-s", type=_positive_float, metavar="S",
                   help="end each run after S seconds of wall clock (completed: false, "
                        "end_reason 'wall limit: ...', kept as a run cut short)")


def _engine_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", choices=("local", "ray", "slurm"),
                   help="where the sim runs execute: local (a process pool here), ray (a Ray "
                        "cluster: a head of this command's own on loopback in a network "
                        "namespace of its own, or --address), slurm (job arrays through "
                        "submitit; --engine-opt slurm_partition=...). Default: local for sweep, "
                        "one run at a time here for compare")
    p.add_argument("--address", metavar="ADDR",
                   help="with --engine ray: an existing Ray cluster (token authentication "
                        "required: RAY_AUTH_MODE=token and its token)")
    p.add_argument("--engine-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="with --engine slurm: a submitit parameter (YAML value), repeatable: "
                        "slurm_partition=gpu, timeout_min=120, slurm_array_parallelism=64")
    p.add_argument("--retries", type=int, default=2, metavar="N",
                   help="runs again a run whose process or machine was lost, up to N times "
                        "(default 2); a run that fails is not")


def _calibration_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--calibration", metavar="FILE",
                   help="sim: this machine's costs from a calibration file (rollcall calibrate "
                        "--suite --out FILE, or one run's calibration.yaml), evaluated at the "
                        "scenario's size; what the scenario means (faults, timeouts) is kept")
