"""The duty cycle that makes a real worker slow (real/duty.py): pure bookkeeping
over a given clock, checked against the signals it sends."""

from __future__ import annotations

import signal

import pytest
from hypothesis import given, strategies as st

from real.duty import PERIOD_S, DutyCycle


def drive(d: DutyCycle, until: float) -> None:
    while (t := d.next_due()) is not None and t <= until:
        d.fire(t)


@given(factor=st.floats(1.5, 20.0), periods=st.integers(1, 50))
def test_the_process_runs_one_factor_th_of_each_period(factor: float, periods: int) -> None:
    sent: list[tuple[float, int]] = []
    now = [0.0]
    d = DutyCycle(lambda key, sig: sent.append((now[0], sig)))
    d.start(0.0, "w", factor)
    while (t := d.next_due()) is not None and t <= periods * PERIOD_S + 1e-9:
        now[0] = t
        d.fire(t)
    stops = [t for t, s in sent if s == signal.SIGSTOP]
    conts = [t for t, s in sent if s == signal.SIGCONT]
    assert len(stops) == periods and len(conts) == periods
    running = sum(stop - start for start, stop in zip([0.0] + conts, stops))
    assert running == pytest.approx(periods * PERIOD_S / factor)


def test_a_paused_worker_is_left_stopped_and_the_end_wakes_it() -> None:
    sent: list[int] = []
    d = DutyCycle(lambda key, sig: sent.append(sig))
    d.start(0.0, "w", 4.0)
    drive(d, 0.006)  # ran its 5 ms: stopped
    assert sent == [signal.SIGSTOP]
    d.hold("w")  # a pause's SIGSTOP
    assert d.next_due() is None
    d.release(1.0, "w")  # its SIGCONT: running again, a fresh period
    drive(d, 1.006)
    assert sent == [signal.SIGSTOP, signal.SIGSTOP]
    d.end("w", 4.0)  # the slowdown ends while stopped: woken, forgotten
    assert sent[-1] == signal.SIGCONT and d.next_due() is None


def test_slowdowns_compound_and_end_one_by_one() -> None:
    d = DutyCycle(lambda key, sig: None)
    d.start(0.0, "w", 2.0)
    d.start(0.0, "w", 3.0)
    assert d.cycles["w"].factor == 6.0
    d.end("w", 2.0)
    assert d.cycles["w"].factor == pytest.approx(3.0)
    d.end("w", 3.0)
    assert "w" not in d.cycles
