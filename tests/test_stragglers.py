"""The straggler policy (``strategy.stragglers``), in the core: who lags, when
the job is faster without it, and the holdout that keeps a lasting
straggler from flapping. No driver: reports in, decisions out."""

from __future__ import annotations

import statistics

import pytest
from hypothesis import event, given, settings, strategies as st

from rollcall.core.detector import TimeoutDetector
from rollcall.core.job import JobPolicy
from rollcall.core.keeper import Broadcast, Formed, Keeper, KeeperConfig, Record, Send
from rollcall.core.messages import Join, JoinBatch, Refused, RollCall
from rollcall.core.stragglers import (
    Lagging, StragglerPolicy, StragglerWatch, eviction_gain, median_with,
)
from rollcall.core.reshard import rank_range
from rollcall.core.types import Cursor

POLICY = StragglerPolicy(factor=2.0, steps=3, holdout_s=10.0, global_batch=64, micro_batch=4,
                         full_workers=4)


def keeper(n: int = 4, n_min: int = 2, steps: int = 1000, policy=POLICY) -> Keeper:
    cfg = KeeperConfig(min_workers=n_min, max_workers=n, last_call_s=0.5,
                       detector=TimeoutDetector(0.5, 3.0), policy=JobPolicy(steps, 10_000),
                       stragglers=policy)
    k = Keeper(cfg)
    for w in range(n):
        k.receive(0.0, Join(w, 0, None))
    k.handle_timer(1.0)
    assert k.generation == 1 and len(k.members) == n
    return k


def records(out: list, f: str) -> list[dict]:
    return [o.record for o in out if isinstance(o, Record) and o.record["f"] == f]


def step(k: Keeper, t: float, s: int, per_batch: dict[int, float], load: int = 4) -> list:
    """Every member commits and reports step ``s`` at ``t`` (a real target's order)."""
    out = []
    for w in k.members:
        k.commit(t, w, 0, k.generation, s)
        out += k.report_compute(t, w, 0, k.generation, s, per_batch.get(w, 0.01) * load, load)
    return out


def run(k: Keeper, steps: range, per_batch: dict[int, float], t0: float = 2.0) -> list:
    """Steps ``steps`` one second apart from ``t0``, each as :func:`step`."""
    out = []
    for s in steps:
        out += step(k, t0 + s, s, per_batch)
    return out


@given(st.lists(st.floats(0.0, 100.0), max_size=20), st.floats(0.0, 100.0), st.integers(0, 20))
def test_median_with_typical_members_is_the_lower_median(values, typical, count) -> None:
    if not values and count == 0:
        return
    every = sorted(values + [typical] * count)
    assert median_with(values, typical, count) == statistics.median_low(every)


@settings(max_examples=200)
@given(st.lists(st.sets(st.integers(0, 5), max_size=6), min_size=1, max_size=30))
def test_watch_counts_consecutive_lagging_steps(slow_per_step) -> None:
    """A member is due exactly when its last ``steps`` judged steps all lagged."""
    watch = StragglerWatch(POLICY, 1, 6)
    for s, slow in enumerate(slow_per_step):
        due = watch.judge(s, s, 1.0, {w: 3.0 for w in slow} | {9: 1.5})  # 1.5: under the bar
        want = {w for w in range(6)
                if s + 1 >= POLICY.steps
                and all(w in slow_per_step[j] for j in range(s - POLICY.steps + 1, s + 1))}
        assert {d.worker for d in due} == want


def test_a_run_of_steps_counts_as_that_many_steps() -> None:
    watch = StragglerWatch(POLICY, 1, 4)
    assert not watch.judge(0, 1, 1.0, {2: 4.0})
    (due,) = watch.judge(2, 2, 1.0, {2: 4.0})
    assert due == Lagging(2, 4.0, 1.0) and due.lag == 4.0
    assert not watch.judge(3, 9, 1.0, {})  # a step at speed ends the count


def test_gain_is_max_bound_with_and_accumulation_without() -> None:
    members = (0, 1, 2, 3)  # 16 micro-batches: 4 each; without one: 6, 5, 5
    with_s, without_s = eviction_gain(POLICY, members, [Lagging(3, 4.0, 1.0)], {})
    assert (with_s, without_s) == (16.0, 6.0)
    with_s, without_s = eviction_gain(POLICY, members, [Lagging(3, 1.2, 1.0)], {})
    assert with_s == pytest.approx(4.8) and without_s == 6.0  # slower without it


def test_a_4x_straggler_is_evicted_after_its_steps_and_the_rest_go_on() -> None:
    k = keeper()
    for s in range(2):
        assert not records(step(k, 2.0 + s, s, {3: 0.04}), "evict")
    out = step(k, 4.0, 2, {3: 0.04})
    (ev,) = records(out, "evict")
    assert ev["worker"] == 3 and ev["reason"] == "straggler" and ev["lag"] == 4.0
    assert ev["holdout_s"] == 10.0 and ev["step_s"] > ev["without_s"]
    refusal = [o.message for o in out if isinstance(o, Send)]
    assert refusal == [Refused(3, 0, 1, "straggler")]
    (call,) = [o for o in out if isinstance(o, Broadcast)]
    assert isinstance(call.message, RollCall) and tuple(call.to) == (0, 1, 2)
    # the straggler rejoins at once, and waits out its holdout as a standby
    k.receive(4.1, Join(3, 0, Cursor(3, 192), 1))
    (f,) = [o for o in k.receive(4.2, JoinBatch((0, 1, 2), Cursor(3, 192), None, 1))
            if isinstance(o, Formed)]
    assert tuple(f.members) == (0, 1, 2) and f.reason == "straggler"
    assert k.next_round_deadline() == 14.0 and k.get_timer() <= 14.0
    # the holdout ends: a growth round readmits it
    k.observe_alive(14.0, range(4))
    out = k.handle_timer(14.0)
    assert [r["reason"] for r in records(out, "round")] == ["growth"]
    out = k.receive(14.1, JoinBatch((0, 1, 2), Cursor(5, 320), None, 2))
    (f,) = [o for o in out if isinstance(o, Formed)]  # full: no last call
    assert tuple(f.members) == (0, 1, 2, 3) and tuple(f.stale) == (3,)


def test_a_straggler_evicted_again_is_held_out_twice_as_long() -> None:
    k = keeper()
    for s in range(3):
        step(k, 2.0 + s, s, {3: 0.04})
    k.receive(4.1, Join(3, 0, Cursor(3, 192), 1))
    k.receive(4.2, JoinBatch((0, 1, 2), Cursor(3, 192), None, 1))
    k.observe_alive(14.0, range(4))
    k.handle_timer(14.0)
    k.receive(14.1, JoinBatch((0, 1, 2), Cursor(5, 320), None, 2))
    assert k.generation == 3
    for s in range(5, 8):
        out = step(k, 15.0 + s, s, {3: 0.04})
    (ev,) = records(out, "evict")
    assert ev["worker"] == 3 and ev["holdout_s"] == 20.0


def test_keep_never_evicts_and_reports_nothing() -> None:
    k = keeper(policy=None)
    for s in range(20):
        out = step(k, 2.0 + s, s, {3: 0.04})
        assert not records(out, "evict") and not records(out, "straggler")
    assert k.generation == 1


def test_not_below_min_workers_nor_when_slower_without() -> None:
    k = keeper(n=2, n_min=2)
    out = run(k, range(5), {1: 0.04})
    assert not records(out, "evict")
    (kept,) = records(out, "straggler")  # said once a generation
    assert kept["decision"] == "keep" and kept["reason"] == "min-workers"
    # 1.4x on 4 members: 4 x 0.014 against 6 x 0.01 without it
    k = keeper(policy=StragglerPolicy(1.3, 3, 10.0, 64, 4, 4))
    out = run(k, range(5), {3: 0.014})
    assert not records(out, "evict")
    assert [r["reason"] for r in records(out, "straggler")] == ["not-faster-without"]


def test_near_the_end_an_eviction_does_not_pay() -> None:
    k = keeper(steps=4)  # the gain of one step left cannot pay for two abandoned ones
    out = run(k, range(3), {3: 0.04})
    assert not records(out, "evict")
    assert [r["reason"] for r in records(out, "straggler")] == ["not-faster-without"]


def test_reports_of_another_generation_or_during_a_round_are_not_judged() -> None:
    k = keeper()
    for s in range(3):
        for w in k.members:
            k.report_compute(2.0 + s, w, 0, 0, s, 0.16 if w == 3 else 0.04, 4)
    assert k.generation == 1 and k.round is None
    k.report_steps(5.0, 1, 0, 9, 0.01, {3: 0.04})  # the bulk form, for a run of steps
    assert k.round is not None and k.round.reason == "straggler"
    out = k.report_steps(5.0, 1, 10, 19, 0.01, {2: 0.04})  # a round is open
    assert not records(out, "evict")


@pytest.mark.parametrize("slow", [{5: 0.04}, {1: 0.03, 2: 0.03, 3: 0.03}, {0: 0.04}])
def test_the_bulk_form_judges_only_members_with_micro_batches(slow: dict[int, float]) -> None:
    """Eight members, four micro-batches a step: ranks 4-7 compute nothing.
    A simulator's bulk report and the members' own reports (a member with
    no micro-batch reports a load of 0) reach the same verdicts: a slow
    member without micro-batches is no straggler, and the bar is the median
    of the four that compute (three of them slow: the slow pace is typical)."""
    policy = StragglerPolicy(2.0, 3, 10.0, global_batch=16, micro_batch=4, full_workers=8)
    bulk, each = keeper(n=8, policy=policy), keeper(n=8, policy=policy)
    out_bulk = bulk.report_steps(5.0, 1, 0, 4, 0.01, slow)
    out_each = []
    for s in range(5):
        for rank, w in enumerate(each.members):
            load = 1 if rank < 4 else 0
            each.commit(5.0, w, 0, 1, s)
            out_each += each.report_compute(5.0, w, 0, 1, s, slow.get(w, 0.01) * load, load)
    def verdicts(out: list) -> list[tuple]:
        return [(r["f"], r["worker"], r.get("reason"), r.get("decision"))
                for r in records(out, "evict") + records(out, "straggler")]

    assert verdicts(out_bulk) == verdicts(out_each)
    assert verdicts(out_bulk) == ([("evict", 0, "straggler", None)] if slow == {0: 0.04} else [])


def test_a_benched_straggler_that_dies_is_forgotten() -> None:
    k = keeper()
    k.report_steps(5.0, 1, 0, 9, 0.01, {3: 0.04})
    assert 3 in k.benched
    k.exited(5.5, 3, 0)
    assert 3 not in k.benched and k.next_round_deadline() is None


def test_stragglers_due_together_leave_together_when_one_alone_would_not_pay() -> None:
    """Eight members of 4 micro-batches, three of them 3x: without one the
    step still waits for the other two (3 x 5 micro-batches against 3 x 4),
    without all three the five left take 7 each at full speed (7 < 12)."""
    policy = StragglerPolicy(2.0, 3, 10.0, global_batch=128, micro_batch=4, full_workers=8)
    k = keeper(n=8, policy=policy)
    out = run(k, range(3), {2: 0.03, 5: 0.03, 6: 0.03})
    assert sorted(r["worker"] for r in records(out, "evict")) == [2, 5, 6]
    assert [r["reason"] for r in records(out, "round")] == ["straggler"]  # one roll call
    (ev, *_) = records(out, "evict")
    assert ev["step_s"] == pytest.approx(0.12) and ev["without_s"] == pytest.approx(0.07)


@st.composite
def _slow_steps(draw) -> tuple[int, int, list[dict[int, float]]]:
    """Members, micro-batches a step, and each step's slow members (their
    compute per micro-batch; every other member takes 0.01 s)."""
    members = draw(st.integers(2, 8))
    micro_batches = draw(st.integers(1, 2 * members))
    slow = st.dictionaries(st.integers(0, members - 1),
                           st.sampled_from([0.015, 0.025, 0.04, 0.08]), max_size=members)
    # mostly one lasting slowdown (a straggler to judge), now and then another
    lasting = draw(slow)
    steps = draw(st.lists(st.sampled_from([{}, lasting, lasting, lasting]) | slow,
                          min_size=1, max_size=14))
    return members, micro_batches, steps


@settings(max_examples=200, deadline=None)
@given(_slow_steps())
def test_the_bulk_form_decides_as_every_members_own_reports(
        case: tuple[int, int, list[dict[int, float]]]) -> None:
    """The simulator's bulk form (``Keeper.report_steps``: a run of steps at
    once while nobody is slow, each step alone while someone is, as
    ``sim/votes.py`` casts them) and each member's own report of each step
    (``Keeper.report_compute``, with its load of micro-batches, as real
    members send them) reach the same verdicts at the same steps: the same
    records of evictions, stragglers and rounds, in the same order."""
    n, micro_batches, steps = case
    policy = StragglerPolicy(2.0, 3, 10.0, global_batch=4 * micro_batches, micro_batch=4,
                             full_workers=n)
    bulk, each = keeper(n=n, policy=policy), keeper(n=n, policy=policy)
    out_bulk: list = []
    out_each: list = []
    run_start = None  # the first step of a run nobody is slow in, not yet reported
    for s, slow in enumerate(steps + [{0: 0.01}]):  # a last step closes any open run
        t = 2.0 + s
        if slow and run_start is not None:
            out_bulk += _bulk(bulk, t, run_start, s - 1, {})
            run_start = None
        if slow and s < len(steps):
            out_bulk += _bulk(bulk, t, s, s, slow)
        elif not slow and run_start is None:
            run_start = s
        if s < len(steps):
            for rank, w in enumerate(each.members):
                low, high = rank_range(micro_batches, n, rank)
                load = high - low
                each.commit(t, w, 0, 1, s)
                out_each += each.report_compute(t, w, 0, 1, s, slow.get(w, 0.01) * load, load)

    def verdicts(out: list) -> list[dict]:
        return [o.record for o in out if isinstance(o, Record)
                and o.record["f"] in ("evict", "straggler", "round")]

    assert verdicts(out_bulk) == verdicts(out_each)
    event(f"evictions: {sum(1 for r in verdicts(out_each) if r['f'] == 'evict')}")


def _bulk(k: Keeper, t: float, first: int, last: int, slow: dict[int, float]) -> list:
    """The sim's vote on steps ``first..last`` and its report of them."""
    out = []
    if k.generation == 1 and k.round is None:
        k.commit(t, k.members.first(), 0, 1, first, last)
    out += k.report_steps(t, 1, first, last, 0.01, slow)
    return out
