"""The sim's gray failures: a worker that is slow, or whose heartbeats are late.

Neither stops the worker, and neither is death; the detector (and, for a
straggler, the keeper's straggler policy) must tell them from it.

* ``late_heartbeats: W, delay_s: D, for_s: S``: every beat W sends from the
  fault for S seconds reaches the keeper D late, in order (the worker holds
  them: a busy host, a loaded control link), and the backlog drains after
  S; its work and its other messages are on time. What the keeper sees is
  one silence of about D at the start (more than one if the beats come in
  bursts), then the usual cadence: :func:`sim.network.held_beat_gaps` with
  a constant cost. Over a silence past the detector's tolerance (its
  nominal ``silence_s``: the sim's beats are on time) the driver holds the
  worker's beats (``Silences.hold_beats``): the keeper last saw it at the
  gap's last beat, while the worker answers roll calls, votes and trains
  on time, so the keeper decides; if it evicts, the worker learns so when
  its late beat arrives (``Silences.release_beats``) and comes back as a
  newcomer, as on real.
* ``slow: W, factor: F, for_s: S``: W computes its share of each step F
  times slower for S seconds (a straggler: thermal throttling, a noisy
  neighbour); its heartbeats stay on time. In synchronous data parallelism
  the step waits for it: the step time becomes ``max(the plan's,
  exchange + W's micro-batches * per-micro-batch compute * F)``, the
  per-micro-batch compute being the plan's compute over the busiest
  rank's micro-batches (:meth:`GrayFaults.step_s`). A running segment is
  repriced where it stands when the slowness starts and ends
  (:meth:`sim.network.NetFaults.reprice`), and again at every generation
  (W's rank and load change with the members).
"""

from __future__ import annotations

from typing import Any

from rollcall.core import NEMESIS, rank_range, rec

from sim.network import held_beat_gaps
from sim.world import World


class GrayFaults:
    """The ``late_heartbeats`` (and ``slow``) faults of one simulation."""

    def __init__(self, sim: World) -> None:
        self.sim = sim
        self.factor: dict[tuple[int, float], float] = {}  # (worker, its process's start) -> F
        self.touched = False  # a member was ever slowed: segments are priced here too

    # -- slow ----------------------------------------------------------------

    def slow(self, now: float, f: Any) -> None:
        """A scripted ``slow`` fault."""
        for w in self.sim.machines.pick(f.targets):
            self._slow(now, w, float(f.factor), float(f.for_s))

    def random_slow(self, now: float, w: int, factor: float, for_s: float) -> None:
        """A random slowdown of node ``w`` the core's fault plan says is due
        (``failures.slow_mtbf_s``; the same draws as real's)."""
        self._slow(now, w, factor, for_s, origin="mtbf")

    def _slow(self, now: float, w: int, factor: float, for_s: float, **extra: Any) -> None:
        sim = self.sim
        alive = sim.alive(w)
        sim.write(rec(now, "info", "fault", NEMESIS, kind="slow", workers=[w] if alive else [],
                       factor=factor, for_s=for_s, **extra))
        if not alive:
            return
        life = (w, float(sim.nodes.started_at[w]))
        self.factor[life] = self.factor.get(life, 1.0) * factor
        self.touched = True
        sim.net.reprice(now)
        sim.at(now + for_s, self._fast_again, life, factor)

    def _fast_again(self, life: tuple[int, float], factor: float) -> None:
        sim = self.sim
        if sim.finished:
            return
        left = self.factor.pop(life, 1.0) / factor
        if left > 1.0 + 1e-12:  # another slowdown of it still runs
            self.factor[life] = left
        w = life[0]
        alive = sim.alive(w) and float(sim.nodes.started_at[w]) == life[1]
        sim.write(rec(sim.env.now, "info", "fault", NEMESIS, kind="heal",
                       workers=[w] if alive else []))
        sim.net.reprice(sim.env.now)

    def step_s(self, base_s: float) -> float:
        """The step time of the current generation with its slow members: the
        plan's ``base_s``, or a slow member's compute (its micro-batches,
        each the plan's per-micro-batch compute times its factor) plus the
        exchange, whichever is longer."""
        sim = self.sim
        if not self.factor:
            return base_s
        members, n = sim.job.members, len(sim.job.members)
        shards = sim.job.batch // sim.sc.workload.micro_batch
        exchange = sim.sc.exchange_s(n)
        per_batch, slow = self.compute(base_s)
        step = base_s
        for w, pb in slow.items():
            lo, hi = rank_range(shards, n, members.index(w))
            step = max(step, exchange + (hi - lo) * pb)
        return step

    def compute(self, base_s: float) -> tuple[float, dict[int, float]]:
        """What each member's compute of one micro-batch takes in the current
        generation: the plan's (its compute over the busiest rank's
        micro-batches), and the slow members' (times their factor). The
        physical fact the keeper's straggler policy is handed, as real
        members report theirs."""
        sim = self.sim
        members, n = sim.job.members, len(sim.job.members)
        shards = sim.job.batch // sim.sc.workload.micro_batch
        busiest = rank_range(shards, n, 0)
        per_batch = max(0.0, base_s - sim.sc.exchange_s(n)) / max(1, busiest[1] - busiest[0])
        slow = {w: per_batch * factor for (w, start), factor in sorted(self.factor.items())
                if w in members and float(sim.nodes.started_at[w]) == start}
        return per_batch, slow

    # -- late heartbeats -----------------------------------------------------

    def late_heartbeats(self, now: float, f: Any) -> None:
        sim = self.sim
        delay_s, for_s = float(f.delay_s), float(f.for_s)
        for w in sim.machines.pick(f.targets):
            if not sim.alive(w):
                continue
            sim.write(rec(now, "info", "fault", NEMESIS, kind="late_heartbeats", workers=[w],
                           delay_s=delay_s, for_s=for_s))
            phase = float(sim.nodes.started_at[w])
            gaps = held_beat_gaps(phase, sim.detector.heartbeat_s, sim.lat, now, now + for_s,
                                  sim.detector.gap_that_counts_s(), lambda: sim.lat + delay_s)
            for last, arrival in gaps:
                sim.at(last, self._held, w, phase, last, arrival)
            sim.at(now + for_s, self._on_time, w, phase)

    def _held(self, w: int, phase: float, last: float, arrival: float) -> None:
        """W's beat that arrived at ``last`` is its last until ``arrival``."""
        sim = self.sim
        if sim.finished or float(sim.nodes.started_at[w]) != phase:
            return  # the run ended, or another process runs there now
        if sim.silences.hold_beats(sim.env.now, w, last):
            sim.at(arrival - sim.lat, sim.silences.release_beats, w, phase)

    def _on_time(self, w: int, phase: float) -> None:
        """The beats W sends from now on leave on time (the backlog drains)."""
        sim = self.sim
        if sim.finished:
            return
        alive = sim.alive(w) and float(sim.nodes.started_at[w]) == phase
        sim.write(rec(sim.env.now, "info", "fault", NEMESIS, kind="heal",
                       workers=[w] if alive else []))
