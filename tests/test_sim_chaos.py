"""Randomized runs of the simulator: whatever the failure timing, the history is valid.

Each seed draws crashes (exponential and Weibull), repairs, scripted pauses
longer and shorter than the detector timeout, kills by step and joins; both
strategies must complete with a history the core's checkers accept, no
sample skipped or duplicated, and every simulated second accounted for.
"""

from __future__ import annotations

import pytest

from rollcall.scenario import parse_scenario
from sim.driver import Simulation

SEEDS = int(__import__("os").environ.get("SIM_CHAOS_SEEDS", "12"))

CHAOS = """
name: sim-chaos
seed: {seed}
cluster: {{workers: 6, spares: {spares}, repair_s: 20.0}}
workload: {{steps: 400, global_batch: 48, micro_batch: 4, dataset_samples: 1000,
           micro_batch_s: 0.05, allreduce_s: 0.01}}
failures:
  worker_mtbf_s: {mtbf}
  distribution: {dist}
  weibull_shape: 0.7
  schedule:
    - {{at_s: 3.0, pause: random, for_s: 5.0}}
    - {{at_s: 9.0, pause: random, for_s: 1.0}}
    - {{at_step: 120, kill: random}}
    - {{at_s: 12.0, join: 2}}
    - {{at_step: 200, pause: random, for_s: 4.0}}
detector: {{heartbeat_s: 0.5, timeout_s: 2.0}}
rendezvous: {{min_workers: 2, max_workers: 7, last_call_s: 0.3}}
strategy: {{kind: {kind}, checkpoint_interval_steps: 25, checkpoint_write_s: 0.2,
           checkpoint_read_s: 0.5, restart_s: 1.5, batch: {batch}}}
"""


def _scenario(seed: int, kind: str, dist: str = "exponential", batch: str = "constant",
              spares: int = 1, mtbf: float = 150.0):
    return parse_scenario(CHAOS.format(seed=seed, kind=kind, dist=dist, batch=batch,
                                       spares=spares, mtbf=mtbf))


def _accounted(s: dict) -> float:
    return (s["productive_s"] + s["lost_work_s"] + s["stall_s"] + s["recovery_s"]
            + s["checkpoint_s"])


@pytest.mark.parametrize("kind", ["elastic", "checkpoint-restart"])
@pytest.mark.parametrize("dist, batch, spares, mtbf", [
    ("exponential", "constant", 1, 150.0), ("weibull", "constant", 0, 150.0),
    ("exponential", "shrink", 2, 150.0),
    ("exponential", "constant", 2, 25.0),  # a storm: failures during rounds and restarts
])
def test_random_failures_keep_history_valid(kind: str, dist: str, batch: str, spares: int,
                                            mtbf: float) -> None:
    for seed in range(SEEDS):
        sim = Simulation(_scenario(seed, kind, dist, batch, spares, mtbf))
        s = sim.run()
        where = f"seed {seed} {kind} {dist} {batch}: {s['violations'][:3]} {s['end_reason']}"
        assert s["completed"], where
        assert s["valid"], where
        assert s["samples_skipped"] == 0 and s["samples_duplicated"] == 0, where
        assert s["steps_committed"] == 400, where
        assert s["failures"] >= 1, where
        assert _accounted(s) == pytest.approx(s["elapsed_s"], rel=1e-9, abs=1e-6), where
        if batch == "constant":
            assert s["global_batch_min"] == s["global_batch_max"] == 48, where
        if kind == "elastic":
            # survivors keep their state: work is lost only if a round had to
            # fall back to the checkpoint (no member held a newer state)
            from_ckpt = [r for r in sim.records if r["f"] == "generation"
                         and r["source"] is None and r["cursor"] != [0, 0]]
            if not from_ckpt:
                assert s["lost_steps"] == 0, where
            assert s["restarts"] == 0, where
        else:
            assert s["restarts"] >= 1, where


def test_restart_resumes_from_a_checkpoint_of_its_own_lineage() -> None:
    """Regression: this chaos test with more seeds (SIM_CHAOS_SEEDS=80).

    A paused worker evicted at step 200 answered an old roll call and waited
    as a standby holding step 200. A later restart resumed from that
    standby's state although the keeper held a checkpoint at step 325; the
    job redid steps 200..325 under ``shrink`` with other batch sizes,
    checkpointed step 325 at another sample offset, and the next restart
    resumed from the *first* lineage's checkpoint: an invalid history. Fixed
    in the core (resume from the newer of held state and checkpoint; a
    checkpoint of the current lineage supersedes the previous one).
    """
    s = Simulation(_scenario(57, "checkpoint-restart", "exponential", "shrink", 2)).run()
    assert s["valid"], s["violations"][:2]


def test_restart_does_not_resume_an_abandoned_lineage() -> None:
    """Regression, found with SIM_CHAOS_SEEDS=100 (seed 55, checkpoint-restart, storm);
    fixed in the core at 05:23 (a held state counts only if no later
    generation resumed behind it).

    Worker 9 is paused right after step 200 commits (its trainer holds step
    200), is evicted, and rejoins as a standby still holding step 200. A
    restart resumes from the checkpoint at step 175 (9 not admitted: no
    room), which cuts the lineage back to 175; the next restart admits 9
    and resumes from its step-200 state, a state of the abandoned branch.
    """
    # reached when restart rounds wait join_timeout_s (600 s) for a relaunched
    # worker whose host died; the sim's default is restart_s + timeout_s
    s = Simulation(_scenario(55, "checkpoint-restart", "exponential", "constant", 2, 25.0),
                   relaunch_timeout_s=600.0).run()
    assert s["valid"], s["violations"][:2]
