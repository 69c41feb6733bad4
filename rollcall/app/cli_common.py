"""What the ``rollcall`` commands share: one-line errors, loading a scenario
with its calibration, the run directories and ``runs/latest``, and the exit
status of a command a signal ended."""

from __future__ import annotations

import argparse
import signal
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rollcall import interrupts
from rollcall.results import prepare_out_dir, update_latest
from rollcall.scenario import Scenario, ScenarioError, load_scenario

__all__ = ["RUNS_ROOT", "RunRefused", "err", "fmt", "interrupt_code",
           "interrupt_reason", "link_latest", "load", "make_dir", "read_calibration", "utc_stamp",
           "warn"]


def utc_stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def err(message: str) -> None:
    print(f"rollcall: {message}", file=sys.stderr)


def load(args: argparse.Namespace) -> Scenario:
    scenario = load_scenario(
        args.scenario,
        args.set,
        seed=getattr(args, "seed", None),
        target=getattr(args, "target", None),
        strategy=getattr(args, "strategy", None),
    )
    warn(args.scenario, scenario)
    doc = read_calibration(args, scenario)
    if doc is not None:
        from rollcall.app import suite

        scenario = suite.calibrated(scenario, doc)
    return scenario


def read_calibration(args: argparse.Namespace, scenario: Scenario) -> dict[str, Any] | None:
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


def warn(source: str, scenario: Scenario) -> None:
    """Say what the scenario will not do although it says so (a fault that never fires)."""
    for field, message in scenario.warnings():
        err(f"warning: {source}: {field}: {message}")


def fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "-" if value is None else str(value)


#: the default root of run, compare and sweep directories (its ``latest`` link is kept)
RUNS_ROOT = Path("runs")


def link_latest(out_dir: Path) -> None:
    """``runs/latest`` -> ``out_dir`` when it lies under runs/; a failure is a warning only."""
    try:
        update_latest(out_dir, RUNS_ROOT)
    except OSError as exc:
        err(f"warning: {RUNS_ROOT / 'latest'}: cannot update the link: {exc.strerror or exc}")


def make_dir(out_dir: Path, scenario: Scenario) -> None:
    """Make a run or compare directory (its scenario.yaml) and point runs/latest at
    it; RunRefused when it cannot be made."""
    try:
        prepare_out_dir(out_dir, scenario)
    except OSError as exc:
        raise RunRefused(f"{out_dir}: cannot create the run directory: "
                         f"{exc.strerror or exc}") from None
    link_latest(out_dir)


class RunRefused(Exception):
    """A run that must not start as asked (too large for the machine or the disk, an
    ``--out`` in use); ``str()`` is one line. The CLI prints it and exits 2."""


def interrupt_code(stop: interrupts.Stop, named: str) -> int:
    """130 or 143: the signal we caught, else the one ``named`` (a real launcher's reason)."""
    if stop.exit_code is not None:
        return stop.exit_code
    return interrupts.exit_code_of_reason(named)


def interrupt_reason(stop: interrupts.Stop, exc: KeyboardInterrupt) -> str:
    """``interrupted (SIGINT)``: the signal we caught, or the one a real launcher named."""
    return f"interrupted ({signal.Signals(interrupt_code(stop, str(exc)) - 128).name})"
