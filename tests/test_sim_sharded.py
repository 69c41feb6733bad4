"""Sharded state on the sim target: copies from buddies, checkpoint
fallback when every holder of a shard is gone, rack failures, and the price
of both.

The keeper decides (``rollcall.core.sharding``); these tests read what the sim
wrote (``recovery`` and ``fault`` records, ``summary.json``) and what its
keeper holds, never the driver's internals.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollcall.core.placement import Copy, Placement, RecoveryPlan
from rollcall.scenario import load_scenario, parse_scenario
from sim.driver import Simulation, run
from sim.sharded import copy_time

ROOT = Path(__file__).resolve().parent.parent
SMALL = ROOT / "scenarios" / "sharded-small.yaml"


def _records(out: Path, f: str) -> list[dict]:
    recs = [json.loads(x) for x in (out / "history.jsonl").read_text().splitlines()]
    return [r for r in recs if r["f"] == f]


def _assert_valid(s: dict) -> None:
    assert s["completed"] is True, s.get("end_reason")
    assert s["valid"] is True, s["violations"]
    assert s["samples_duplicated"] == s["samples_skipped"] == 0


def test_the_shipped_scenario_loses_shard_0_exactly_where_its_comment_says() -> None:
    """Without the last fault, at step 230 shard 0 is held by workers 0 and 4 only."""
    sc = load_scenario(SMALL)
    early = sc.model_copy(update={"failures": sc.failures.model_copy(
        update={"schedule": sc.failures.schedule[:2]})})
    sim = Simulation(early, None)
    sim.run()
    assert sim.keeper.placement is not None
    assert sorted(sim.keeper.placement.holders(0)) == [0, 4]


def test_buddies_restore_a_lost_slice_and_a_lost_shard_falls_back(tmp_path: Path) -> None:
    sc = load_scenario(SMALL)
    s = run(sc, tmp_path)
    _assert_valid(s)
    recovery = _records(tmp_path, "recovery")
    assert [r["initial"] for r in recovery] == [True, False, False, False]
    first, kill, rack, pair = recovery
    shard = sc.workload.model_params * sc.workload.bytes_per_param / sc.state_shards
    # kill 3, then rack 1: each dead worker held 2 replicas, copied from buddies
    for r in (kill, rack):
        assert r["fallback"] is False and r["lost"] == [] and r["steps_lost"] == 0
        assert r["copies"] == 2 and r["bytes_moved"] == 2 * shard
    # 0 and 4 together: shard 0 lost, back to the checkpoint of step 200
    assert pair["fallback"] is True and pair["lost"] == [[0, 0]]
    assert pair["steps_lost"] == 30 and pair["copies"] == 0
    gens = _records(tmp_path, "generation")
    assert gens[-1]["cursor"] == [200, 200 * sc.workload.global_batch]
    assert gens[-1]["source"] is None
    assert s["fallbacks"] == 1 and s["steps_lost_to_fallback"] == 30
    assert s["state_bytes_moved"] == 4 * shard
    (fault,) = [r for r in _records(tmp_path, "fault") if r["kind"] == "kill_rack"]
    assert fault["rack"] == 1 and fault["workers"] == [2]  # 3 was already down


def test_without_buddies_one_kill_forces_a_fallback(tmp_path: Path) -> None:
    sc = load_scenario(SMALL, ["state.replicas=1"])
    s = run(sc, tmp_path)
    _assert_valid(s)
    first_loss = _records(tmp_path, "recovery")[1]
    assert first_loss["fallback"] is True
    assert first_loss["steps_lost"] == 10  # killed at step 60, checkpoint at 50
    assert s["fallbacks"] >= 2


def test_copies_cost_the_busiest_link() -> None:
    p = Placement(((0, 1), (0, 2), (1, 2)))
    plan = RecoveryPlan(p, (Copy(0, 1, 3), Copy(1, 1, 4), Copy(2, 2, 5)), (), (), ())
    # worker 1 sends two shards of 100 bytes: the busiest endpoint
    assert copy_time(plan, [100, 100, 100], 10.0, 0.5) == pytest.approx(20.5)
    empty = RecoveryPlan(p, (), (), (), ())
    assert copy_time(empty, [100, 100, 100], 10.0, 0.5) == 0.0


def test_slower_links_make_a_sharded_recovery_slower(tmp_path: Path) -> None:
    fast = run(load_scenario(SMALL), tmp_path / "fast")
    slow = run(load_scenario(SMALL, ["network.bandwidth_Bps=1.25e8"]), tmp_path / "slow")
    _assert_valid(slow)
    assert slow["elapsed_s"] > fast["elapsed_s"]
    assert slow["state_bytes_moved"] == fast["state_bytes_moved"]


RANDOM = """
name: sharded-random
seed: {seed}
cluster: {{workers: 16, rack_size: 4, repair_s: 600}}
workload: {{steps: 4000, global_batch: 128, micro_batch: 8, micro_batch_s: 0.5,
           allreduce_s: 0.05, model_params: 1000000000}}
failures: {{worker_mtbf_s: 4000}}
rendezvous: {{min_workers: 4}}
strategy: {{kind: elastic, checkpoint_interval_steps: 100, checkpoint_write_s: 10,
           checkpoint_read_s: 30}}
state: {{sharding: sharded, replicas: {r}}}
"""


def test_fallbacks_become_rarer_as_replicas_grow(tmp_path: Path) -> None:
    seeds = range(4)
    fallbacks: dict[int, int] = {}
    goodput: dict[int, float] = {}
    for r in (1, 2, 3):
        fallbacks[r] = 0
        goodput[r] = 0.0
        for seed in seeds:
            sc = parse_scenario(RANDOM.format(seed=seed, r=r), "<random>")
            s = run(sc, tmp_path / f"r{r}-s{seed}")
            _assert_valid(s)
            assert s["failures"] > 0
            fallbacks[r] += s["fallbacks"]
            goodput[r] += s["goodput"] / len(seeds)
    # r = 1: every worker owns a shard only it holds, so every loss falls back
    assert fallbacks[1] >= len(seeds)
    assert fallbacks[1] > fallbacks[2] >= fallbacks[3], fallbacks
    assert goodput[2] > goodput[1], goodput


def test_a_random_rack_failure_takes_one_whole_rack(tmp_path: Path) -> None:
    text = RANDOM.format(seed=0, r=2).replace(
        "failures: {worker_mtbf_s: 4000}",
        "failures: {schedule: [{at_step: 50, kill_rack: random}]}")
    s = run(parse_scenario(text, "<rack>"), tmp_path)
    _assert_valid(s)
    (fault,) = [r for r in _records(tmp_path, "fault") if r["kind"] == "kill_rack"]
    assert len(fault["workers"]) == 4
    assert {w // 4 for w in fault["workers"]} == {fault["rack"]}
    assert s["fallbacks"] == 0  # replicas were spread over racks


def test_a_replicated_copy_is_striped_over_the_holders() -> None:
    """Each stale member pulls a stripe from every holder: bounded by its own
    link while holders outnumber it, by the holders' links beyond."""
    from sim.sharded import replicated_copy_time

    one = replicated_copy_time(4e9, 1, 7, 1e9, 0.001)
    assert one == pytest.approx(4.001)
    assert replicated_copy_time(4e9, 4, 4, 1e9, 0.001) == pytest.approx(one)
    assert replicated_copy_time(4e9, 6, 2, 1e9, 0.001) == pytest.approx(12.001)
