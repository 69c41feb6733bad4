"""The sim's instants for the faults the plan scripts ``at_step``.

When such a fault lands is the core's definition
(:mod:`rollcall.core.step_faults`): once the keeper committed N steps for
every member, those before its answer first. The sim votes once per run of
steps, for the whole generation, and that vote reaches the keeper one
latency after the members computed step N: the fault lands then. So the
running segment is cut where the members have computed N steps, and what
lands is carried out a latency later. A ``slow`` handed out a step early
(its ``from_step`` still ahead) acts from that step: it is held until the
members begin it, as the real worker holds the order it was sent.
"""

from __future__ import annotations

from typing import Optional

from rollcall.core import Due, FaultPlan, StepFaults

__all__ = ["SimStepFaults"]


class SimStepFaults:
    """The step-scripted faults of one run: when they land, and the slows held for their step."""

    def __init__(self, plan: FaultPlan) -> None:
        self._faults = StepFaults(plan)
        self._held: dict[int, list[Due]] = {}  # from_step -> slows handed out early

    def none_pending(self) -> bool:
        """Whether no step-scripted fault is left, in the plan or held."""
        return not self._held and self._faults.next_step() is None

    def next_stop(self, step: int) -> Optional[int]:
        """Where a segment running from ``step`` must end for a step-scripted
        fault: the step it acts at (one a past step owes: the next)."""
        ahead = self._faults.next_step()
        if self._held:
            ahead = min(self._held) if ahead is None else min(ahead, *self._held)
        return None if ahead is None else max(ahead, step + 1)

    def computed(self, step: int) -> tuple[list[Due], list[Due]]:
        """The members computed ``step`` steps, their vote on its way:
        the held slows that act from ``step`` (now, as they begin it), and
        the faults that land when the vote reaches the keeper (in the order
        they go in)."""
        if self.none_pending():
            return [], []  # nothing scripted at a step is left (most runs: at once)
        held = self._held
        acting = [due for key in sorted(k for k in held if k <= step) for due in held.pop(key)]
        landing = []
        for due in self._faults.held_by_all(step).in_order():
            ahead = due.from_step
            if ahead is not None and ahead > step:
                held.setdefault(ahead, []).append(due)
            elif ahead is not None:
                acting.append(due)
            else:
                landing.append(due)
        return sorted(acting, key=lambda d: d.index), landing
