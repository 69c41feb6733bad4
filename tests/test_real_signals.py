"""SIGINT and SIGTERM at exact instants of ``rollcall run`` on the real target.

Each test runs the real command (``tests/signal_at.py``: ``python -m
rollcall`` that signals itself at a named phase, so the instant is chosen,
not timed) and reads what it left: exit status, stderr, ``summary.json``,
the processes it started, its namespaces. The rules (rollcall.interrupts):
before the run directory exists a signal is one line and the signal's
status, nothing written; while the run runs, the signal's status and a
summary that says ``interrupted``; once the run has ended, its own result
and status. Never a traceback, never a process or namespace left, and a
second signal SIGKILLs every process of the run at once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable

import psutil
import pytest

from rollcall.results import read_summary
from real.netns import NETNS_DIR, netns_available
from real_processes import REAL_PROCESSES
from polling import pid_running

ROOT = Path(__file__).resolve().parent.parent
SEAM = Path(__file__).resolve().parent / "signal_at.py"
KILL_ONE = ROOT / "scenarios" / "real-kill-one.yaml"
SHORT = ["--set", "workload.steps=12", "--set", "failures.schedule=[]"]
EXIT_TIMEOUT_S = 300

pytestmark = REAL_PROCESSES


def _as_from_a_shell(ignored: tuple[signal.Signals, ...]) -> Callable[[], None]:
    """In the child before it runs: SIGINT and SIGTERM as a shell leaves them
    (default, unblocked), whatever this test process has, but ``ignored``."""
    def reset() -> None:
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_IGN if s in ignored else signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    return reset


def signalled_run(tmp_path: Path, hooks: list[str], scenario: Path = KILL_ONE,
                  extra: tuple[str, ...] = (),
                  ignored: tuple[signal.Signals, ...] = ()) -> tuple[int, str, Path]:
    """``rollcall run`` with ``hooks`` (PHASE:SIGNAL...); its status, stderr and run directory.
    ``ignored``: signals it starts with ignored (a shell's background job: SIGINT).
    Every process it started is checked gone (by PID, and by its run directory)."""
    out = tmp_path / "run"
    cmd = [sys.executable, str(SEAM), *hooks, "--", "run", str(scenario), "--out", str(out),
           "--quiet", *extra]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=_as_from_a_shell(ignored),
                            start_new_session=True)  # its own group: --group reaches only it
    try:
        _, err = proc.communicate(timeout=EXIT_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = err.decode(errors="replace")
    assert "Traceback" not in text, text
    left = [p.pid for p in psutil.process_iter(["cmdline"])
            if any(str(out) in a for a in p.info["cmdline"] or ()) and pid_running(p.pid)]
    assert not left, f"processes of the run left: {left}"
    return proc.returncode, text, out


def assert_interrupted(rc: int, err: str, out: Path, name: str) -> dict:
    assert rc == 128 + signal.Signals[name], err
    summary = read_summary(out)
    assert summary["result"] == "interrupted", summary["end_reason"]
    assert summary["end_reason"] == f"interrupted by {name}"
    assert (out / "history.jsonl").exists()
    assert not [p["pid"] for p in summary["processes"] if pid_running(p["pid"])]
    return summary


@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM"])
def test_a_signal_while_the_command_imports_is_one_line_and_writes_nothing(
        tmp_path: Path, name: str) -> None:
    rc, err, out = signalled_run(tmp_path, [f"importing:{name}"])
    assert rc == 128 + signal.Signals[name], err
    assert err.strip().splitlines() == [f"rollcall: interrupted by {name}"]
    assert not out.exists()


def test_a_background_job_still_ends_on_sigterm_while_it_imports(tmp_path: Path) -> None:
    """Started with SIGINT ignored (``rollcall run ... &`` from a script), the
    command keeps ignoring it, and SIGTERM while it imports is still one line
    and the signal's status."""
    rc, err, out = signalled_run(tmp_path, ["importing:SIGTERM"], ignored=(signal.SIGINT,))
    assert rc == 128 + signal.SIGTERM, err
    assert err.strip().splitlines() == ["rollcall: interrupted by SIGTERM"]
    assert not out.exists()


def test_a_signal_before_the_run_directory_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    rc, err, out = signalled_run(tmp_path, ["checks:SIGTERM"])
    assert rc == 143, err
    assert err.strip().splitlines() == ["rollcall: interrupted by SIGTERM"]
    assert not out.exists()


@pytest.mark.parametrize("signals", ["SIGTERM", "SIGINT,SIGINT"])
def test_a_signal_while_the_launcher_imports_torch_ends_the_run_cleanly(
        tmp_path: Path, signals: str) -> None:
    """A signal raised inside ``import torch`` left torch half imported, and the
    summary's next import of it failed (or crashed): no summary, a traceback."""
    rc, err, out = signalled_run(tmp_path, [f"importing-torch:{signals}"])
    assert_interrupted(rc, err, out, signals.split(",")[0])


def test_a_terminal_ctrl_c_reaches_the_launcher_alone(tmp_path: Path) -> None:
    """Ctrl-C goes to the terminal's whole process group. The workers, still
    importing torch, must not get it: the launcher stops them (SIGKILL, -9)."""
    rc, err, out = signalled_run(tmp_path, ["--group", "workers-started:SIGINT"])
    summary = assert_interrupted(rc, err, out, "SIGINT")
    codes = {p["worker"]: p["returncode"] for p in summary["processes"]}
    assert codes and set(codes.values()) == {-signal.SIGKILL}, codes


def test_a_second_signal_during_cleanup_kills_every_process_at_once(tmp_path: Path) -> None:
    """The first signal's cleanup had the signals ignored: a second one did nothing."""
    rc, err, out = signalled_run(tmp_path, ["workers-started:SIGINT", "cleanup:SIGINT"])
    assert "signal_at: alive after the signal: []" in err, err
    assert_interrupted(rc, err, out, "SIGINT")


@pytest.mark.parametrize("phase", ["writing-summary", "summary-written"])
def test_a_signal_after_the_run_ended_keeps_its_result(tmp_path: Path, phase: str) -> None:
    """The launcher decided (completed): a signal now changes neither the summary
    nor the exit status (it used to exit 130 beside a summary saying completed)."""
    rc, err, out = signalled_run(tmp_path, [f"{phase}:SIGINT"], extra=tuple(SHORT))
    summary = read_summary(out)
    assert summary["result"] == "completed" and summary["valid"], summary["violations"]
    assert rc == 0, err


@pytest.mark.skipif(netns_available() is not None, reason=netns_available() or "")
def test_a_signal_while_the_namespaces_are_made_leaves_none(tmp_path: Path) -> None:
    """A signal raised inside the making of a namespace lost its record (the
    launcher's interrupt was an Exception, which ``Network._make`` forgets): the
    namespace outlived the run."""
    rc, err, out = signalled_run(tmp_path, ["making-namespaces:SIGTERM"],
                                 scenario=ROOT / "scenarios" / "real-lose-host.yaml")
    assert_interrupted(rc, err, out, "SIGTERM")
    prefix = json.loads((out / "real" / "network.json").read_text())["prefix"]
    assert not [n for n in os.listdir(NETNS_DIR) if n.startswith(prefix + "-")]
    assert not [n for n in os.listdir("/sys/class/net") if n.startswith(prefix + "-")]
