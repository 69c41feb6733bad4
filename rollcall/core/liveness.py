"""When the record-keeper last saw each tracked worker's heartbeat advance.

The keeper's own clock only (see :mod:`rollcall.core.detector`). At scale nearly
every tracked worker was last seen at one of a few instants: a simulator
reports "everyone but these few is alive now" in one call, a roll call's
answers or a relaunch's joins arrive together. So the record keeps *groups*:
an id set per instant, for workers that advanced in bulk, plus explicit
instants (``own``, with a heap to find the earliest) for workers that
advanced one by one (a real heartbeat). A worker is in exactly one group or
in ``own``. Marking 10^4 workers alive is a few set operations per group;
finding the next expiry and the expired workers costs the groups and the
individuals, never 10^4 steps.

A simulator, which sends no beat for a healthy worker, says instead which
workers beat on time (:meth:`Liveness.beat_on_time_except`): those have no
instant and never expire, as if each beat had come at its cadence, until
it says a worker fell silent (:meth:`Liveness.silent_since`, or a later
statement that leaves it out). A heartbeat brings a silent one back; a
worker tracked since the last statement has its instant until the next.
So the keeper's timer names the silent and the new workers' expiries only,
as it would with every beat delivered.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush
from typing import Callable, Optional

from rollcall.core.idset import EMPTY, IdRuns


class Liveness:
    """The tracked workers (the lives the keeper watches) and when each advanced."""

    __slots__ = ("tracked", "_groups", "_own", "_heap", "_seen", "_beating", "_vouched_at")

    # A batch this small is recorded worker by worker: a group per instant is
    # worth it for the bulk, not for a handful (the count of groups stays low).
    BULK_MIN = 8

    def __init__(self) -> None:
        self.tracked: IdRuns = EMPTY
        self._groups: dict[float, IdRuns] = {}  # instant -> workers that advanced then, in bulk
        # worker -> its instant, for the ones that advanced alone, shifted by
        # the worker's own extra tolerance where it has one (an adaptive
        # detector's: see set); the instant itself is then in _seen
        self._own: dict[int, float] = {}
        self._seen: dict[int, float] = {}
        self._heap: list[tuple[float, int]] = []  # (instant, worker) of _own, lazily pruned
        # the workers said to beat on time (no instant: they do not expire), and
        # when that was last said (None: never, and nobody beats on time)
        self._beating: IdRuns = EMPTY
        self._vouched_at: Optional[float] = None

    def __contains__(self, w: object) -> bool:
        return w in self.tracked

    def __len__(self) -> int:
        return len(self.tracked)

    def at(self, w: int) -> Optional[float]:
        if w not in self.tracked:
            return None
        if w in self._beating:
            assert self._vouched_at is not None
            return self._vouched_at  # the last instant it was said to beat on time
        t = self._own.get(w)
        if t is not None:
            return self._seen.get(w, t)
        for t, g in self._groups.items():
            if w in g:
                return t
        raise AssertionError(f"tracked worker {w} has no instant")  # pragma: no cover

    def beats_on_time(self, w: int) -> bool:
        """Whether ``w`` is said to beat on time (:meth:`beat_on_time_except`)."""
        return w in self._beating

    # --- updates --------------------------------------------------------------

    def set(self, now: float, w: int, extra_s: float = 0.0) -> None:
        """Track ``w`` (if not yet) as advanced at ``now``, with ``extra_s`` more
        tolerance than the detector's nominal one (an adaptive detector's, from
        the worker's cadence): the queries below see the instant ``now +
        extra_s``, so the keeper asks one question of every worker."""
        if w in self._beating:
            return  # it beats on time: this advance is one of its beats
        if w not in self.tracked:
            self.tracked = self.tracked | (w,)
        elif w not in self._own:
            self._ungroup(IdRuns.span(w, w))
        key = now + extra_s
        self._own[w] = key
        if extra_s:
            self._seen[w] = now
        elif self._seen:
            self._seen.pop(w, None)
        heappush(self._heap, (key, w))
        if len(self._heap) > 2 * len(self._own) + 64:
            self._reheap()

    def track(self, now: float, ws: IdRuns) -> None:
        """Track every worker of ``ws`` as advanced at ``now``."""
        if ws:
            self.tracked = self.tracked | ws
            self.advance(now, ws)

    def beat(self, now: float, w: int, extra_s: float = 0.0) -> None:
        """``w``'s heartbeat arrived at ``now`` (see :meth:`set`). Once
        workers were said to beat on time, a silent one beats on time again."""
        if self._vouched_at is None or w not in self.tracked:
            self.set(now, w, extra_s)
            return
        if w not in self._beating:
            self._forget(IdRuns.span(w, w))
            self._beating = self._beating | (w,)

    def beat_on_time_except(self, now: float, silent: IdRuns) -> None:
        """Every tracked worker but ``silent`` beats on time from ``now`` on
        (a simulator's exact bulk form of their heartbeats): until
        :meth:`silent_since` names it, or a later call leaves it out, when it
        was last seen at this call's ``now``. Costs the groups and the silent."""
        assert self._vouched_at is None or now >= self._vouched_at, (now, self._vouched_at)
        beating = self.tracked - silent
        leaving = self._beating - beating
        if leaving:  # silent since the last statement: last seen then
            assert self._vouched_at is not None
            self._beating = self._beating - leaving
            self.advance(self._vouched_at, leaving)
        self._forget(beating - self._beating)
        self._beating = beating
        self._vouched_at = now

    def silent_since(self, t: float, ws: IdRuns) -> None:
        """The tracked workers of ``ws`` last advanced at ``t`` and beat no more
        (a simulator's report of a worker fallen silent)."""
        ws = ws & self.tracked
        self._beating = self._beating - ws
        self.advance(t, ws)

    def _forget(self, ws: IdRuns) -> None:
        """``ws`` beat on time: they have no instant of their own."""
        if ws:
            self._ungroup(ws)
            self._disown(ws)

    def advance(self, now: float, ws: IdRuns) -> None:
        """The tracked workers of ``ws`` advanced at ``now`` (others, and those
        beating on time: ignored)."""
        ws = ws & self.tracked
        if self._beating:
            ws = ws - self._beating
        if not ws:
            return
        if len(ws) < self.BULK_MIN:
            for w in ws:
                self.set(now, w)
            return
        self._ungroup(ws)
        self._disown(ws)
        g = self._groups.get(now)
        self._groups[now] = ws if g is None else g | ws

    def advance_except(self, now: float, silent: IdRuns) -> None:
        """Every tracked worker but ``silent`` advanced at ``now``: the same as
        ``advance(now, tracked - silent)``, costing the groups and ``own``."""
        self.advance(now, self.tracked - silent)

    def drop(self, w: int) -> None:
        if w in self._beating:
            self._beating = self._beating - (w,)
            self.tracked = self.tracked - (w,)
        elif w in self.tracked:
            self.tracked = self.tracked - (w,)
            if self._own.pop(w, None) is None:
                self._ungroup(IdRuns.span(w, w))
            elif self._seen:
                self._seen.pop(w, None)

    def drop_many(self, ws: IdRuns) -> None:
        gone = ws & self.tracked
        if not gone:
            return
        self.tracked = self.tracked - gone
        if self._beating:
            self._beating = self._beating - gone
        self._ungroup(gone)
        self._disown(gone)

    def _ungroup(self, ws: IdRuns) -> None:
        """Take ``ws`` out of every group (an emptied group goes)."""
        groups = self._groups
        for t, g in list(groups.items()):
            rest = g - ws
            if rest is not g:
                if rest:
                    groups[t] = rest
                else:
                    del groups[t]

    def _disown(self, ws: IdRuns) -> None:
        """Take ``ws`` out of ``own`` (their heap entries go stale)."""
        own = self._own
        if not own:
            return
        if len(own) <= len(ws):
            for w in [w for w in own if w in ws]:
                del own[w]
        else:
            for w in ws:
                own.pop(w, None)
        seen = self._seen
        for w in [w for w in seen if w not in own]:
            del seen[w]

    def _reheap(self) -> None:
        self._heap = [(t, w) for w, t in self._own.items()]
        heapify(self._heap)

    # --- queries --------------------------------------------------------------

    def _top(self) -> Optional[float]:
        h, own = self._heap, self._own
        while h and own.get(h[0][1]) != h[0][0]:
            heappop(h)
        return h[0][0] if h else None

    def earliest(self) -> Optional[float]:
        """The oldest advance among the tracked workers (None if none), each
        shifted by its extra tolerance (see :meth:`set`)."""
        t = self._top()
        if self._groups:
            g = min(self._groups)
            t = g if t is None else min(t, g)
        return t

    def expired(self, due: Callable[[float], bool]) -> list[int]:
        """The tracked workers whose (shifted) advance instant is ``due``, sorted."""
        dead = EMPTY
        for t, g in self._groups.items():
            if due(t):
                dead = dead | g
        popped = []
        while self._top() is not None and due(self._heap[0][0]):
            popped.append(heappop(self._heap))
        for e in popped:  # still tracked until the keeper drops them
            heappush(self._heap, e)
        if popped:
            dead = dead | IdRuns.of(w for _, w in popped)
        return list(dead)
