"""Unit tests of the agent's answer to a generation, fed by a real keeper.

What a member claims at a roll call and whether the generation's source
broadcasts are the core's decisions: the driver only carries
them out. Each test forms generations with :class:`Keeper`, hands the
Membership it broadcasts to one :class:`Agent` per member, and reads the
agents' ``Enter`` and, at the next roll call, their ``Join``.
"""

from __future__ import annotations

from typing import Optional

from hypothesis import given, strategies as st

from rollcall.core import (
    Agent, Broadcast, Checkpointed, Cursor, Enter, Join, Keeper, KeeperConfig, Membership,
    RollCall, SendToKeeper, TimeoutDetector,
)


def keeper(n_max: int = 4) -> Keeper:
    return Keeper(KeeperConfig(min_workers=1, max_workers=n_max, last_call_s=0.5,
                               detector=TimeoutDetector(0.5, 3.0)))


def membership(outputs: list) -> Membership:
    (m,) = [o.message for o in outputs
            if isinstance(o, Broadcast) and isinstance(o.message, Membership)]
    return m


def enter_all(m: Membership, now: float) -> dict[int, tuple[Agent, Enter]]:
    """One fresh agent per member (the life the keeper admitted), entered into ``m``."""
    out = {}
    for w, inc in zip(m.members, m.incarnations):
        a = Agent(w, inc, 0.5)
        a.start(now)
        (e,) = [x for x in a.receive(now, m) if isinstance(x, Enter)]
        out[w] = (a, e)
    return out


def claim(a: Agent, now: float) -> Optional[Cursor]:
    """The cursor the agent claims when the next roll call reaches it."""
    sends = [x.message for x in a.receive(now, RollCall(a.generation + 1, "failure"))
             if isinstance(x, SendToKeeper)]
    (join,) = [x for x in sends if isinstance(x, Join)]
    return join.cursor


def grow(held: dict[int, Optional[Cursor]], newcomers: dict[int, Optional[Cursor]],
         checkpoint: Optional[Cursor] = None) -> Membership:
    """Generation 1 of ``held``'s workers, then a growth round where they
    answer with the cursors ``held`` gives and ``newcomers`` join."""
    k = keeper()
    for w in held:
        k.receive(0.0, Join(w, 0, None))
    membership(k.handle_timer(1.0))
    if checkpoint is not None:
        k.receive(1.5, Checkpointed(min(held), 0, 1, checkpoint))
    out = []
    for w, c in newcomers.items():
        out += k.receive(2.0, Join(w, 0, c))
    for w, c in held.items():
        out += k.receive(2.1, Join(w, 0, c, 1))
    out += k.handle_timer(3.0)
    return membership(out)


def test_a_newcomer_is_stale_and_every_member_joins_the_broadcast() -> None:
    c = Cursor(3, 24)
    m = grow({0: c, 1: c}, {2: None})
    assert m.source == 0 and tuple(m.stale) == (2,)
    entered = enter_all(m, 3.0)
    assert {w: (e.sync, e.broadcast) for w, (_, e) in entered.items()} == {
        0: (False, True), 1: (False, True), 2: (True, True)}
    # until its trainer reports the copy done, the stale member claims no state
    assert claim(entered[2][0], 4.0) is None
    assert claim(entered[0][0], 4.0) == claim(entered[1][0], 4.0) == c


def test_the_stale_member_claims_the_state_once_its_trainer_has_it() -> None:
    c = Cursor(3, 24)
    a, e = enter_all(grow({0: c, 1: c}, {2: None}), 3.0)[2]
    assert e.sync
    a.state_ready(3.5, e.cursor)
    assert claim(a, 4.0) == c


def test_no_broadcast_when_every_member_holds_the_state() -> None:
    c = Cursor(5, 40)
    m = grow({0: c, 1: c, 2: c}, {})
    assert m.source == 0 and not m.stale
    assert not any(e.broadcast or e.sync for _, e in enter_all(m, 3.0).values())


def test_a_load_from_the_checkpoint_is_no_broadcast() -> None:
    ck = Cursor(1, 8)
    m = grow({0: None, 1: None}, {2: None}, checkpoint=ck)
    assert m.source is None and m.cursor == ck and tuple(m.stale) == (0, 1, 2)
    entered = enter_all(m, 3.0)
    assert all(e.sync and not e.broadcast for _, e in entered.values())
    assert all(claim(a, 4.0) is None for a, _ in entered.values())


def test_a_member_entering_at_the_origin_claims_it_before_its_trainer_builds_it() -> None:
    k = keeper()
    for w in (0, 1):
        k.receive(0.0, Join(w, 0, None))
    m = membership(k.handle_timer(1.0))
    assert m.source is None and m.cursor == Cursor() and not m.stale
    entered = enter_all(m, 1.0)
    assert all(not e.sync and not e.broadcast for _, e in entered.values())
    # the origin needs no copy: anyone can build it (Enter's docstring)
    assert claim(entered[0][0], 1.5) == Cursor()


cursors = st.one_of(st.none(), st.builds(lambda s: Cursor(s, 8 * s), st.integers(1, 4)))


@given(st.lists(cursors, min_size=1, max_size=3), st.lists(cursors, max_size=2))
def test_every_member_agrees_on_the_broadcast_and_only_the_stale_take_it(
        old: list[Optional[Cursor]], new: list[Optional[Cursor]]) -> None:
    m = grow(dict(enumerate(old)), {len(old) + i: c for i, c in enumerate(new)})
    entered = enter_all(m, 3.0)
    flags = {e.broadcast for _, e in entered.values()}
    assert flags == {m.source is not None and len(m.stale) > 0}
    for w, (a, e) in entered.items():
        assert e.sync == (w in m.stale) and e.source == m.source
        assert not (e.sync and w == m.source)
        assert claim(a, 4.0) == (None if e.sync else m.cursor)
