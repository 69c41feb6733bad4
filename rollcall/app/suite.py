"""The calibration suite: short real runs that measure each cost on its own,
fitted as functions of a scenario's size, so one calibration predicts
scenarios it never ran.

Why: a calibration taken from one real run (:mod:`rollcall.app.calibrate`) holds
that run's numbers (its step time at its member counts, the costs of the
faults it happened to have) and predicts only runs like it. The suite runs
four micro-scenarios (:data:`MICRO`) on the real target, two strategies at
two model sizes, whose faults exercise every cost: a kill (the exit notice,
the roll call, a restart and the checkpoint read), a pause (detection by
timeout), joins (the state copy), a spare pulled in (a fresh process's
start-up) and member counts from 2 to 4. Each run is
measured by :func:`rollcall.app.calibrate.measure`; :func:`fit` then turns the
measurements into a model:

- step time: least squares with non-negative coefficients on the relative
  error (each generation weighted by the square root of the steps its mean
  is over, divided by that mean) over every generation's mean step of
  ``c0 + c1 m + c2 m P + c3 S P / min(m, cpus) + c4 S / min(m, cpus)``
  (``m`` members, ``S`` micro-batches per step, ``P`` millions of
  parameters): a fixed part, a per-member part (each process's exchange and
  overhead, growing with the model) and the compute, shared by the cores;
- checkpoint write and read, and the state copy: ``base + per_byte x
  bytes`` over the two model sizes;
- exit notice, roll call, restart, first-step warm-up and a new process's
  start-up (``cluster.launch_s``): medians;
- the keeper's failover (where etcd is installed, a fifth run kills the
  active keeper twice): the time beyond the lease etcd granted, added to a
  scenario's own lease (``keeper.failover_s``, etcd-backed keepers only),
  and the step's extra when each commit goes through the launcher's relay
  to a keeper process (its steps against the fit: median residual), added
  to an etcd-backed scenario's steps.

:func:`overrides` evaluates the model at a scenario's own size: the sim keys
of its costs (``workload.step_s_by_workers`` for every member count it can
have: the suite's own measured step where a micro-run had the scenario's
micro-batches and model size at that count, else the fit;
``strategy.checkpoint_*_s``, ``strategy.restart_s``,
``network.bandwidth_Bps``, ...). A calibration models costs only: the
detector's timeout and heartbeat, the faults and the sizes stay the
scenario's (detection by timeout is measured and reported, not applied).

:func:`read_any` and :func:`calibrated` take a calibration file of either
kind, this suite's model or one run's (:mod:`rollcall.app.calibrate`): they
live here, above :mod:`rollcall.app.calibrate`, which imports nothing of this
module.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import yaml

from rollcall.app import targets
from rollcall.scenario import Scenario, parse_scenario

__all__ = ["ETCD_MICRO", "KIND", "MICRO", "calibrated", "fit", "fit_step", "is_suite", "overrides",
           "read", "read_any", "run", "runnable", "write"]

KIND = "rollcall-calibration-suite"

_BASE = """
target: real
detector: {heartbeat_s: 0.1, timeout_s: 1.0}
"""

# name -> scenario body; each is small enough for a 2-core machine
MICRO: dict[str, str] = {
    "cal-elastic-small": """
cluster: {workers: 4}
workload: {steps: 300, global_batch: 32, micro_batch: 4, dataset_samples: 512, model_params: 20000}
rendezvous: {min_workers: 2, max_workers: 5, last_call_s: 0.2, join_timeout_s: 10.0}
strategy: {kind: elastic, batch: constant, checkpoint_interval_steps: 50}
failures: {schedule: [{at_step: 40, kill: 1}, {at_step: 80, pause: 2, for_s: 2.0},
                      {at_step: 160, join: 1}]}
""",
    "cal-elastic-big": """
cluster: {workers: 4, spare_pool: 1, preempt_s: 0.1}
workload: {steps: 100, global_batch: 96, micro_batch: 4, dataset_samples: 960, model_params: 2000000}
rendezvous: {min_workers: 2, max_workers: 4, last_call_s: 0.2, join_timeout_s: 10.0}
strategy: {kind: elastic, batch: constant, checkpoint_interval_steps: 20}
failures: {schedule: [{at_step: 10, kill: 3}]}
""",
    **{f"cal-cr-{size}": f"""
cluster: {{workers: 3}}
workload: {{steps: 60, global_batch: 24, micro_batch: 4, dataset_samples: 480,
           model_params: {params}}}
rendezvous: {{min_workers: 2, last_call_s: 0.2, join_timeout_s: 120.0}}
strategy: {{kind: checkpoint-restart, checkpoint_interval_steps: 10, batch: constant}}
failures: {{schedule: [{{at_step: 25, kill: 1}}]}}
""" for size, params in (("small", 20000), ("big", 2000000))},
}

# the keeper's failover, where etcd is installed (the lease's length is the
# scenario's; what the suite measures is the time beyond it)
ETCD_MICRO: dict[str, str] = {
    "cal-keeper-failover": """
cluster: {workers: 3}
workload: {steps: 60, global_batch: 24, micro_batch: 4, dataset_samples: 480, model_params: 20000}
rendezvous: {min_workers: 2, last_call_s: 0.2, join_timeout_s: 20.0}
strategy: {kind: elastic, batch: constant, checkpoint_interval_steps: 10}
keeper: {store: etcd, standbys: 1, lease_ttl_s: 1.0}
failures: {schedule: [{at_step: 15, kill_keeper: active}, {at_step: 35, kill_keeper: active}]}
""",
}

STEP_FEATURES = ("1", "m", "m*P", "S*P/min(m,cpus)", "S/min(m,cpus)")


def runnable() -> dict[str, str]:
    """The micro-scenarios this machine can run: :data:`MICRO`, and
    :data:`ETCD_MICRO` where the etcd server is installed."""
    try:
        binary = targets.etcd_binary()
    except ModuleNotFoundError:  # the real target without a package it needs
        return dict(MICRO)
    return {**MICRO, **ETCD_MICRO} if binary else dict(MICRO)


def micro_scenario(name: str) -> Scenario:
    """One micro-scenario of the suite, as a real scenario."""
    return parse_scenario(f"name: {name}\n{_BASE}{({**MICRO, **ETCD_MICRO})[name]}")


def run(out_dir: str | Path, say: Callable[[str], None] = lambda _: None) -> list[Path]:
    """Run every micro-scenario on the real target under ``out_dir``; their run directories."""
    from rollcall.results import prepare_out_dir

    dirs = []
    names = runnable()
    if len(names) < len(MICRO) + len(ETCD_MICRO):
        say("no etcd server here: the keeper's failover is not measured")
    for name in names:
        sc = micro_scenario(name)
        d = Path(out_dir) / name
        prepare_out_dir(d, sc)
        summary = targets.driver(sc.target).run(sc, d)  # as a sweep point
        if not (summary.get("completed") and summary.get("valid")):
            raise RuntimeError(f"calibration run {name} did not complete validly "
                               f"({summary.get('end_reason')}): see {d}")
        say(f"{name}: {summary['elapsed_s']:.2f} s")
        dirs.append(d)
    return dirs


def _features(m: int, shards: int, params_m: float, cpus: int) -> list[float]:
    share = min(m, cpus)
    return [1.0, float(m), m * params_m, shards * params_m / share, shards / share]


def _lstsq(rows: Sequence[Sequence[float]], ys: Sequence[float]) -> list[float]:
    import numpy as np

    coef, *_ = np.linalg.lstsq(np.array(rows, dtype=float), np.array(ys, dtype=float), rcond=None)
    return [float(c) for c in coef]


def _nnls(rows: Sequence[Sequence[float]], ys: Sequence[float]) -> list[float]:
    """Least squares with every coefficient at least 0: each feature is a
    cost (a part of a step cannot make it faster), and noisy points would
    otherwise buy a fit with a negative term that predicts nonsense away
    from them. Exact: the best of the unconstrained fits over every subset
    of the features whose coefficients all come out non-negative."""
    import itertools

    import numpy as np

    a, y = np.array(rows, dtype=float), np.array(ys, dtype=float)
    k = a.shape[1]
    best, best_err = [0.0] * k, float(y @ y)
    for size in range(1, k + 1):
        for cols in itertools.combinations(range(k), size):
            sub, *_ = np.linalg.lstsq(a[:, cols], y, rcond=None)
            if (sub < 0).any():
                continue
            err = float(((a[:, cols] @ sub - y) ** 2).sum())
            if err < best_err - 1e-18:
                best_err, best = err, [0.0] * k
                for c, v in zip(cols, sub):
                    best[c] = float(v)
    return best


def _linear(points: Sequence[tuple[float, float]]) -> dict[str, Any] | None:
    """``seconds = base_s + per_byte_s x bytes`` over (bytes, seconds) points
    (both clamped at 0); one size only: a constant."""
    if not points:
        return None
    xs = {x for x, _ in points}
    if len(xs) < 2:
        return {"base_s": statistics.median(y for _, y in points), "per_byte_s": 0.0,
                "points": [list(p) for p in points]}
    base, slope = _lstsq([[1.0, x] for x, _ in points], [y for _, y in points])
    if slope < 0:
        base, slope = statistics.median(y for _, y in points), 0.0
    return {"base_s": max(0.0, base), "per_byte_s": slope, "points": [list(p) for p in points]}


def _median_of(ms: Sequence[Mapping[str, Any]], key: str) -> float | None:
    xs = [float(m[key]) for m in ms if m.get(key) is not None]
    return statistics.median(xs) if xs else None


def fit(run_dirs: Sequence[str | Path], cpus: int | None = None) -> dict[str, Any]:
    """The suite's model from its real runs (see the module docstring)."""
    from rollcall.app import calibrate

    cpus = cpus or os.cpu_count() or 1
    measured, step_points = [], []
    relayed: list[tuple[int, int, float, float, int]] = []  # an etcd-backed keeper's steps
    write, read, copy, failover = [], [], [], []
    timeout: list[tuple[float, float]] = []  # (measured, the sim's expectation)
    for d in map(Path, run_dirs):
        m = calibrate.measure(d)
        sc = yaml.safe_load((d / "scenario.yaml").read_text(encoding="utf-8"))
        wl = sc["workload"]
        nbytes = wl["model_params"] * wl["bytes_per_param"]
        points = _step_points(d, m, wl)
        if (sc.get("keeper") or {}).get("store") == "etcd":
            # the keeper's run: its failover, and its steps, which carry each
            # commit through the launcher's relay to a keeper process (fitted
            # below as the extra over the machine's step)
            if m.get("keeper_failover_s") is not None:  # beyond the lease etcd granted
                failover.append(float(m["keeper_failover_s"])
                                - _granted_s(sc["keeper"]["lease_ttl_s"]))
            relayed += points
            continue
        step_points += points
        if m.get("checkpoint_write_s"):  # 0.0: the run wrote none
            write.append((nbytes, float(m["checkpoint_write_s"])))
        if m.get("checkpoint_read_s") is not None:
            read.append((nbytes, float(m["checkpoint_read_s"])))
        if m.get("state_transfer_s") is not None:  # striped: the busiest link's load
            copy.append((nbytes * float(m.get("state_transfer_states") or 1.0),
                         float(m["state_transfer_s"])))
        if m.get("pause_detection_s") is not None:
            det = sc["detector"]
            timeout.append((float(m["pause_detection_s"]),
                            det["timeout_s"] - det["heartbeat_s"] / 2))
        measured.append(m)
    assert step_points, "no step measured"
    coef = fit_step(step_points, cpus)
    relay = [y - _step(coef, m, s, p, cpus) for m, s, p, y, _ in relayed]

    return {
        "kind": KIND, "version": 1,
        "machine": {"cpus": cpus, "python": platform.python_version(),
                    "platform": platform.platform(terse=True)},
        "runs": [str(d) for d in run_dirs],
        "step": {"features": list(STEP_FEATURES), "coef": coef, "cpus": cpus,
                 # members, micro-batches, 1e6 params, steps, measured s, fitted s
                 "points": [[m, s, p, n, y, _step(coef, m, s, p, cpus)]
                            for m, s, p, y, n in step_points]},
        "checkpoint_write": _linear(write),
        "checkpoint_read": _linear(read),
        "state_copy": _linear(copy),
        "exit_notice_s": _median_of(measured, "kill_detection_s"),
        "roll_call_s": _median_of(measured, "roll_call_s"),
        "restart_s": _median_of(measured, "restart_s"),
        "warmup_s": _median_of(measured, "warmup_s"),
        "launch_s": _median_of(measured, "launch_s"),
        # a keeper's death -> its successor's roll call, beyond the lease
        "keeper_failover_beyond_lease_s": statistics.median(failover) if failover else None,
        # a step's extra with an etcd-backed keeper (each commit through the relay)
        "keeper_relay_step_s": max(0.0, statistics.median(relay)) if relay else None,
        # reported, not applied: the timeout is the scenario's own setting
        "timeout_detection": None if not timeout else {
            "measured_s": statistics.median(t for t, _ in timeout),
            "expected_s": statistics.median(e for _, e in timeout)},
    }


def _step_points(run_dir: Path, measured: dict[str, Any],
                 workload: dict[str, Any]) -> list[tuple[int, int, float, float, int]]:
    """One run's (members, micro-batches, 1e6 params, mean step s, steps)
    point per generation. A generation timed at 0 s (its commits stamped at
    one instant: a hand-made history) has no step to fit or to take as measured."""
    from rollcall.core.types import from_ranges
    from rollcall.results import read_history

    shards = workload["global_batch"] // workload["micro_batch"]
    params_m = workload["model_params"] / 1e6
    sizes = {int(r["gen"]): len(from_ranges(r["members"])) for r in read_history(run_dir)
             if r.get("f") == "generation"}
    counts = measured.get("steps_by_generation") or {}
    return [(sizes[int(g)], shards, params_m, float(step_s), int(counts.get(g, 1)))
            for g, step_s in measured["step_s_by_generation"].items() if float(step_s) > 0]


def fit_step(points: Sequence[tuple[int, int, float, float, int]], cpus: int) -> list[float]:
    """The step model's coefficients (:data:`STEP_FEATURES`) from
    (members, micro-batches, 1e6 params, mean step s, steps) points.

    The goal is a relative error (a prediction within 15%), so each row is
    divided by its measured step: fitted on absolute seconds, the slow steps
    of the large model outweighed the small ones tenfold, and the fit missed
    those by up to 53% (22% so, on the same points). And each generation's
    mean step weighs as the steps it is over (a mean of few steps is noisy:
    its variance is ~1/n, so its row gets sqrt(n)). A step timed at 0 has
    no relative error to fit: it is left out (:func:`fit` gathers none).
    """
    points = [pt for pt in points if pt[3] > 0 and pt[4] > 0]
    if not points:
        return [0.0] * len(STEP_FEATURES)
    weights = [math.sqrt(n) / y for *_, y, n in points]
    return _nnls([[w * x for x in _features(m, s, p, cpus)]
                  for (m, s, p, _, _), w in zip(points, weights)],
                 [w * y for (*_, y, _), w in zip(points, weights)])


def _granted_s(lease_ttl_s: float) -> float:
    """The lease etcd grants for a TTL asked: whole seconds, rounded up."""
    return float(max(1, math.ceil(lease_ttl_s)))


def _step(coef: Sequence[float], m: int, shards: int, params_m: float, cpus: int) -> float:
    return sum(c * x for c, x in zip(coef, _features(m, shards, params_m, cpus)))


def _at(line: Mapping[str, Any] | None, nbytes: float) -> float | None:
    return None if line is None else line["base_s"] + line["per_byte_s"] * nbytes


def _measured_steps(points: Sequence[Sequence[float]], shards: int,
                    params_m: float) -> dict[int, float]:
    """Members -> the suite's own measured step (the mean over its
    generations, weighted by their steps) where a micro-run had this
    scenario's shape (micro-batches and model size) at that member count:
    a measurement beats the fit; the fit fills the other counts."""
    sums: dict[int, list[float]] = {}
    for point in points:
        if len(point) == 6:
            m, s, p, n, y, _ = point
        else:  # a version-1 file: no step counts
            (m, s, p, y, _), n = point, 1
        if s == shards and math.isclose(p, params_m, rel_tol=1e-9):
            acc = sums.setdefault(int(m), [0.0, 0.0])
            acc[0] += n * y
            acc[1] += n
    return {m: total / n for m, (total, n) in sums.items() if n > 0}


def overrides(model: Mapping[str, Any], sc: Scenario) -> dict[str, Any]:
    """The sim keys of ``sc``'s costs on the calibrated machine."""
    assert model.get("kind") == KIND, model.get("kind")
    wl = sc.workload
    shards, params_m = wl.global_batch // wl.micro_batch, wl.model_params / 1e6
    nbytes = wl.model_params * wl.bytes_per_param
    step, floor = model["step"], 1e-6
    most = max(sc.rendezvous.max_workers, sc.cluster.workers)
    relay = model.get("keeper_relay_step_s") if sc.keeper.store == "etcd" else None
    seen = _measured_steps(step["points"], shards, params_m)
    table = {m: round(max(floor, seen.get(m, _step(step["coef"], m, shards, params_m,
                                                   step["cpus"])) + (relay or 0.0)), 9)
             for m in range(1, most + 1)}
    full = table[sc.cluster.workers]
    out: dict[str, Any] = {
        "workload.step_s_by_workers": table,
        "workload.micro_batch_s": round(full / math.ceil(shards / sc.cluster.workers), 9),
        "workload.allreduce_s": 0.0,
    }
    for key, value in (("workload.warmup_s", model.get("warmup_s")),
                       ("detector.exit_notice_s", model.get("exit_notice_s")),
                       ("strategy.restart_s", model.get("restart_s")),
                       ("strategy.checkpoint_write_s", _at(model.get("checkpoint_write"), nbytes)),
                       ("strategy.checkpoint_read_s", _at(model.get("checkpoint_read"), nbytes))):
        if value is not None:
            out[key] = round(max(0.0, value), 9)
    if model.get("roll_call_s") is not None:
        out["network.latency_s"] = round(max(model["roll_call_s"] / 2.0, floor), 9)
    if model.get("launch_s") is not None:  # to the join's arrival: less its one way
        one_way = out.get("network.latency_s", 0.0)
        out["cluster.launch_s"] = round(max(0.0, model["launch_s"] - one_way), 9)
    copy = model.get("state_copy")
    if copy is not None and copy["per_byte_s"] > 0:
        out["network.bandwidth_Bps"] = float(f"{1.0 / copy['per_byte_s']:.6g}")
    beyond = model.get("keeper_failover_beyond_lease_s")
    if beyond is not None and sc.keeper.store == "etcd":  # the scenario's lease, plus the machine's
        out["keeper.failover_s"] = round(_granted_s(sc.keeper.lease_ttl_s) + max(0.0, beyond), 9)
    return out


def is_suite(doc: Mapping[str, Any]) -> bool:
    return isinstance(doc, Mapping) and doc.get("kind") == KIND


def write(model: Mapping[str, Any], path: str | Path) -> Path:
    path = Path(path)
    path.write_text(yaml.safe_dump(dict(model), sort_keys=False), encoding="utf-8")
    return path


def read(path: str | Path) -> dict[str, Any]:
    """A suite calibration file; ValueError (one line) when it is not one."""
    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ValueError(f"not YAML: {str(exc).splitlines()[0]}") from None
    if not is_suite(doc):
        raise ValueError(f"not a calibration suite file (kind: {KIND}); "
                         f"make one with: rollcall calibrate --suite --out FILE")
    if not isinstance(doc.get("step"), Mapping) or len(doc["step"].get("coef", [])) != \
            len(STEP_FEATURES):
        raise ValueError("calibration file: step model missing or malformed")
    return dict(doc)


def read_any(path: str | Path) -> dict[str, Any]:
    """A calibration file of either kind: a suite's model (this module's) or one
    run's ``calibration.yaml`` (:mod:`rollcall.app.calibrate`). ValueError (one line) otherwise."""
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read it ({exc.__class__.__name__})") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"not YAML: {str(exc).splitlines()[0]}") from None
    if is_suite(doc):
        return read(path)
    if isinstance(doc, dict) and isinstance(doc.get("measured"), dict):
        return dict(doc)
    raise ValueError("not a calibration file (rollcall calibrate --suite --out FILE, or "
                     "rollcall calibrate RUN_DIR)")


def calibrated(scenario: Scenario, doc: Mapping[str, Any]) -> Scenario:
    """``scenario`` on the sim with the costs of a calibration file (:func:`read_any`):
    a suite's model evaluated at the scenario's size, or one run's costs as measured."""
    from rollcall.app import calibrate

    keys = overrides(doc, scenario) if is_suite(doc) else calibrate.overrides(doc["measured"])
    return calibrate.with_keys(scenario, keys, "sim")
