"""Every core configuration, built from a :class:`~rollcall.scenario.Scenario` in one place.

Both drivers call these and nothing else to configure the core, so the sim
and the real target cannot drift apart in how they read a scenario (the
keeper's relaunch timeout was once set by the sim only). The core never
sees a Scenario: it is handed the plain values it decides with.
"""

from __future__ import annotations

from typing import Optional

from rollcall.core import (
    DataSpec, Draws, FailureModel, FaultPlan, JobPolicy, KeeperConfig, RepairPolicy, RepairShop,
    ScheduledFault, ShardSpec, SlowdownModel, StragglerPolicy,
    make_detector, split_bytes,
)
from rollcall.scenario import Fault, Scenario

__all__ = ["arrivals_end_s", "data_spec", "draws", "failure_model", "fault_plan", "fleet_returns",
           "horizon_s", "job_policy", "keeper_config", "repair_policy", "repair_shop",
           "scheduled_faults", "shard_spec"]


def shard_spec(sc: Scenario) -> Optional[ShardSpec]:
    """The shard spec under ``state.sharding: sharded``; None when replicated.

    Per-shard bytes: ``workload.model_params * workload.bytes_per_param`` is
    the whole training state (parameters and optimizer state, what a full
    state copy moves), split evenly over ``state_shards`` shards.
    """
    if sc.state.sharding != "sharded":
        return None
    w = sc.workload
    n = sc.state_shards
    return ShardSpec(n_shards=n, replicas=sc.state.replicas, rack_size=sc.cluster.rack_size,
                     shard_bytes=split_bytes(round(w.model_params * w.bytes_per_param), n))


def job_policy(sc: Scenario) -> JobPolicy:
    """When the job checkpoints and when it is complete."""
    return JobPolicy(steps=sc.workload.steps,
                     checkpoint_interval_steps=sc.strategy.checkpoint_interval_steps)


def keeper_config(sc: Scenario) -> KeeperConfig:
    """The record-keeper's configuration, the same on every target.

    A restart round expects every relaunched worker; one that has not joined
    ``restart_s`` plus the detector's silence (``timeout_s``) after the
    teardown is as silent as a dead worker (its host may have died
    meanwhile): the detector's rule, applied from the relaunch. The keeper
    relaunches at once; ``restart_s`` is how long the new processes take to
    start, which the sim charges as simulated time and a real restart
    takes in fact.
    """
    d, r, s = sc.detector, sc.rendezvous, sc.strategy
    return KeeperConfig(
        min_workers=r.min_workers, max_workers=r.max_workers, last_call_s=r.last_call_s,
        detector=make_detector(d.kind, d.heartbeat_s, d.timeout_s, d.phi_threshold),
        join_timeout_s=r.join_timeout_s, strategy=s.kind,
        relaunch_timeout_s=s.restart_s + d.silence_s,
        sharding=shard_spec(sc), policy=job_policy(sc), stragglers=straggler_policy(sc),
        restart_failure=s.restart_failure, max_restarts=s.max_restarts,
        max_recoveries_without_progress=s.max_recoveries_without_progress,
        arrivals_end_s=arrivals_end_s(sc), fleet_returns=fleet_returns(sc),
        give_up_at_s=horizon_s(sc),
        durable=sc.keeper.store == "etcd")


def fleet_returns(sc: Scenario) -> bool:
    """Whether the fleet may bring a node to the job after the start: a
    repair pipeline (one that retires every node at its first failure brings
    none back), a cold spare pool, or idle nodes a warm-standby limit holds
    back. The repair shop then counts the nodes left (its capacity)."""
    c = sc.cluster
    returns = c.repair_s is not None or (
        c.repair is not None and not (c.repair.retire_after == 1 and c.repair.retire_window_s is None))
    idle = c.warm_standbys is not None and c.spares > c.warm_standbys
    return returns or bool(c.spare_pool) or idle


def arrivals_end_s(sc: Scenario) -> Optional[float]:
    """The last instant a scripted worker can come to the job: an ``at_s``
    join, or the end of an ``at_s`` fault that cut live processes off (they
    rejoin); None when one can come at any time (an ``at_step`` or
    ``at_roll_call`` fault, whose instant is the run's). What the fleet
    brings back is counted apart (:func:`fleet_returns`)."""
    c = sc.cluster
    end = 0.0
    for f in sc.failures.schedule:
        for_s = f.parameters.get("for_s")
        if f.action != "join" and for_s is None:
            continue  # a fault that ends nothing it cut off (a kill, a lost host)
        if f.trigger != "at_s":
            return None
        end = max(end, float(f.when) + float(for_s or 0.0) + c.launch_s)
    return end


def horizon_s(sc: Scenario) -> float:
    """When a job that is not done gives up (the keeper's
    ``give_up_at_s``, both targets), far past any run that ends on its own:
    1,000 times the failure-free work, 100 restarts and detections, ten of the
    slowest ways back (a repair, a pull from the pool, a warm standby's
    selection) and an hour."""
    c = sc.cluster
    policy = repair_policy(sc)
    back_s = (0.0 if policy is None else policy.mean_repair_s()) + c.preempt_s + c.select_s
    return (1000.0 * sc.workload.steps * sc.ideal_step_s
            + 100.0 * (sc.strategy.restart_s + sc.detector.silence_s)
            + 10.0 * (back_s + c.launch_s) + 3600.0)


def straggler_policy(sc: Scenario) -> Optional[StragglerPolicy]:
    """``strategy.stragglers: evict``'s policy, or None (keep them)."""
    s, w = sc.strategy, sc.workload
    if s.stragglers != "evict":
        return None
    return StragglerPolicy(factor=s.straggler_factor, steps=s.straggler_steps,
                           holdout_s=s.straggler_holdout_s, global_batch=w.global_batch,
                           micro_batch=w.micro_batch, full_workers=sc.cluster.workers,
                           batch=str(getattr(s.batch, "value", s.batch)))


def data_spec(sc: Scenario) -> DataSpec:
    """What the checkers need to rebuild the data order of a run."""
    w = sc.workload
    return DataSpec(seed=sc.seed, dataset_samples=w.dataset_samples,
                    global_batch=w.global_batch, micro_batch=w.micro_batch,
                    batch_policy=str(getattr(sc.strategy.batch, "value", sc.strategy.batch)),
                    steps_target=w.steps)


def failure_model(sc: Scenario) -> Optional[FailureModel]:
    """Random hardware failures, or None when ``failures.worker_mtbf_s`` is unset."""
    f = sc.failures
    if f.worker_mtbf_s is None:
        return None
    return FailureModel(seed=sc.seed, distribution=f.distribution, mean_s=f.worker_mtbf_s,
                        weibull_shape=f.weibull_shape, lognormal_sigma=f.lognormal_sigma,
                        bad_fraction=f.bad_fraction, bad_multiplier=f.bad_multiplier)


def slowdown_model(sc: Scenario) -> Optional[SlowdownModel]:
    """Random slowdowns, or None when ``failures.slow_mtbf_s`` is unset."""
    f = sc.failures
    if f.slow_mtbf_s is None:
        return None
    factor, spread = ((f.slow_factor, 0.0) if isinstance(f.slow_factor, float)
                      else (f.slow_factor.median, f.slow_factor.spread))
    return SlowdownModel(seed=sc.seed, mtbf_s=f.slow_mtbf_s, factor=factor, for_s=f.slow_for_s,
                         spread=spread)


def repair_policy(sc: Scenario) -> Optional[RepairPolicy]:
    """How failed nodes come back (``cluster.repair_s`` or ``cluster.repair``), or None: never."""
    c = sc.cluster
    if c.repair_s is not None:
        return RepairPolicy(fixed_s=c.repair_s)
    r = c.repair
    if r is None:
        return None
    return RepairPolicy(auto_s=r.auto_s, manual_s=r.manual_s, manual_p=r.manual_p,
                        auto_fail_p=r.auto_fail_p, manual_fail_p=r.manual_fail_p,
                        diagnosis_p=r.diagnosis_p, wrong_blame_p=r.wrong_blame_p,
                        reboot_s=r.reboot_s,
                        retire_after=r.retire_after, retire_window_s=r.retire_window_s)


def repair_shop(sc: Scenario, draws: Draws) -> RepairShop:
    """The run's repair shop and cold spare pool, curing through ``draws``."""
    c = sc.cluster
    return RepairShop(draws, repair_policy(sc), up=c.workers + c.spares, want=c.workers,
                      target=c.workers + c.spares, pool=c.spare_pool, preempt_s=c.preempt_s,
                      first_pool_id=sc.pool_first_id, warm=c.warm_standbys, select_s=c.select_s)


def draws(sc: Scenario) -> Draws:
    """A fresh counter of the run's random draws (node lifetimes, slowdowns, random targets)."""
    return Draws(sc.seed, failure_model(sc), slowdown_model(sc))


def scheduled_faults(sc: Scenario) -> tuple[ScheduledFault, ...]:
    """``failures.schedule`` as the core's fault plan reads it, in schedule order."""
    return tuple(_scheduled_fault(i, f) for i, f in enumerate(sc.failures.schedule))


def _scheduled_fault(index: int, f: Fault) -> ScheduledFault:
    return ScheduledFault(index=index, trigger=f.trigger, when=f.when, action=f.action,
                          targets=f.subject, **f.parameters)


def fault_plan(sc: Scenario) -> FaultPlan:
    """The real target's fault plan: the scenario's schedule and its own fresh
    :func:`draws` (node lifetimes, slowdowns, random targets)."""
    return FaultPlan(scheduled_faults(sc), draws(sc))
