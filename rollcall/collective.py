"""The all-or-nothing exchange of one step, as a fencing rule.

A contribution counts only if it is stamped with the exchange's generation
and comes from one of that generation's members. Drivers use this to decide
whether a step completed; the property tests use it to prove that nothing a
stale worker computed is ever counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rollcall.types import WorkerId


@dataclass
class Exchange:
    generation: int
    step: int
    members: frozenset[WorkerId]
    arrived: set[WorkerId] = field(default_factory=set)

    def offer(self, worker: WorkerId, generation: int, step: int) -> str:
        """Return ``accepted`` or why the contribution is refused."""
        if generation != self.generation:
            return "stale-generation"
        if worker not in self.members:
            return "not-member"
        if step != self.step:
            return "wrong-step"
        self.arrived.add(worker)
        return "accepted"

    @property
    def complete(self) -> bool:
        return self.arrived >= self.members
