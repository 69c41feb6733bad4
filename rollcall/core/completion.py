"""When a job that has all its steps is over: one rule for every target.

The keeper's commit vote says when the last step is committed
(``CommitVerdict.complete``). The run is over once, after that, the members
have said so themselves: each member with a live process sends a *final*
report (its cursor and a digest of its weights, so the checks can see that
every replica ended with the same state). A member that died or hangs sends
nothing, so the run waits for the reports no longer than ``grace_s`` after
the verdict (the links are drained after the run's end, and a report read
then still counts). The end cursor is the first report's (the job's state
as a member holds it), or the committed one where none came.

The sim's members report at the instant the last vote passes; the real
target's members report over their links, in any order with the keeper's
verdict (with direct worker links the verdict reaches the launcher on a
link of its own).

Sans-IO: the caller hands in the verdict (with ``now``) and each report, and asks
whether the run is over (:meth:`Completion.done`) and when to ask next
(:meth:`Completion.get_timer`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional

#: How long the run waits, once the job is complete, for the live members' final reports.
FINAL_GRACE_S = 2.0


@dataclass(frozen=True)
class Final:
    """A member's report of how the job ended for it."""

    cursor: Any  # the cursor's JSON form (a list)
    digest: Optional[str]  # the weights' sha256, where the target computes them


class Completion:
    """The end of one run's job: the verdict, the members' final reports, the grace."""

    def __init__(self, grace_s: float = FINAL_GRACE_S) -> None:
        assert grace_s >= 0.0, grace_s
        self._grace_s = grace_s
        self._complete_at: Optional[float] = None
        self._finals: dict[int, Final] = {}

    @property
    def complete(self) -> bool:
        """The keeper committed the job's last step."""
        return self._complete_at is not None

    @property
    def finals(self) -> Mapping[int, Final]:
        """Each member's latest final report, in the order they first came (a copy)."""
        return dict(self._finals)

    def job_complete(self, now: float) -> None:
        """The keeper's vote said the job has all its steps (the first time counts)."""
        if self._complete_at is None:
            self._complete_at = now

    def final(self, worker: int, report: Final) -> None:
        """``worker`` reported how the job ended for it (a later report replaces it)."""
        self._finals[worker] = report

    def get_timer(self) -> Optional[float]:
        """When the grace ends (``grace_s`` after the verdict); None before it."""
        if self._complete_at is None:
            return None
        return self._complete_at + self._grace_s

    def done(self, now: float, live_members: Iterable[int]) -> bool:
        """Whether the run is over: the job is complete, and every member with
        a live process has reported (none left: at once) or the grace has ended."""
        deadline = self.get_timer()
        if deadline is None:
            return False
        return now >= deadline or all(w in self._finals for w in live_members)

    def end_cursor(self, committed: Any) -> Any:
        """The cursor the run ended at: the first report's, else ``committed``."""
        first = next(iter(self._finals.values()), None)
        return committed if first is None else first.cursor
