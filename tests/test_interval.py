"""Each strategy's checkpoint interval when the two are compared (rollcall.app.interval)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollcall.app.analysis import daly_interval
from rollcall.app.interval import checkpoint_intervals, daly_optimum_s, describe
from rollcall.app.plan import failure_rates
from rollcall.scenario import parse_scenario

# 1,024 nodes failing once in 50,000 h each, 30-minute writes, an hour's interval in the file
BIG = """
name: big-writes
cluster: {workers: 1024, gpus_per_worker: 8}
workload: {steps: 100000, global_batch: 8192, micro_batch: 8, micro_batch_s: 3.0,
           dataset_samples: 1000000,
           allreduce_s: 1.0}
failures: {worker_mtbf_s: 180000000}
rendezvous: {min_workers: 900, max_workers: 1024}
strategy: {kind: elastic, checkpoint_interval_steps: 900, checkpoint_write_s: 1800,
           restart_s: 600}
"""


def _expected_time_factor(tau_s: float, write_s: float, mtbf_s: float) -> float:
    """log of Daly's tau-dependent factor (e^((tau + delta)/M) - 1) / tau."""
    x = (tau_s + write_s) / mtbf_s
    return (x + math.log(-math.expm1(-x))) - math.log(tau_s)


@settings(max_examples=300, deadline=None)
@given(st.floats(0.01, 1e5), st.floats(1.0, 1e8))
def test_the_optimum_minimises_dalys_expected_time(write_s: float, mtbf_s: float) -> None:
    tau = daly_optimum_s(write_s, mtbf_s)
    assert 0 < tau < mtbf_s
    best = _expected_time_factor(tau, write_s, mtbf_s)
    for other in (tau * 0.99, tau * 1.01, tau * 0.5, tau * 2):
        assert best <= _expected_time_factor(other, write_s, mtbf_s) + 1e-12


@pytest.mark.parametrize("write_s, mtbf_s", [(60, 3600), (60, 11102), (1, 1e6)])
def test_the_optimum_agrees_with_dalys_higher_order_form_where_writes_are_short(
        write_s: float, mtbf_s: float) -> None:
    assert daly_optimum_s(write_s, mtbf_s) == pytest.approx(daly_interval(write_s, mtbf_s),
                                                            rel=1e-3)


def test_without_random_failures_both_keep_the_scenarios_interval() -> None:
    sc = parse_scenario(BIG.replace("failures: {worker_mtbf_s: 180000000}", ""))
    choices = checkpoint_intervals(sc)
    assert {c.steps for c in choices.values()} == {900}
    assert {c.source for c in choices.values()} == {"no-random-failures"}
    assert "no rate to optimise for" in describe(choices)


@pytest.mark.parametrize("fixed, grid, source", [(True, False, "fixed"), (False, True, "grid")])
def test_a_fixed_or_grid_interval_is_kept_for_both(fixed: bool, grid: bool, source: str) -> None:
    choices = checkpoint_intervals(parse_scenario(BIG), fixed=fixed, grid=grid)
    assert [(c.steps, c.source) for c in choices.values()] == [(900, source)] * 2


def test_each_strategy_gets_the_optimum_for_its_own_rollbacks() -> None:
    """Checkpoint-restart goes back to its checkpoint at every failure (a job
    MTBF of 48.8 h here): Daly's optimum. Replicated elastic with 124 nodes
    to spare never does at these rates: no checkpoint before the end."""
    sc = parse_scenario(BIG)
    choices = checkpoint_intervals(sc)
    cr, el = choices["checkpoint-restart"], choices["elastic"]
    job_mtbf_s = 180000000 / 1024
    assert cr.source == "daly" and cr.mtbf_s == pytest.approx(job_mtbf_s)
    assert cr.steps * sc.ideal_step_s == pytest.approx(daly_optimum_s(1800, job_mtbf_s),
                                                       abs=sc.ideal_step_s)
    assert el.source == "whole-job" and el.steps == 100000 and math.isinf(el.mtbf_s)
    line = describe(choices)
    assert "checkpoint-restart" in line and "Daly's optimum" in line
    assert "elastic 100000 steps" in line and "no rollback" in line


def test_the_step_count_is_the_cheaper_whole_step_around_the_optimum() -> None:
    sc = parse_scenario(BIG)
    cr = checkpoint_intervals(sc)["checkpoint-restart"]
    step_s, write_s = sc.ideal_step_s, 1800.0
    costs = {k: _expected_time_factor(k * step_s, write_s, cr.mtbf_s) for k in range(1, 20000)}
    assert cr.steps == min(costs, key=costs.__getitem__)


def test_sharded_elastic_without_buddies_goes_back_at_every_failure() -> None:
    """One replica per shard: every failure loses a shard, so elastic's
    rollbacks come at the job's failure rate and its optimum is
    checkpoint-restart's."""
    sc = parse_scenario(BIG + "state: {sharding: sharded, replicas: 1}\n")
    rates = failure_rates(sc)
    assert rates["shard_loss"] == pytest.approx(rates["job"])
    choices = checkpoint_intervals(sc)
    assert choices["elastic"].steps == choices["checkpoint-restart"].steps
    assert choices["elastic"].source == "daly"


def test_a_job_that_cannot_spare_a_node_goes_back_below_min_workers() -> None:
    """min_workers = workers and no spares or repairs: the first failure sends
    elastic below min_workers, almost surely within the job."""
    sc = parse_scenario(BIG.replace("min_workers: 900", "min_workers: 1024"))
    rates = failure_rates(sc)
    assert rates["below_min"] > 0 and rates["rollback"] == rates["below_min"]
    assert checkpoint_intervals(sc)["elastic"].source == "daly"
