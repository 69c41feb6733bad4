"""Gray failures: late heartbeats, on the sim and on real.

A worker whose heartbeats reach the keeper late while its work is on time
is not dead. A fixed timeout shorter than the delay evicts it anyway (a
false eviction: it comes back as a newcomer); phi accrual at its default
threshold tolerates 18.4 of the worker's own intervals and keeps it. Both
targets run the same fault (sim/gray.py; real: the worker holds its beats,
``HeldBeats`` in real/worker.py) and decide the same generations.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rollcall.core import make_detector
from rollcall.results import read_history
from rollcall.scenario import ScenarioError, load_scenario
from real_processes import REAL_PROCESSES
from test_real_hosts import member_ids

ROOT = Path(__file__).resolve().parent.parent
LATE = ROOT / "scenarios" / "real-late-heartbeats.yaml"


def generations(history: list[dict]) -> list[tuple[int, list[int], str]]:
    return [(r["gen"], member_ids(r), r["reason"]) for r in history if r["f"] == "generation"]


def evictions(history: list[dict]) -> list[tuple[int, str]]:
    return [(r["worker"], r["reason"]) for r in history if r["f"] == "evict"]


def sim_run(tmp_path: Path, *overrides: str) -> tuple[dict, list[dict]]:
    from sim import driver as sim_driver

    sc = load_scenario(LATE, list(overrides), target="sim")
    summary = sim_driver.run(sc, tmp_path)
    assert summary["completed"] and summary["valid"], summary["violations"]
    return summary, list(read_history(tmp_path))


def test_a_fixed_timeout_evicts_a_worker_whose_beats_are_late(tmp_path: Path) -> None:
    _, history = sim_run(tmp_path)
    (fault,) = [r for r in history if r["f"] == "fault" and r["kind"] == "late_heartbeats"]
    assert fault["workers"] == [2] and fault["delay_s"] == 1.5 and fault["for_s"] == 2.0
    (evict,) = [r for r in history if r["f"] == "evict"]
    assert (evict["worker"], evict["reason"]) == (2, "timeout")
    # its last on-time beat arrived no later than the fault: evicted one timeout after
    assert 0 < evict["t"] - fault["t"] <= 1.0 + 1e-6
    assert generations(history) == [(1, [0, 1, 2, 3], "start"), (2, [0, 1, 3], "failure"),
                                    (3, [0, 1, 2, 3], "growth")]
    heal = [r for r in history if r["f"] == "fault" and r["kind"] == "heal"]
    assert [r["t"] - fault["t"] for r in heal] == pytest.approx([2.0])


def test_a_worker_whose_beats_are_late_answers_a_roll_call_on_time(tmp_path: Path) -> None:
    """Only the beats are late: when the late heartbeats start as a roll
    call opens (``at_roll_call``), the worker answers it at once and is in
    the generation it forms; the keeper, which heard it in that answer,
    evicts it one timeout after it, not after its last beat. Then it
    learns of the eviction from its late beat's answer and rejoins."""
    from sim import driver as sim_driver

    path = ROOT / "tests" / "data" / "scenarios" / "cross-slow-late-heartbeats.yaml"
    sc = load_scenario(path, [], target="sim")
    summary = sim_driver.run(sc, tmp_path)
    assert summary["completed"] and summary["valid"], summary["violations"]
    history = list(read_history(tmp_path))
    (fault,) = [r for r in history if r["f"] == "fault" and r["kind"] == "late_heartbeats"]
    (opened,) = [r for r in history if r["f"] == "round" and r["type"] == "invoke" and r["gen"] == 2]
    assert fault["t"] == opened["t"] and fault["workers"] == [1]
    assert generations(history)[1] == (2, [0, 1, 3], "straggler")
    formed = [r for r in history if r["f"] == "generation" and r["gen"] == 2][0]
    late = [r for r in history if r["f"] == "evict" and r["worker"] == 1]
    assert [r["reason"] for r in late] == ["timeout"]
    # its answer closed the roll call: the keeper heard it as the generation formed
    assert late[0]["t"] == pytest.approx(formed["t"] + sc.detector.timeout_s)
    assert generations(history)[2:] == [(3, [0, 3], "failure"), (4, [0, 1, 3], "growth"),
                                        (5, [0, 1, 2, 3], "growth")]


def test_phi_keeps_a_worker_whose_beats_are_late_and_still_evicts_the_dead(tmp_path: Path) -> None:
    _, history = sim_run(tmp_path / "late", "detector.kind=phi")
    assert evictions(history) == []
    assert generations(history) == [(1, [0, 1, 2, 3], "start")]
    # a worker that stops is declared dead after phi's tolerance, 18.4 beats
    _, paused = sim_run(tmp_path / "pause", "detector.kind=phi",
                        "failures.schedule=[{at_step: 10, pause: 2, for_s: 3.0}]")
    (fault,) = [r for r in paused if r["f"] == "fault" and r["kind"] == "pause"]
    (evict,) = [r for r in paused if r["f"] == "evict"]
    assert 1.84 - 0.1 - 1e-6 <= evict["t"] - fault["t"] <= 1.84 + 1e-3


def test_late_heartbeats_need_their_delay_and_a_worker(tmp_path: Path) -> None:
    for fault, words in [("{at_step: 1, late_heartbeats: 2, for_s: 1.0}", "required with late_"),
                         ("{at_step: 1, late_heartbeats: 2, delay_s: 1.0}", "required with late"),
                         ("{at_step: 1, late_heartbeats: 9, delay_s: 1.0, for_s: 1.0}",
                          "worker 9 does not exist"),
                         ("{at_step: 1, pause: 2, delay_s: 1.0, for_s: 1.0}", "only allowed with"),
                         ("{at_step: 1, late_heartbeats: 2, delay_s: 4000, for_s: 1.0}",
                          "must be <= 3600")]:
        with pytest.raises(ScenarioError, match=words):
            load_scenario(LATE, [f"failures.schedule=[{fault}]"])


def twice_late(second_delay_s: float) -> str:
    """Worker 2's beats late by 1.5 s for 2 s from 1 s (a 1.6 s gap, within
    phi's nominal 1.84 s), then by ``second_delay_s`` for 2 s from 4 s."""
    return ("failures.schedule=[{at_s: 1.0, late_heartbeats: 2, delay_s: 1.5, for_s: 2.0}, "
            f"{{at_s: 4.0, late_heartbeats: 2, delay_s: {second_delay_s}, for_s: 2.0}}]")


def test_phi_on_the_sim_learns_from_a_late_worker(tmp_path: Path) -> None:
    """The sim's phi hears every late beat's gap, as real's does: after a
    1.6 s gap its window of 64 intervals holds it, and its tolerance grows
    from 1.84 s to 2.27 s for a while. A second gap of 2.05 s is then
    tolerated (it would not be at the nominal cadence); one of 2.6 s is
    not, and the worker is evicted 2.27 s after its last beat."""
    _, kept = sim_run(tmp_path / "kept", "detector.kind=phi", twice_late(1.95))
    assert evictions(kept) == []
    _, gone = sim_run(tmp_path / "gone", "detector.kind=phi", twice_late(2.5))
    (evict,) = [r for r in gone if r["f"] == "evict"]
    phi = make_detector("phi", 0.1, 1.0)
    window = [1.6] + [0.1] * 63  # the gap (1.5 s late, a beat's 0.1 s), then on time
    last_beat = 4.0 - 0.1 + load_scenario(LATE).network.latency_s
    assert evict["worker"] == 2 and evict["t"] == pytest.approx(
        last_beat + phi.silence_s(phi.mean_s(window)), abs=1e-6)
    assert evict["t"] - last_beat > phi.silence_s() + 0.3


@pytest.mark.timeout(200)
@pytest.mark.parametrize("schedule", [[], [twice_late(1.95)]], ids=["once", "twice"])
def test_both_targets_keep_a_late_worker_under_phi(tmp_path: Path, schedule: list[str]) -> None:
    """The shipped scenario with phi: nobody evicted on either target, and
    the run valid on both (the timeout variant is in tests/test_conformance.py).
    Twice late, the second gap (2.05 s) longer than phi's nominal tolerance
    (1.84 s): both keepers learnt from the first one and keep the worker."""
    from real import driver as real_driver

    _, sim = sim_run(tmp_path / "sim", "detector.kind=phi", *schedule)
    sc = load_scenario(LATE, ["detector.kind=phi", *schedule])
    summary = real_driver.run(sc, tmp_path / "real")
    assert summary["completed"] and summary["valid"], summary["violations"]
    real = list(read_history(tmp_path / "real"))
    assert [r["workers"] for r in real if r["f"] == "fault" and r["kind"] == "late_heartbeats"] \
        == [[2]] * (1 + len(schedule))
    assert evictions(real) == evictions(sim) == []
    assert generations(real) == generations(sim) == [(1, [0, 1, 2, 3], "start")]



# -- slow ------------------------------------------------------------------------

SLOW = ["failures.schedule=[{at_step: 10, slow: 2, factor: 4, for_s: 2.0}]",
        "workload.micro_batch_s=0.01", "workload.allreduce_s=0.002",
        "strategy.checkpoint_interval_steps=1000"]


def test_a_slow_member_stretches_every_step_to_its_pace(tmp_path: Path) -> None:
    """Worker 2 computes 4x slower for 2 s: each step waits for it (2
    micro-batches of 10 ms at 4x, then the 2 ms exchange: 82 ms instead of
    22), so the run takes the 2 s minus what 2 s of slow steps did at the
    usual pace longer; nobody is evicted (its heartbeats are on time)."""
    base, _ = sim_run(tmp_path / "base", "failures.schedule=[]", *SLOW[1:])
    slow, history = sim_run(tmp_path / "slow", *SLOW)
    (fault,) = [r for r in history if r["f"] == "fault" and r["kind"] == "slow"]
    assert fault["workers"] == [2] and fault["factor"] == 4.0
    assert evictions(history) == []
    steps_slow = 2.0 / 0.082  # steps done while slow, at 82 ms
    assert slow["elapsed_s"] - base["elapsed_s"] == pytest.approx(
        steps_slow * (0.082 - 0.022), abs=0.1)


def test_slow_needs_a_factor_above_one(tmp_path: Path) -> None:
    for fault, words in [("{at_step: 1, slow: 2, for_s: 1.0}", "required with slow"),
                         ("{at_step: 1, slow: 2, factor: 1.0, for_s: 1.0}", "must be > 1"),
                         ("{at_step: 1, slow: 2, factor: 2000, for_s: 1.0}", "<= 1000"),
                         ("{at_step: 1, slow: 2, factor: 2}", "required with slow")]:
        with pytest.raises(ScenarioError, match=words):
            load_scenario(LATE, [f"failures.schedule=[{fault}]"])


@pytest.mark.timeout(200)
@pytest.mark.parametrize("hosts", [False, True], ids=["launcher", "host-agent"])
def test_both_targets_wait_for_a_slow_worker(tmp_path: Path, hosts: bool) -> None:
    """``slow`` on real: the launcher tells the worker (directly, or through
    its host agent's relay in hosts mode), which stretches each step's
    compute (``Trainer.stretch``). Its compute gets slower, nobody is evicted
    (its heartbeats are on time), and both targets decide the same
    generations; the run is valid on both."""
    from real import driver as real_driver
    from real.netns import netns_available

    overrides = ["failures.schedule=[{at_step: 10, slow: 2, factor: 4, for_s: 2.0}]"]
    if hosts:
        if (why := netns_available()) is not None:
            pytest.skip(why)
        overrides.append("cluster.workers_per_host=2")
    _, sim = sim_run(tmp_path / "sim", *overrides)
    summary = real_driver.run(load_scenario(LATE, overrides), tmp_path / "real")
    assert summary["completed"] and summary["valid"], summary["violations"]
    real = list(read_history(tmp_path / "real"))
    (fault,) = [r for r in real if r["f"] == "fault" and r["kind"] == "slow"]
    (heal,) = [r for r in real if r["f"] == "fault" and r["kind"] == "heal"]
    assert fault["workers"] == [2] and heal["workers"] == [2]
    assert evictions(real) == evictions(sim) == []
    assert generations(real) == generations(sim) == [(1, [0, 1, 2, 3], "start")]
    # its compute was stretched (how much is the benchmark's to measure:
    # benchmarks/slow_worker.py; here only that the fault reached it)
    mine = [r for r in real if r["f"] == "contribute" and r["process"] == 2]
    during = [r["compute_s"] for r in mine if fault["t"] + 0.2 < r["t"] < heal["t"]]
    before = [r["compute_s"] for r in mine if r["t"] < fault["t"]]
    assert during and sorted(during)[len(during) // 2] > sorted(before)[len(before) // 2]


for _mark in REAL_PROCESSES:  # one real run at a time, pidfds needed
    test_both_targets_keep_a_late_worker_under_phi = _mark(
        test_both_targets_keep_a_late_worker_under_phi)
    test_both_targets_wait_for_a_slow_worker = _mark(test_both_targets_wait_for_a_slow_worker)


def test_random_slowdowns_are_the_seeds_on_both_targets(tmp_path: Path) -> None:
    """``failures.slow_mtbf_s``: each worker is slowed now and then, drawn from
    the seed (``slow/<node>``), the same on both targets: the sim's slow
    records are the real fault plan's, worker for worker and time for time
    (the real plan counts from training's start, the sim from 0)."""
    from rollcall.config import fault_plan

    overrides = ["failures.schedule=[]", "failures.slow_mtbf_s=3",
                 "failures.slow_factor={median: 3, spread: 0.5}", "failures.slow_for_s=1",
                 "workload.steps=400"]
    summary, history = sim_run(tmp_path, *overrides)
    sim = [(round(r["t"], 6), r["workers"], r["factor"]) for r in history
           if r["f"] == "fault" and r["kind"] == "slow"]
    assert len(sim) >= 4 and all(r.get("origin") == "mtbf" for r in history
                                 if r["f"] == "fault" and r["kind"] == "slow")
    assert all(f > 1 for _, _, f in sim) and len({f for _, _, f in sim}) > 1  # spread
    plan = fault_plan(load_scenario(LATE, overrides))
    for w in range(4):
        plan.node_up(w, 0.0)
    real = []
    t = 0.0
    while (t := plan.next_time()) is not None and t <= summary["elapsed_s"]:
        real += [(round(t, 6), list(d.targets), d.rate) for d in plan.due_by_time(t)]
    assert real == sim


def test_a_slowdown_model_factor_is_above_one_and_capped() -> None:
    from rollcall.core import SlowdownModel

    m = SlowdownModel(seed=1, mtbf_s=10.0, factor=1.5, for_s=1.0, spread=3.0)
    draws = [m.slowdown(n, k) for n in range(20) for k in range(20)]
    assert all(gap > 0 and 1 < f <= 1000 for gap, f in draws)
    assert max(f for _, f in draws) == 1000  # the cap reached at this spread
    assert SlowdownModel(1, 10.0, 4.0, 1.0).slowdown(3, 2)[1] == 4.0


def test_gray_failures_and_phi_replay_byte_for_byte(tmp_path: Path) -> None:
    """Same scenario and seed, same sim history, with phi, random slowdowns,
    a slow worker and late beats all in play (the determinism promise)."""
    overrides = ["detector.kind=phi", "failures.slow_mtbf_s=2", "failures.slow_for_s=0.5",
                 "failures.slow_factor={median: 3, spread: 1}", "workload.steps=300",
                 "failures.schedule=[{at_step: 10, late_heartbeats: random, delay_s: 2.5, "
                 "for_s: 1.0}, {at_step: 40, slow: random, factor: 3, for_s: 1.0}]"]
    overrides.append("strategy.stragglers=evict")
    for name in ("a", "b"):
        sim_run(tmp_path / name, *overrides)
    assert (tmp_path / "a" / "history.jsonl").read_bytes() == \
        (tmp_path / "b" / "history.jsonl").read_bytes()


# -- stragglers (strategy.stragglers) ----------------------------------------------

STRAGGLER = ROOT / "scenarios" / "real-straggler.yaml"


def straggler_run(tmp_path: Path, *overrides: str) -> tuple[dict, list[dict]]:
    """The straggler scenario on the sim at a 3x bar (the tests below reason
    with it; the shipped file's is higher for the sake of real's jitter)."""
    from sim import driver as sim_driver

    sc = load_scenario(STRAGGLER, ["strategy.straggler_factor=3.0", *overrides], target="sim")
    summary = sim_driver.run(sc, tmp_path)
    assert summary["completed"] and summary["valid"], summary["violations"]
    return summary, list(read_history(tmp_path))


LASTING = ["failures.schedule=[{at_step: 10, slow: 2, factor: 4, for_s: 1000.0}]",
           "strategy.straggler_holdout_s=1000"]


def test_a_4x_straggler_is_evicted_under_evict_kept_under_keep(tmp_path: Path) -> None:
    """Worker 2 computes 4x slower from step 10 for good. ``keep`` waits for
    it every step; ``evict`` takes it out after its 5 lagging steps (steps
    10-14: the generation without it resumes at 15), and that run finishes
    sooner: 3 workers accumulating 3 micro-batches beat a 4x worker's 2."""
    kept, kept_history = straggler_run(tmp_path / "keep", *LASTING, "strategy.stragglers=keep")
    evicted, history = straggler_run(tmp_path / "evict", *LASTING)
    assert evictions(kept_history) == [] and generations(kept_history) == [(1, [0, 1, 2, 3],
                                                                              "start")]
    assert evictions(history) == [(2, "straggler")]
    assert generations(history) == [(1, [0, 1, 2, 3], "start"), (2, [0, 1, 3], "straggler")]
    (gen2,) = [r for r in history if r["f"] == "generation" and r["gen"] == 2]
    assert gen2["cursor"][0] == 15
    (ev,) = [r for r in history if r["f"] == "evict"]
    assert ev["lag"] == 4.0 and ev["step_s"] > ev["without_s"]
    assert evicted["elapsed_s"] < 0.6 * kept["elapsed_s"], (evicted["elapsed_s"],
                                                            kept["elapsed_s"])


def test_a_straggler_still_slow_when_readmitted_waits_twice_as_long(tmp_path: Path) -> None:
    """Slow for 6 s, holdout 3 s: evicted, readmitted while still slow,
    evicted again for 6 s, readmitted at full speed (it stays)."""
    _, history = straggler_run(tmp_path, "failures.schedule=[{at_step: 10, slow: 2, factor: 4, "
                                         "for_s: 6.0}]")
    evs = [r for r in history if r["f"] == "evict"]
    assert [(r["worker"], r["reason"], r["holdout_s"]) for r in evs] == \
        [(2, "straggler", 3.0), (2, "straggler", 6.0)]
    assert [g[2] for g in generations(history)] == ["start", "straggler", "growth", "straggler",
                                                    "growth"]
    (heal,) = [r for r in history if r["f"] == "fault" and r["kind"] == "heal"]
    last = [r for r in history if r["f"] == "generation"][-1]
    assert last["t"] > heal["t"] and member_ids(last) == [0, 1, 2, 3]


def test_a_straggler_is_kept_when_the_job_is_not_faster_without_it(tmp_path: Path) -> None:
    """At 1.4x the straggler's 2 micro-batches (2.8) beat the 3 each of 3
    workers: waiting for it is faster, so it is kept, and the keeper says
    why once; and never below ``min_workers``."""
    for overrides, why in [(["failures.schedule=[{at_step: 10, slow: 2, factor: 1.4, "
                             "for_s: 1000.0}]", "strategy.straggler_factor=1.3"],
                            "not-faster-without"),
                           ([*LASTING, "rendezvous.min_workers=4"], "min-workers")]:
        _, history = straggler_run(tmp_path / why, *overrides)
        assert evictions(history) == []
        kept = [r for r in history if r["f"] == "straggler"]
        assert [(r["worker"], r["decision"], r["reason"]) for r in kept] == [(2, "keep", why)]
