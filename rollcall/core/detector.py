"""Failure detection as a policy object.

The keeper judges a worker only by its own clock: it notes *when it saw* the
worker's heartbeat counter advance, never what time the worker claimed. The
trade-off between evicting a slow-but-alive worker and waiting on a dead one
lives entirely in these knobs.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Verdict(str, Enum):
    ALIVE = "alive"
    SUSPECT = "suspect"
    DEAD = "dead"


@dataclass(frozen=True)
class TimeoutDetector:
    """Dead after ``timeout_s`` without an advance; suspect after two beats."""

    heartbeat_s: float
    timeout_s: float

    def __post_init__(self) -> None:
        if not 0 < self.heartbeat_s < self.timeout_s:
            raise ValueError("need 0 < heartbeat_s < timeout_s")

    def expiry(self, advanced_at: float) -> float:
        """The keeper-clock instant at which a silent worker is declared dead."""
        return advanced_at + self.timeout_s

    def verdict(self, now: float, advanced_at: float) -> Verdict:
        silent_s = now - advanced_at
        if silent_s >= self.timeout_s:
            return Verdict.DEAD
        if silent_s >= 2 * self.heartbeat_s:
            return Verdict.SUSPECT
        return Verdict.ALIVE

    def detection_time(self, failed_at: float, phase_s: float, latency_s: float) -> float:
        """When the keeper declares dead a worker that stopped at ``failed_at``.

        Its last heartbeat left at the latest beat ``phase_s + k*heartbeat_s``
        not after ``failed_at`` and arrived ``latency_s`` later. Simulators use
        this to schedule the verdict instead of simulating every heartbeat;
        the result equals what :meth:`expiry` gives on the live path.
        """
        beats = max(0, int((failed_at - phase_s) // self.heartbeat_s))
        last_sent = phase_s + beats * self.heartbeat_s
        return self.expiry(last_sent + latency_s)


def make_detector(kind: str, heartbeat_s: float, timeout_s: float) -> TimeoutDetector:
    if kind != "timeout":
        raise ValueError(f"unknown detector kind {kind!r}")
    return TimeoutDetector(heartbeat_s, timeout_s)
