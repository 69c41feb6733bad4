"""The job's own rules: when a checkpoint is due and when the job is complete.

One policy for both targets and both strategies: a checkpoint follows every
``checkpoint_interval_steps``-th committed step except the last (a finished
job has nothing to resume), and the job is complete once ``steps`` steps are
committed. Elastic jobs checkpoint too: the keeper resumes from the last
checkpoint when no member holds usable state (every holder lost, a shard
lost).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["JobPolicy"]


@dataclass(frozen=True)
class JobPolicy:
    steps: int
    checkpoint_interval_steps: int

    def __post_init__(self) -> None:
        if self.steps < 1 or self.checkpoint_interval_steps < 1:
            raise ValueError("need steps >= 1 and checkpoint_interval_steps >= 1")

    def checkpoint_due(self, committed: int) -> bool:
        """Whether the state after ``committed`` steps is checkpointed."""
        return committed % self.checkpoint_interval_steps == 0 and 0 < committed < self.steps

    def complete(self, committed: int) -> bool:
        return committed >= self.steps

    def next_boundary(self, committed: int) -> int:
        """The next step count at which a checkpoint is due or the job ends."""
        nxt = (committed // self.checkpoint_interval_steps + 1) * self.checkpoint_interval_steps
        return min(nxt, self.steps)
