"""Lives started together join together: one rule for every target.

A batch is the processes started at once: the job's first workers and
spares, or the lives a checkpoint-restart relaunches. Their Joins reach the
keeper as one arrival, in worker-id order, once every one of them still
alive has sent its Join, or when the batch's time is up (a process that
never starts must not hold the others). So which of them the keeper keeps as
standbys beyond ``max_workers`` is the lowest ids, and the first generation
is the whole job, not whoever imported torch first. On the sim the batch's
processes start at the same instant and their Joins are one
:class:`~rollcall.core.messages.JoinBatch`; the real target starts
processes that take seconds each, and holds their Joins here (in the
launcher, or in a keeper process with direct worker links).

Sans-IO: the caller hands in ``now``, each Join as it comes and each exit,
and asks which batches go (:meth:`JoinBatches.release`) and when it must ask
next (:meth:`JoinBatches.get_timer`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional

from rollcall.core.messages import Join

Life = tuple[int, int]  # (worker id, the life its process runs as)


@dataclass
class _Batch:
    lives: set[Life]
    until: float
    sent: set[Life] = field(default_factory=set)
    held: list[tuple[int, Join]] = field(default_factory=list)

    def complete(self) -> bool:
        """Whether every life still alive (not :meth:`JoinBatches.exited`) has sent its Join."""
        return self.sent >= self.lives


class JoinBatches:
    """The open batches of one run, keyed by the number :meth:`open` returns."""

    def __init__(self) -> None:
        self._batches: dict[int, _Batch] = {}
        self._opened = 0

    def open(self, lives: Iterable[Life], until: float) -> int:
        """A batch of ``lives`` started now; their Joins wait at most until
        ``until``. Returns its number."""
        self._opened += 1
        self._batches[self._opened] = _Batch(set(lives), until)
        return self._opened

    def hold(self, now: float, life: Life, join: Join) -> bool:
        """``life``'s Join came: True when it waits for its batch, False when
        it goes to the keeper at once (no open batch names the life, its Join
        was held already, the batch's time is up, or the Join speaks for
        another life: the keeper's fencing answers that one)."""
        if (join.worker, join.incarnation) != life:
            return False
        batch = next((b for b in self._batches.values()
                      if life in b.lives and life not in b.sent), None)
        if batch is None:
            return False
        batch.sent.add(life)
        if now >= batch.until:
            return False
        batch.held.append((life[0], join))
        return True

    def exited(self, life: Life) -> None:
        """``life``'s process ended: its batch no longer waits for it."""
        for batch in self._batches.values():
            batch.lives.discard(life)

    def release(self, now: float) -> list[list[Join]]:
        """The held Joins of each batch that is complete (every life that has
        not exited sent its Join) or late, each batch's in id order; those
        batches close."""
        out = []
        for number, batch in list(self._batches.items()):
            if now < batch.until and not batch.complete():
                continue
            del self._batches[number]
            if batch.held:
                out.append([join for _, join in sorted(batch.held, key=lambda x: x[0])])
        return out

    def until(self, number: int) -> Optional[float]:
        """Batch ``number``'s deadline while it is open (None: released)."""
        batch = self._batches.get(number)
        return None if batch is None else batch.until

    def get_timer(self) -> Optional[float]:
        """When the next open batch's time is up (None: none is open)."""
        return min((b.until for b in self._batches.values()), default=None)
