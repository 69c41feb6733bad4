"""What a scenario will do, before running it: ``rollcall validate --plan``.

Read from the resolved scenario alone (no target runs): the worker id
ranges, the scripted fault timeline, the failure-free time of the job
(every step at ``Scenario.ideal_step_s`` plus its checkpoint writes) and
the expected number of random failures over that time. The expectation is
a floor: failures lengthen the run, and a longer run sees more failures.

And a wall-time estimate, with its basis. The real target runs in real
time: the failure-free time plus, per expected failure, its detection and
recovery. The sim's wall time is a model of its work: a fixed start, a cost
per checkpoint segment (the sim runs a failure-free segment ahead in one
go), per per-sample ledger record (small runs only) and per failure or
scripted fault (detection, a membership round, recovery). No cost is a
constant written here: :func:`calibrate` times tiny built-in sim runs on
this machine when ``--plan`` asks (a few tenths of a second), so the
estimate follows the machine. It is an estimate: load on a shared machine
and the failure pattern move it by a few times (``benchmarks/plan_estimate.py``
compares it with measured runs; ``benchmarks/sim_scale.py`` times the big ones).
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from rollcall.app import targets
from rollcall.scenario import Scenario

__all__ = ["UnitCosts", "calibrate", "expected_run", "failure_rates", "format_plan", "plan",
           "real_wall_estimate",
           "sim_wall_estimate", "sim_work", "wall_estimate"]

_DAY_S = 86_400.0


def plan(scenario: Scenario) -> dict[str, Any]:
    """The plan as plain data (what ``--plan`` prints)."""
    sc = scenario
    w, spares = sc.cluster.workers, sc.cluster.spares
    ids: list[dict[str, Any]] = [{"ids": [0, w - 1], "what": "initial workers"}]
    if spares:
        ids.append({"ids": [w, w + spares - 1], "what": "hot spares"})
    nxt = w + spares
    timeline = []
    for i, f in enumerate(sorted(sc.failures.schedule, key=lambda f: (f.trigger, f.when))):
        entry: dict[str, Any] = {"trigger": f.trigger, "when": f.when, "action": f.action}
        parameters = f.parameters
        if f.newcomers:
            entry["workers"] = [nxt, nxt + f.newcomers - 1]
            ids.append({"ids": [nxt, nxt + f.newcomers - 1],
                        "what": f"newcomers ({f.trigger} {f.when})"})
            nxt += f.newcomers
        elif f.rack is not None:
            entry["rack"] = f.rack
        elif f.host is not None:  # lose_host
            entry["host"] = f.host
            if f.host != "random":
                entry["workers"] = list(sc.host_workers(int(f.host)))
        elif f.hosts:  # partition, isolate_keeper
            entry["hosts"] = list(f.hosts)
            entry["workers"] = [w for h in f.hosts for w in sc.host_workers(h)]
            entry["for_s"] = parameters["for_s"]
        elif f.link is not None:  # delay, loss
            entry["host"] = f.link
            if f.link != "random":
                entry["workers"] = list(sc.host_workers(int(f.link)))
            entry["for_s"] = parameters["for_s"]
            entry.update({key: value for key, value in parameters.items() if key != "for_s"})
        else:
            t = f.targets
            entry["workers"] = t if t == "random" else list(t)
            if f.action == "pause":
                entry["for_s"] = parameters["for_s"]
        timeline.append(entry)
    if sc.cluster.spare_pool:
        ids.append({"ids": [sc.pool_first_id, sc.worker_id_limit - 1],
                    "what": f"cold spare pool (pulled one per {sc.cluster.preempt_s:g} s)"})
    st = sc.strategy
    steps = sc.workload.steps
    checkpoints = max(0, (steps - 1) // st.checkpoint_interval_steps)  # none after the last step
    free_s = steps * sc.ideal_step_s + checkpoints * st.checkpoint_write_s
    mtbf = sc.failures.worker_mtbf_s
    expected = None if mtbf is None else w * free_s / mtbf
    return {"scenario": sc.name, "target": sc.target, "strategy": st.kind, "seed": sc.seed,
            "ids": ids, "worker_id_limit": sc.worker_id_limit, "timeline": timeline,
            "steps": steps, "ideal_step_s": sc.ideal_step_s, "checkpoints": checkpoints,
            "failure_free_s": free_s, "expected_random_failures": expected,
            "wall_estimate": None}


def format_plan(p: dict[str, Any]) -> str:
    """The plan as the lines ``--plan`` prints."""
    lines = [f"plan: {p['scenario']} ({p['target']}, {p['strategy']}, seed {p['seed']})", "ids:"]
    lines += [f"  {a}..{b}  {d['what']}" for d in p["ids"] for a, b in [d["ids"]]]
    lines.append("faults:" if p["timeline"] else "faults: none scripted")
    for f in p["timeline"]:
        target = f.get("workers", f.get("rack"))
        extra = f"  for {f['for_s']:g} s" if "for_s" in f else ""
        lines.append(f"  {f['trigger']} {f['when']:g}: {f['action']} {target}{extra}")
    free = p["failure_free_s"]
    lines.append(f"failure-free time: {free:.6g} s ({free / _DAY_S:.3g} days): {p['steps']} steps "
                 f"at {p['ideal_step_s']:.6g} s and {p['checkpoints']} checkpoint writes")
    exp = p["expected_random_failures"]
    lines.append("expected random failures: none (no failures.worker_mtbf_s)" if exp is None else
                 f"expected random failures: {exp:.3g} over the failure-free time (a floor)")
    est = p.get("wall_estimate")
    lines.append("wall time: not estimated" if est is None else
                 f"wall time ({p['target']}, an estimate): ~{_duration(est['wall_s'])}: "
                 f"{est['basis']}")
    return "\n".join(lines)


def _many(n: float, noun: str) -> str:
    """``442 failures``, ``1 failure``, ``0.37 failures``, ``1,570 failures``."""
    text = f"{n:,.0f}" if n >= 100 or float(n).is_integer() else f"{n:.3g}"
    return f"{text} {noun}" + ("" if text == "1" else "s")


def _duration(seconds: float) -> str:
    """Seconds in the unit a person reads (ms, s, min, h, days)."""
    for unit, size in (("days", _DAY_S), ("h", 3600.0), ("min", 60.0), ("s", 1.0)):
        if seconds >= 2 * size or unit == "s" and seconds >= 1.0:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds * 1e3:.3g} ms"


# --------------------------------------------------------------------------
# Analytic failure rates


def failure_rates(sc: Scenario) -> dict[str, float]:
    """Per second, from the scenario's random failures alone (scripted faults
    are not rates; every value 0 without ``failures.worker_mtbf_s``):

    - ``node``: one node's failure rate, lemon nodes averaged in
      (``bad_fraction`` of them fail ``bad_multiplier`` times as often);
    - ``job``: a failure of any of the job's workers, what sends
      checkpoint-restart back to its checkpoint;
    - ``shard_loss``: (sharded state) every holder of some shard lost within
      one recovery window (detection, last call, the shard's copy), a first-
      order estimate ``shards x r! x node^r x window^(r-1)`` for ``r``
      replicas, at most ``job``;
    - ``below_min``: more nodes down at once than the job can spare
      (``workers + spares - min_workers``): with repairs, the rate at which
      the down count (Poisson, mean ``nodes x node x repair``, M/G/inf)
      reaches that many; without, the chance that that many fail within the
      job's failure-free time, spread over it;
    - ``rollback``: ``shard_loss + below_min``, what sends elastic back to
      its checkpoint (a keeper is lost only with an etcd record and a
      standby, which keeps the job's state).
    """
    f, c = sc.failures, sc.cluster
    if f.worker_mtbf_s is None:
        return dict.fromkeys(("node", "job", "shard_loss", "below_min", "rollback"), 0.0)
    node = ((1.0 - f.bad_fraction) + f.bad_fraction * f.bad_multiplier) / f.worker_mtbf_s
    job = c.workers * node
    shard_loss = min(job, _shard_loss_rate(sc, node)) if sc.state.sharding == "sharded" else 0.0
    below_min = _below_min_rate(sc, node)
    return {"node": node, "job": job, "shard_loss": shard_loss, "below_min": below_min,
            "rollback": shard_loss + below_min}


def _shard_loss_rate(sc: Scenario, node: float) -> float:
    replicas = min(sc.state.replicas, sc.cluster.workers)
    shard_s = sc.workload.model_params * sc.workload.bytes_per_param / sc.state_shards
    window_s = (sc.detector.silence_s + sc.rendezvous.last_call_s
                + shard_s / sc.network.bandwidth_Bps + sc.network.latency_s)
    return (sc.state_shards * math.factorial(replicas) * node ** replicas
            * window_s ** (replicas - 1))


def _below_min_rate(sc: Scenario, node: float) -> float:
    from rollcall.config import repair_policy

    nodes = sc.cluster.workers + sc.cluster.spares
    spare = nodes - sc.rendezvous.min_workers  # down at once and still running
    policy = repair_policy(sc)
    if policy is not None:
        down_mean = nodes * node * policy.mean_repair_s()
        return (nodes - spare) * node * _poisson_pmf(spare, down_mean)
    free_s = sc.workload.steps * sc.ideal_step_s
    return _poisson_tail(spare + 1, nodes * node * free_s) / free_s


def _poisson_pmf(k: int, mean: float) -> float:
    if mean <= 0.0:
        return 1.0 if k == 0 else 0.0
    return math.exp(k * math.log(mean) - mean - math.lgamma(k + 1))


def _poisson_tail(k: int, mean: float) -> float:
    """P(X >= k) for X ~ Poisson(mean)."""
    return max(0.0, 1.0 - math.fsum(_poisson_pmf(i, mean) for i in range(k)))


# --------------------------------------------------------------------------
# Wall time


def _faults(sc: Scenario) -> int:
    """Scripted faults that can fire: each costs a detection or a round (a join too)."""
    return sum(1 for f in sc.failures.schedule
               if f.at_step is None or f.at_step < sc.workload.steps)


def _per_failure(sc: Scenario) -> tuple[float, str]:
    """Seconds one failure costs the job, and how: detection (the detector's
    silence at the nominal cadence: ``detector.timeout_s`` for a timeout),
    then for checkpoint-restart the restart, the checkpoint read and, on
    average, half an interval of lost steps; for elastic the last call and
    the state copy to a newcomer."""
    st, wl, det = sc.strategy, sc.workload, sc.detector
    if st.kind == "checkpoint-restart":
        lost_s = st.checkpoint_interval_steps * sc.ideal_step_s / 2
        return (det.silence_s + st.restart_s + st.checkpoint_read_s + lost_s,
                f"detect {det.silence_s:.3g} s + restart {st.restart_s:g} s + read "
                f"{st.checkpoint_read_s:g} s + half an interval {lost_s:.3g} s")
    copy_s = wl.model_params * wl.bytes_per_param / sc.network.bandwidth_Bps
    return (det.silence_s + sc.rendezvous.last_call_s + copy_s,
            f"detect {det.silence_s:.3g} s + last call {sc.rendezvous.last_call_s:g} s "
            f"+ state copy {copy_s:.3g} s")


def expected_run(sc: Scenario, p: dict[str, Any]) -> dict[str, Any]:
    """The job's expected time and failures, failures lengthening it included.

    Every node alive at the start can fail (workers and spares, as the sim
    draws them), at ``(workers + spares) / worker_mtbf_s`` per second of
    the run; each failure adds its :func:`_per_failure` time, during which
    more can come. So the run lasts ``T = free + rate x T x per_s``: ``T =
    free / (1 - rate x per_s)``. When ``rate x per_s >= 1`` failures come
    faster than the job recovers (it may never finish): the failure-free
    floor is used and ``saturated`` says so. Scripted faults add their
    count and their time.
    """
    per_s, how = _per_failure(sc)
    free_s, faults = p["failure_free_s"], _faults(sc)
    mtbf = sc.failures.worker_mtbf_s
    rate = 0.0 if mtbf is None else (sc.cluster.workers + sc.cluster.spares) / mtbf
    load = rate * per_s
    saturated = load >= 1.0
    random_s = free_s if saturated else free_s / (1.0 - load)
    failures = rate * random_s + faults
    return {"elapsed_s": random_s + faults * per_s, "failures": failures, "per_failure_s": per_s,
            "how": how, "saturated": saturated}


def real_wall_estimate(sc: Scenario, p: dict[str, Any]) -> dict[str, Any]:
    """The real target's wall time: it runs in real time, so the job's own
    (:func:`expected_run`) plus the warm-up of its first step."""
    run = expected_run(sc, p)
    wall_s = sc.workload.warmup_s + run["elapsed_s"]
    basis = (f"failure-free {_duration(p['failure_free_s'])} + warm-up {sc.workload.warmup_s:g} s"
             f" + {_many(run['failures'], 'failure')} x {run['per_failure_s']:.3g} s "
             f"({run['how']}){_SATURATED if run['saturated'] else ''}; plus process start-up; "
             f"assumes steps take ideal_step_s here (rollcall calibrate measures them)")
    return {**run, "wall_s": wall_s, "basis": basis}


_SATURATED = ("; failures come faster than the job recovers, so it may never finish: "
              "its failures counted over the failure-free time only")


@dataclass(frozen=True)
class UnitCosts:
    """Wall seconds per unit of sim work, as :func:`calibrate` timed them."""

    start_s: float    # a run's fixed cost (set-up, the checks' floor, the summary)
    segment_s: float  # one checkpoint interval run ahead (commit and checkpoint records)
    record_s: float   # one per-sample ledger record (a member's step: written and checked)
    failure_s: float  # one failure or scripted fault (detection, a round, recovery)
    basis: str        # how they were measured, said in the plan

    def __post_init__(self) -> None:
        for name in ("start_s", "segment_s", "record_s", "failure_s"):
            value = getattr(self, name)
            assert math.isfinite(value) and value >= 0, (name, value)


def sim_work(sc: Scenario, p: dict[str, Any], ledger_samples: int) -> dict[str, Any]:
    """The units of sim work the scenario asks for (expected values; failures as
    :func:`expected_run` counts them, over the run they lengthen).

    ``ledger_samples``: the driver's ``LEDGER_SAMPLES``, up to which a run
    writes one ledger record per member per step (see ``sim.driver``).
    """
    wl = sc.workload
    per_sample = (wl.steps * wl.global_batch <= ledger_samples
                  and wl.dataset_samples <= ledger_samples)
    run = expected_run(sc, p)
    return {"segments": float(-(-wl.steps // sc.strategy.checkpoint_interval_steps)),
            "records": float(wl.steps * sc.cluster.workers if per_sample else 0),
            "failures": run["failures"], "saturated": run["saturated"]}


def sim_wall_estimate(work: dict[str, Any], costs: UnitCosts) -> dict[str, Any]:
    """The sim's wall time: the fixed start plus each unit of work at its cost."""
    wall_s = (costs.start_s + work["segments"] * costs.segment_s
              + work["records"] * costs.record_s + work["failures"] * costs.failure_s)
    basis = (f"start {_duration(costs.start_s)} + {_many(work['segments'], 'segment')} x "
             f"{costs.segment_s * 1e6:.3g} us + {_many(work['records'], 'ledger record')} x "
             f"{costs.record_s * 1e6:.3g} us + {_many(work['failures'], 'failure')} x "
             f"{costs.failure_s * 1e3:.3g} ms; {costs.basis}; the run only, not Python's start"
             f"{_SATURATED if work.get('saturated') else ''}")
    return {"wall_s": wall_s, **work, "basis": basis}


#: the failure calibration runs at the scenario's worker count, within these
#: bounds: a failure's cost grows slowly with the membership (~0.3 ms at 64
#: workers, ~1 ms at 2,048-12,500 on the 2-core development machine), and
#: beyond ~1,000 the calibration itself would take too long
CALIBRATION_WORKERS = (64, 1024)
#: wall-clock bound of the failure calibration run (the sim's --max-wall-s)
CALIBRATION_WALL_S = 0.2


def _timed(run: Callable[..., dict[str, Any]], raw: dict[str, Any], ledger: bool,
           max_wall_s: float | None = None) -> dict[str, Any]:
    """One tiny sim run into a throw-away directory; its summary (``wall_s``: the run's time)."""
    sc = Scenario.model_validate(raw)
    with tempfile.TemporaryDirectory(prefix="rollcall-plan-") as tmp:
        return run(sc, Path(tmp), ledger=ledger, max_wall_s=max_wall_s)


def _failure_scenario(sc: Scenario) -> dict[str, Any]:
    """About 16-64 random failures over 2,000 steps of 1 s, with the scenario's strategy and state."""
    low, high = CALIBRATION_WORKERS
    w = min(max(sc.cluster.workers, low), high)
    failures = min(64, w // 4)  # the job never shrinks below half its size
    return {"name": "calibrate-failures", "cluster": {"workers": w},
            "workload": {"steps": 2000, "global_batch": w, "micro_batch": 1, "micro_batch_s": 1.0,
                         "allreduce_s": 0.0, "dataset_samples": max(4096, w)},
            "failures": {"worker_mtbf_s": w * 2000.0 / failures},
            "rendezvous": {"min_workers": 1},
            "state": {"sharding": sc.state.sharding, "replicas": min(sc.state.replicas, w)},
            "strategy": {"kind": sc.strategy.kind, "checkpoint_interval_steps": 20,
                         "checkpoint_write_s": 0.5, "checkpoint_read_s": 1.0, "restart_s": 5.0}}


def calibrate(sc: Scenario) -> UnitCosts:
    """Time four tiny sim runs here and now: a start, segments, ledger records, failures.

    Each unit's cost is its run's wall time less what the units timed before
    it explain, per unit done (clamped at 0: a busy machine can make the
    difference negative). Bounded: about 0.1-0.3 s in all.
    """
    run = targets.driver("sim").run
    start = _timed(run, {"name": "calibrate-start", "cluster": {"workers": 2},
                         "workload": {"steps": 1, "global_batch": 2, "micro_batch": 1}}, False)
    start_s = start["wall_s"]
    seg = _timed(run, {"name": "calibrate-segments", "cluster": {"workers": 2},
                       "workload": {"steps": 1000, "global_batch": 2, "micro_batch": 1},
                       "strategy": {"checkpoint_interval_steps": 1}}, False)
    segment_s = max(0.0, seg["wall_s"] - start_s) / max(1, seg["steps_committed"])
    rec = _timed(run, {"name": "calibrate-ledger", "cluster": {"workers": 16},
                       "workload": {"steps": 200, "global_batch": 16, "micro_batch": 1},
                       "strategy": {"checkpoint_interval_steps": 200}}, True)
    records = rec["steps_committed"] * 16
    record_s = max(0.0, rec["wall_s"] - start_s - segment_s) / max(1, records)
    raw = _failure_scenario(sc)
    fail = _timed(run, raw, False, CALIBRATION_WALL_S)
    segments = fail["steps_committed"] // raw["strategy"]["checkpoint_interval_steps"] + 1
    failure_s = max(0.0, fail["wall_s"] - start_s - segments * segment_s) / max(1, fail["failures"])
    took_s = start_s + seg["wall_s"] + rec["wall_s"] + fail["wall_s"]
    basis = (f"unit costs timed just now by 4 tiny sim runs ({took_s:.2g} s; "
             f"{fail['failures']} failures at {raw['cluster']['workers']} workers, {sc.strategy.kind})")
    return UnitCosts(start_s, segment_s, record_s, failure_s, basis)


def wall_estimate(sc: Scenario, p: dict[str, Any]) -> dict[str, Any]:
    """The plan's wall-time estimate for the scenario's target (the sim's calibrates here)."""
    if sc.target == "real":
        return real_wall_estimate(sc, p)
    ledger_samples = targets.ledger_samples("sim")
    return sim_wall_estimate(sim_work(sc, p, ledger_samples), calibrate(sc))
