"""Where a run's time went, read from its history alone: one definition of
the summary's time metrics for both targets.

The elapsed time runs from the first generation formed (training starts) to
the last committed step of a completed run, or to the run's ``end`` record
otherwise. Every instant of it falls in exactly one category, the first of
these that covers it:

1. *stall*, ridden out: a member paused and resumed within its generation
   (a ``pause`` fault to its ``resume``): the step in flight waits for it,
   even when it then commits;
2. *productive*: computing a step that stayed committed (a lineage commit
   record's ``t0`` to ``t``; a bulk record cut by a rollback counts the
   kept share of its span);
3. *checkpoint*: writing a checkpoint (a checkpoint record's ``t0`` to ``t``);
4. *lost*: computing work that did not count: a commit that left the
   lineage (refused or rolled back; the record's ``t0`` to ``t``), and the
   step a roll call abandoned, from the generation's last commit until the
   job stalled (the generation's latest fault, not healed or resumed since,
   that took a member or the keeper out: :data:`STALLING`) or, when none
   did, until the roll call (a growth or straggler roll call abandons a
   running step);
5. *recovery*: from a roll call (or a restart's, or the first round at
   the start) opening to the first step of a generation it formed;
6. *stall*, the rest: members waiting on a silent or dead member before
   anything declared it gone, and any time no record accounts for.

Overlaps resolve by that order, so the five sum to the elapsed time.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, fields
from operator import itemgetter
from typing import Any, Iterable, Mapping, Optional, Sequence

from rollcall.core.history import expand_deltas
from rollcall.core.idset import IdRuns

__all__ = ["STALLING", "TIME_KEYS", "TIME_PARTS", "TimeAccount", "time_account"]

Span = tuple[float, float, int]  # start, end, category (its index in _ORDER)
Record = Mapping[str, Any]

_ORDER = ("stall", "productive", "checkpoint", "lost", "recovery")

#: Fault kinds that stop the job's exchange until a roll call or a heal: a
#: member or the keeper is gone or cut off (a slow, delayed or lossy link
#: slows the job; a join, a repair or a heal takes nobody out).
STALLING = frozenset({"kill", "crash", "kill_rack", "lose_host", "pause", "partition",
                      "isolate_keeper", "kill_keeper", "partition_keeper"})
_STALL, _PRODUCTIVE, _CHECKPOINT, _LOST, _RECOVERY = range(5)


@dataclass(frozen=True)
class TimeAccount:
    """A run's elapsed seconds and their split; the five parts sum to ``elapsed_s``."""

    elapsed_s: float
    productive_s: float
    checkpoint_s: float
    lost_work_s: float
    recovery_s: float
    stall_s: float


# the summary keys of the account, in its order: elapsed_s, then its parts
TIME_KEYS: tuple[str, ...] = tuple(f.name for f in fields(TimeAccount))
TIME_PARTS: tuple[str, ...] = TIME_KEYS[1:]


def time_account(records: Sequence[Record], lineage: Sequence[Record],
                 completed: bool) -> TimeAccount:
    """The account of a history whose committed lineage is ``lineage`` (the
    checker's :attr:`CheckReport.lineage`, possibly cut by rollbacks)."""
    kinds = _by_kind(records)
    if not kinds.generations:
        return TimeAccount(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    start_s = min(r["t"] for r in kinds.generations)
    if completed and lineage:
        end_s = max(c["t"] for c in lineage)
    else:
        end_s = kinds.ends[-1]["t"] if kinds.ends else max(r["t"] for r in records)
    end_s = max(start_s, end_s)
    spans = list(_commit_spans(kinds.commits, lineage))
    spans += ((r["t0"], r["t"], _CHECKPOINT) for r in kinds.checkpoints if "t0" in r)
    spans += _interrupted_spans(kinds.timeline, kinds.generations)
    spans += _recovery_spans(kinds.commits, kinds.opened)
    parts = _sweep(spans, start_s, end_s)
    elapsed = end_s - start_s
    stall = parts[_STALL] + max(0.0, elapsed - sum(parts))
    return TimeAccount(elapsed, parts[_PRODUCTIVE], parts[_CHECKPOINT], parts[_LOST],
                       parts[_RECOVERY], stall)


@dataclass
class _Kinds:
    """The records the account reads, by kind (in history order)."""

    commits: list[Record]
    checkpoints: list[Record]
    generations: list[Record]
    opened: list[Record]  # roll calls and restarts' rounds, the first (the start) too
    ends: list[Record]
    timeline: list[Record]  # faults, generations, commits and openings, by time


# the records the account reads: kind -> the type it reads of that kind
_READ = {"commit": "ok", "checkpoint": "ok", "generation": "ok", "round": "invoke",
         "fault": "info", "end": "info"}
_TIMELINE = ("commit", "generation", "round", "fault")
_TIME = itemgetter("t")


def _by_kind(records: Sequence[Record]) -> _Kinds:
    read: dict[str, list[Record]] = {f: [] for f in _READ}
    timeline = []  # in history order, then by time (a stable sort)
    for r in records:
        f = r.get("f")
        if f in _READ and r.get("type") == _READ[f]:
            read[f].append(r)
            # the start abandons no step: only later rounds are on the timeline
            if f in _TIMELINE and (f != "round" or r.get("reason") != "start"):
                timeline.append(r)
    timeline.sort(key=_TIME)
    return _Kinds(read["commit"], read["checkpoint"], read["generation"], read["round"],
                  read["end"], timeline)


def _commit_spans(commits: list[Record], lineage: Sequence[Record]) -> Iterable[Span]:
    """Productive spans of the lineage, lost ones of every other commit."""
    kept = {(c["gen"], c["step"]): c["last"] for c in lineage}
    for r in commits:
        t0, t = r["t0"], r["t"]
        last = kept.get((r["gen"], r["step"]))
        if last is None:
            yield t0, t, _LOST
            continue
        if last == r["last"]:
            yield t0, t, _PRODUCTIVE
            continue
        share = (last - r["step"] + 1) / (r["last"] - r["step"] + 1)
        assert 0 < share < 1, (r, last)
        cut = t0 + share * (t - t0)
        yield t0, cut, _PRODUCTIVE
        yield cut, t, _LOST


def _members(generations: list[Record]) -> dict[int, Optional[IdRuns]]:
    """Each generation's members (None where its record names none)."""
    return {r["gen"]: r.get("members") for r in expand_deltas(generations, lists=False)}


def _interrupted_spans(timeline: list[Record], generations: list[Record]) -> Iterable[Span]:
    """What a fault or a roll call cost the job beyond its recovery: a
    member paused and resumed within its generation stalls the job until
    it resumes (the step in flight waits for it, even when it commits); a
    roll call abandons the step in flight, from the generation's last commit
    until the job stalled (the generation's latest fault, not healed or
    resumed since, that took a member or the keeper out), or until the
    roll call."""
    current = 0  # the latest generation formed
    progress: Optional[float] = None  # the current generation's last commit
    stalled: Optional[float] = None  # the latest fault that takes a member or the keeper out
    paused: dict[int, float] = {}  # members paused, since when
    # each generation's members, read at the first pause (only a pause needs
    # them, and 10^4 restarts' lists cost more than the rest of the account)
    members: Optional[dict[int, Optional[IdRuns]]] = None
    for r in timeline:
        f = r["f"]
        if f == "commit":
            if r["gen"] == current:
                progress = r["t"] if progress is None else max(progress, r["t"])
        elif f == "fault":
            kind = r.get("kind")
            if kind in STALLING:
                stalled = r["t"]
            elif kind in ("resume", "heal"):
                stalled = None  # the member is back (or it was ridden out)
            if kind == "pause":
                if members is None:
                    members = _members(generations)
                ids = members.get(current)
                paused.update((w, r["t"]) for w in r.get("workers", ()) if ids is None or w in ids)
            elif kind == "resume":
                yield from ((paused.pop(w), r["t"], _STALL) for w in r.get("workers", ())
                            if w in paused)
        elif f == "generation":
            current, progress, stalled = r["gen"], None, None
            paused.clear()
        else:  # a roll call opens
            paused.clear()
            if progress is not None:
                stop = r["t"] if stalled is None else min(r["t"], max(progress, stalled))
                yield progress, stop, _LOST
                progress = None


def _recovery_spans(commits: list[Record], opened: list[Record]) -> Iterable[Span]:
    """From each roll call's opening to the first step of a later generation."""
    starts = sorted((r["t0"], r["gen"]) for r in commits)
    for r in opened:
        i = bisect.bisect_left(starts, (r["t"], -1))
        while i < len(starts) and starts[i][1] < r["gen"]:
            i += 1  # a step of an older generation, finishing late
        yield r["t"], starts[i][0] if i < len(starts) else float("inf"), _RECOVERY


def _sweep(spans: list[Span], start_s: float, end_s: float) -> list[float]:
    """Seconds of [start_s, end_s] per category, each instant to the first
    category (in :data:`_ORDER`) whose spans cover it: the first k
    categories together cover a union, and category k gets what its spans
    add to the union of those before it."""
    own: list[list[tuple[float, float]]] = [[] for _ in _ORDER]
    for a, b, category in spans:
        if a < start_s:
            a = start_s
        if b > end_s:
            b = end_s
        if b > a:
            own[category].append((a, b))
    parts, below = [], 0.0
    union: list[tuple[float, float]] = []  # of the categories so far: disjoint, sorted
    for intervals in own:
        intervals.sort()
        union = _coalesce(sorted(union + intervals))  # a merge of two sorted runs
        covered = sum([b - a for a, b in union])
        parts.append(max(0.0, covered - below))
        below = max(below, covered)
    return parts


def _coalesce(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted intervals as the disjoint, sorted intervals of their union."""
    out: list[tuple[float, float]] = []
    if not intervals:
        return out
    start, end = intervals[0]
    for a, b in intervals:
        if a > end:
            out.append((start, end))
            start, end = a, b
        elif b > end:
            end = b
    out.append((start, end))
    return out
