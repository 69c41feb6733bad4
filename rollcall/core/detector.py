"""Failure detection as a policy object.

The keeper judges a worker only by its own clock: it notes *when it saw* the
worker's heartbeat counter advance, never what time the worker claimed. The
trade-off between evicting a slow-but-alive worker and waiting on a dead one
lives entirely in these knobs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Optional, Sequence, Union


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

    @property
    def adaptive(self) -> bool:
        """Whether the tolerance follows each worker's cadence (no: one for all)."""
        return False

    def silence_s(self, mean_s: Optional[float] = None) -> float:
        """The longest silence tolerated, whatever the cadence."""
        return self.timeout_s

    def gap_that_counts_s(self) -> float:
        """The shortest gap between two beats' arrivals that can change a
        verdict: a shorter one is no silence it would act on."""
        return self.timeout_s

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
        return self.expiry(self.last_arrival(failed_at, phase_s, latency_s))

    def last_arrival(self, failed_at: float, phase_s: float, latency_s: float) -> float:
        """When the last heartbeat of a worker that stopped at ``failed_at``
        reached the keeper (see :meth:`detection_time`)."""
        beats = max(0, int((failed_at - phase_s) // self.heartbeat_s))
        return phase_s + beats * self.heartbeat_s + latency_s


LN10 = math.log(10.0)


@dataclass(frozen=True)
class PhiDetector:
    """Phi accrual (Hayashibara et al., 2004): suspicion that grows with the
    silence, measured against the worker's own observed heartbeat cadence.

    ``phi(silent_s) = -log10(P(an interval longer than silent_s))`` under the
    observed inter-arrival distribution, modelled as exponential with the
    mean of the worker's last ``window`` intervals (as Cassandra's
    FailureDetector does): ``phi = silent_s / (mean_s * ln 10)``. Why not the
    paper's normal model: heartbeats on time have a near-zero spread, so a
    normal's tail vanishes and one late beat reads as death unless a floor
    and a pause allowance are added (as Akka does): two more knobs. The
    exponential tolerates a silence of ``threshold * ln 10`` mean intervals
    (8: 18.4), so a worker whose beats come slower (a busy host) is given
    more rope, one whose beats come on time less, and a fixed timeout
    gives every worker the same.

    The mean has a prior: a life starts with ``window`` intervals of
    ``heartbeat_s`` and each observed interval replaces one, so a new life
    is judged at the nominal cadence, and a simulator's bulk observations
    (which stand for on-time beats) are that nominal cadence exactly. And a
    floor: the worker sends every ``heartbeat_s``, so a mean below it is
    beats held back and delivered together (after a delay), not a faster
    sender; it is taken as ``heartbeat_s``. The tolerance is never below
    the nominal one.
    """

    heartbeat_s: float
    threshold: float = 8.0
    window: int = 64

    def __post_init__(self) -> None:
        if not (self.heartbeat_s > 0 and self.threshold > 0 and self.window >= 1):
            raise ValueError("need heartbeat_s > 0, threshold > 0, window >= 1")

    @property
    def adaptive(self) -> bool:
        return True

    def phi(self, silent_s: float, mean_s: Optional[float] = None) -> float:
        """The suspicion after ``silent_s`` without an advance."""
        mean = self.heartbeat_s if mean_s is None else mean_s
        return max(0.0, silent_s) / (mean * LN10)

    def silence_s(self, mean_s: Optional[float] = None) -> float:
        """The longest silence tolerated: phi reaches the threshold there."""
        return self.threshold * LN10 * (self.heartbeat_s if mean_s is None else mean_s)

    def gap_that_counts_s(self) -> float:
        """The shortest gap between two beats' arrivals that can change a
        verdict: any beyond the nominal cadence, since each interval moves
        the worker's mean (and its tolerance of a later silence); one as
        long as the cadence, give or take rounding, is a beat on time."""
        return self.heartbeat_s * (1.0 + 1e-9)

    def mean_s(self, intervals: Sequence[float]) -> float:
        """The observed mean interval: the last ``window`` intervals, the
        prior's nominal ones filling what has not been observed yet."""
        recent = intervals[-self.window:]
        mean = (math.fsum(recent) + (self.window - len(recent)) * self.heartbeat_s) / self.window
        return max(mean, self.heartbeat_s)

    def on_time(self, span_s: float) -> list[float]:
        """The intervals of beats sent on time (every ``heartbeat_s``) from
        one arrival to another ``span_s`` later, oldest first, as a keeper
        hearing each would observe them (those the window keeps): what a
        simulator's bulk form of on-time beats stands for."""
        assert span_s >= 0, span_s
        beats = max(1, math.ceil(span_s / self.heartbeat_s - 1e-9))
        first = span_s - (beats - 1) * self.heartbeat_s
        rest = min(beats - 1, self.window)
        return ([first] if rest < self.window else []) + [self.heartbeat_s] * rest

    def extra_s(self, intervals: Sequence[float]) -> float:
        """The tolerance beyond the nominal one, for a worker with these intervals."""
        return self.silence_s(self.mean_s(intervals)) - self.silence_s()

    def expiry(self, advanced_at: float) -> float:
        """When a worker last seen at ``advanced_at``, at the nominal cadence, is declared dead."""
        return advanced_at + self.silence_s()

    def verdict(self, now: float, advanced_at: float, mean_s: Optional[float] = None) -> Verdict:
        phi = self.phi(now - advanced_at, mean_s)
        if phi >= self.threshold:
            return Verdict.DEAD
        if phi >= self.threshold / 2:
            return Verdict.SUSPECT
        return Verdict.ALIVE

    def detection_time(self, failed_at: float, phase_s: float, latency_s: float) -> float:
        """As :meth:`TimeoutDetector.detection_time`, at the nominal cadence."""
        return self.expiry(self.last_arrival(failed_at, phase_s, latency_s))

    def last_arrival(self, failed_at: float, phase_s: float, latency_s: float) -> float:
        """As :meth:`TimeoutDetector.last_arrival`."""
        beats = max(0, int((failed_at - phase_s) // self.heartbeat_s))
        return phase_s + beats * self.heartbeat_s + latency_s


Detector = Union[TimeoutDetector, PhiDetector]


def make_detector(kind: str, heartbeat_s: float, timeout_s: float,
                  phi_threshold: float = 8.0) -> Detector:
    if kind == "phi":
        return PhiDetector(heartbeat_s, phi_threshold)
    if kind != "timeout":
        raise ValueError(f"unknown detector kind {kind!r}")
    return TimeoutDetector(heartbeat_s, timeout_s)
