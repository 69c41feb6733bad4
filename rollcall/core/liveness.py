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
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush
from typing import Callable, Optional

from rollcall.core.idset import EMPTY, IdRuns


class Liveness:
    """The tracked workers (the lives the keeper watches) and when each advanced."""

    __slots__ = ("tracked", "_groups", "_own", "_heap", "_seen")

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

    def __contains__(self, w: object) -> bool:
        return w in self.tracked

    def __len__(self) -> int:
        return len(self.tracked)

    def at(self, w: int) -> Optional[float]:
        if w not in self.tracked:
            return None
        t = self._own.get(w)
        if t is not None:
            return self._seen.get(w, t)
        for t, g in self._groups.items():
            if w in g:
                return t
        raise AssertionError(f"tracked worker {w} has no instant")  # pragma: no cover

    # --- updates --------------------------------------------------------------

    def set(self, now: float, w: int, extra_s: float = 0.0) -> None:
        """Track ``w`` (if not yet) as advanced at ``now``, with ``extra_s`` more
        tolerance than the detector's nominal one (an adaptive detector's, from
        the worker's cadence): the queries below see the instant ``now +
        extra_s``, so the keeper asks one question of every worker."""
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

    def advance(self, now: float, ws: IdRuns) -> None:
        """The tracked workers of ``ws`` advanced at ``now`` (others: ignored)."""
        ws = ws & self.tracked
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
        if w in self.tracked:
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
