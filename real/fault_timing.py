"""When, on the real target, each fault the core's plan makes due goes in.

What is due is the core's :class:`rollcall.core.FaultPlan`: by time since
the training started (``at_s``, random lifetimes), by the keeper's record
of a roll call (``at_roll_call``), by the committed step (``at_step``).
This class holds the real target's instants for them, which the launcher
reaches by its clock and its commit answers, and hands each fault to the
fault injector (``inject``) then:

- a roll call's faults after the keeper's outputs that opened it (in the
  launcher's timers), as the sim carries them out, never inside them;
- a step's faults as the core defines it (:mod:`rollcall.core.step_faults`):
  once every member of the generation has had its commit of that step
  answered ``ok``, some before the last member's answer, the rest after
  it; with direct links the keeper holds that answer at a gate until they
  are in (:meth:`hold`, :meth:`released`).
"""

from __future__ import annotations

from typing import Callable, Optional

from rollcall.core import Due, FaultPlan, StepDue, StepFaults


class FaultTiming:
    def __init__(self, faults: FaultPlan, inject: Callable[[Due], None]) -> None:
        self.faults = faults
        self.inject = inject
        self._steps = StepFaults(faults)  # at_step: once every member was answered
        self._by_record: list[Due] = []  # due by a keeper record, carried out in the timers
        self._after_gate: list[Due] = []  # direct links: a gate's faults that follow its ack

    # --- by time -----------------------------------------------------------------------

    def next_time(self, train_start: Optional[float]) -> Optional[float]:
        """The launcher's instant of the next fault due by time, once training started."""
        if train_start is None:
            return None
        due = self.faults.next_time()
        return None if due is None else train_start + due

    def handle_timer(self, now: float, train_start: Optional[float]) -> None:
        """Carry out the faults a roll call made due, then those due by ``now``."""
        due, self._by_record = self._by_record, []
        for d in due:
            self.inject(d)
        if train_start is not None:
            for d in self.faults.due_by_time(now - train_start):
                self.inject(d)

    # --- by the keeper's record ------------------------------------------------------

    def record(self, record: dict) -> None:
        """A record of the keeper's: the faults it makes due wait for the timers."""
        self._by_record += self.faults.due_by_record(record)

    @property
    def waiting(self) -> bool:
        """Faults a record made due wait for the timers (they are due now)."""
        return bool(self._by_record)

    # --- by the committed step --------------------------------------------------------

    def answered(self, gen: int, step: int, worker: int, members: int,
                 committed: int) -> StepDue:
        """``worker`` was answered ``ok`` for ``step`` of ``gen``: the faults
        that land at ``committed`` steps once all ``members`` were (else none)."""
        return self._steps.answered(gen, step, worker, members, committed)

    def before_answer(self, due: StepDue) -> list[Due]:
        """Carry out the faults of ``due`` that go before the last member's
        answer; returns those that go after it."""
        for d in due.before:
            self.inject(d)
        return list(due.after)

    def hold(self, after: list[Due]) -> None:
        """Direct links: ``after`` goes in once the keeper let the held answer go."""
        self._after_gate += after

    def released(self) -> None:
        """Direct links: the held answer went; the faults that follow it go in."""
        after, self._after_gate = self._after_gate, []
        for d in after:
            self.inject(d)
