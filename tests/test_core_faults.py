"""The core's fault plan (rollcall/core/faults.py): which fault is due when,
and when a step's faults land (rollcall/core/step_faults.py).

Pure and fast: scripted ``at_s`` faults by training time, ``at_step`` faults
by committed step (a ``slow`` of fixed targets a step early), random crashes
and slowdowns and ``random`` targets from the run's seeded
:class:`~rollcall.core.Draws`, and ``rollcall.config.fault_plan``'s reading
of a scenario's schedule.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollcall.config import fault_plan, scheduled_faults
from rollcall.core import (
    BEFORE_THE_ANSWER, Draws, Due, FailureModel, FaultPlan, ScheduledFault, SlowdownModel,
    StepAnswers, StepDue, StepFaults,
)
from rollcall.scenario import parse_scenario


def _plan(*faults: ScheduledFault, seed: int = 0, mtbf_s: float | None = None,
          slow: SlowdownModel | None = None) -> FaultPlan:
    model = None if mtbf_s is None else FailureModel(seed=seed, distribution="exponential",
                                                     mean_s=mtbf_s)
    return FaultPlan(faults, Draws(seed, model, slow))


def _kill(index: int, trigger: str, when: float, *targets: int) -> ScheduledFault:
    return ScheduledFault(index=index, trigger=trigger, when=when, action="kill",
                          targets=targets or "random")


def test_at_s_faults_come_due_in_order_at_their_seconds() -> None:
    plan = _plan(_kill(0, "at_s", 3.0, 1), _kill(1, "at_s", 1.0, 2), _kill(2, "at_s", 1.0, 3),
                 _kill(3, "at_step", 1, 4))
    assert plan.next_time() == 1.0
    assert plan.due_by_time(0.999) == []
    # a tie goes in schedule order; the step-scripted kill is not due by time
    assert plan.due_by_time(1.0) == [Due("kill", (2,), index=1), Due("kill", (3,), index=2)]
    assert plan.next_time() == 3.0
    assert plan.due_by_time(2.9) == []
    assert plan.due_by_time(10.0) == [Due("kill", (1,), index=0)]
    assert plan.next_time() is None and plan.due_by_time(1e9) == []


def _round(generation: int, type_: str = "invoke", f: str = "round") -> dict:
    return {"t": 1.0, "type": type_, "f": f, "process": "keeper", "gen": generation}


def test_at_roll_call_faults_come_due_when_that_roll_call_opens() -> None:
    join = ScheduledFault(index=2, trigger="at_roll_call", when=2, action="join", targets=1)
    plan = _plan(_kill(0, "at_roll_call", 3, 1), _kill(1, "at_step", 2, 2), join,
                 _kill(3, "at_s", 2.0, 3))
    # only the keeper's record of a roll call opening: not its close, not a commit
    for record in (_round(1), _round(2, "ok"), _round(2, "fail"), _round(2, "info", "restart"),
                   {"t": 1.0, "type": "ok", "f": "commit", "gen": 2}):
        assert plan.due_by_record(record) == []
    assert plan.due_by_step(5) == [Due("kill", (2,), index=1)]
    assert plan.due_by_record(_round(2)) == [Due("join", 1, index=2)]
    assert plan.due_by_record(_round(2)) == []  # a new keeper's roll call of the same generation
    # a later generation's roll call fires what an earlier one was due to
    assert plan.due_by_record(_round(5)) == [Due("kill", (1,), index=0)]
    assert plan.due_by_time(1e9) == [Due("kill", (3,), index=3)]
    assert plan.due_by_record(_round(9)) == [] and plan.next_step() is None


@pytest.mark.parametrize("when", [0, 1.5, -1])
def test_a_roll_call_trigger_names_a_generation(when: float) -> None:
    with pytest.raises(ValueError, match="bad fault trigger at_roll_call"):
        _kill(0, "at_roll_call", when, 1)


def test_at_step_faults_are_due_by_committed_step() -> None:
    slow_fixed = ScheduledFault(index=1, trigger="at_step", when=5, action="slow", targets=(2,),
                                for_s=1.0, factor=3.0)
    slow_random = ScheduledFault(index=2, trigger="at_step", when=5, action="slow",
                                 targets="random", for_s=1.0, factor=4.0)
    plan = _plan(_kill(0, "at_step", 3, 1), slow_fixed, slow_random, _kill(3, "at_s", 0.0, 0))
    assert plan.next_gate() == 3 and plan.next_step() == 3
    assert plan.due_by_step(2) == []
    assert plan.due_by_step(3) == [Due("kill", (1,), index=0)]
    # a slow of fixed targets is handed out a step early, marked with its step
    assert plan.next_gate() == 4 and plan.next_step() == 5  # handed out at 4, acts at 5
    assert plan.due_by_step(4) == [Due("slow", (2,), 1.0, rate=3.0, index=1, from_step=5)]
    assert plan.next_gate() == 5
    assert plan.due_by_step(5) == [Due("slow", "random", 1.0, rate=4.0, index=2)]
    assert plan.next_gate() == 0 and plan.next_step() is None and plan.due_by_step(100) == []
    assert plan.due_by_time(0.0) == [Due("kill", (0,), index=3)]  # the at_s one, untouched


def test_a_gate_is_never_below_one() -> None:
    plan = _plan(_kill(0, "at_step", 0, 1))
    assert plan.next_gate() == 1
    assert plan.due_by_step(0) == [Due("kill", (1,), index=0)]


def test_random_crash_times_are_the_core_draws() -> None:
    seed, mean = 7, 50.0
    plan = _plan(seed=seed, mtbf_s=mean)
    ref = Draws(seed, FailureModel(seed=seed, distribution="exponential", mean_s=mean))
    plan.node_up(0, 2.0)
    plan.node_up(1, 1.0)
    plan.node_up(1, 4.0)  # a relaunch on the same hardware life draws nothing
    first = {0: 2.0 + ref.next_lifetime(0), 1: 1.0 + ref.next_lifetime(1)}
    assert plan.next_time() == min(first.values())
    plan.node_down(0)
    assert plan.next_time() == first[1]  # node 0's crash went with its node
    plan.node_up(0, 9.0)  # repaired: the node's next life, k = 1
    crash_at = {0: 9.0 + ref.next_lifetime(0), 1: first[1]}
    # crashes come due in time order, as the machine's end
    order = sorted(crash_at, key=crash_at.__getitem__)
    assert plan.next_time() == crash_at[order[0]]
    assert plan.due_by_time(max(crash_at.values())) == [
        Due("crash", (w,), origin="mtbf") for w in order]
    assert plan.next_time() is None and plan.due_by_time(1e12) == []


def test_the_same_seed_gives_the_same_crashes_and_another_seed_differs() -> None:
    def crashes(seed: int) -> dict[int, float]:
        plan = _plan(seed=seed, mtbf_s=100.0)
        for w in range(8):
            plan.node_up(w, 0.0)
        crash_at = {}
        while (t := plan.next_time()) is not None:
            crash_at.update({due.targets[0]: t for due in plan.due_by_time(t)})
        assert sorted(crash_at) == list(range(8))
        return crash_at

    assert crashes(3) == crashes(3)
    assert crashes(3) != crashes(4)


def test_random_slowdowns_are_the_core_draws_and_follow_each_other() -> None:
    slow = SlowdownModel(seed=5, mtbf_s=10.0, factor=3.0, for_s=2.0, spread=0.5)
    plan = _plan(seed=5, slow=slow)
    ref = Draws(5, None, slow)
    plan.node_up(2, 1.0)
    gap, factor = ref.next_slowdown(2)
    assert plan.next_time() == 1.0 + gap
    assert plan.due_by_time(1.0 + gap) == [Due("slow", (2,), 2.0, rate=factor, origin="mtbf")]
    gap2, factor2 = ref.next_slowdown(2)  # the next one a gap after this one ends
    then = 1.0 + gap + 2.0 + gap2
    assert plan.next_time() == then
    assert plan.due_by_time(then) == [Due("slow", (2,), 2.0, rate=factor2, origin="mtbf")]
    plan.node_down(2)
    assert plan.next_time() is None  # its next slowdown went with the node


def test_a_random_target_is_the_seeded_pick() -> None:
    candidates = list(range(100))

    def picks(seed: int) -> list:
        plan = _plan(seed=seed)
        return [plan.pick(candidates) for _ in range(10)]

    ref = Draws(11, None)
    assert picks(11) == [ref.pick(candidates) for _ in range(10)]
    assert picks(11) != picks(12)
    assert _plan().pick([]) is None


def test_a_scheduled_fault_is_checked() -> None:
    with pytest.raises(ValueError):
        ScheduledFault(index=0, trigger="at_time", when=1.0, action="kill", targets=(1,))
    with pytest.raises(ValueError):
        ScheduledFault(index=0, trigger="at_step", when=1.5, action="kill", targets=(1,))
    with pytest.raises(ValueError):
        ScheduledFault(index=0, trigger="at_s", when=-1.0, action="kill", targets=(1,))


def test_config_reads_every_action_of_the_schedule() -> None:
    sc = parse_scenario("""
name: t
seed: 9
cluster: {workers: 8, rack_size: 4, workers_per_host: 2}
keeper: {store: etcd, standbys: 1}
failures:
  worker_mtbf_s: 100
  schedule:
    - {at_s: 1, kill: [1, 2]}
    - {at_s: 1, kill_rack: 1}
    - {at_s: 1, lose_host: random}
    - {at_s: 1, partition: [0, 2], for_s: 2}
    - {at_s: 1, isolate_keeper: 3, for_s: 2}
    - {at_s: 1, delay: 1, latency_s: 0.2, for_s: 2}
    - {at_s: 1, loss: random, rate: 0.1, for_s: 2}
    - {at_s: 1, pause: 4, for_s: 2}
    - {at_s: 1, late_heartbeats: random, delay_s: 1.5, for_s: 2}
    - {at_s: 1, join: 2}
    - {at_s: 1, kill_keeper: active}
    - {at_s: 1, kill_etcd: 0}
    - {at_s: 1, partition_keeper: active, for_s: 2}
    - {at_step: 4, slow: 5, factor: 3, for_s: 2}
""", target="real")
    assert [f.index for f in scheduled_faults(sc)] == list(range(14))
    plan = fault_plan(sc)
    assert plan.draws.seed == 9 and plan.draws.model is not None
    assert plan.due_by_time(1.0) == [
        Due("kill", (1, 2), index=0),
        Due("kill_rack", 1, index=1),
        Due("lose_host", "random", index=2),
        Due("partition", (0, 2), 2.0, index=3),
        Due("isolate_keeper", 3, 2.0, index=4),
        Due("delay", 1, 2.0, latency_s=0.2, index=5),
        Due("loss", "random", 2.0, rate=0.1, index=6),
        Due("pause", (4,), 2.0, index=7),
        Due("late_heartbeats", "random", 2.0, latency_s=1.5, index=8),
        Due("join", 2, index=9),
        Due("kill_keeper", (), index=10),
        Due("kill_etcd", 0, index=11),
        Due("partition_keeper", "active", 2.0, index=12),
    ]
    assert plan.due_by_step(3) == [Due("slow", (5,), 2.0, rate=3.0, index=13, from_step=4)]


_ACTIONS = st.sampled_from(["kill", "pause", "join", "slow"])


@st.composite
def _schedules(draw) -> list[ScheduledFault]:
    out = []
    for i in range(draw(st.integers(0, 12))):
        action = draw(_ACTIONS)
        if draw(st.booleans()):
            trigger, when = "at_s", draw(st.sampled_from([0.0, 0.5, 1.0, 2.5, 4.0]))
        else:
            trigger, when = "at_step", draw(st.integers(0, 6))
        targets = 1 if action == "join" else draw(st.sampled_from([(1,), (2, 3), "random"]))
        out.append(ScheduledFault(index=i, trigger=trigger, when=when, action=action,
                                  targets=targets, factor=2.0 if action == "slow" else None,
                                  for_s=1.0 if action in ("pause", "slow") else None))
    return draw(st.permutations(out))


@given(_schedules(), st.lists(st.floats(0.0, 5.0), max_size=8))
def test_every_scheduled_fault_comes_due_once_in_trigger_order(
        schedule: list[ScheduledFault], probes: list[float]) -> None:
    plan = _plan(*schedule)
    by_time: list[int] = []
    for t in sorted(probes) + [5.0]:
        due = plan.due_by_time(t)
        by_time += [d.index for d in due]
        assert all(schedule_of(schedule, d.index).when <= t for d in due)
        nxt = plan.next_time()
        assert nxt is None or nxt > t  # nothing due by t is left behind
    at_s = sorted((f for f in schedule if f.trigger == "at_s"), key=lambda f: (f.when, f.index))
    assert by_time == [f.index for f in at_s]

    handed: dict[int, int] = {}
    for committed in range(0, 8):
        gate = plan.next_gate()
        due = plan.due_by_step(committed)
        # never before the gate it announced (at least 1: no step-0 ack to hold)
        assert not due or committed >= gate or committed == 0
        for d in due:
            assert d.index not in handed
            handed[d.index] = committed
    for f in schedule:
        if f.trigger == "at_step":
            early = f.action == "slow" and f.targets != "random"
            assert handed[f.index] == max(0, f.when - early), f  # at its step, fixed slows early
    assert set(handed) == {f.index for f in schedule if f.trigger == "at_step"}
    assert plan.next_gate() == 0 and plan.next_time() is None


def schedule_of(schedule: list[ScheduledFault], index: int) -> ScheduledFault:
    return next(f for f in schedule if f.index == index)


# --- when a step's faults land (rollcall/core/step_faults.py) --------------------------


def test_every_fault_kind_is_placed_around_the_answer() -> None:
    """Each action a schedule can hold, and a lifetime's crash, is before or
    after the last answer on purpose: the link faults and the kinds that
    must not let the answered member step on go before it."""
    from rollcall.scenario import FAULT_MODELS, LINK_ACTIONS

    assert set(LINK_ACTIONS) <= set(BEFORE_THE_ANSWER)
    before = {"kill", "kill_rack", "lose_host", "slow", "crash", *LINK_ACTIONS}
    assert set(BEFORE_THE_ANSWER) == before
    after = set(FAULT_MODELS) - before
    assert after == {"pause", "late_heartbeats", "join", "kill_keeper", "kill_etcd",
                     "partition_keeper"}, after


@given(_schedules(), st.integers(1, 5), st.data())
def test_answers_one_by_one_land_what_the_whole_generation_lands(
        schedule: list[ScheduledFault], members: int, data: st.DataObject) -> None:
    """The real target's per-member answers and the sim's one vote for the
    whole generation land the same faults at the same committed count, in
    the same order, and only once the last member is answered."""
    plan_of_one_by_one = _plan(*schedule)
    one_by_one, all_at_once = StepFaults(plan_of_one_by_one), StepFaults(_plan(*schedule))
    plan = _plan(*schedule)  # the plan's own order, which each part keeps
    landed: list[int] = []
    for step in range(8):
        order = data.draw(st.permutations(range(members)))
        for k, worker in enumerate(order):
            due = one_by_one.answered(1, step, worker, members, step + 1)
            if k < members - 1:
                assert not due and due.in_order() == []
        expected = all_at_once.held_by_all(step + 1)
        assert due == expected
        handed = plan.due_by_step(step + 1)
        assert list(due.before) == [d for d in handed if d.kind in BEFORE_THE_ANSWER]
        assert list(due.after) == [d for d in handed if d.kind not in BEFORE_THE_ANSWER]
        landed += [d.index for d in due.in_order()]
    assert sorted(landed) == sorted(f.index for f in schedule if f.trigger == "at_step")
    assert one_by_one.next_step() is None and plan_of_one_by_one.next_gate() == 0


def test_an_answer_counts_once_and_for_its_own_step_and_generation() -> None:
    answers = StepAnswers()
    assert not answers.answered(1, 4, 0, 2)
    assert not answers.answered(1, 4, 0, 2)  # the same member again: still one of two
    assert not answers.answered(2, 4, 1, 2)  # another generation's step
    assert not answers.answered(1, 5, 1, 2)  # another step
    assert answers.answered(1, 4, 1, 2)
    assert not answers.answered(1, 4, 0, 2)  # counted afresh once landed
    answers.forget()
    assert not answers.answered(1, 5, 0, 2)  # the old generation's partial count is gone
    assert answers.answered(1, 5, 1, 2)


def test_a_step_lands_a_kill_before_the_answer_and_a_pause_after_it() -> None:
    pause = ScheduledFault(index=0, trigger="at_step", when=3, action="pause", targets=(2,),
                           for_s=1.0)
    plan = _plan(pause, _kill(1, "at_step", 3, 1))
    due = StepFaults(plan).held_by_all(3)
    assert due.before == (Due("kill", (1,), index=1),)
    assert due.after == (Due("pause", (2,), 1.0, index=0),)
    assert [d.index for d in due.in_order()] == [1, 0]
    assert StepDue.split([]) == StepDue() and not StepDue()
