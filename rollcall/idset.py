"""Worker-id sets kept as sorted runs: the member list of a 10^4-node job.

A generation's member list is the sorted ids of its members. At scale it is
thousands of ids with a few holes (failed workers under repair) and a few
strays (spares that took their place), so it is a few dozen inclusive runs
``[lo, hi]``. :class:`IdRuns` keeps exactly that and is, at once:

* the ordered member list every worker sees (a read-only sequence: ``len``,
  indexing, ``.index()``, iteration in rank order, equality with a tuple of
  the same ids), so ``Formed.members`` and ``Membership.members`` keep their
  meaning; and
* a set with ``&``, ``|``, ``-``, ``in``, ``<=`` whose cost grows with the
  number of runs, never with the number of ids.

That is what lets the record-keeper handle a generation in O(changes): "every
member of generation g except these" is ``members - these``, a few runs, not
one tuple of 10^4 ids. Immutable and hashable, so a snapshot is shared, never
copied.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from itertools import accumulate, chain
from typing import Iterable, Iterator, Optional, Sequence, Union, overload

Ids = Union["IdRuns", Iterable[int]]


class IdRuns(Sequence[int]):
    """An immutable sorted set of ints stored as disjoint, non-adjacent runs."""

    __slots__ = ("_lo", "_hi", "_cum_", "_n", "_pairs_", "_hash")

    def __init__(self, runs: Iterable[Sequence[int]] = ()) -> None:
        """From inclusive ``[lo, hi]`` runs in increasing order (checked)."""
        lo: list[int] = []
        hi: list[int] = []
        for a, b in runs:
            a, b = int(a), int(b)
            if b < a:
                raise ValueError(f"empty run [{a}, {b}]")
            if hi and a <= hi[-1] + 1:
                if a <= hi[-1]:
                    raise ValueError("runs must be increasing and disjoint")
                hi[-1] = b  # adjacent: one run
            else:
                lo.append(a)
                hi.append(b)
        self._set(lo, hi)

    def _set(self, lo: list[int], hi: list[int]) -> None:
        self._lo = lo
        self._hi = hi
        self._cum_: Optional[list[int]] = None
        self._n = sum(hi) - sum(lo) + len(lo)
        self._pairs_: Optional[frozenset] = None
        self._hash: Optional[int] = None

    @property
    def _cum(self) -> list[int]:
        """``_cum[i]``: ids before run i; ``_cum[-1]``: the size (computed
        on first use: most sets of the keeper are only intersected)."""
        if self._cum_ is None:
            hi, lo = self._hi, self._lo
            self._cum_ = list(accumulate(map(int.__sub__, map((1).__add__, hi), lo), initial=0))
        return self._cum_

    @classmethod
    def _raw(cls, lo: list[int], hi: list[int]) -> "IdRuns":
        """From already normalised run bounds (no checks): internal."""
        out = cls.__new__(cls)
        out._set(lo, hi)
        return out

    @classmethod
    def from_bounds(cls, lo: list[int], hi: list[int]) -> "IdRuns":
        """From the run bounds of an already normalised set: ascending,
        disjoint, non-adjacent (a driver that cut its sorted ids at the gaps
        with numpy). Trusted, not checked: O(1) in Python."""
        return cls._raw(lo, hi) if lo else EMPTY

    @classmethod
    def of(cls, ids: Ids) -> "IdRuns":
        """Any iterable of ints (in any order, repeats allowed)."""
        if isinstance(ids, IdRuns):
            return ids
        if isinstance(ids, range) and ids.step == 1:
            return cls._raw([ids.start], [ids.stop - 1]) if len(ids) else EMPTY
        lo: list[int] = []
        hi: list[int] = []
        for i in sorted(set(ids)):
            if hi and hi[-1] == i - 1:
                hi[-1] = i
            else:
                lo.append(i)
                hi.append(i)
        return cls._raw(lo, hi)

    @classmethod
    def span(cls, lo: int, hi: int) -> "IdRuns":
        """The ids ``lo..hi`` inclusive (empty when hi < lo)."""
        return cls._raw([lo], [hi]) if hi >= lo else EMPTY

    # --- runs -----------------------------------------------------------------

    def runs(self) -> list[list[int]]:
        """Inclusive ``[lo, hi]`` runs, the history's member-list format."""
        return list(map(list, zip(self._lo, self._hi)))

    @property
    def n_runs(self) -> int:
        return len(self._lo)

    # --- sequence -------------------------------------------------------------

    def __len__(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return bool(self._lo)

    def __iter__(self) -> Iterator[int]:
        return chain.from_iterable(map(range, self._lo, map((1).__add__, self._hi)))

    def __reversed__(self) -> Iterator[int]:
        return reversed(tuple(self))

    @overload
    def __getitem__(self, k: int) -> int: ...

    @overload
    def __getitem__(self, k: slice) -> tuple[int, ...]: ...

    def __getitem__(self, k):
        if isinstance(k, slice):
            return tuple(self)[k]
        n = self._cum[-1]
        if k < 0:
            k += n
        if not 0 <= k < n:
            raise IndexError("IdRuns index out of range")
        i = bisect_right(self._cum, k) - 1
        return self._lo[i] + k - self._cum[i]

    def index(self, x: object, start: int = 0, stop: Optional[int] = None) -> int:
        """Rank of ``x`` (its position in the sorted list)."""
        i = self._run_of(x)
        if i < 0:
            raise ValueError(f"{x!r} is not in the list")
        k = self._cum[i] + x - self._lo[i]  # type: ignore[operator]
        if k < start or (stop is not None and k >= stop):
            raise ValueError(f"{x!r} is not in the list")
        return k

    def count(self, x: object) -> int:
        return 1 if x in self else 0

    def _run_of(self, x: object) -> int:
        if not isinstance(x, int) or isinstance(x, bool):
            return -1
        i = bisect_right(self._lo, x) - 1
        return i if i >= 0 and x <= self._hi[i] else -1

    def __contains__(self, x: object) -> bool:
        return self._run_of(x) >= 0

    def head(self, k: int) -> "IdRuns":
        """The ``k`` lowest ids."""
        if k >= len(self):
            return self
        if k <= 0:
            return EMPTY
        i = bisect_right(self._cum, k - 1) - 1
        lo, hi = self._lo[:i + 1], self._hi[:i + 1]
        hi[-1] = lo[-1] + k - 1 - self._cum[i]
        return IdRuns._raw(lo, hi)

    def tail(self, k: int) -> "IdRuns":
        """Every id but the ``k`` lowest."""
        if k <= 0:
            return self
        if k >= len(self):
            return EMPTY
        i = bisect_right(self._cum, k) - 1
        lo, hi = self._lo[i:], self._hi[i:]
        lo[0] = self._lo[i] + k - self._cum[i]
        return IdRuns._raw(lo, hi)

    # --- comparison -----------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        """Same ids. Against a tuple or list: the same ordered list; against
        a set: the same set (an IdRuns is both)."""
        if isinstance(other, IdRuns):
            return self._lo == other._lo and self._hi == other._hi
        if isinstance(other, (tuple, list)):
            return len(other) == len(self) and tuple(other) == tuple(self)
        if isinstance(other, (set, frozenset)):
            return len(other) == len(self) and all(map(other.__contains__, self))
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self) -> int:
        """The hash of the equal tuple, so either may key a dict (O(n) once)."""
        if self._hash is None:
            self._hash = hash(tuple(self))
        return self._hash

    def __repr__(self) -> str:
        return f"IdRuns({self.runs()!r})"

    def __reduce__(self):
        return (IdRuns, (self.runs(),))

    # --- set algebra ----------------------------------------------------------

    def isdisjoint(self, other: Ids) -> bool:
        if not isinstance(other, IdRuns):
            return not any(map(self.__contains__, other))
        return not (self & other)

    def issubset(self, other: Ids) -> bool:
        return not (self - IdRuns.of(other))

    __le__ = issubset

    def _pairs(self) -> frozenset:
        """The runs as a set of ``(lo, hi)`` (cached: the keeper's long-lived
        sets, members and tracked workers, meet many others)."""
        if self._pairs_ is None:
            self._pairs_ = frozenset(zip(self._lo, self._hi))
        return self._pairs_

    def __sub__(self, other: Ids) -> "IdRuns":
        o = IdRuns.of(other)
        if not self or not o:
            return self
        if self is o:
            return EMPTY
        alo, ahi, blo, bhi = self._lo, self._hi, o._lo, o._hi
        if len(blo) <= _SPLICE_MAX_RUNS < len(alo):
            for x, y in zip(blo, bhi):
                alo, ahi = _splice_out(alo, ahi, x, y)
            return self if alo is self._lo else IdRuns._raw(alo, ahi)
        if len(alo) >= _COMMON_MIN_RUNS and len(blo) >= _COMMON_MIN_RUNS:
            # a run in both is gone whole and cuts nothing else: only the
            # runs that differ need the walk below
            mine = self._pairs() - o._pairs()
            if not mine:
                return EMPTY
            if len(mine) < len(alo):
                alo, ahi = _unzip(sorted(mine))
                blo, bhi = _unzip(sorted(o._pairs() - self._pairs()))
                lo, hi = _cut(alo, ahi, blo, bhi)
                return IdRuns._raw(lo, hi)
        lo, hi = _cut(alo, ahi, blo, bhi)
        return self if len(lo) == len(alo) and lo == alo and hi == ahi else IdRuns._raw(lo, hi)

    difference = __sub__

    def __rsub__(self, other: Ids) -> "IdRuns":
        return IdRuns.of(other) - self

    def __and__(self, other: Ids) -> "IdRuns":
        o = IdRuns.of(other)
        if not self or not o:
            return EMPTY
        if self is o:
            return self
        if len(o._lo) < len(self._lo):
            a, b = o, self
        else:
            a, b = self, o
        if len(a._lo) <= _SPLICE_MAX_RUNS or len(a._lo) * 8 < len(b._lo):
            # few runs against many: clip each against the runs it meets
            lo, hi = _clip(a._lo, a._hi, b._lo, b._hi)
            return IdRuns._raw(lo, hi)
        gone = a - b  # a & b = a - (a - b); near-equal sets differ by little
        if not gone:
            return a
        if gone is a:
            return EMPTY
        return a - gone

    intersection = __and__
    __rand__ = __and__

    def __or__(self, other: Ids) -> "IdRuns":
        o = IdRuns.of(other)
        if not o or self is o:
            return self
        if not self:
            return o
        a, b = (self, o) if len(o._lo) <= len(self._lo) else (o, self)
        if len(b._lo) >= _COMMON_MIN_RUNS:
            b = b - a  # only what is new needs merging in
            if not b:
                return a
        if len(b._lo) <= _SPLICE_MAX_RUNS < len(a._lo):
            lo, hi = a._lo, a._hi
            for x, y in zip(b._lo, b._hi):
                lo, hi = _splice_in(lo, hi, x, y)
            return a if lo is a._lo else IdRuns._raw(lo, hi)
        lo = []
        hi = []
        for x, y in sorted(chain(zip(a._lo, a._hi), zip(b._lo, b._hi))):
            if hi and x <= hi[-1] + 1:
                if y > hi[-1]:
                    hi[-1] = y
            else:
                lo.append(x)
                hi.append(y)
        return IdRuns._raw(lo, hi)

    union = __or__
    __ror__ = __or__

    def first(self) -> int:
        if not self._lo:
            raise ValueError("empty IdRuns")
        return self._lo[0]


EMPTY = IdRuns()

# Adding or removing a few runs (one worker joined, one died) to a set of
# many: splice the lists around them (bisect and slice), O(log n) in Python.
_SPLICE_MAX_RUNS = 4


def _splice_out(lo: list[int], hi: list[int], x: int, y: int) -> tuple[list[int], list[int]]:
    """``lo, hi`` without ``[x, y]``; the same lists when nothing changes."""
    i = bisect_right(hi, x - 1)  # first run that ends at x or later
    j = bisect_right(lo, y)      # first run that starts after y
    if i >= j:
        return lo, hi
    mid_lo: list[int] = []
    mid_hi: list[int] = []
    if lo[i] < x:
        mid_lo.append(lo[i])
        mid_hi.append(x - 1)
    if hi[j - 1] > y:
        mid_lo.append(y + 1)
        mid_hi.append(hi[j - 1])
    return lo[:i] + mid_lo + lo[j:], hi[:i] + mid_hi + hi[j:]


def _splice_in(lo: list[int], hi: list[int], x: int, y: int) -> tuple[list[int], list[int]]:
    """``lo, hi`` with ``[x, y]``; the same lists when nothing changes."""
    i = bisect_right(hi, x - 2)  # first run that ends at x - 1 or later (touches)
    j = bisect_right(lo, y + 1)  # first run that starts after y + 1
    if i < j:
        if lo[i] <= x and hi[j - 1] >= y and j == i + 1:
            return lo, hi  # already inside one run
        x, y = min(x, lo[i]), max(y, hi[j - 1])
    return lo[:i] + [x] + lo[j:], hi[:i] + [y] + hi[j:]


# Sets of at least this many runs are compared run by run first (as sets of
# ``(lo, hi)`` pairs, in C): the keeper's sets are mostly the same runs (the
# members and the tracked workers differ by a few holes), and the Python
# walks below then only see the runs that differ.
_COMMON_MIN_RUNS = 16


def _unzip(pairs: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _cut(alo: list[int], ahi: list[int], blo: list[int],
         bhi: list[int]) -> tuple[list[int], list[int]]:
    """The runs of ``a`` minus those of ``b`` (both sorted, normalised)."""
    nb = len(blo)
    lo: list[int] = []
    hi: list[int] = []
    j = 0
    for a, b in zip(alo, ahi):
        j = bisect_left(bhi, a, j)  # skip the b runs wholly before [a, b]
        k = j
        while k < nb and blo[k] <= b:
            x, y = blo[k], bhi[k]
            if x > a:
                lo.append(a)
                hi.append(x - 1)
            a = y + 1
            if a > b:
                break
            k += 1
        if a <= b:
            lo.append(a)
            hi.append(b)
    return lo, hi


def _clip(alo: list[int], ahi: list[int], blo: list[int],
          bhi: list[int]) -> tuple[list[int], list[int]]:
    """The runs of ``a`` intersected with ``b``; ``a`` the one with fewer runs."""
    nb = len(blo)
    lo: list[int] = []
    hi: list[int] = []
    for a, b in zip(alo, ahi):
        j = bisect_right(blo, a) - 1
        if j < 0:
            j = 0
        while j < nb and blo[j] <= b:
            x, y = blo[j], bhi[j]
            if x < a:
                x = a
            if y > b:
                y = b
            if x <= y:
                lo.append(x)
                hi.append(y)
            j += 1
    return lo, hi
