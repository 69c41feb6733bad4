"""Which life (incarnation) of each worker id the record-keeper knows, sparsely.

Incarnations are fencing tokens: a message from an older life of a worker is
refused. Most workers keep the life they started with (0), and a
checkpoint-restart moves every member to its next life at once. So the table
keeps only what differs from that: ``own`` holds the non-zero lives of
workers outside the *cohort* (the members the latest restart moved), and a
cohort member's life is ``base + delta`` with ``delta`` stored only where it
is not 0. A restart of 10^4 members costs the changes since the previous
restart (who joined or left the cohort), not 10^4 updates; a generation's
snapshot (:class:`Lives`) shares the table's dicts until the table next
changes (copy on write), so a snapshot costs nothing and two snapshots with
no change between them compare in O(1).
"""

from __future__ import annotations

from typing import Iterator, Optional, Sequence

from rollcall.idset import EMPTY, IdRuns


class LifeTable:
    """worker -> latest life the keeper knows of (0 for a worker never seen)."""

    __slots__ = ("_own", "_cohort", "_base", "_delta", "_shared")

    def __init__(self) -> None:
        self._own: dict[int, int] = {}
        self._cohort: IdRuns = EMPTY
        self._base = 0
        self._delta: dict[int, int] = {}
        self._shared = False  # a snapshot holds the dicts: copy before writing

    def _write(self) -> None:
        if self._shared:
            self._own = dict(self._own)
            self._delta = dict(self._delta)
            self._shared = False

    def get(self, w: int) -> int:
        if w in self._cohort:
            return self._base + self._delta.get(w, 0)
        return self._own.get(w, 0)

    def set(self, w: int, life: int) -> None:
        if life == self.get(w):
            return
        self._write()
        if w in self._cohort:
            d = life - self._base
            if d:
                self._delta[w] = d
            else:
                self._delta.pop(w, None)
        elif life:
            self._own[w] = life
        else:
            self._own.pop(w, None)

    def set_many(self, ws: IdRuns, lives: "Sequence[int]") -> None:
        """``lives`` pairs with ``ws`` in order."""
        for w, life in zip(ws, lives):
            self.set(w, life)

    def bump(self, ws: IdRuns) -> None:
        """Every worker of ``ws`` moves to its next life; ``ws`` becomes the cohort."""
        self._write()
        cohort, base, delta, own = self._cohort, self._base, self._delta, self._own
        for w in cohort - ws:  # leaving the cohort: their life becomes explicit
            life = base + delta.pop(w, 0)
            if life:
                own[w] = life
            else:
                own.pop(w, None)
        entering = ws - cohort
        # an entering worker of life v gets delta v - base (its next life is
        # v + 1 = base + 1 + delta); with base 0 only the stored lives matter
        if base == 0 and len(entering) > len(own):
            for w in [w for w in own if w in entering]:
                delta[w] = own.pop(w)
        else:
            for w in entering:
                d = own.pop(w, 0) - base
                if d:
                    delta[w] = d
        self._cohort = ws
        self._base = base + 1

    def snapshot(self, members: IdRuns) -> "Lives":
        """The lives of ``members`` now, as an immutable sequence paired with them."""
        self._shared = True
        return Lives(members, self._own, self._cohort, self._base, self._delta)


class Lives(Sequence[int]):
    """The incarnation of each worker of ``members``, in the same order.

    Read-only, like the tuple it stands for: ``lives[i]`` is the life of
    ``members[i]``; :meth:`of` answers by worker id in O(log runs).
    """

    __slots__ = ("members", "_own", "_cohort", "_base", "_delta")

    def __init__(self, members: IdRuns, own: dict[int, int], cohort: IdRuns, base: int,
                 delta: dict[int, int]) -> None:
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
            return self._base + self._delta.get(w, 0)
        return self._own.get(w, 0)

    def restricted(self, members: IdRuns) -> "Lives":
        """The same lives for a subset of the members (no copy)."""
        return Lives(members & self.members, self._own, self._cohort, self._base, self._delta)

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
            for w in set(mine).union(theirs):
                if w in both and mine.get(w, 0) != theirs.get(w, 0):
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
