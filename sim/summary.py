"""A sim run's summary (``summary.json``), from its history (the checker's
report, and the core's account of where the time went), its counters and
the facts of how it ended."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from rollcall.core import CheckReport, summarize_report, time_account
from rollcall.results import check_summary_keys, ettr, goodput
from rollcall.scenario import Scenario

from sim.state import Tally

__all__ = ["RunFacts", "run_summary"]

# the tally's counters a summary reports, in its order (keeper_calls comes later)
COUNTED = ("checkpoints", "detections", "evictions", "crashes", "kills", "rack_kills", "pauses",
           "joins", "repairs", "retired", "blames", "pulled", "rounds")


@dataclass(frozen=True)
class RunFacts:
    """How a run ended, and what it cost (wall seconds, events, keeper failovers)."""

    completed: bool
    interrupted: bool
    end_reason: str
    failures: int
    wall_s: float
    keeper_failovers: int
    events: int
    keeper_wall_s: float
    check_wall_s: float


def run_summary(sc: Scenario, records: Sequence[Mapping[str, Any]], report: CheckReport,
                tally: Tally, facts: RunFacts) -> dict[str, Any]:
    """Every summary key of a sim run (``docs/results.md``), checked against the list."""
    # a run that did not complete took until it ended (it gave up or was
    # stopped), not until its last committed step
    account = time_account(records, report.lineage, facts.completed)
    elapsed = account.elapsed_s
    ideal = sc.ideal_step_s
    out = {
        "scenario": sc.name,
        "target": "sim",
        "strategy": sc.strategy.kind,
        "seed": sc.seed,
        **summarize_report(report),
        "completed": facts.completed,
        # the real target's word for how the run ended, with the same values
        "result": "completed" if facts.completed else (
            "interrupted" if facts.interrupted else "failed"),
        "steps_target": sc.workload.steps,
        "elapsed_s": elapsed,
        "productive_s": account.productive_s,
        "ettr": ettr(account.productive_s, elapsed),
        "goodput": goodput(report.steps_committed, ideal, elapsed),
        "lost_work_s": account.lost_work_s,
        "stall_s": account.stall_s,
        "recovery_s": account.recovery_s,
        "checkpoint_s": account.checkpoint_s,
        "failures": facts.failures,
        "wall_s": facts.wall_s,
        # extras
        "end_s": tally.end_s,
        "end_reason": facts.end_reason,
        "ideal_step_s": ideal,
        **{name: tally.counts[name] for name in COUNTED},
        "keeper_failovers": facts.keeper_failovers,
        "min_members": tally.min_members,
        "events": facts.events,
        "keeper_calls": tally.counts["keeper_calls"],
        "sim_per_wall": (tally.end_s / facts.wall_s) if facts.wall_s > 0 else 0.0,
        "keeper_wall_s": facts.keeper_wall_s,
        "check_wall_s": facts.check_wall_s,
    }
    check_summary_keys(out, "sim")
    return out
