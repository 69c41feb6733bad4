"""When, on the real target, each fault the core's plan makes due goes in.

What is due is the core's :class:`rollcall.core.FaultPlan`: by time since
the training started (``at_s``, random lifetimes), by the keeper's record
of a roll call (``at_roll_call``), by the committed step (``at_step``).
This class holds the real target's instants for them, which the launcher
reaches by its clock and its commit answers, and hands each fault to the
fault injector (``inject``) then:

- a roll call's faults after the keeper's outputs that opened it (in the
  launcher's timers), as the sim carries them out, never inside them;
- a step's faults once every member of the generation has had its commit
  of that step answered ``ok``, not while some still wait for their
  answer (a survivor left a step behind would make the outcome a race);
  some before the last member's answer, the rest after it
  (:meth:`FaultTiming.before_answer`); with direct links the keeper holds
  that answer at a gate until they are in (:meth:`hold`, :meth:`released`).
"""

from __future__ import annotations

from typing import Callable, Optional

from rollcall.core import Due, FaultPlan
from rollcall.scenario import LINK_ACTIONS

# A link fault's rules, and a lost host's link-down and kills, go in before
# the last member's answer: they take milliseconds (nft, netlink), a step
# less, and the next step (which needs that member) must not commit across a
# cut, or with a machine, that should already be gone (the sim's lose_host at
# step N commits N steps, never N+1). A slow order goes first too: step N's
# exchange needs the last member's compute, so the slowed worker hears it
# before it can ask to commit step N (its first slow step, as on the sim;
# sent after the answer, it came a step late now and then). A kill goes
# first for the same reason: the answer's send wakes its worker, which on a
# busy machine could run step N+1 and ask to commit it before the launcher
# got the CPU back to send SIGKILL.
BEFORE_THE_ANSWER = (*LINK_ACTIONS, "lose_host", "slow", "kill", "kill_rack", "crash")


class FaultTiming:
    def __init__(self, faults: FaultPlan, inject: Callable[[Due], None]) -> None:
        self.faults = faults
        self.inject = inject
        self._acked: dict[tuple[int, int], set[int]] = {}  # members told a step committed
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

    def acked(self, gen: int, step: int, worker: int, members: int, committed: int) -> list[Due]:
        """``worker`` was answered ``ok`` for ``step`` of ``gen``: the faults due
        at ``committed`` steps once all ``members`` were (else none)."""
        acked = self._acked.setdefault((gen, step), set())
        acked.add(worker)
        if len(acked) < members:
            return []
        del self._acked[(gen, step)]
        return self.faults.due_by_step(committed)

    def before_answer(self, due: list[Due]) -> list[Due]:
        """Carry out the faults of ``due`` that go before the last member's
        answer; returns those that go after it."""
        for d in due:
            if d.kind in BEFORE_THE_ANSWER:
                self.inject(d)
        return [d for d in due if d.kind not in BEFORE_THE_ANSWER]

    def hold(self, after: list[Due]) -> None:
        """Direct links: ``after`` goes in once the keeper let the held answer go."""
        self._after_gate += after

    def released(self) -> None:
        """Direct links: the held answer went; the faults that follow it go in."""
        after, self._after_gate = self._after_gate, []
        for d in after:
            self.inject(d)
