"""Which life (incarnation) of each worker id the record-keeper knows, sparsely.

Incarnations are fencing tokens: a message from an older life of a worker is
refused. Most workers keep the life they started with (0), and a
checkpoint-restart moves every member to its next life at once. So the table
keeps only what differs from that: ``own`` holds the non-zero lives of
workers outside the *cohort* (the members the latest restart moved), and a
cohort member's life is ``base + delta`` with ``delta`` stored only where it
is not 0. A restart of 10^4 members costs the changes since the previous
restart (who joined or left the cohort), not 10^4 updates. Both maps are
:class:`_Layers`: a frozen base dict plus the few changes since it was last
folded, so a generation's snapshot (:class:`Lives`) copies the changes, not
the thousands of lives a long run accumulates, and two snapshots of one
table compare by the changes only.
"""

from __future__ import annotations

from typing import Iterator, Optional, Sequence

from rollcall.core.idset import EMPTY, IdRuns


class _Layers:
    """An id -> int map (0: absent) kept as a frozen ``base`` dict, shared by
    every snapshot, plus a small dict ``top`` of the changes since; ``top``
    is folded into a new base once it holds ``fold`` changes, so a snapshot
    costs at most ``fold`` copies and a fold is paid once per ``fold`` writes.

    ``folds`` (shared by a map and all its snapshots, append-only) keeps the
    ids each fold took in, and ``epoch`` how many folds this base has seen:
    two snapshots of one map, folds apart, differ only at the ids of their
    tops and of the folds between them (:meth:`changed_keys`), not at every
    id stored in a long run.
    """

    __slots__ = ("base", "top", "fold", "folds", "epoch", "_frozen")

    def __init__(self, base: Optional[dict[int, int]] = None,
                 top: Optional[dict[int, int]] = None, fold: int = 64,
                 folds: Optional[list[frozenset[int]]] = None, epoch: int = 0) -> None:
        self.base: dict[int, int] = {} if base is None else base  # never written
        self.top: dict[int, int] = {} if top is None else top  # 0 here hides a base entry
        self.fold = fold
        self.folds: list[frozenset[int]] = [] if folds is None else folds
        self.epoch = epoch
        assert epoch <= len(self.folds), (epoch, len(self.folds))
        self._frozen: Optional[_Layers] = None

    def get(self, w: int) -> int:
        v = self.top.get(w)
        return self.base.get(w, 0) if v is None else v

    def __setitem__(self, w: int, v: int) -> None:
        if self.get(w) == v:
            return
        self._frozen = None
        self.top[w] = v
        if len(self.top) > self.fold:
            base = dict(self.base)
            for k, x in self.top.items():
                if x:
                    base[k] = x
                else:
                    base.pop(k, None)
            assert self.epoch == len(self.folds), "only the live map folds"
            self.folds.append(frozenset(self.top))
            self.base, self.top, self.epoch = base, {}, self.epoch + 1

    def pop(self, w: int) -> int:
        v = self.get(w)
        if v:
            self[w] = 0
        return v

    def keys(self) -> Iterator[int]:
        """The ids with a non-zero value."""
        top = self.top
        for k in self.base:
            if k not in top:
                yield k
        for k, v in top.items():
            if v:
                yield k

    def __len__(self) -> int:
        """An upper bound on the number of non-zero entries (cheap)."""
        return len(self.base) + len(self.top)

    def frozen(self) -> "_Layers":
        """An unchanging copy (the same one until the next change)."""
        if self._frozen is None:
            self._frozen = _Layers(self.base, dict(self.top), self.fold, self.folds, self.epoch)
            self._frozen._frozen = self._frozen
        return self._frozen

    def __reduce__(self):
        """A copy elsewhere (a message's snapshot) carries the map, not the
        fold history: it shares no folds with anything, so it compares by
        its keys (as a copy's base is never the original's either)."""
        return (_Layers, (self.base, self.top, self.fold))

    def changed_keys(self, other: "_Layers") -> set[int]:
        """Every id whose value may differ between ``self`` and ``other``."""
        if self.base is other.base:
            return set(self.top).union(other.top)
        if self.folds is other.folds:  # one map's snapshots, some folds apart
            lo, hi = sorted((self.epoch, other.epoch))
            return set(self.top).union(other.top, *self.folds[lo:hi])
        return set(self.keys()).union(other.keys())


class LifeTable:
    """worker -> latest life the keeper knows of (0 for a worker never seen)."""

    __slots__ = ("_own", "_cohort", "_base", "_delta")

    FOLD = 64  # changes kept beside each map's base before folding them in

    def __init__(self) -> None:
        self._own = _Layers(fold=self.FOLD)
        self._cohort: IdRuns = EMPTY
        self._base = 0
        self._delta = _Layers(fold=self.FOLD)

    def get(self, w: int) -> int:
        if w in self._cohort:
            return self._base + self._delta.get(w)
        return self._own.get(w)

    def set(self, w: int, life: int) -> None:
        if life == self.get(w):
            return
        if w in self._cohort:
            self._delta[w] = life - self._base
        else:
            self._own[w] = life

    def bump(self, ws: IdRuns) -> None:
        """Every worker of ``ws`` moves to its next life; ``ws`` becomes the cohort.

        An empty ``ws`` (a restart of a group whose lives are all gone) moves
        nobody and keeps the cohort: emptying it would write every member's
        life out and the next restart of the same members would write them
        all back (Llama-3 checkpoint-restart: half the table's writes)."""
        if not ws:
            return
        cohort, base, delta, own = self._cohort, self._base, self._delta, self._own
        for w in cohort - ws:  # leaving the cohort: their life becomes explicit
            own[w] = base + delta.pop(w)
        entering = ws - cohort
        # an entering worker of life v gets delta v - base (its next life is
        # v + 1 = base + 1 + delta); with base 0 only the stored lives matter
        if base == 0 and len(entering) > len(own):
            for w in [w for w in own.keys() if w in entering]:
                delta[w] = own.pop(w)
        else:
            for w in entering:
                delta[w] = own.pop(w) - base
        self._cohort = ws
        self._base = base + 1

    def snapshot(self, members: IdRuns) -> "Lives":
        """The lives of ``members`` now, as an immutable sequence paired with them."""
        return Lives(members, self._own.frozen(), self._cohort, self._base, self._delta.frozen())

    def to_data(self) -> dict:
        """The table as plain data (a durable keeper record), in its sparse form:
        what :meth:`from_data` reads back into an equal table."""
        return {"own": sorted([w, self._own.get(w)] for w in self._own.keys()),
                "cohort": self._cohort.runs(), "base": self._base,
                "delta": sorted([w, self._delta.get(w)] for w in self._delta.keys())}

    @classmethod
    def from_data(cls, own: list[tuple[int, int]], cohort: IdRuns, base: int,
                  delta: list[tuple[int, int]]) -> "LifeTable":
        """The table :meth:`to_data` described (fields already checked)."""
        assert base >= 0 and all(v > 0 for _, v in own), "lives are never negative"
        table = cls()
        for w, v in own:
            table._own[w] = v
        table._cohort, table._base = cohort, base
        for w, v in delta:
            assert w in cohort and base + v >= 0, (w, v)
            table._delta[w] = v
        return table


class Lives(Sequence[int]):
    """The incarnation of each worker of ``members``, in the same order.

    Read-only, like the tuple it stands for: ``lives[i]`` is the life of
    ``members[i]``; :meth:`of` answers by worker id in O(log runs).
    """

    __slots__ = ("members", "_own", "_cohort", "_base", "_delta")

    def __init__(self, members: IdRuns, own: _Layers, cohort: IdRuns, base: int,
                 delta: _Layers) -> None:
        self.members = members
        self._own = own
        self._cohort = cohort
        self._base = base
        self._delta = delta

    def of(self, w: int) -> Optional[int]:
        """The life of member ``w``; None if ``w`` is not a member."""
        if w not in self.members:
            return None
        if w in self._cohort:
            return self._base + self._delta.get(w)
        return self._own.get(w)

    def restricted(self, members: IdRuns) -> "Lives":
        """The same lives for a subset of the members (no copy)."""
        return Lives(members & self.members, self._own, self._cohort, self._base, self._delta)

    def agreeing(self, ws: IdRuns, other: "Lives") -> IdRuns:
        """The members of both ``self`` and ``other`` in ``ws`` that have the
        same life in each, compared sparsely.

        A life is a base (``base`` in the cohort, 0 outside) plus a stored
        value; so ``ws`` splits into four regions by cohort, and in each only
        the ids stored on either side can differ from the region's rule (see
        :func:`_agreeing`). Costs the runs and the stored lives, never a step
        per member: a batch of agents checks a generation's admissions so.
        """
        ws = ws & self.members & other.members
        mine, theirs = self._cohort, other._cohort
        both = ws & mine & theirs
        only_mine = (ws & mine) - both
        only_theirs = (ws & theirs) - both
        neither = ws - mine - theirs
        out = EMPTY
        for region, base_a, a, base_b, b in (
                (both, self._base, self._delta, other._base, other._delta),
                (only_mine, self._base, self._delta, 0, other._own),
                (only_theirs, 0, self._own, other._base, other._delta),
                (neither, 0, self._own, 0, other._own)):
            if region:
                out = out | _agreeing(region, base_a, a, base_b, b)
        return out

    def having(self, ws: IdRuns, life: int) -> IdRuns:
        """The members of ``ws`` whose life is ``life``, sparsely (as :meth:`agreeing`)."""
        ws = ws & self.members
        inside = ws & self._cohort
        outside = ws - inside
        out = _agreeing(inside, self._base, self._delta, life, _NONE) if inside else EMPTY
        if outside:
            out = out | _agreeing(outside, 0, self._own, life, _NONE)
        return out

    def common_and_others(self, listed_max: Optional[int] = None,
                          ) -> tuple[int, Optional[list[tuple[int, int]]]]:
        """``(life, others)``: every member is at ``life`` except the
        ``(worker, life)`` pairs of ``others`` (by worker id); ``others`` is
        None, not listed, when there are more than ``listed_max`` members.

        The history's form of a relaunch set (``relaunch`` records). A
        restart relaunches members of the cohort, most at the cohort's life;
        the others are those whose life differs (a newcomer since the last
        restart, a repaired node). At scale those are every node repaired in
        the run, on every restart, hence ``listed_max``.
        """
        ws = self.members
        inside = ws & self._cohort
        outside = ws - inside
        common = self._base if inside else 0
        if listed_max is not None and len(ws) > listed_max:
            return common, None
        others: dict[int, int] = {}
        if inside:
            for w in self._delta.keys():
                if w in inside:
                    others[w] = self._base + self._delta.get(w)
        if outside:
            if common:  # outside the cohort a life is 0 unless one is stored
                others.update((w, 0) for w in outside)
            for w in self._own.keys():
                if w in outside:
                    others[w] = self._own.get(w)
        out = sorted((w, life) for w, life in others.items() if life != common)
        assert all(self.of(w) == life for w, life in out[:8]), "others are members' lives"
        return common, out

    def same_as(self, other: "Lives") -> bool:
        """Same members with the same lives, compared sparsely.

        Where both put a worker in their cohort with the same base, only the
        stored deltas can differ; every other member is compared one by one
        (at a restart: the few that joined or left the cohort since).
        """
        ws = self.members
        if ws != other.members:
            return False
        if self._own is other._own and self._delta is other._delta \
                and self._base == other._base and self._cohort == other._cohort:
            return True  # snapshots of one table with no change between them
        both = ws & self._cohort & other._cohort
        if both and self._base == other._base:
            mine, theirs = self._delta, other._delta
            for w in mine.changed_keys(theirs):
                if w in both and mine.get(w) != theirs.get(w):
                    return False
            rest = ws - both
        else:
            rest = ws
        return all(self.of(w) == other.of(w) for w in rest)

    def __len__(self) -> int:
        return len(self.members)

    def __getitem__(self, k):  # type: ignore[override]
        if isinstance(k, slice):
            return tuple(self)[k]
        return self.of(self.members[k])

    def __iter__(self) -> Iterator[int]:
        return map(self.of, self.members)  # type: ignore[arg-type]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (Lives, tuple, list)):
            return len(self) == len(other) and tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"Lives({dict(zip(self.members, self))!r})" if len(self) <= 16 else \
            f"Lives(<{len(self)} members>)"

    def __reduce__(self):
        return (Lives, (self.members, self._own, self._cohort, self._base, self._delta))


_NONE = _Layers()  # no stored value: every id reads 0


def _agreeing(ws: IdRuns, base_a: int, a: _Layers, base_b: int, b: _Layers) -> IdRuns:
    """The ids of ``ws`` where ``base_a + a[w] == base_b + b[w]``.

    An id stored on neither side agrees exactly when the bases do; so with
    equal bases only the ids whose stored values may differ are looked at,
    and otherwise only the stored ids can agree.
    """
    if base_a == base_b and a is b:
        return ws
    if len(ws) <= len(a) + len(b):  # fewer ids than stored lives: look at each id
        return IdRuns.of([w for w in ws if base_a + a.get(w) == base_b + b.get(w)])
    if base_a == base_b:
        # a.get(w) != b.get(w), read from the layers inline: a restart's
        # admissions compare hundreds of changed ids
        at, ab, bt, bb = a.top, a.base, b.top, b.base
        differ = []
        for w in a.changed_keys(b):
            va, vb = at.get(w), bt.get(w)
            if (ab.get(w, 0) if va is None else va) != (bb.get(w, 0) if vb is None else vb) \
                    and w in ws:
                differ.append(w)
        return ws - IdRuns.of(differ) if differ else ws
    stored = set(a.keys()).union(b.keys())
    return IdRuns.of(w for w in stored if w in ws and base_a + a.get(w) == base_b + b.get(w))
