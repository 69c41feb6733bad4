"""``failures``: one definition for both targets (rollcall.core.FailureTally).

A worker a kill, crash or rack kill took out counts once; a pause counts
only if the keeper evicted the paused worker for its silence before it
resumed ("a pause counts as a failure only if it caused an
eviction"). The conformance test checks sim and real agree on every
shipped real scenario; here, the rule itself and the sim summary.
"""

from __future__ import annotations

from pathlib import Path

from rollcall.core import FailureTally, rec
from rollcall.results import read_history
from rollcall.scenario import load_scenario
from sim import driver as sim_driver

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"


def fault(t: float, kind: str, *workers: int) -> dict:
    return rec(t, "info", "fault", "nemesis", kind=kind, workers=list(workers))


def evict(t: float, worker: int, reason: str) -> dict:
    return rec(t, "info", "evict", "keeper", worker=worker, incarnation=0, reason=reason)


def test_each_worker_a_kill_takes_out_counts() -> None:
    records = [fault(1, "kill", 3), fault(2, "crash", 4), fault(3, "kill_rack", 0, 1),
               fault(4, "join", 9, 10), fault(5, "repair", 3)]
    assert FailureTally.of(records) == 4


def test_a_pause_counts_only_if_it_cost_the_membership() -> None:
    ridden_out = [fault(1, "pause", 2), fault(2, "resume", 2)]
    evicted = [fault(1, "pause", 2), evict(2, 2, "timeout"), fault(3, "resume", 2)]
    assert FailureTally.of(ridden_out) == 0
    assert FailureTally.of(evicted) == 1


def test_an_eviction_after_the_resume_or_for_another_reason_is_not_the_pause() -> None:
    after = [fault(1, "pause", 2), fault(2, "resume", 2), evict(3, 2, "timeout")]
    other = [fault(1, "pause", 2), evict(2, 2, "restarted"), evict(2.5, 5, "timeout")]
    assert FailureTally.of(after) == 0
    assert FailureTally.of(other) == 0


def test_a_paused_worker_killed_counts_once() -> None:
    records = [fault(1, "pause", 2), fault(2, "kill", 2), evict(3, 2, "timeout")]
    assert FailureTally.of(records) == 1
    twice = [fault(1, "pause", 2), evict(2, 2, "timeout"), evict(2.5, 2, "timeout")]
    assert FailureTally.of(twice) == 1  # one pause, one failure


def _sim(tmp_path: Path, name: str, *overrides: str) -> tuple[dict, list[dict]]:
    sc = load_scenario(SCENARIOS / f"{name}.yaml", ["target=sim", *overrides])
    summary = sim_driver.run(sc, tmp_path)
    return summary, list(read_history(tmp_path))


def test_sim_summary_counts_an_evicting_pause(tmp_path: Path) -> None:
    """kill-pause-join: a kill and a 10 s pause past a 3 s timeout: 2 failures."""
    summary, history = _sim(tmp_path, "kill-pause-join")
    assert summary["pauses"] == 1 and summary["kills"] == 1
    assert summary["failures"] == FailureTally.of(history) == 2


def test_sim_summary_does_not_count_a_pause_the_job_rode_out(tmp_path: Path) -> None:
    """The same pause, shorter than the detector timeout: only the kill counts."""
    summary, history = _sim(tmp_path, "kill-pause-join", "failures.schedule.1.for_s=1.0")
    assert summary["pauses"] == 1
    assert not any(r["f"] == "evict" and r["worker"] == 2 for r in history)
    assert summary["failures"] == FailureTally.of(history) == 1
