"""The core's completion rule (rollcall/core/completion.py): a run whose
job has all its steps ends once every live member has reported, or the
grace after the verdict has ended; never before the verdict."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rollcall.core import FINAL_GRACE_S, Completion, Final

_events = st.lists(st.one_of(
    st.tuples(st.just("complete"), st.floats(0.0, 10.0)),
    st.tuples(st.just("final"), st.integers(0, 5)),
), max_size=12)


@given(_events, st.sets(st.integers(0, 5)), st.floats(0.0, 20.0), st.floats(0.0, 5.0))
def test_done_exactly_when_the_rule_says(events: list, live: set[int], now: float,
                                         grace_s: float) -> None:
    """``done`` is: the verdict came, and every live member reported or
    ``grace_s`` has passed since the (first) verdict; the end cursor is the
    first report's, whatever came later."""
    completion = Completion(grace_s)
    complete_at, reported, first = None, set(), None
    for kind, value in events:
        if kind == "complete":
            completion.job_complete(value)
            complete_at = value if complete_at is None else complete_at
        else:
            completion.final(value, Final([value, value], f"sha{value}"))
            reported.add(value)
            first = value if first is None else first
    expected = complete_at is not None and (live <= reported or now >= complete_at + grace_s)
    assert completion.done(now, live) == expected
    assert completion.complete == (complete_at is not None)
    assert completion.get_timer() == (None if complete_at is None else complete_at + grace_s)
    assert set(completion.finals) == reported
    assert completion.end_cursor("committed") == ("committed" if first is None else [first, first])


def test_a_member_that_never_reports_is_waited_for_the_grace_only() -> None:
    completion = Completion()
    completion.job_complete(10.0)
    completion.final(0, Final([8, 80], "a"))
    assert not completion.done(10.5, [0, 1])
    assert completion.get_timer() == 10.0 + FINAL_GRACE_S
    assert completion.done(10.0 + FINAL_GRACE_S, [0, 1])


def test_reports_before_the_verdict_end_nothing() -> None:
    """With direct worker links the reports can reach the launcher before the
    verdict does: the run still waits for the verdict, then ends at once."""
    completion = Completion()
    for w in (0, 1):
        completion.final(w, Final([8, 80], "a"))
    assert not completion.done(100.0, [0, 1]) and completion.get_timer() is None
    completion.job_complete(100.0)
    assert completion.done(100.0, [0, 1])


def test_no_live_member_left_ends_it_at_the_verdict() -> None:
    completion = Completion()
    completion.job_complete(3.0)
    assert completion.done(3.0, [])
    assert completion.end_cursor([8, 80]) == [8, 80]
