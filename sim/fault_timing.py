"""When the plan's step-scripted faults come due on the sim.

The core's :class:`rollcall.core.FaultPlan` says which ``at_step`` fault is
due at which step; the sim's instant for step N is when the members have
*computed* N steps (one latency before the last of those steps' votes
reaches the keeper), so the running segment is cut there. A ``Due`` whose
``from_step`` is still ahead (a ``slow`` handed out a step early) is held
until the cursor reaches it. The real target's instant is in
:mod:`real.fault_timing` (docs/design.md, "Decisions still made in the
drivers", item 1).
"""

from __future__ import annotations

from typing import Optional

from rollcall.core import Due, FaultPlan

__all__ = ["StepFaults"]


class StepFaults:
    """The step-scripted faults of one run: the plan's, and those held for a later step."""

    def __init__(self, plan: FaultPlan) -> None:
        self._plan = plan
        self._held: dict[int, list[Due]] = {}  # from_step -> faults handed out early

    def none_pending(self) -> bool:
        """Whether no step-scripted fault is left, in the plan or held."""
        return not self._held and self._plan.next_step() is None

    def next_stop(self, step: int) -> Optional[int]:
        """Where a segment running from ``step`` must end for a step-scripted
        fault: the step it acts at (one a past step owes: the next)."""
        steps = [s for s in (self._plan.next_step(), *self._held) if s is not None]
        return max(min(steps), step + 1) if steps else None

    def due(self, step: int) -> list[Due]:
        """The step-scripted faults to carry out now that ``step`` steps are
        done, in schedule order: those the core's plan hands out, each at the
        step it acts from (a ``slow`` handed out a step early waits for it)."""
        held = self._held
        dues = [due for key in sorted(k for k in held if k <= step)
                for due in held.pop(key)] + self._plan.due_by_step(step)
        for due in dues:
            ahead = due.from_step
            if ahead is not None and ahead > step:
                held.setdefault(ahead, []).append(due)
        return sorted((d for d in dues if d.from_step is None or d.from_step <= step),
                      key=lambda d: d.index)
