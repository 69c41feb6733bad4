"""Which checkpoint interval ``rollcall compare`` gives checkpoint-restart.

Why: one scenario file carries one ``strategy.checkpoint_interval_steps``,
tuned (at best) for one scale and failure rate. Comparing elastic against a
checkpoint-restart that checkpoints too often or too rarely for the case at
hand would flatter elastic, so by default the checkpoint-restart runs get
Young's optimum (Young 1974, ``analysis.young_interval``)::

    tau = sqrt(2 * delta * M),   M = failures.worker_mtbf_s / cluster.workers

with ``delta = strategy.checkpoint_write_s``; tau is converted to whole
steps of the scenario's step time (``Scenario.ideal_step_s``: the measured
``workload.step_s_by_workers`` entry, else the micro-batch model), at least
one step. Young's first-order form is used, not Daly's (2006) higher-order
one (``analysis.daly_interval``): with ``delta`` far below ``M`` they differ
by a few percent (Llama-3 case: 1,154 s against 1,115 s), and Young's is the
one a reader can check by hand.

A scenario without random failures (``worker_mtbf_s`` unset, scripted
faults only) has no failure rate to optimise for: its interval is kept, and
the choice says so. Elastic runs always keep the scenario's interval.

This is app layer: it reads a validated Scenario and imports no target.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from rollcall.analysis import young_interval
from rollcall.scenario import Scenario

__all__ = ["IntervalChoice", "checkpoint_interval"]

Source = Literal["young", "fixed", "no-random-failures"]


@dataclass(frozen=True)
class IntervalChoice:
    """The checkpoint-restart interval and why: ``steps`` is what the runs use."""

    steps: int
    step_s: float
    source: Source
    why: str
    young_s: float | None = None  # Young's tau in seconds, when computed
    job_mtbf_s: float | None = None

    def __post_init__(self) -> None:
        assert self.steps >= 1, self.steps
        assert (self.source == "young") == (self.young_s is not None)

    def line(self, scenario_steps: int) -> str:
        """One output line: both strategies' intervals and the reason."""
        return (f"checkpoint interval: checkpoint-restart {self.steps} steps "
                f"({self.steps * self.step_s:.6g} s), {self.why}; "
                f"elastic keeps the scenario's {scenario_steps} steps")

    def to_json(self, scenario_steps: int) -> dict[str, Any]:
        return {
            "checkpoint-restart": {
                "steps": self.steps, "seconds": self.steps * self.step_s, "source": self.source,
                "why": self.why, "young_s": self.young_s, "job_mtbf_s": self.job_mtbf_s,
                "step_s": self.step_s,
            },
            "elastic": {"steps": scenario_steps, "source": "scenario"},
        }


def checkpoint_interval(scenario: Scenario, *, fixed: bool = False) -> IntervalChoice:
    """The interval checkpoint-restart runs with: Young's optimum unless ``fixed``
    or the scenario has no random failures (then the scenario's own)."""
    kept = scenario.strategy.checkpoint_interval_steps
    step_s = scenario.ideal_step_s
    if fixed:
        return IntervalChoice(kept, step_s, "fixed", "the scenario's (--fixed-interval)")
    mtbf_s = scenario.failures.worker_mtbf_s
    if mtbf_s is None:
        return IntervalChoice(kept, step_s, "no-random-failures",
                              "the scenario's: no random failures (failures.worker_mtbf_s "
                              "unset), so there is no failure rate to optimise for")
    workers = scenario.cluster.workers
    write_s = scenario.strategy.checkpoint_write_s
    job_mtbf_s = mtbf_s / workers
    tau_s = young_interval(write_s, job_mtbf_s)
    steps = max(1, round(tau_s / step_s))
    why = (f"Young's optimum sqrt(2 x {write_s:.6g} s write x {job_mtbf_s:.6g} s job MTBF "
           f"[{mtbf_s:.6g} s / {workers} workers]) = {tau_s:.6g} s at {step_s:.6g} s/step")
    return IntervalChoice(steps, step_s, "young", why, young_s=tau_s, job_mtbf_s=job_mtbf_s)
