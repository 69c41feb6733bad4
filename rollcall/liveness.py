"""When the record-keeper last saw each tracked worker's heartbeat advance.

The keeper's own clock only (see :mod:`rollcall.detector`). At scale nearly
every tracked worker was last seen at the same instant: a simulator reports
"everyone but these few is alive now" in one call, a roll call's answers
arrive together. So the record is a shared ``base`` instant for the bulk
plus explicit instants (``own``) for the workers that differ, with a heap of
those to find the earliest. Marking 10^4 workers alive, finding the next
expiry and the expired workers cost the exceptions, not 10^4 steps.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush
from typing import Callable, Optional

from rollcall.idset import EMPTY, IdRuns


class Liveness:
    """The tracked workers (the lives the keeper watches) and when each advanced."""

    __slots__ = ("tracked", "_base", "_own", "_heap")

    def __init__(self) -> None:
        self.tracked: IdRuns = EMPTY
        self._base = float("-inf")  # when every tracked worker not in _own advanced
        self._own: dict[int, float] = {}
        self._heap: list[tuple[float, int]] = []

    def __contains__(self, w: object) -> bool:
        return w in self.tracked

    def __len__(self) -> int:
        return len(self.tracked)

    def at(self, w: int) -> Optional[float]:
        if w not in self.tracked:
            return None
        return self._own.get(w, self._base)

    # --- updates --------------------------------------------------------------

    def set(self, now: float, w: int) -> None:
        """Track ``w`` (if not yet) as advanced at ``now``."""
        if w not in self.tracked:
            self.tracked = self.tracked | (w,)
        self._own[w] = now
        heappush(self._heap, (now, w))
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
        rest = self.tracked - ws
        own = self._own
        if len(rest) < len(ws):
            # re-base: ``now`` becomes the bulk instant; the rest keep theirs
            keep = {w: t for w, t in own.items() if w not in ws}
            if len(self.tracked) > len(own):  # some used the old base
                base = self._base
                for w in rest:
                    if w not in own:
                        keep[w] = base
            self._own = keep
            self._base = now
            self._reheap()
        else:
            for w in ws:
                own[w] = now
                heappush(self._heap, (now, w))
            if len(self._heap) > 2 * len(own) + 64:
                self._reheap()

    def advance_except(self, now: float, silent: IdRuns) -> None:
        """Every tracked worker but ``silent`` advanced at ``now``: the same as
        ``advance(now, tracked - silent)``, costing the silent ones."""
        rest = silent & self.tracked
        if 2 * len(rest) < len(self.tracked):
            own, base = self._own, self._base
            self._own = {w: own.get(w, base) for w in rest}  # they keep theirs
            self._base = now
            self._reheap()
        else:
            self.advance(now, self.tracked - rest)

    def drop(self, w: int) -> None:
        if w in self.tracked:
            self.tracked = self.tracked - (w,)
            self._own.pop(w, None)

    def drop_many(self, ws: IdRuns) -> None:
        gone = ws & self.tracked
        if not gone:
            return
        self.tracked = self.tracked - gone
        own = self._own
        if len(own) <= len(gone):
            for w in [w for w in own if w in gone]:
                del own[w]
        else:
            for w in gone:
                own.pop(w, None)

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
        """The oldest advance among the tracked workers (None if none)."""
        t = self._top()
        if len(self.tracked) > len(self._own):
            t = self._base if t is None else min(t, self._base)
        return t

    def expired(self, due: Callable[[float], bool]) -> list[int]:
        """The tracked workers whose advance instant is ``due``, sorted."""
        dead: list[int] = []
        own = self._own
        if len(self.tracked) > len(own) and due(self._base):
            dead.extend(w for w in self.tracked if w not in own)  # a silent bulk: rare
        popped = []
        while self._top() is not None and due(self._heap[0][0]):
            t, w = heappop(self._heap)
            popped.append((t, w))
            dead.append(w)
        for e in popped:  # still tracked until the keeper drops them
            heappush(self._heap, e)
        return sorted(set(dead))
