"""The core's account of where a run's time went (``rollcall.core.accounting``).

Hand-written histories check each category's rule (a committed step, a
checkpoint under a vote in flight, a refused commit, a step abandoned by a
kill, a cut the job stalls on, a growth roll call, a pause ridden out, a
rollback's cut record, a run that gave up); a property test checks the sweep against counting on a
grid of instants, and that the five parts always sum to the elapsed time;
a sim run's summary is the account of its own history.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, strategies as st

from rollcall.config import data_spec
from rollcall.core import check, time_account
from rollcall.core.accounting import _sweep
from rollcall.scenario import parse_scenario


def gen(t: float, g: int, reason: str = "failure") -> list[dict[str, Any]]:
    """A roll call opening at ``t`` and generation ``g`` formed at once (the first: at start)."""
    opened = {"f": "round", "type": "invoke", "t": t, "gen": g, "reason": "start" if g == 1 else reason}
    return [opened, {"f": "generation", "type": "ok", "t": t, "gen": g}]


def commit(t0: float, t: float, g: int, step: int, last: int | None = None) -> dict[str, Any]:
    return {"f": "commit", "type": "ok", "t0": t0, "t": t, "gen": g, "step": step,
            "last": step if last is None else last}


def fault(t: float, kind: str) -> dict[str, Any]:
    return {"f": "fault", "type": "info", "t": t, "kind": kind}


def account(records: list[dict[str, Any]], lineage: list[dict[str, Any]], completed: bool = True):
    a = time_account(sorted(records, key=lambda r: r["t"]), lineage, completed)
    parts = a.productive_s + a.checkpoint_s + a.lost_work_s + a.recovery_s + a.stall_s
    assert parts == pytest.approx(a.elapsed_s)
    return a


def test_committed_steps_are_productive_and_a_checkpoint_yields_to_a_vote_in_flight() -> None:
    c1, c2 = commit(1.0, 3.0, 1, 0, 1), commit(3.5, 5.0, 1, 2, 3)
    ckpt = {"f": "checkpoint", "type": "ok", "t0": 2.9, "t": 3.5, "gen": 1}
    a = account(gen(0.0, 1) + [c1, ckpt, c2], [c1, c2])
    assert (a.elapsed_s, a.productive_s, a.checkpoint_s) == pytest.approx((5.0, 3.5, 0.5))
    assert a.recovery_s == pytest.approx(1.0)  # the start, until the first step
    assert a.lost_work_s == a.stall_s == 0.0


def test_a_refused_commit_is_lost() -> None:
    good, refused = commit(0.0, 1.0, 1, 0), commit(1.0, 2.0, 1, 1)
    later = commit(2.5, 3.0, 2, 1)
    a = account(gen(0.0, 1) + [good, refused] + gen(2.0, 2) + [later], [good, later])
    assert (a.productive_s, a.lost_work_s, a.recovery_s) == pytest.approx((1.5, 1.0, 0.5))


def test_a_killed_member_costs_the_step_in_flight_a_stall_and_a_recovery() -> None:
    before, after = commit(0.0, 2.0, 1, 0, 3), commit(4.0, 5.0, 2, 4)
    a = account(gen(0.0, 1) + [before, fault(2.5, "kill")] + gen(3.5, 2) + [after], [before, after])
    assert (a.productive_s, a.lost_work_s, a.stall_s, a.recovery_s) == pytest.approx(
        (3.0, 0.5, 1.0, 0.5))


def test_a_cut_before_the_last_commit_stalls_the_job_from_that_commit() -> None:
    before, after = commit(0.0, 2.0, 1, 0, 3), commit(4.0, 5.0, 2, 4)
    a = account(gen(0.0, 1) + [fault(1.5, "isolate_keeper"), before] + gen(3.5, 2) + [after],
                [before, after])
    assert (a.lost_work_s, a.stall_s, a.recovery_s) == pytest.approx((0.0, 1.5, 0.5))


def test_a_growth_roll_call_abandons_a_running_step_and_a_healed_cut_is_over() -> None:
    before, after = commit(0.0, 2.0, 1, 0, 3), commit(4.0, 5.0, 2, 4)
    records = gen(0.0, 1) + [fault(0.5, "partition"), fault(1.0, "heal"), before]
    a = account(records + [fault(3.0, "join")] + gen(3.5, 2, "growth") + [after], [before, after])
    assert (a.lost_work_s, a.stall_s, a.recovery_s) == pytest.approx((1.5, 0.0, 0.5))


def test_a_fault_of_an_older_generation_does_not_stall_a_later_one() -> None:
    c1, c2, c3 = commit(0.0, 1.0, 1, 0), commit(2.0, 3.0, 2, 1), commit(4.0, 5.0, 3, 2)
    records = gen(0.0, 1) + [c1, fault(1.0, "kill")] + gen(1.5, 2) + [c2]
    a = account(records + gen(3.5, 3, "growth") + [c3], [c1, c2, c3])
    assert (a.lost_work_s, a.stall_s) == pytest.approx((0.5, 0.5))


def test_a_pause_ridden_out_stalls_the_step_it_holds_up_unless_the_member_is_out() -> None:
    step = commit(0.0, 3.0, 1, 0)  # one step held up by a member paused for 1 s
    pause = dict(fault(1.0, "pause"), workers=[2])
    resume = dict(fault(2.0, "resume"), workers=[2])
    first = gen(0.0, 1)
    a = account(first + [pause, resume, step], [step])
    assert (a.productive_s, a.stall_s) == pytest.approx((2.0, 1.0))
    first[1]["members"] = [[0, 1]]  # worker 2 is a standby: the step was not held up
    a = account(first + [pause, resume, step], [step])
    assert (a.productive_s, a.stall_s) == pytest.approx((3.0, 0.0))


def test_a_record_cut_by_a_rollback_counts_its_kept_share() -> None:
    c = commit(0.0, 4.0, 1, 0, 3)
    again = commit(6.0, 7.0, 2, 2)
    kept = dict(c, last=1)  # the checker's lineage: steps 2 and 3 rolled back
    a = account(gen(0.0, 1) + [c, fault(4.0, "kill")] + gen(5.0, 2, "restart") + [again], [kept, again])
    assert (a.productive_s, a.lost_work_s, a.stall_s, a.recovery_s) == pytest.approx(
        (3.0, 2.0, 1.0, 1.0))


def test_a_run_that_gave_up_is_accounted_to_its_end() -> None:
    c = commit(0.0, 1.0, 1, 0)
    end = {"f": "end", "type": "info", "t": 9.0, "completed": False}
    a = account(gen(0.0, 1) + [c, fault(1.0, "crash"), {"f": "round", "type": "invoke", "t": 4.0,
                                                         "gen": 2, "reason": "failure"}, end],
                [c], completed=False)
    assert (a.elapsed_s, a.productive_s, a.stall_s, a.recovery_s) == pytest.approx((9.0, 1.0, 3.0, 5.0))


def test_no_generation_no_time() -> None:
    a = time_account([{"f": "end", "type": "info", "t": 3.0}], [], False)
    assert a.elapsed_s == a.stall_s == 0.0


spans = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40), st.integers(0, 4)), max_size=12)


@given(spans, st.integers(0, 20), st.integers(0, 40))
def test_the_sweep_gives_each_instant_to_its_first_category(
        raw: list[tuple[int, int, int]], start: int, length: int) -> None:
    end = start + length
    cut = [(float(min(a, b)), float(max(a, b)), c) for a, b, c in raw]
    parts = _sweep(cut, float(start), float(end))
    expected = [0.0] * 5
    for t in range(start, end):  # each unit interval [t, t+1): spans have integer ends
        covering = [c for a, b, c in cut if a <= t and t + 1 <= b]
        if covering:
            expected[min(covering)] += 1.0
    assert parts == expected
    assert sum(parts) <= length


SIM = """
name: accounted
seed: 3
cluster: {workers: 4}
workload: {steps: 120, global_batch: 32, micro_batch: 4, dataset_samples: 4096}
strategy: {kind: elastic, checkpoint_interval_steps: 40}
failures:
  schedule:
    - {at_step: 30, kill: 1}
    - {at_s: 20.0, pause: 2, for_s: 4.0}
    - {at_step: 90, join: 1}
"""


@pytest.mark.parametrize("kind", ["elastic", "checkpoint-restart"])
def test_a_sim_summary_is_the_account_of_its_history(kind: str) -> None:
    from sim.driver import Simulation

    sc = parse_scenario(SIM.replace("kind: elastic", f"kind: {kind}"))
    sim = Simulation(sc)
    s = sim.run()
    assert s["completed"] and s["valid"], s["violations"]
    a = time_account(sim.records, check(sim.records, data_spec(sc)).lineage, True)
    for key in ("elapsed_s", "productive_s", "checkpoint_s", "lost_work_s", "recovery_s", "stall_s"):
        assert s[key] == getattr(a, key), key
    assert a.checkpoint_s > 0 and a.lost_work_s > 0 and a.recovery_s > 0 and a.stall_s > 0, a
