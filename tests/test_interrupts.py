"""Interrupts: SIGINT and SIGTERM on the sim and the CLI keep the results and say so.

The runs are real ``python -m rollcall`` processes; a test waits (bounded,
polling) until the history has records, then signals, and reads what the
process left: exit status, ``summary.json``, ``history.jsonl``, processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from rollcall import interrupts
from rollcall.app.comparison import RUNS_FILE, compare
from rollcall.results import SUMMARY_KEYS, read_summary
from rollcall.scenario import load_scenario
from polling import pid_running, signal_when, wait_for

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"
# a failure-free-after-the-start run that would take days, a record per step
LONG = ["--set", "workload.steps=100000000", "--set", "strategy.checkpoint_interval_steps=1",
        "--max-history-mb", "1000000"]


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT))


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def _interrupt_run(tmp_path: Path, signum: int) -> tuple[int, str, int, Path, set[int]]:
    """Start a long sim run, signal it once it has written history; what it left."""
    out = tmp_path / "run"
    rc, err, before, seen = signal_when(
        ["run", str(QUICKSTART), "--out", str(out), "--quiet", *LONG], tmp_path, signum,
        lambda _: _lines(out / "history.jsonl"), "history records on disk")
    return rc, err, before, out, seen


@pytest.mark.timeout(300)
@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signalled_sim_run_keeps_its_history_and_says_interrupted(
        tmp_path: Path, signum: int, code: int) -> None:
    rc, err, before, out, seen = _interrupt_run(tmp_path, signum)
    name = signal.Signals(signum).name
    assert rc == code, err
    assert "Traceback" not in err, err
    assert f"interrupted by {name}" in err and str(out) in err, err
    s = read_summary(out)
    assert s["result"] == "interrupted" and s["completed"] is False
    assert s["end_reason"] == f"interrupted by {name}"
    assert s["valid"] is True, s["violations"]
    assert not set(SUMMARY_KEYS) - s.keys()
    assert 0 < s["steps_committed"] < s["steps_target"]
    lines = (out / "history.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) > before  # the buffer was flushed, not cut at a 4,096 boundary
    last = json.loads(lines[-1])  # complete JSON
    assert last["f"] == "end" and last["completed"] is False
    assert last["reason"] == f"interrupted by {name}"
    assert not [pid for pid in seen if psutil.pid_exists(pid)]
    assert not psutil.Process().children(recursive=True)


@pytest.mark.parametrize("quiet", [[], ["--quiet"]])  # the rich table; the replay line alone
def test_a_closed_stdout_ends_the_run_without_a_traceback(tmp_path: Path, quiet: list) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before a byte is written: every write fails
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "rollcall", "run", str(QUICKSTART), "--out",
             str(tmp_path / "run"), *quiet], cwd=tmp_path, env=_env(), stdout=write_end,
            stderr=subprocess.PIPE, timeout=120)
    finally:
        os.close(write_end)
    err = proc.stderr.decode()
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert proc.returncode == 141, err
    assert read_summary(tmp_path / "run")["completed"] is True


def test_head_one_of_a_run_prints_one_line_and_no_traceback(tmp_path: Path) -> None:
    cmd = (f"{sys.executable} -m rollcall run {QUICKSTART} --out {tmp_path / 'run'} | head -1")
    proc = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, env=_env(),
                          capture_output=True, timeout=120)
    assert proc.returncode == 0
    assert len(proc.stdout.decode().splitlines()) == 1
    assert b"Traceback" not in proc.stderr, proc.stderr.decode()


def test_an_interrupted_compare_keeps_finished_runs_and_resumes(tmp_path: Path) -> None:
    from sim.driver import run as sim_run

    sc = load_scenario(QUICKSTART, [])
    out = tmp_path / "cmp"
    calls: list[str] = []

    def interrupted_second(s: Any, run_dir: Path) -> dict:
        calls.append(s.strategy.kind)
        if len(calls) == 2:
            raise KeyboardInterrupt("interrupted by SIGINT")
        return sim_run(s, run_dir)

    with pytest.raises(KeyboardInterrupt):
        compare(sc, [0], out, interrupted_second, log=lambda line: None)
    assert len(calls) == 2 and (out / RUNS_FILE).exists()
    kept = sorted(p.name for p in out.iterdir() if (p / "summary.json").exists())
    calls.clear()

    def counted(s: Any, run_dir: Path) -> dict:
        calls.append(s.strategy.kind)
        return sim_run(s, run_dir)

    logged: list[str] = []
    cmp = compare(sc, [0], out, counted, log=logged.append)
    assert len(kept) == 1 and len(calls) == 1, (kept, calls)  # the finished run is not redone
    assert sum("done before, kept" in line for line in logged) == 1
    assert len(cmp.runs) == 2 and not cmp.problems
    # a changed scenario makes the kept runs stale: both run again
    calls.clear()
    compare(load_scenario(QUICKSTART, ["workload.steps=200"]), [0], out, counted,
            log=lambda line: None)
    assert len(calls) == 2


def test_the_first_signal_asks_and_the_second_raises() -> None:
    old = signal.getsignal(signal.SIGTERM)
    with interrupts.catch() as stop:
        assert stop.reason() is None
        os.kill(os.getpid(), signal.SIGTERM)
        wait_for(stop.reason, 10, "the handler")
        assert stop.reason() == "interrupted by SIGTERM" and stop.exit_code == 143
        with pytest.raises(interrupts.Interrupted) as info:
            os.kill(os.getpid(), signal.SIGINT)
            wait_for(lambda: False, 10, "the second signal")
    assert info.value.exit_code == 130
    assert signal.getsignal(signal.SIGTERM) is old


def test_exit_code_of_a_launcher_reason() -> None:
    assert interrupts.exit_code_of_reason("interrupted by SIGTERM") == 143
    assert interrupts.exit_code_of_reason("interrupted by SIGINT") == 130
    assert interrupts.exit_code_of_reason("") == 130


@pytest.mark.timeout(300)
@pytest.mark.parametrize("signum, code, jobs", [(signal.SIGINT, 130, 1), (signal.SIGTERM, 143, 2)])
def test_a_signalled_sweep_stops_keeps_its_csv_and_leaves_no_process(
        tmp_path: Path, signum: int, code: int, jobs: int) -> None:
    """A sweep whose points would run for days: the signal ends it at once,
    its pool's processes with it (a SIGTERM reaches the sweep alone, not its
    pool), and ``sweep.csv`` is written for the (no) finished points."""
    out = tmp_path / "sweep"
    cmd = ["sweep", str(QUICKSTART), "--out", str(out), "--quiet", "--seeds", "2",
           "--jobs", str(jobs), "--strategy", "elastic", "--grid", "cluster.workers=4", *LONG]

    def started(me: psutil.Process) -> bool:  # history written, and the whole pool up
        return bool(sum(_lines(p) for p in out.glob("**/history.jsonl"))) and (
            jobs == 1 or len(me.children()) >= jobs)

    rc, text, _, seen = signal_when(cmd, tmp_path, signum, started,
                                     "sweep points writing history, and the pool")
    name = signal.Signals(signum).name
    assert rc == code, text
    assert "Traceback" not in text, text
    assert f"interrupted ({name})" in text and str(out) in text, text
    assert (out / "sweep.csv").exists()
    assert jobs == 1 or len(seen) >= jobs, seen
    assert wait_for(lambda: not [p for p in seen if pid_running(p)], 30,
                    "the pool's processes gone")


@pytest.mark.timeout(300)
def test_a_sigterm_to_compare_ends_the_run_cleanly_and_says_how_to_resume(tmp_path: Path) -> None:
    """The run in progress stops at a consistent point (its summary says
    interrupted, its history is valid) and the command exits 143."""
    out = tmp_path / "cmp"
    rc, text, _, _ = signal_when(
        ["compare", str(QUICKSTART), "--out", str(out), "--seeds", "1", *LONG], tmp_path,
        signal.SIGTERM, lambda _: sum(_lines(p) for p in out.glob("*/history.jsonl")),
        "the first run writing history")
    assert rc == 143, text
    assert "Traceback" not in text and "run the same command to resume" in text, text
    (run_dir,) = [p.parent for p in out.glob("*/history.jsonl")]
    s = read_summary(run_dir)
    assert s["result"] == "interrupted" and s["end_reason"] == "interrupted by SIGTERM"
    assert s["valid"] is True, s["violations"]
    assert not psutil.Process().children(recursive=True)


def test_a_second_signal_runs_the_kill_callbacks_and_waits_for_the_shield() -> None:
    """The first signal wakes a selector and raises nothing; the second runs the
    callbacks (the real launcher's SIGKILLs) at once, but is raised only as the
    shielded section (a process being started and recorded) ends."""
    killed: list[int] = []
    with interrupts.catch() as stop:
        stop.on_second(lambda: killed.append(stop.count))
        wake = stop.wake_fd()
        os.kill(os.getpid(), signal.SIGINT)
        wait_for(stop.reason, 10, "the first signal")
        assert wake.recv(16) == b"!" and not killed
        with pytest.raises(interrupts.Interrupted):
            with stop.shielded():
                os.kill(os.getpid(), signal.SIGTERM)
                wait_for(lambda: killed, 10, "the second signal's callback")
                assert killed == [2]  # ran inside the shield, which was not cut
        with stop.shielded(then_raise=False):  # the end of a program: nothing left to stop
            os.kill(os.getpid(), signal.SIGTERM)
            wait_for(lambda: len(killed) == 2, 10, "the third signal's callback")
    assert stop.exit_code == 130


def test_the_early_handler_is_only_the_commands_own() -> None:
    """Importing the CLI from a test, the API or a host agent leaves the handlers alone."""
    old = signal.getsignal(signal.SIGTERM)
    interrupts.quit_until_main("rollcall")
    interrupts.finish_on_signal("rollcall", 0)
    assert signal.getsignal(signal.SIGTERM) is old


def test_a_sim_that_crashes_keeps_every_record_written_before(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An invariant that fails inside the sim (a bug) raises, but the history
    up to it is on disk, not lost in the unflushed batch: the restart record
    written just before the failing relaunch is there."""
    from sim import driver, machines

    def broken(self: Any, now: float, order: Any) -> None:
        raise AssertionError("a relaunch that breaks an invariant")

    monkeypatch.setattr(machines.Machines, "relaunch", broken)
    base = load_scenario(QUICKSTART)
    sc = base.model_validate({**base.model_dump(), "strategy": {
        **base.strategy.model_dump(), "kind": "checkpoint-restart"}})
    with pytest.raises(AssertionError, match="breaks an invariant"):
        driver.run(sc, tmp_path)
    records = [json.loads(line) for line in (tmp_path / "history.jsonl").open()]
    assert len(records) < 4096, "fewer than one batch: none of them was flushed before"
    assert records[-1]["f"] in ("restart", "relaunch"), records[-1]


def test_a_sim_spinning_at_one_instant_raises_and_keeps_its_history(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A livelock (an event that keeps scheduling itself at the same simulated
    instant) does not hang the run: past the bound of events at one instant
    it raises :class:`SimulationStuck` naming the instant, with or without
    a stop hook, and the history written before is on disk."""
    from sim import driver, stepping

    monkeypatch.setattr(stepping, "SPIN_EVENTS", 20_000)
    monkeypatch.setattr(stepping, "SPIN_EVENTS_PER_NODE", 0)
    for stop in (None, interrupts.Stop()):  # no signal: the stop never ends the run
        out = tmp_path / ("hooked" if stop else "plain")
        out.mkdir()
        sim = driver.Simulation(load_scenario(QUICKSTART), out)

        def again() -> None:
            sim.at(sim.env.now, again)

        sim.at(1.0, again)
        with pytest.raises(driver.SimulationStuck, match=r"at simulated t=1\.0 s"):
            sim.run(stop=stop)
        records = [json.loads(line) for line in (out / "history.jsonl").open()]
        assert records[0]["f"] == "start" and any(r["f"] == "generation" for r in records)
