"""Scenarios written from the README alone, as a new user would: each once
crashed or hung the sim. Each runs bounded (a wall limit only reports a
hang, it never passes one) and must complete with a valid history."""

from __future__ import annotations

import pytest

from rollcall.scenario import parse_scenario
from sim.driver import Simulation

# checkpoint-restart where the job's MTBF (15 min) is close to its restart (10 min):
# restarts fail while they restart (restart_failure: repeat), repaired nodes come
# back within a second, so a new life handed to a repaired node is often torn down
# before it joins
DALY_SHORT = """
name: daly-short
seed: {seed}
cluster: {{workers: 8, gpus_per_worker: 8, spares: 0, repair_s: 1.0}}
workload: {{steps: 3000, global_batch: 8, micro_batch: 1, dataset_samples: 80,
           micro_batch_s: 60.0, allreduce_s: 0.0, model_params: 1000}}
failures: {{worker_mtbf_s: 7200, distribution: exponential}}
detector: {{heartbeat_s: 0.5, timeout_s: 1.0}}
rendezvous: {{min_workers: 8, max_workers: 8, last_call_s: 0.0}}
strategy: {{kind: checkpoint-restart, checkpoint_interval_steps: 9, checkpoint_write_s: 300,
           checkpoint_read_s: 0.0, restart_s: 600, restart_failure: repeat}}
"""

# elastic with random slowdowns and straggler eviction: a slowdown's start or
# end closes a segment right after its last step's vote was cast
STRAGGLERS = """
name: my-stragglers
seed: {seed}
cluster: {{workers: 64, spares: 2}}
workload: {{steps: 5000, global_batch: 256, micro_batch: 1, micro_batch_s: 0.25,
           allreduce_s: 0.2, model_params: 7000000000}}
failures: {{worker_mtbf_s: 5000000, slow_mtbf_s: 20000,
           slow_factor: {{median: 3, spread: 0.5}}, slow_for_s: 120}}
detector: {{heartbeat_s: 1, timeout_s: 10}}
rendezvous: {{min_workers: 48}}
strategy: {{kind: elastic, stragglers: evict, straggler_factor: 1.5}}
"""

HANG_GUARD_S = 120.0  # far above the runs' tenths of a second: only a hang reaches it


def _run(text: str, seed: int) -> tuple[Simulation, dict]:
    sim = Simulation(parse_scenario(text.format(seed=seed)))
    summary = sim.run(max_wall_s=HANG_GUARD_S)
    where = f"seed {seed}: {summary['end_reason']} {summary['violations'][:2]}"
    assert summary["completed"], where
    assert summary["valid"], where
    return sim, summary


@pytest.mark.parametrize("seed", [0, 7])
def test_a_relaunch_starts_the_life_the_keeper_names(seed: int) -> None:
    """The keeper alone counts lives: a life it handed a repaired node and a
    restart then tore down is skipped, and the relaunch starts the next one
    it names (the driver once counted one more per relaunch on its own and
    stopped on 'relaunch incarnations out of step with the keeper')."""
    sim, summary = _run(DALY_SHORT, seed)
    assert summary["restarts"] > 100
    started: dict[int, int] = {}
    for r in sim.records:
        if r["f"] == "enter":  # each process's life only grows
            w, life = r["process"], r["incarnation"]
            assert life >= started.get(w, 0), (w, life, started.get(w))
            started[w] = life
    relaunched = [r for r in sim.records if r["f"] == "relaunch"]
    skipped = [r for r in relaunched for w, life in (r["others"] or []) if life > r["incarnation"]]
    assert relaunched and skipped, "the case of a skipped life is exercised"


@pytest.mark.parametrize("seed", [1, 3])
def test_a_segment_closed_at_its_last_vote_does_not_hold_the_votes_behind_it(seed: int) -> None:
    """A segment closed (a slowdown began) just after its last computed
    step's vote was cast has no vote left: it is written at once. It once
    stayed first in line, so the checkpoint waiting on the next step's vote
    never saw it cast and the sim spun at one instant (t = 4121.44 s)."""
    _, summary = _run(STRAGGLERS, seed)
    assert summary["steps_committed"] == 5000
    assert summary["evictions"] > 0



LOST_WHILE_RESTARTING = """
name: restart-loses-a-node
seed: 1
cluster: {workers: 4}
workload: {steps: 100, global_batch: 16, micro_batch: 4, dataset_samples: 1600,
           micro_batch_s: 0.1, allreduce_s: 0.0}
detector: {heartbeat_s: 0.5, timeout_s: 2.0}
rendezvous: {min_workers: 2, max_workers: 4, last_call_s: 0.0}
strategy: {kind: checkpoint-restart, checkpoint_interval_steps: 5, checkpoint_write_s: 0.0,
           restart_s: 100, restart_failure: repeat}
failures:
  schedule:
    - {at_step: 10, kill: 1}
    - {at_s: 30, kill: 2}
"""


def test_a_node_lost_while_the_job_restarts_fails_the_restart_once_detected() -> None:
    """``restart_failure: repeat``: a node of the restarting group is lost
    while the relaunched processes start (100 s); the restart starts over
    once the loss is detected (30 s + the 2 s timeout), as the keeper's
    timer says on both targets, not when those processes come up (101 s)."""
    sim = Simulation(parse_scenario(LOST_WHILE_RESTARTING))
    summary = sim.run(max_wall_s=HANG_GUARD_S)
    assert summary["completed"] and summary["valid"], summary["violations"][:2]
    restarts = [(r["reason"], r["t"]) for r in sim.records if r["f"] == "restart"]
    assert restarts == [("failure", pytest.approx(1.0025)), ("restart-failure", 32.0)]
    first, again = [r for r in sim.records if r["f"] == "relaunch"]
    assert first["t"] == pytest.approx(1.0025) and first["not_relaunched"] == [[1, 1]]
    assert again["t"] == 32.0 and again["not_relaunched"] == [[1, 2]]
    assert again["incarnation"] == 2  # the lives the first relaunch started are over
    (formed,) = [r for r in sim.records if r["f"] == "generation" and r["gen"] == 2]
    assert formed["t"] == pytest.approx(132.0005)  # the new processes took restart_s

# a job whose MTBF (100 s) is far below its restart (600 s): checkpoint-restart
# never gets a restart through, elastic recovers in seconds
HOPELESS = """
name: hopeless-restarts
seed: {seed}
cluster: {{workers: 64, spares: 4, repair_s: 3600}}
workload: {{steps: 20000, global_batch: 256, micro_batch: 1, micro_batch_s: 0.25,
           allreduce_s: 0.2}}
failures: {{worker_mtbf_s: 6400}}
detector: {{heartbeat_s: 1, timeout_s: 10}}
rendezvous: {{min_workers: 8}}
strategy: {{kind: {kind}, checkpoint_interval_steps: 100, checkpoint_write_s: 30,
           restart_s: 600}}
"""


@pytest.mark.parametrize("seed", [0, 1])
def test_a_job_whose_failures_outpace_its_restarts_ends_as_not_expected_to_finish(
        seed: int) -> None:
    """The keeper's rule (rollcall.core.progress) ends checkpoint-restart
    with a reason naming the measured rates, after one window of recoveries
    rather than at the sim's horizon; elastic, recovering in seconds, completes."""
    sim = Simulation(parse_scenario(HOPELESS.format(seed=seed, kind="checkpoint-restart")))
    summary = sim.run(max_wall_s=HANG_GUARD_S)
    assert not summary["completed"] and summary["valid"], summary["violations"][:2]
    reason = summary["end_reason"]
    assert "not expected to finish: over the last 64 recoveries" in reason, reason
    assert summary["restarts"] == 64
    (give_up,) = [r for r in sim.records if r["f"] == "round" and r["type"] == "fail"]
    assert give_up["reason"] in reason
    _run(HOPELESS.replace("{kind}", "elastic"), seed)


# one step on one worker, slowed now and then: a slowdown starts inside the step
SLOWED_STEP = """
name: slowed-step
seed: {seed}
cluster: {{workers: 1}}
workload: {{steps: 1, global_batch: 1, micro_batch: 1}}
failures: {{slow_mtbf_s: 0.0146}}
"""


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_a_step_repriced_in_flight_is_charged_what_it_cost(seed: int) -> None:
    """A step in flight when its price changes keeps the fraction it had done
    (its end moves), but is charged the seconds it took, not its new price:
    productive time never exceeds the elapsed time (ETTR within [0, 1]) and
    every simulated second is in one category."""
    sim = Simulation(parse_scenario(SLOWED_STEP.format(seed=seed)))
    s = sim.run(max_wall_s=HANG_GUARD_S)
    assert s["completed"] and s["valid"], s["violations"][:2]
    assert any(r["f"] == "fault" and r["kind"] == "slow" for r in sim.records)
    assert 0.0 <= s["ettr"] <= 1.0 and 0.0 <= s["goodput"] <= 1.0, (s["ettr"], s["goodput"])
    accounted = (s["productive_s"] + s["lost_work_s"] + s["stall_s"] + s["recovery_s"]
                 + s["checkpoint_s"])
    assert accounted == pytest.approx(s["elapsed_s"], rel=1e-9, abs=1e-12)


# the active keeper dies while checkpoint-restart restarts (after the teardown
# and the relaunch, while the new processes start); its last record is of the
# generation before
KEEPER_LOST_IN_A_RESTART = """
name: keeper-lost-in-a-restart
cluster: {workers: 2}
workload: {steps: 10, global_batch: 2, micro_batch: 1}
failures:
  schedule:
  - {at_step: 2, kill: 1}
  - {at_s: 5.0, kill_keeper: active}
rendezvous: {min_workers: 1, join_timeout_s: null}
strategy: {kind: checkpoint-restart}
keeper: {store: etcd, standbys: 1}
"""


def test_a_new_keeper_restarts_a_group_whose_restart_was_in_flight() -> None:
    """The standby finds worker 1's process gone and worker 0's new one still
    starting (reported as running); a checkpoint-restart group that lost a
    member restarts, as under the old keeper: worker 0 is relaunched as a
    life after the one starting, never the same life twice, and the job
    completes. It once waited in the roll call for lives nobody would
    start, until the sim's horizon."""
    sim = Simulation(parse_scenario(KEEPER_LOST_IN_A_RESTART))
    summary = sim.run(max_wall_s=HANG_GUARD_S)
    assert summary["completed"] and summary["valid"], summary["end_reason"]
    restarts = [r["t"] for r in sim.records if r["f"] == "restart"]
    takeover = [r["t"] for r in sim.records if r["f"] == "takeover"]
    assert len(restarts) == 2 and restarts[1] == takeover[0] == 7.0
    first, second = [r for r in sim.records if r["f"] == "relaunch"]
    assert first["t"] == restarts[0] and second["t"] == restarts[1]
    assert first["not_relaunched"] == second["not_relaunched"] == [[1, 1]]
    assert first["incarnation"] == 1 and first["others"] == []
    assert second["others"] == [[0, 2]]  # worker 0: life 1 was starting


# the only worker is paused for a millisecond while the active keeper is down
VOTE_BEFORE_TAKEOVER = """
name: vote-before-takeover
cluster: {workers: 1}
workload: {steps: 3, global_batch: 1, micro_batch: 1}
failures:
  schedule:
  - {at_s: 0.0675, pause: 0, for_s: 0.001}
  - {at_step: 1, kill_keeper: active}
strategy: {checkpoint_interval_steps: 1}
keeper: {store: etcd, standbys: 1}
"""


def test_a_keeper_restored_from_its_record_votes_on_no_step_before_its_roll_call() -> None:
    """A vote that reached the new keeper before it took over is refused (it
    knows the generation, not which steps committed): the step is redone
    after the roll call. It once tripped the keeper's assertion that a vote
    never skips a committed step."""
    sim = Simulation(parse_scenario(VOTE_BEFORE_TAKEOVER))
    summary = sim.run(max_wall_s=HANG_GUARD_S)
    assert summary["completed"] and summary["valid"], summary["end_reason"]
    assert summary["keeper_failovers"] == 1 and summary["steps_committed"] == 3


# one worker failing every 4.6 s, repaired in 1 ms, a repaired node's process up 6 s later
REFUSED_REPAIRED_LIFE = """
name: refused-repaired-life
cluster: {workers: 1, repair_s: 0.001, launch_s: 6.0}
workload: {steps: 12, global_batch: 4, micro_batch: 1}
failures: {worker_mtbf_s: 4.6}
strategy: {kind: checkpoint-restart}
"""


def test_a_life_refused_after_a_restart_moved_past_it_exits() -> None:
    """A repaired node's process starts as the life the keeper handed out at
    the repair; a restart meanwhile moved that node's life on, so its Join is
    refused and the process, fenced, exits (the sim once asserted that a
    bulk agent is never fenced). The job, failing far faster than it
    restarts, then ends as not expected to finish."""
    sim = Simulation(parse_scenario(REFUSED_REPAIRED_LIFE))
    summary = sim.run(max_wall_s=HANG_GUARD_S)
    assert summary["valid"], summary["violations"][:2]
    assert "not expected to finish" in summary["end_reason"], summary["end_reason"]
    assert [r for r in sim.records if r["f"] == "refuse" and r["reason"] == "stale-incarnation"]


def test_a_run_without_failures_has_an_ettr_of_at_most_one() -> None:
    """The productive seconds are summed step by step, the elapsed ones are
    the last step's end: an ulp apart, never a ratio above 1."""
    text = """
name: exact-ettr
cluster: {workers: 1}
workload: {steps: 92, global_batch: 1, micro_batch: 1, micro_batch_s: 0.0229}
network: {latency_s: 0.0}
strategy: {checkpoint_write_s: 0.0}
"""
    summary = Simulation(parse_scenario(text)).run(max_wall_s=HANG_GUARD_S)
    assert summary["completed"] and summary["ettr"] <= 1.0 and summary["goodput"] <= 1.0


def test_failures_in_one_tick_give_up_the_job_once() -> None:
    """Several verdicts in one tick, the first of which gives the job up (no
    progress over one recovery): the others decide nothing more (the keeper
    once failed the job a second time and tripped its own assertion)."""
    text = """
name: verdicts-in-one-tick
cluster: {workers: 10}
failures: {worker_mtbf_s: 1.22}
detector: {heartbeat_s: 0.02, timeout_s: 0.024}
strategy: {max_recoveries_without_progress: 1}
"""
    sim = Simulation(parse_scenario(text))
    summary = sim.run(max_wall_s=HANG_GUARD_S)
    assert summary["valid"] and not summary["completed"]
    assert "committed over 1 consecutive recoveries" in summary["end_reason"]
    assert len([r for r in sim.records if r["f"] == "round" and r["type"] == "fail"]) == 1


def test_below_min_workers_with_nothing_to_come_ends_as_not_expected_to_finish() -> None:
    """The only worker is killed at once, nothing repairs it and
    join_timeout_s is null: the keeper waits a detection window and a last
    call, then gives up (it once waited until the sim's horizon)."""
    text = """
name: nothing-comes
cluster: {workers: 1}
failures:
  schedule:
  - {at_s: 0.0, kill: 0}
rendezvous: {join_timeout_s: null}
"""
    summary = Simulation(parse_scenario(text)).run(max_wall_s=HANG_GUARD_S)
    assert summary["valid"] and not summary["completed"]
    assert "nothing can bring a worker" in summary["end_reason"], summary["end_reason"]
    assert summary["end_s"] < 10.0


def test_a_repaired_nodes_late_start_yields_to_a_newer_relaunched_life() -> None:
    """A repaired node's process is still starting (launch_s) when a restart
    relaunches the node as a newer life: the older start is moot (the sim
    once started it anyway, an older life over a newer one)."""
    text = """
name: late-start
seed: 0
cluster: {repair_s: 0.0326, launch_s: 0.313}
workload: {allreduce_s: 0.488}
failures: {worker_mtbf_s: 28.6}
strategy: {kind: checkpoint-restart, restart_s: 0.001}
"""
    summary = Simulation(parse_scenario(text)).run(max_wall_s=HANG_GUARD_S)
    assert summary["completed"] and summary["valid"], summary["end_reason"]


@pytest.mark.parametrize("cluster", [
    "{warm_standbys: 0}",  # no idle node to warm: nothing comes
    "{workers: 4, repair: {auto_s: 1.0, manual_p: 0.0, retire_after: 1}}",  # every node retired
    # repaired at first, retired at the second failure (or the first within
    # the window): the job gives up once too few nodes are left, not at its horizon
    "{workers: 4, repair: {auto_s: 1.0, manual_p: 0.0, retire_after: 2}}",
    "{workers: 4, repair: {auto_s: 1.0, manual_p: 0.0, retire_after: 1, retire_window_s: 60.0}}",
    "{workers: 4, spares: 2, spare_pool: 2,"
    " repair: {auto_s: 1.0, manual_p: 0.0, retire_after: 2}}",
])
def test_nothing_to_come_is_read_from_the_whole_cluster(cluster: str) -> None:
    text = f"""
name: nothing-comes-back
cluster: {cluster}
failures: {{worker_mtbf_s: 5.0}}
rendezvous: {{join_timeout_s: null}}
"""
    sc = parse_scenario(text)
    summary = Simulation(sc).run(max_wall_s=HANG_GUARD_S)
    assert summary["valid"] and not summary["completed"]
    assert "nothing can bring a worker" in summary["end_reason"], summary["end_reason"]
    from rollcall.config import horizon_s
    assert summary["end_s"] < horizon_s(sc) / 10, (summary["end_s"], horizon_s(sc))


def test_a_job_not_done_by_its_horizon_gives_up_as_not_expected_to_finish() -> None:
    """Nodes fail every 10 s and take days to repair: two are never up at
    once. The keeper gives the job up at rollcall.config.horizon_s (1,000
    times its work, with room for restarts and repairs), named as such."""
    text = """
name: repairs-outlast-it
cluster: {workers: 4, repair: {}}
failures: {worker_mtbf_s: 9.57}
rendezvous: {join_timeout_s: null}
"""
    sc = parse_scenario(text)
    summary = Simulation(sc).run(max_wall_s=HANG_GUARD_S)
    assert summary["valid"] and not summary["completed"]
    assert "not expected to finish: not done by t=" in summary["end_reason"]
    from rollcall.config import horizon_s
    assert summary["end_s"] == pytest.approx(horizon_s(sc))


@pytest.mark.parametrize("seed, mtbf, step", [(300, 0.529, 0.000422), (2, 0.344, 0.0001)])
def test_the_last_steps_vote_is_counted_when_it_arrives_far_into_a_run(
        seed: int, mtbf: float, step: float) -> None:
    """Days of repairs put the last step ~5e5 s into the run, where the float
    division that counts the votes arrived falls an ulp short of the one the
    final check waits for; the job once never finished (and the keeper,
    complete, went on opening rounds). The vote is counted at its arrival and
    a keeper whose job has every step decides nothing more."""
    text = f"""
name: last-vote-late
seed: {seed}
cluster: {{workers: 2, repair: {{}}}}
workload: {{steps: 51, global_batch: 1, micro_batch: 1, micro_batch_s: {step}}}
failures: {{worker_mtbf_s: {mtbf}}}
detector: {{heartbeat_s: 0.02, timeout_s: 0.024}}
rendezvous: {{min_workers: 1, join_timeout_s: null}}
"""
    summary = Simulation(parse_scenario(text)).run(max_wall_s=HANG_GUARD_S)
    assert summary["completed"] and summary["valid"], summary["end_reason"]
    assert summary["steps_committed"] == 51
