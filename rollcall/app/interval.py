"""Which checkpoint interval each strategy runs at when the two are compared.

Why: one scenario file carries one ``strategy.checkpoint_interval_steps``,
tuned (at best) for one strategy, scale and failure rate. Comparing the two
strategies at one interval flatters whichever it suits: an elastic job that
seldom goes back to a checkpoint pays for writes it never reads, a
checkpoint-restart job that checkpoints too rarely redoes hours of work. So
by default each strategy runs at the interval that minimises *its own*
expected time under Daly's model (Daly 2006)::

    T(tau) = M e^(R/M) (e^((tau + delta)/M) - 1) T_s / tau

with ``delta = strategy.checkpoint_write_s`` and ``M`` the mean time
between the events that send that strategy back to its checkpoint
(``rollcall.app.plan.failure_rates``):

- checkpoint-restart: any failure of the job's workers (``job``);
- elastic: a loss it cannot recover from its survivors (``rollback``: every
  holder of a shard lost, more nodes down than it can spare); replicated
  state with room to spare has no such event, and its interval is the job's
  whole length (no checkpoint before the end).

``R`` and ``T_s`` do not move the optimum, so it solves
``e^(u + d) (1 - u) = 1`` for ``u = tau/M``, ``d = delta/M`` (the exact
minimum, not Young's first-order ``sqrt(2 delta M)``, which is poor where
``M`` nears ``delta``). ``tau`` becomes whole steps of ``Scenario.ideal_step_s``,
the better of the two around it, between one step and the job's length.

A scenario without random failures (``failures.worker_mtbf_s`` unset) has
no rate to optimise for: both strategies keep its interval, and the choice
says so. ``fixed`` (``--fixed-interval``) keeps it for both too, and a sweep
whose grid sets the interval keeps the grid's.

App layer: it reads a validated Scenario and imports no target.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Mapping

from rollcall.app.plan import failure_rates
from rollcall.scenario import Scenario

__all__ = ["INTERVAL_KEY", "IntervalChoice", "at_its_interval", "checkpoint_intervals",
           "daly_optimum_s", "describe"]

INTERVAL_KEY = "strategy.checkpoint_interval_steps"

STRATEGIES = ("checkpoint-restart", "elastic")
Source = Literal["daly", "whole-job", "fixed", "grid", "no-random-failures"]


@dataclass(frozen=True)
class IntervalChoice:
    """One strategy's interval in steps (what its runs use) and why."""

    strategy: str
    steps: int
    step_s: float
    source: Source
    why: str
    mtbf_s: float | None = None  # the mean time between its rollbacks, when optimised

    def __post_init__(self) -> None:
        assert self.steps >= 1, self.steps
        assert (self.source in ("daly", "whole-job")) == (self.mtbf_s is not None), self

    def text(self) -> str:
        """``elastic 300 steps (16.5 s): the job's whole length ...``."""
        return f"{self.strategy} {self.steps} steps ({self.steps * self.step_s:.6g} s), {self.why}"

    def short(self) -> str:
        """``checkpoint-restart every 1116 s (Daly's optimum)``: for a verdict sentence."""
        if self.source == "whole-job":
            return f"{self.strategy} only at the end (no rollback expected before it)"
        origin = {"daly": "Daly's optimum", "fixed": "the scenario's, --fixed-interval",
                  "grid": "the grid's", "no-random-failures":
                  "the scenario's: no random failures to optimise for"}[self.source]
        return f"{self.strategy} every {self.steps * self.step_s:.4g} s ({origin})"

    def to_json(self) -> dict[str, Any]:
        return {"steps": self.steps, "seconds": self.steps * self.step_s, "source": self.source,
                "why": self.why, "mtbf_s": None if self.mtbf_s is None or math.isinf(self.mtbf_s)
                else self.mtbf_s, "step_s": self.step_s}

    @classmethod
    def from_json(cls, strategy: str, doc: Mapping[str, Any]) -> "IntervalChoice":
        """What :meth:`to_json` wrote (a compare directory's record of it)."""
        source = doc["source"]
        mtbf_s = doc.get("mtbf_s")
        if source in ("daly", "whole-job") and mtbf_s is None:
            mtbf_s = math.inf  # written as null: no rollback at all
        return cls(strategy, int(doc["steps"]), float(doc["step_s"]), source, str(doc["why"]),
                   None if mtbf_s is None else float(mtbf_s))


def describe(choices: Mapping[str, IntervalChoice]) -> str:
    """One output line naming both strategies' intervals and where each came from."""
    first, second = (choices[s] for s in STRATEGIES)
    if first.source == second.source and first.source not in ("daly", "whole-job"):
        assert first.steps == second.steps, (first, second)
        return (f"checkpoint intervals: both strategies {first.steps} steps "
                f"({first.steps * first.step_s:.6g} s), {first.why}")
    return "checkpoint intervals: " + "; ".join(choices[s].text() for s in STRATEGIES)


def daly_optimum_s(write_s: float, mtbf_s: float) -> float:
    """The compute time between checkpoints that minimises Daly's expected
    time, for checkpoint writes of ``write_s`` and a mean time ``mtbf_s``
    between rollbacks (inf: none, so no finite optimum)."""
    assert write_s >= 0 and mtbf_s > 0, (write_s, mtbf_s)
    if math.isinf(mtbf_s):
        return math.inf
    d = write_s / mtbf_s
    lo, hi = 0.0, 1.0  # h(u) = u + d + ln(1 - u) falls from d >= 0 to -inf on [0, 1)
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid < 1.0 and mid + d + math.log1p(-mid) > 0:
            lo = mid
        else:
            hi = mid
    return lo * mtbf_s


def _log_cost(tau_s: float, write_s: float, mtbf_s: float) -> float:
    """log of Daly's tau-dependent factor ``(e^((tau + delta)/M) - 1) / tau`` (no overflow)."""
    x = (tau_s + write_s) / mtbf_s
    log_expm1 = x + math.log1p(-math.exp(-x)) if x > 30 else math.log(math.expm1(x))
    return log_expm1 - math.log(tau_s)


def _best_steps(tau_s: float, step_s: float, write_s: float, mtbf_s: float,
                job_steps: int) -> int:
    """Whole steps near ``tau_s``: the cheaper of the two around it, in [1, job_steps]."""
    if tau_s >= job_steps * step_s:
        return job_steps
    around = {min(job_steps, max(1, math.floor(tau_s / step_s))),
              min(job_steps, max(1, math.ceil(tau_s / step_s)))}
    return min(sorted(around), key=lambda k: _log_cost(k * step_s, write_s, mtbf_s))


def _optimised(sc: Scenario, strategy: str, rate_per_s: float, rate_why: str) -> IntervalChoice:
    step_s, write_s, steps = sc.ideal_step_s, sc.strategy.checkpoint_write_s, sc.workload.steps
    mtbf_s = 1.0 / rate_per_s if rate_per_s > 0 else math.inf
    tau_s = daly_optimum_s(write_s, mtbf_s)
    job_s = steps * step_s
    if tau_s >= job_s:
        past = "" if math.isinf(tau_s) else f"Daly's optimum {tau_s:.6g} s is past it, for "
        why = f"the job's whole length, no checkpoint before the end ({past}{rate_why})"
        return IntervalChoice(strategy, steps, step_s, "whole-job", why, mtbf_s)
    best = _best_steps(tau_s, step_s, write_s, mtbf_s, steps)
    why = (f"Daly's optimum {tau_s:.6g} s for {write_s:.6g} s writes and {rate_why} "
           f"at {step_s:.6g} s/step")
    return IntervalChoice(strategy, best, step_s, "daly", why, mtbf_s)


def checkpoint_intervals(scenario: Scenario, *, fixed: bool = False,
                         grid: bool = False) -> dict[str, IntervalChoice]:
    """Each strategy's interval: Daly's optimum for its own rollbacks, unless
    ``fixed`` (``--fixed-interval``), ``grid`` (a sweep's grid sets it) or
    the scenario has no random failures: then the scenario's, for both."""
    kept, step_s = scenario.strategy.checkpoint_interval_steps, scenario.ideal_step_s
    if fixed or grid or scenario.failures.worker_mtbf_s is None:
        source: Source = "fixed" if fixed else "grid" if grid else "no-random-failures"
        why = {"fixed": "the scenario's (--fixed-interval)",
               "grid": "the sweep grid's",
               "no-random-failures": "the scenario's: no random failures "
                                     "(failures.worker_mtbf_s unset), so no rate to optimise "
                                     "for (scripted faults are not a rate)"}[source]
        return {s: IntervalChoice(s, kept, step_s, source, why) for s in STRATEGIES}
    # a rate too small for its mean time to be a float is no rate
    rates = {k: v if math.isfinite(1 / v) else 0.0 for k, v in failure_rates(scenario).items()
             if v > 0}
    rates = {k: rates.get(k, 0.0) for k in ("node", "job", "shard_loss", "below_min", "rollback")}
    workers = scenario.cluster.workers
    job_why = (f"a job MTBF of {1 / rates['job']:.6g} s [{workers} workers, one failure "
               f"per {1 / rates['node']:.6g} s each]")
    parts = [f"{name.replace('_', ' ')} {1 / rates[name]:.6g} s"
             for name in ("shard_loss", "below_min") if rates[name] > 0]
    rollback_why = (f"a mean time between rollbacks of {1 / rates['rollback']:.6g} s "
                    f"[{', '.join(parts)}]" if rates["rollback"] > 0 else
                    "no rollback at these rates: no loss its survivors cannot recover from ("
                    + ("sharded" if scenario.state.sharding == "sharded" else "replicated")
                    + " state, never below min_workers)")
    return {"checkpoint-restart": _optimised(scenario, "checkpoint-restart", rates["job"], job_why),
            "elastic": _optimised(scenario, "elastic", rates["rollback"], rollback_why)}


def at_its_interval(scenario: Scenario, *, fixed: bool = False, grid: bool = False) -> Scenario:
    """The scenario as its strategy (``strategy.kind``) runs in a comparison:
    at the interval :func:`checkpoint_intervals` gives that strategy. The one
    place ``compare``, ``sweep``, the report and the API set it."""
    steps = checkpoint_intervals(scenario, fixed=fixed, grid=grid)[scenario.strategy.kind].steps
    if steps == scenario.strategy.checkpoint_interval_steps:
        return scenario
    data = scenario.to_dict()
    data["strategy"]["checkpoint_interval_steps"] = steps
    return Scenario.model_validate(data)
