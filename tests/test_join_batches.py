"""The core's rule for lives started together (rollcall.core.joins): their
Joins reach the keeper as one arrival, in id order, once every live one has
sent its Join or when the batch's time is up; every Join goes exactly once."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rollcall.core import Join, JoinBatches


def join(w: int, life: int = 0) -> Join:
    return Join(w, life, None)


def test_a_batch_goes_once_complete_in_id_order() -> None:
    b = JoinBatches()
    b.open([(2, 0), (0, 0), (1, 0)], until=10.0)
    assert b.hold(1.0, (2, 0), join(2)) and b.release(1.0) == []
    assert b.hold(2.0, (0, 0), join(0)) and b.release(2.0) == []
    assert b.hold(3.0, (1, 0), join(1))
    assert b.release(3.0) == [[join(0), join(1), join(2)]]
    assert b.get_timer() is None  # closed


def test_a_late_batch_goes_with_what_it_holds_and_later_joins_pass() -> None:
    b = JoinBatches()
    number = b.open([(0, 1), (1, 1)], until=5.0)
    assert b.hold(1.0, (0, 1), join(0, 1))
    assert b.get_timer() == 5.0 and b.until(number) == 5.0
    assert b.release(4.9) == []
    assert b.release(5.0) == [[join(0, 1)]]
    assert b.until(number) is None and b.get_timer() is None
    assert not b.hold(6.0, (1, 1), join(1, 1))  # its batch is gone: straight to the keeper


def test_an_exit_does_not_hold_the_others() -> None:
    b = JoinBatches()
    b.open([(0, 0), (1, 0)], until=100.0)
    assert b.hold(1.0, (0, 0), join(0))
    b.exited((1, 0))  # before it sent its Join
    assert b.release(1.0) == [[join(0)]]
    b.open([(0, 1), (1, 1)], until=100.0)
    assert b.hold(2.0, (1, 1), join(1, 1))
    b.exited((0, 1))
    assert b.release(2.0) == [[join(1, 1)]]


def test_joins_outside_a_batch_or_speaking_for_another_life_pass() -> None:
    b = JoinBatches()
    b.open([(0, 0)], until=100.0)
    assert not b.hold(1.0, (5, 0), join(5))  # no batch names it
    assert not b.hold(1.0, (0, 0), join(0, 3))  # another life's Join
    assert b.hold(1.0, (0, 0), join(0))
    assert not b.hold(1.0, (0, 0), join(0))  # held already: a second one passes


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_every_held_join_reaches_the_keeper_exactly_once(data: st.DataObject) -> None:
    """Random batches, arrivals, exits and clock: every Join held is released
    in exactly one batch, in id order, and no batch stays open past its
    deadline once released at that time."""
    b = JoinBatches()
    now = 0.0
    held: list[tuple[int, int]] = []
    released: list[tuple[int, int]] = []
    lives = data.draw(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 2)),
                               unique=True, min_size=1, max_size=10))
    for _ in range(data.draw(st.integers(1, 3))):
        group = data.draw(st.lists(st.sampled_from(lives), unique=True, min_size=1))
        b.open(group, until=now + data.draw(st.floats(0.0, 10.0)))
    for _ in range(data.draw(st.integers(0, 30))):
        now += data.draw(st.floats(0.0, 3.0))
        life = data.draw(st.sampled_from(lives))
        if data.draw(st.booleans()):
            if b.hold(now, life, join(*life)):
                held.append(life)
        else:
            b.exited(life)
        for group in b.release(now):
            assert [j.worker for j in group] == sorted(j.worker for j in group), group
            released.extend((j.worker, j.incarnation) for j in group)
        timer = b.get_timer()
        assert timer is None or timer > now, (timer, now)
    for group in b.release(float("inf")):
        released.extend((j.worker, j.incarnation) for j in group)
    assert sorted(released) == sorted(held)
