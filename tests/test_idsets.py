"""The keeper's compact bookkeeping against plain models (hypothesis).

``IdRuns`` (member lists as runs), ``Liveness`` (heartbeat instants as a base
plus exceptions) and ``LifeTable``/``Lives`` (sparse incarnations) exist only
to make a 10^4-member generation cheap; each must answer exactly what a
sorted tuple / a dict would.
"""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from rollcall.core.idset import IdRuns
from rollcall.core.lives import LifeTable
from rollcall.core.liveness import Liveness

ids = st.lists(st.integers(0, 60), max_size=40)


@given(ids, ids, st.integers(0, 60))
def test_id_runs_behave_as_a_sorted_tuple_and_a_set(a: list[int], b: list[int], x: int) -> None:
    ra, rb = IdRuns.of(a), IdRuns.of(b)
    sa, sb = sorted(set(a)), sorted(set(b))
    assert list(ra) == sa and len(ra) == len(sa) and tuple(ra) == tuple(sa)
    assert (ra == rb) == (sa == sb)
    assert [ra[i] for i in range(len(sa))] == sa
    assert [ra[-i - 1] for i in range(len(sa))] == sa[::-1]
    assert (x in ra) == (x in sa)
    if x in sa:
        assert ra.index(x) == sa.index(x)
    assert list(ra & rb) == sorted(set(a) & set(b))
    assert list(ra | rb) == sorted(set(a) | set(b))
    assert list(ra - rb) == sorted(set(a) - set(b))
    assert ra.issubset(rb) == set(a).issubset(b)
    assert ra.isdisjoint(rb) == set(a).isdisjoint(b)
    # runs are maximal: no two touch
    runs = ra.runs()
    assert all(hi + 1 < lo for (_, hi), (lo, _) in zip(runs, runs[1:]))
    assert IdRuns(runs) == ra and hash(IdRuns(runs)) == hash(ra)
    # equal only to another id set (the hash is the bitmask's, O(1)); a
    # tuple, list or set of the same ids is compared through tuple(ra)
    assert ra != tuple(sa) and ra != sa and ra != set(sa) and ra != frozenset(sa)


@given(st.lists(st.integers(0, 400), min_size=60, max_size=200),
       st.lists(st.integers(0, 400), max_size=12), st.lists(st.integers(0, 400), max_size=12),
       st.lists(st.integers(0, 400), max_size=12))
def test_set_algebra_on_many_shared_runs(base: list[int], a_out: list[int], b_out: list[int],
                                         extra: list[int]) -> None:
    """Two sets of dozens of runs that share most of them (members vs tracked
    workers): results whose runs numpy derives from the mask (more than a few
    ids) and small operands must agree with sets."""
    a = set(base) - set(a_out)
    b = (set(base) - set(b_out)) | set(extra)
    ra, rb = IdRuns.of(a), IdRuns.of(b)
    assert list(ra & rb) == sorted(a & b) and list(rb & ra) == sorted(a & b)
    assert list(ra - rb) == sorted(a - b) and list(rb - ra) == sorted(b - a)
    assert list(ra | rb) == sorted(a | b)
    few = IdRuns.of(extra[:3])  # a few runs spliced in or out of many
    assert list(ra - few) == sorted(a - set(few)) and list(ra | few) == sorted(a | set(few))
    assert list(few | ra) == sorted(a | set(few)) and list(ra & few) == sorted(a & set(few))
    for r in (ra & rb, ra - rb, rb - ra, ra | rb, ra - few, ra | few):
        runs = r.runs()
        assert all(hi + 1 < lo for (_, hi), (lo, _) in zip(runs, runs[1:]))
        assert len(r) == len(list(r))


@given(st.lists(st.integers(0, 200_000), max_size=40))
def test_a_few_ids_far_apart_read_off_the_mask(ids: list[int]) -> None:
    """A set of changes (a few ids, wide as a 10^5-node job): its ids and runs
    read off the top of the mask are the sorted ids and their runs."""
    want = sorted(set(ids))
    r = IdRuns.from_mask(sum(1 << i for i in want))
    assert list(r) == want and list(IdRuns.from_mask(r.mask).ascending()) == want
    assert r.runs() == IdRuns.of(want).runs() == [list(x) for x in IdRuns.of(want).runs()]
    runs = r.runs()
    assert all(hi + 1 < lo for (_, hi), (lo, _) in zip(runs, runs[1:]))
    assert sum(hi - lo + 1 for lo, hi in runs) == len(want)


@given(st.lists(st.tuples(st.integers(0, 20_000), st.integers(0, 300)), max_size=40),
       st.integers(0, 20_100), st.integers(0, 40))
def test_mask_and_runs_are_one_set(spans: list[tuple[int, int]], x: int, k: int) -> None:
    """The bitmask and the runs derived from it (bit by bit for a few ids,
    numpy over the mask's bytes for more) describe the same ids, across byte
    boundaries and ids far above 2**8; ranks, head and tail agree too."""
    ids = sorted({i for lo, n in spans for i in range(lo, lo + n)})
    r = IdRuns.of(ids)
    back = IdRuns.from_mask(r.mask)
    assert back == r and list(back) == ids and len(back) == len(ids)
    assert back.runs() == r.runs() and IdRuns(back.runs()) == r
    assert r.mask == sum(1 << i for i in ids)
    assert (x in back) == (x in set(ids))
    if ids:
        assert back.first() == ids[0] and back.last() == ids[-1] and back[len(ids) // 2] == ids[len(ids) // 2]
        assert back.index(ids[-1]) == len(ids) - 1
    if ids:  # a mask with no runs derived yet: ranks counted and ids peeled off the mask
        mid = ids[len(ids) // 2]
        assert IdRuns.from_mask(r.mask).index(mid) == len(ids) // 2
        assert list(IdRuns.from_mask(r.mask).ascending())[:5] == ids[:5]
    for cut in (k, k * len(ids) // 40):  # near the start, and anywhere
        for s in (r, back, IdRuns.from_mask(r.mask)):  # runs given, derived, none yet
            h, t = s.head(cut), s.tail(cut)
            assert list(h) == ids[:cut] and list(t) == ids[cut:]
            for part in (h, t):  # cut runs: the same as the mask's own
                assert part.runs() == IdRuns.from_mask(part.mask).runs()
                assert len(part) == len(list(part))


@pytest.mark.parametrize("make", [lambda: IdRuns.of([3, -1]), lambda: IdRuns([(-2, 4)]),
                                  lambda: IdRuns.span(-1, 2), lambda: IdRuns.from_mask(-5)])
def test_id_sets_refuse_negative_ids(make) -> None:
    with pytest.raises(ValueError):
        make()


class LivenessModel(RuleBasedStateMachine):
    """Liveness vs a dict worker -> last advance instant (and one of its
    shifted instant: an adaptive detector's extra tolerance), and the
    workers said to beat on time (no instant: they never expire; leaving,
    they were last seen when that was last said)."""

    def __init__(self) -> None:
        super().__init__()
        self.live = Liveness()
        self.model: dict[int, float] = {}
        self.shifted: dict[int, float] = {}
        self.beating: set[int] = set()
        self.vouched: float | None = None
        self.now = 0.0

    def _seen(self, ws: object, t: float) -> None:
        """Workers of ``ws`` that are tracked and not beating advanced at ``t``."""
        for w in ws:  # type: ignore[attr-defined]
            if w in self.model and w not in self.beating:
                self.model[w] = self.shifted[w] = t

    @rule(dt=st.floats(0.0, 5.0))
    def tick(self, dt: float) -> None:
        self.now += dt

    @rule(w=st.integers(0, 30), extra=st.sampled_from([0.0, 0.0, 0.5, 2.0]))
    def set_one(self, w: int, extra: float) -> None:
        self.live.set(self.now, w, extra)
        if w not in self.beating:
            self.model[w] = self.now
            self.shifted[w] = self.now + extra

    @rule(ws=ids)
    def track(self, ws: list[int]) -> None:
        self.live.track(self.now, IdRuns.of(ws))
        for w in ws:
            self.model.setdefault(w, self.now)
            self.shifted.setdefault(w, self.now)
        self._seen(ws, self.now)

    @rule(ws=ids)
    def advance(self, ws: list[int]) -> None:
        self.live.advance(self.now, IdRuns.of(ws))
        self._seen(ws, self.now)

    @rule(ws=ids)
    def advance_except(self, ws: list[int]) -> None:
        self.live.advance_except(self.now, IdRuns.of(ws))
        self._seen([w for w in self.model if w not in ws], self.now)

    @rule(ws=ids)
    def beat_on_time_except(self, ws: list[int]) -> None:
        self.live.beat_on_time_except(self.now, IdRuns.of(ws))
        beating = {w for w in self.model if w not in ws}
        for w in self.beating - beating:
            assert self.vouched is not None
            self.model[w] = self.shifted[w] = self.vouched
        self.beating, self.vouched = beating, self.now

    @rule(ws=ids, back=st.floats(0.0, 3.0))
    def silent_since(self, ws: list[int], back: float) -> None:
        t = self.now - back
        self.live.silent_since(t, IdRuns.of(ws))
        self.beating -= set(ws)
        self._seen(ws, t)

    @rule(w=st.integers(0, 30), extra=st.sampled_from([0.0, 0.5]))
    def beat(self, w: int, extra: float) -> None:
        self.live.beat(self.now, w, extra)
        if self.vouched is not None and w in self.model:
            self.beating.add(w)
        elif w not in self.beating:
            self.model[w] = self.now
            self.shifted[w] = self.now + extra

    @rule(w=st.integers(0, 30))
    def drop(self, w: int) -> None:
        self.live.drop(w)
        self.model.pop(w, None)
        self.shifted.pop(w, None)
        self.beating.discard(w)

    @rule(ws=ids)
    def drop_many(self, ws: list[int]) -> None:
        self.live.drop_many(IdRuns.of(ws))
        for w in ws:
            self.model.pop(w, None)
            self.shifted.pop(w, None)
            self.beating.discard(w)

    @rule(age=st.floats(0.0, 10.0))
    def expired(self, age: float) -> None:
        cut = self.now - age
        assert self.live.expired(lambda t: t <= cut) == sorted(
            w for w, t in self.shifted.items() if t <= cut and w not in self.beating)

    @invariant()
    def same(self) -> None:
        assert list(self.live.tracked) == sorted(self.model)
        for w in range(32):
            assert self.live.at(w) == (self.vouched if w in self.beating else self.model.get(w))
        silent = [t for w, t in self.shifted.items() if w not in self.beating]
        assert self.live.earliest() == (min(silent) if silent else None)


class LifeTableModel(RuleBasedStateMachine):
    """LifeTable and its snapshots vs a dict worker -> life."""

    def __init__(self) -> None:
        super().__init__()
        self.table = LifeTable()
        self.model: dict[int, int] = {}
        self.snaps: list[tuple[object, dict[int, int]]] = []

    @rule(w=st.integers(0, 30), life=st.integers(0, 5))
    def set_life(self, w: int, life: int) -> None:
        self.table.set(w, life)
        self.model[w] = life

    @rule(ws=ids)
    def bump(self, ws: list[int]) -> None:
        self.table.bump(IdRuns.of(ws))
        for w in set(ws):
            self.model[w] = self.model.get(w, 0) + 1

    @rule(ws=ids)
    def snapshot(self, ws: list[int]) -> None:
        members = IdRuns.of(ws)
        snap = self.table.snapshot(members)
        want = {w: self.model.get(w, 0) for w in members}
        assert list(snap) == [want[w] for w in members]
        # the history's form (relaunch records): one common life, the rest listed
        common, others = snap.common_and_others()
        assert others == sorted(others) and all(life != common for _, life in others)
        assert {w: dict(others).get(w, common) for w in members} == want
        assert snap.common_and_others(len(members) - 1) == (common, None)  # not listed
        self.snaps.append((snap, want))

    @invariant()
    def same(self) -> None:
        for w in range(32):
            assert self.table.get(w) == self.model.get(w, 0)
        for snap, want in self.snaps:  # a snapshot never changes afterwards
            assert {w: snap.of(w) for w in want} == want
            assert snap.same_as(snap.restricted(IdRuns.of(want)))
            # against the table now: the same exactly when no member's life moved
            now = self.table.snapshot(snap.members)  # type: ignore[attr-defined]
            moved = any(self.model.get(w, 0) != life for w, life in want.items())
            assert snap.same_as(now) != moved and now.same_as(snap) != moved
        if self.snaps:  # a snapshot travels to real workers pickled
            snap, want = self.snaps[-1]
            back = pickle.loads(pickle.dumps(snap))
            assert {w: back.of(w) for w in want} == want


def test_snapshot_differs_after_a_cohort_member_changes_life() -> None:
    """The case the sparse comparison can miss: a change recorded only on
    the newer side of two snapshots that share a base."""
    table = LifeTable()
    table.bump(IdRuns.of([1, 2]))
    before = table.snapshot(IdRuns.of([1, 2]))
    table.set(1, 5)
    after = table.snapshot(IdRuns.of([1, 2]))
    assert list(before) == [1, 1] and list(after) == [5, 1]
    assert not before.same_as(after) and not after.same_as(before)
    assert table.snapshot(IdRuns.of([1, 2])).same_as(after)


class _AllBulk(Liveness):
    BULK_MIN = 1  # every batch a group, even of one worker


class LivenessAllBulkModel(LivenessModel):
    """The same, with every batch recorded as a group."""

    def __init__(self) -> None:
        super().__init__()
        self.live = _AllBulk()


class _FoldOften(LifeTable):
    FOLD = 2  # changes folded into the shared base almost at every write


class LifeTableFoldingModel(LifeTableModel):
    """The same, with snapshots taken across many folds."""

    def __init__(self) -> None:
        super().__init__()
        self.table = _FoldOften()


TestLiveness = LivenessModel.TestCase
TestLivenessAllBulk = LivenessAllBulkModel.TestCase
TestLifeTable = LifeTableModel.TestCase
TestLifeTableFolding = LifeTableFoldingModel.TestCase
