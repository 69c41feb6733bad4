"""When a fault scripted ``at_step`` lands: one definition for both targets.

:class:`~rollcall.core.faults.FaultPlan` says *which* faults N committed
steps make due. This module says *when* they land: once the keeper has
committed N steps for every member of the generation, at its answer to
the last member's commit request of step N-1. Earlier, a member could still
be a step behind the others, and whether the fault hit before or after its
step would be a race; later, the next step (which needs every member) could
already be on its way. So the observable is the same on both targets: the
fault finds N steps committed, never N+1.

Around that answer the kinds divide (:data:`BEFORE_THE_ANSWER`):

- a kill, a lost host or rack, a link fault and a slow order go in *before*
  the answer leaves: the answer wakes the last member, which must not run
  step N+1 across a machine or a link that is already gone, nor compute
  step N at full speed when it is its first slow one;
- the others (a pause, late heartbeats, a join, a fault of the keeper or
  its store) go in right *after* it: every member then holds the step.

A ``slow`` of fixed targets is handed out a step early (``from_step`` N,
see :meth:`FaultPlan.due_by_step`): it acts from step N on.

The real target counts the answers one by one (:meth:`StepFaults.answered`).
The sim votes once per run of steps, for the whole generation, so it says
that every member holds N steps at the instant that vote reaches the
keeper (:meth:`StepFaults.held_by_all`).
"""

from __future__ import annotations

from dataclasses import dataclass

from rollcall.core.faults import Due, FaultPlan

__all__ = ["BEFORE_THE_ANSWER", "StepAnswers", "StepDue", "StepFaults"]

#: the kinds that go in before the keeper's answer to the last member's
#: commit of the step (see the module docstring)
BEFORE_THE_ANSWER = ("partition", "isolate_keeper", "delay", "loss", "lose_host", "slow",
                     "kill", "kill_rack", "crash")


@dataclass(frozen=True)
class StepDue:
    """The faults a step makes land: those before the last answer, then those after it."""

    before: tuple[Due, ...] = ()
    after: tuple[Due, ...] = ()

    @classmethod
    def split(cls, due: list[Due]) -> "StepDue":
        """``due`` (in schedule order) divided around the answer, each part in that order."""
        return cls(tuple(d for d in due if d.kind in BEFORE_THE_ANSWER),
                   tuple(d for d in due if d.kind not in BEFORE_THE_ANSWER))

    def __bool__(self) -> bool:
        return bool(self.before or self.after)

    def in_order(self) -> list[Due]:
        """Every fault, in the order they go in."""
        return [*self.before, *self.after]


class StepAnswers:
    """Which members of a generation were answered ``ok`` for each step, until all were."""

    def __init__(self) -> None:
        self._answered: dict[tuple[int, int], set[int]] = {}

    def answered(self, generation: int, step: int, worker: int, members: int) -> bool:
        """``worker`` was answered ``ok`` for ``step`` of ``generation``:
        whether every one of its ``members`` now was (then it is forgotten)."""
        done = self._answered.setdefault((generation, step), set())
        done.add(worker)
        if len(done) < members:
            return False
        del self._answered[(generation, step)]
        return True

    def forget(self) -> None:
        """A new generation formed: the old one's steps will never be all answered."""
        self._answered.clear()


class StepFaults:
    """The step-scripted faults of one run, landing as :mod:`this module <rollcall.core.step_faults>` defines."""

    def __init__(self, plan: FaultPlan) -> None:
        self._plan = plan
        self._answers = StepAnswers()

    def answered(self, generation: int, step: int, worker: int, members: int,
                 committed: int) -> StepDue:
        """``worker`` was answered ``ok`` for ``step`` of ``generation`` (of
        ``members``), the job holding ``committed`` steps: the faults that
        land, once every member was (else none)."""
        if not self._answers.answered(generation, step, worker, members):
            return StepDue()
        return self.held_by_all(committed)

    def held_by_all(self, committed: int) -> StepDue:
        """Every member holds ``committed`` steps: the faults that land."""
        return StepDue.split(self._plan.due_by_step(committed))

    def next_step(self) -> int | None:
        """The committed count at which the next fault lands (None: none left)."""
        return self._plan.next_step()
