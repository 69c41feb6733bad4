"""The phi-accrual detector: its rule, and the keeper applying it
per worker from the heartbeats it observes.

The rule is pure (``PhiDetector``); the keeper keeps each life's recent
intervals and hands the liveness record the worker's own tolerance, so one
query (``get_timer``/``handle_timer``) covers a fixed timeout and phi alike.
A reference model (a dict of each worker's beats) checks the keeper's
verdicts against the formula for any heartbeat schedule.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st

from rollcall.core.detector import PhiDetector, TimeoutDetector, Verdict, make_detector
from rollcall.core.keeper import Keeper, KeeperConfig
from rollcall.core.messages import Heartbeat, Join

HB = 0.1


def keeper(detector) -> Keeper:
    return Keeper(KeeperConfig(min_workers=1, max_workers=8, last_call_s=0.05, detector=detector))


def started(detector, n: int) -> Keeper:
    k = keeper(detector)
    for w in range(n):
        k.receive(0.0, Join(w, 0, None))
    k.handle_timer(0.05)
    assert k.generation == 1 and list(k.members) == list(range(n))
    return k


def evicted(outputs: list) -> list[tuple[int, str]]:
    return [(o.record["worker"], o.record["reason"]) for o in outputs
            if getattr(o, "record", {}).get("f") == "evict"]


def test_phi_is_the_silence_in_mean_intervals_over_ln10() -> None:
    d = PhiDetector(HB, threshold=8.0)
    assert d.phi(HB * math.log(10)) == pytest.approx(1.0)
    assert d.silence_s() == pytest.approx(8 * math.log(10) * HB)  # 18.4 beats
    assert d.verdict(1.0, 1.0 - d.silence_s() + 1e-9) is Verdict.SUSPECT
    assert d.verdict(1.0, 1.0 - d.silence_s()) is Verdict.DEAD
    assert d.verdict(1.0, 1.0 - HB) is Verdict.ALIVE
    # the simulator's shortcut agrees with the live path, as the timeout's does
    slow = PhiDetector(0.5)
    assert slow.detection_time(10.2, 0.1, 0.01) == slow.expiry(10.1 + 0.01)


@given(intervals=st.lists(st.floats(0.0, 5.0), max_size=200))
def test_the_mean_has_a_nominal_prior_and_floor(intervals: list[float]) -> None:
    """A new life is judged at the nominal cadence; a burst (beats held back
    and delivered together) never makes the tolerance tighter than nominal;
    only the last ``window`` intervals count."""
    d = PhiDetector(HB, window=16)
    mean = d.mean_s(intervals)
    recent = intervals[-16:]
    assert mean == max(HB, (math.fsum(recent) + (16 - len(recent)) * HB) / 16)
    assert d.extra_s(intervals) >= 0.0
    assert d.extra_s([]) == 0.0


def play(k: Keeper, arrivals: list[tuple[float, int]], until: float) -> dict[int, float]:
    """Deliver each worker's beats at their arrival instants (counters in
    order), firing the keeper's timer whenever it comes due in between;
    returns each eviction's worker and instant."""
    counters: dict[int, int] = {}
    deaths: dict[int, float] = {}

    def timers(upto: float) -> None:
        while (t := k.get_timer()) is not None and t <= upto:
            for w, _ in evicted(k.handle_timer(t)):
                deaths[w] = t

    for at, w in sorted(arrivals):
        timers(at)
        counters[w] = counters.get(w, 0) + 1
        k.receive(at, Heartbeat(w, 0, 1, counters[w]))
    timers(until)
    return deaths


def test_a_worker_whose_beats_come_slower_is_given_more_rope() -> None:
    """Worker 1 beats every 0.3 s (a busy host), worker 0 every 0.1 s; both
    fall silent at 20 s. Phi declares 0 dead 18.4 of its intervals later and
    1 only 18.4 of its own; a fixed timeout declares both after 2 s."""
    beats = [(i * 0.1, 0) for i in range(1, 201)] + [(i * 0.3, 1) for i in range(1, 67)]
    last = {0: 20.0, 1: 19.8}
    for detector in (PhiDetector(HB), TimeoutDetector(HB, 2.0)):
        deaths = play(started(detector, 2), beats, 40.0)
        if isinstance(detector, TimeoutDetector):
            assert deaths == pytest.approx({w: last[w] + 2.0 for w in last})
        else:  # worker 1's window holds 64 intervals of 0.3 s by then
            assert deaths == pytest.approx({0: last[0] + detector.silence_s(),
                                            1: last[1] + detector.silence_s(0.3)})


def test_late_beats_at_full_speed_pass_phi_but_not_a_shorter_timeout() -> None:
    """Worker 0's beats arrive 1.5 s late from 10 s on (its work is fine):
    one 1.6 s gap, then the usual cadence. A fixed 1 s timeout evicts it;
    phi at the default threshold (18.4 intervals: 1.84 s) does not."""
    beats = [(i * 0.1 + (1.5 if i >= 100 else 0.0), 0) for i in range(1, 301)]
    beats += [(i * 0.1, 1) for i in range(1, 316)]
    assert play(started(TimeoutDetector(HB, 1.0), 2), beats, 31.5) == \
        pytest.approx({0: 9.9 + 1.0})
    assert play(started(PhiDetector(HB), 2), beats, 31.5) == {}


@settings(max_examples=80, deadline=None)
@given(beats=st.lists(st.tuples(st.floats(0.0, 0.6), st.integers(0, 3)), min_size=1, max_size=80),
       threshold=st.sampled_from([1.0, 3.0, 8.0]))
def test_the_keeper_times_each_worker_as_the_formula_says(
        beats: list[tuple[float, int]], threshold: float) -> None:
    """Any schedule of beats from four members: the keeper's timer is always
    the earliest deadline of a reference model (each worker's arrivals, its
    last ``window`` intervals), and its first eviction is that worker."""
    d = PhiDetector(HB, threshold=threshold, window=8)
    k = started(d, 4)
    arrivals = {w: [0.0] for w in range(4)}  # the Join: the first advance, no interval

    def deadline(w: int) -> float:
        a = arrivals[w]
        return a[-1] + d.silence_s(d.mean_s([y - x for x, y in zip(a, a[1:])]))

    now, counters = 0.05, [0] * 4
    for dt, w in beats:
        now += dt
        first = min(range(4), key=deadline)
        assert k.get_timer() == pytest.approx(deadline(first))
        if deadline(first) <= now:
            assert evicted(k.handle_timer(deadline(first)))[0] == (first, "timeout")
            return
        counters[w] += 1
        k.receive(now, Heartbeat(w, 0, 1, counters[w]))
        arrivals[w].append(now)


@settings(max_examples=150, deadline=None)
@given(runs=st.lists(st.tuples(st.integers(1, 30), st.floats(0.15, 2.5)), min_size=1,
                     max_size=5),
       threshold=st.sampled_from([1.0, 3.0, 8.0]), window=st.sampled_from([4, 16, 64]))
def test_the_bulk_form_of_beats_on_time_gives_phi_every_interval(
        runs: list[tuple[int, float]], threshold: float, window: int) -> None:
    """Worker 0 beats on time (every 0.1 s) in runs, each followed by a gap
    (its beats late, or stopped) and at last by its death; worker 1 beats
    on time throughout. A keeper that hears every beat, and one told as a
    simulator tells it (everyone beats on time, ``observe_beating_except``
    at each instant, ``observe_silent`` when a gap starts, the first beat
    after it heard alone), declare worker 0 dead at the same instant, or
    both not during a gap it survives: phi's window holds the same
    intervals on both."""
    d = PhiDetector(HB, threshold=threshold, window=window)
    heard, told = started(d, 2), started(d, 2)
    told.observe_beating_except(0.05, ())
    # worker 0's arrivals after its Join at 0 (instant, heard alone: the first after a gap)
    beats: list[tuple[float, bool]] = []
    gaps: list[float] = []  # the instants its gaps start (its last beat's arrival)
    start = 0.0
    for count, gap_s in runs:
        beats += [(start + k * HB, k == 0) for k in range(0 if gaps else 1, count + 1)]
        gaps.append(start + count * HB)
        start = gaps[-1] + gap_s
    end = gaps[-1] + d.silence_s(max(gap for _, gap in runs) + HB) + 1.0
    ones = [(k * HB, 1) for k in range(1, int(end / HB) + 2)]
    expected = play(heard, [(at, 0) for at, _ in beats if at > 0] + ones, end)
    assert tuple(expected) == (0,)

    deaths: dict[int, float] = {}
    silent: set[int] = set()
    events = sorted([(at, "beat") for at, alone in beats if alone and at > 0]
                    + [(at, "gap") for at in gaps] + [(at, "vouch") for at, _ in ones])
    counter = 0
    for at, kind in events:
        while (due := told.get_timer()) is not None and due <= at:
            for w, _ in evicted(told.handle_timer(due)):
                deaths[w] = due
        if 0 in deaths:
            break
        if kind == "gap":
            told.observe_silent(at, (0,))
            silent.add(0)
        elif kind == "beat":
            counter += 1
            told.receive(at, Heartbeat(0, 0, 1, counter))
            silent.discard(0)
        else:
            told.observe_beating_except(at, tuple(silent))
    while 0 not in deaths and (due := told.get_timer()) is not None and due <= end:
        for w, _ in evicted(told.handle_timer(due)):
            deaths[w] = due
    assert deaths.get(0) == pytest.approx(expected[0], abs=1e-9)


def test_make_detector_builds_each_kind() -> None:
    assert isinstance(make_detector("phi", 0.5, 3.0, 4.0), PhiDetector)
    assert make_detector("phi", 0.5, 3.0, 4.0).threshold == 4.0
    assert isinstance(make_detector("timeout", 0.5, 3.0), TimeoutDetector)
    with pytest.raises(ValueError):
        make_detector("gossip", 0.5, 3.0)
