"""When a job is not expected to finish: the keeper's rule, measured as the run goes.

A job whose failures come faster than it recovers never finishes: each
recovery (a checkpoint-restart's restart, an elastic roll call after a loss)
is cut short by the next failure, and the run goes on until something
outside it is killed. The plan's analytic estimate (``rollcall.app.plan``) can
say so before the run; this rule says so *during* it, from what the keeper
sees, on both targets alike. Two measurements, either of which ends the
job (the keeper's :class:`~rollcall.core.keeper.JobFailed`):

* **Failures faster than recovery.** Over the last :data:`RECOVERY_WINDOW`
  recoveries, count those that completed (a step committed after them)
  against those a new failure cut short. With failures at rate ``lambda``
  and a recovery of ``R`` seconds, a share ``exp(-lambda R)`` completes, so
  the failed attempts per completed recovery estimate ``exp(lambda R) - 1``.
  The job is given up when that exceeds :data:`FAILED_ATTEMPTS_LIMIT`
  (20: failures arrive about three times as often as a recovery takes,
  ``lambda R >= ln 21``, and a completed recovery costs 21 attempts). The
  reason names the measured failure interval and recovery time.
* **No progress.** No step beyond the furthest one ever committed has
  committed over ``limit`` consecutive recoveries
  (``strategy.max_recoveries_without_progress``): the work redone after
  each rollback never gets past what was lost.

Pure: handed ``now``, no clock. The keeper calls :meth:`ProgressWatch.committed`
on each newly committed run of steps and :meth:`ProgressWatch.recovery` as
each recovery begins.
"""

from __future__ import annotations

from collections import deque
from typing import Optional

__all__ = ["FAILED_ATTEMPTS_LIMIT", "NOT_EXPECTED", "RECOVERY_WINDOW", "ProgressWatch"]

RECOVERY_WINDOW = 64  # recoveries the failure rate is measured over
FAILED_ATTEMPTS_LIMIT = 20.0  # failed attempts per completed recovery: beyond, given up

NOT_EXPECTED = "not expected to finish"


class ProgressWatch:
    """The recoveries of one keeper and the job's furthest step."""

    __slots__ = ("_limit", "_finished", "_cut_short", "_open_since", "_furthest",
                 "_since_progress")

    def __init__(self, limit: Optional[int], furthest: Optional[int] = None,
                 since_progress: int = 0) -> None:
        """``furthest`` and ``since_progress``: what a predecessor's record
        held (:attr:`furthest`, :attr:`since_progress`), so that a keeper's
        failover does not start the no-progress count over. The failure
        rate is measured anew in each term: its window is not recorded."""
        assert limit is None or limit >= 1, limit
        assert since_progress >= 0 and (furthest is None or furthest >= 0), (furthest,
                                                                             since_progress)
        self._limit = limit
        # the latest recoveries that ended: (start, end, completed)
        self._finished: deque[tuple[float, float, bool]] = deque(maxlen=RECOVERY_WINDOW)
        self._cut_short = 0  # the recoveries in the window that were cut short
        self._open_since: Optional[float] = None  # the recovery in progress began then
        self._furthest = -1 if furthest is None else furthest  # the furthest step committed
        self._since_progress = since_progress  # recoveries begun since the furthest step moved

    @property
    def furthest(self) -> Optional[int]:
        """The furthest step ever committed (None: none yet)."""
        return None if self._furthest < 0 else self._furthest

    @property
    def since_progress(self) -> int:
        """Recoveries begun since :attr:`furthest` last moved."""
        return self._since_progress

    def committed(self, now: float, last: int) -> None:
        """Steps up to ``last`` committed at ``now``: a recovery in progress completed."""
        if self._open_since is not None:
            self._end(now, True)
            self._open_since = None
        if last > self._furthest:
            self._furthest = last
            self._since_progress = 0

    def recovery(self, now: float) -> Optional[str]:
        """A recovery begins at ``now`` (one in progress is cut short):
        None, or why the job is not expected to finish."""
        if self._open_since is not None:
            assert now >= self._open_since, (now, self._open_since)
            self._end(now, False)
        self._open_since = now
        self._since_progress += 1
        limit = self._limit
        if limit is not None and self._since_progress > limit:
            what = ("no step" if self._furthest < 0 else
                    f"no step beyond step {self._furthest}")
            return (f"{NOT_EXPECTED}: {what} committed over {limit} consecutive recoveries "
                    f"(strategy.max_recoveries_without_progress)")
        return self._rate_verdict(now)

    def _end(self, now: float, completed: bool) -> None:
        """The recovery in progress ended at ``now``; the window keeps the
        latest (its count of those cut short follows, so the rule is read
        without a pass over the window at every recovery)."""
        finished = self._finished
        assert self._open_since is not None
        if len(finished) == finished.maxlen and not finished[0][2]:
            self._cut_short -= 1
        finished.append((self._open_since, now, completed))
        if not completed:
            self._cut_short += 1
        assert 0 <= self._cut_short <= len(finished), (self._cut_short, len(finished))

    def _rate_verdict(self, now: float) -> Optional[str]:
        finished = self._finished
        if len(finished) < RECOVERY_WINDOW:
            return None
        cut_short = self._cut_short
        if cut_short < FAILED_ATTEMPTS_LIMIT * max(1, len(finished) - cut_short):
            return None
        completed = [end - start for start, end, done in finished if done]
        every_s = (now - finished[0][0]) / len(finished)
        head = (f"{NOT_EXPECTED}: over the last {len(finished)} recoveries failures "
                f"interrupted the job every {every_s:.4g} s on average, and ")
        if not completed:
            return (head + f"none completed: {cut_short} failed attempts and no completed "
                    f"recovery, above the limit of {FAILED_ATTEMPTS_LIMIT:g} per completed one")
        return (head + f"{len(completed)} completed (in {sum(completed) / len(completed):.4g} s "
                f"on average): {cut_short / len(completed):.3g} failed attempts per completed "
                f"recovery, above the limit of {FAILED_ATTEMPTS_LIMIT:g}")
