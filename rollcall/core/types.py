"""Small value types shared by every part of the core.

Workers are named by integers: the initial workers are ``0 .. workers-1`` and
every newcomer (spare or join) takes the next unused id. A repaired machine
comes back under its old id with a higher incarnation.
"""

from __future__ import annotations

import bisect
from operator import itemgetter, sub
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

WorkerId = int


@dataclass(frozen=True, order=True)
class Cursor:
    """The training position: one point in the data stream.

    ``step`` counts committed optimizer steps, ``sample`` counts samples
    consumed from the endless stream of per-epoch permutations (stream offset
    ``q`` is sample ``perm[q // dataset_samples][q % dataset_samples]``).
    Under ``batch: constant`` ``sample == step * global_batch``; under
    ``shrink`` the two drift apart, so both are kept.
    """

    step: int = 0
    sample: int = 0

    def __init__(self, step: int = 0, sample: int = 0) -> None:
        # What the generated frozen __init__ does (no checks, no conversion),
        # without its object.__setattr__ per field: a sim run makes a cursor
        # per segment and per vote.
        d = self.__dict__
        d["step"] = step
        d["sample"] = sample

    # Equality written out (the generated one builds two tuples, and `!=`
    # went through it and negated): the sim compares cursors per segment.
    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return self.step == other.step and self.sample == other.sample  # type: ignore[attr-defined]
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return self.step != other.step or self.sample != other.sample  # type: ignore[attr-defined]
        return NotImplemented

    def to_json(self) -> list[int]:
        return [self.step, self.sample]

    @classmethod
    def from_json(cls, value: Iterable[int]) -> "Cursor":
        step, sample = value
        return cls(int(step), int(sample))


def to_ranges(ids: Iterable[int]) -> list[list[int]]:
    """Encode integer ids as sorted inclusive ``[lo, hi]`` runs.

    Member lists of thousands of workers with a few holes stay a few runs
    long, which keeps a weeks-long history small.
    """
    runs: list[list[int]] = []
    for i in sorted(set(ids)):
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return runs


def runs_of_sorted(ids: Sequence[int]) -> list[list[int]]:
    """:func:`to_ranges` for a strictly increasing sequence, in O(runs log n).

    In such a sequence ``ids[j] - j`` never decreases and is constant exactly
    along a run, so each run's end is found by bisection: a member list of
    10^4 ids with a few holes costs a few dozen steps, not 10^4.
    """
    runs: list[list[int]] = []
    i, n = 0, len(ids)
    while i < n:
        d = ids[i] - i
        lo, hi = i, n - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if ids[mid] - mid == d:
                lo = mid
            else:
                hi = mid - 1
        runs.append([ids[i], ids[lo]])
        i = lo + 1
    return runs


def from_ranges(runs: Iterable[Iterable[int]]) -> tuple[int, ...]:
    """Decode the output of :func:`to_ranges` back to a sorted tuple."""
    out: list[int] = []
    for lo, hi in runs:
        out.extend(range(int(lo), int(hi) + 1))
    return tuple(out)


class RunSet:
    """A member list kept as its id runs: membership by bisection.

    Ten thousand members over a thousand generations stay a few runs each
    instead of ten million Python ints.
    """

    __slots__ = ("runs", "_los", "_len")

    def __init__(self, runs: Iterable[Iterable[int]]) -> None:
        # a history's runs, JSON ints already; kept as given (a checker
        # compares most member lists and looks up ids in few of them)
        self.runs = runs if isinstance(runs, list) else list(runs)
        self._los: Optional[list[int]] = None
        self._len: Optional[int] = None

    def __contains__(self, worker: object) -> bool:
        if not isinstance(worker, int) or isinstance(worker, bool):
            return False
        if self._los is None:
            self._los = list(map(itemgetter(0), self.runs))
        i = bisect.bisect_right(self._los, worker) - 1
        return i >= 0 and worker <= self.runs[i][1]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RunSet):
            return False
        # runs as lists (JSON) or tuples: equal ids either way
        return self.runs == other.runs or \
            list(map(tuple, self.runs)) == list(map(tuple, other.runs))

    def __hash__(self) -> int:
        return hash(tuple(map(tuple, self.runs)))

    def __len__(self) -> int:
        if self._len is None:  # sum(hi - lo + 1), looped in C
            runs = self.runs
            self._len = sum(map(sub, map(itemgetter(1), runs), map(itemgetter(0), runs))) + len(runs)
        return self._len
