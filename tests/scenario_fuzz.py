"""Scenario fuzzing for the sim: hypothesis strategies that draw valid
scenarios over the whole schema, and a runner that checks how one run ends.

The scenarios the shipped tests run were written by the people who wrote
the sim; users write others from the README alone. :func:`fuzz_cases` draws
a scenario as a person could write it (every key of every section, the
scale helpers, every fault family with either trigger, faults near the
start and the end of the job), dumps it as YAML and validates it through
the product's own loader (``parse_scenario``, target sim): a draw the
loader refuses is a bug of this generator, raised as :class:`GeneratorBug`.

:func:`run_case` runs one scenario on the sim, bounded by simulated events
(a run spinning at one simulated instant, or past an event budget, is
stopped and reported) and by the sim's own horizon of simulated time; a
generous wall limit only reports a hang. It checks that nothing raised,
that the run completed or ended for one of :data:`ACCEPTED_END_REASONS`,
that the checkers accept the history and a ledger was written, that the
metrics are in range and, for the cases drawn ``twice``, that the same
seed wrote a byte-identical ``history.jsonl``. A failure's scenario goes to
``runs/fuzz-failures/`` (git ignores ``runs/``) for
``rollcall run FILE --target sim`` to replay.

Used by ``tests/test_scenario_fuzz.py`` (fast) and ``benchmarks/fuzz_sim.py``
(thorough, 10^4 scenarios and more).
"""

from __future__ import annotations

import hashlib
import importlib
import math
import pkgutil
import re
import tempfile
import traceback
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Literal, Sequence

import yaml
from hypothesis import strategies as st
from pydantic import BaseModel

from rollcall.core.accounting import TIME_PARTS
from rollcall.core.checkers import check
from rollcall.config import data_spec, horizon_s
from rollcall.results import read_history
from rollcall.scenario import (
    FAULT_MODELS, MAX_EXTRA_JOINS, SCALE_HELPERS, Detector, FaultTrigger, Scenario, ScenarioError,
    parse_scenario,
)
from sim.driver import Simulation
from sim.stepping import POLL_EVENTS

ROOT = Path(__file__).resolve().parent.parent
FAILURES_DIR = ROOT / "runs" / "fuzz-failures"
CORPUS_DIR = ROOT / "tests" / "data" / "fuzz-corpus"

#: How a run that did not complete may end (``re.search`` in its
#: ``end_reason``): the job gave up as its scenario told it to. Any other
#: end ("stuck: no events left", "horizon: ...", a wall or event limit) is
#: a failure.
ACCEPTED_END_REASONS = (
    r"below min_workers=\d+ for join_timeout_s",
    r"max_restarts=\d+ reached",
    r"not expected to finish: ",
)

# The sim polls its ``stop`` hook once every POLL_EVENTS stepped events
# (``sim.stepping.Stepper``); the event bounds count polls.
#: Stepped events at one simulated instant before a run counts as spinning
#: there, and in one run before it counts as running away. Measured over
#: 10^4 drawn runs (``benchmarks/fuzz_sim.py`` prints both): at most about
#: 7,000 at one instant and 300,000 in a run (the sim steps a job's nodes in
#: bulk), so these are far above any run that ends, and low enough that a
#: spinning run of 10^4 nodes (milliseconds an event) is caught in minutes.
SAME_INSTANT_EVENTS = 100_000
TOTAL_EVENTS = 10_000_000
#: Wall seconds after which the sim ends a run "wall limit": only ever a
#: report of a hang, above any run drawn here (the slowest ones go through
#: thousands of keeper lives to the horizon, bounded by
#: :data:`KEEPER_TERMS`), and below the tests' own time limit
#: (pyproject.toml), so that such a run fails as a finding with its
#: scenario saved: a test time limit would be read by hypothesis as a
#: failure to shrink, run after run.
WALL_REPORT_S = 240.0

#: Schema keys and values the generator never draws, each with its reason.
EXCLUDED = {
    "target=real": "the fuzzer runs the sim target; a real scenario does not run on it",
}


class GeneratorBug(AssertionError):
    """The product's loader refused a scenario this module drew."""


class SimulatedHang(Exception):
    """A run stepped too many events at one simulated instant, or in all."""


# --------------------------------------------------------------------------
# Value helpers. Each draws from a few fixed strategies (building strategies
# per draw costs more than the draw), and shrinks to the simple end: an
# optional key to absent, a number to the low end of its range.

_UNIT = st.floats(0.0, 1.0)
_PERCENT = st.integers(0, 99)


def _round(value: float, digits: int = 3) -> float:
    return float(f"{value:.{digits}g}")


def _chance(draw: Callable, percent: int) -> bool:
    """True with about ``percent``% probability; shrinks to False."""
    return draw(_PERCENT) >= 100 - percent


def _int(draw: Callable, lo: int, hi: int) -> int:
    return draw(st.integers(lo, hi))


def _pick(draw: Callable, values: Sequence[Any]) -> Any:
    return values[draw(st.integers(0, len(values) - 1))]


def _log(draw: Callable, lo: float, hi: float) -> float:
    """A float in ``[lo, hi]``, uniform in log, three significant digits."""
    assert 0 < lo <= hi, (lo, hi)
    return min(hi, max(lo, _round(lo * (hi / lo) ** draw(_UNIT))))


def _zero_or_log(draw: Callable, lo: float, hi: float) -> float:
    return 0.0 if _chance(draw, 15) else _log(draw, lo, hi)


def _probability(draw: Callable) -> float:
    return _pick(draw, (0.0, 1.0, 0.5)) if _chance(draw, 30) else _round(draw(_UNIT))


def _big_or_small(draw: Callable, lo: float, usual: float, most: float) -> float:
    """Mostly up to ``usual``, now and then up to the schema's ``most``."""
    return _log(draw, lo, most if _chance(draw, 15) else usual)


@dataclass
class Shape:
    """What later sections must agree with: sizes, times, the keeper."""

    workers: int
    spares: int = 0
    spare_pool: int = 0
    per_host: int | None = None
    rack_size: int | None = None
    steps: int = 200
    step_s: float = 0.0
    job_s: float = 0.0  # the failure-free time of the whole job
    heartbeat_s: float = 0.5
    silence_s: float = 3.0
    restart_s: float = 30.0
    max_workers: int = 0
    etcd: bool = False
    standbys: int = 0
    endpoints: bool = False
    direct_links: bool = False

    @property
    def scale_s(self) -> float:
        """A time the job's faults are sized by: its work plus a few detections."""
        return self.job_s + 5 * self.silence_s + self.restart_s


# --------------------------------------------------------------------------
# Sections. Each returns the keys it drew (the rest keep their defaults).


def _worker_count(draw: Callable) -> int:
    """1 to 10^4 workers: mostly a few, rarely thousands (runs stay fast)."""
    tier = draw(_PERCENT)
    return (_int(draw, 1, 8) if tier < 72 else _int(draw, 9, 64) if tier < 93
            else _int(draw, 65, 1000) if tier < 99 else _int(draw, 1001, 10_000))


def _topology(draw: Callable) -> tuple[dict, Shape]:
    """``cluster``'s sizes: workers (or the ``gpus`` helper), hosts, racks, spares."""
    shape = Shape(workers=_worker_count(draw))
    w = shape.workers
    out: dict[str, Any] = {}
    per_gpu = _int(draw, 1, 8) if _chance(draw, 25) else None
    if per_gpu is not None:
        out["gpus_per_worker"] = per_gpu
    if _chance(draw, 15):
        out["gpus"] = w * (per_gpu or 1)
        if _chance(draw, 30):
            out["workers"] = w  # both spellings, agreeing
    else:
        out["workers"] = w
    if _chance(draw, 40):
        divisors = [d for d in range(1, min(w, 16) + 1) if w % d == 0]
        shape.per_host = out["workers_per_host"] = _pick(draw, divisors)
    if _chance(draw, 35):
        hosts = shape.per_host or 1
        shape.rack_size = out["rack_size"] = hosts * _int(draw, 1, 8 if hosts == 1 else 4)
    if _chance(draw, 35):
        shape.spares = out["spares"] = _int(draw, 0, 3)
    if _chance(draw, 20):
        shape.spare_pool = out["spare_pool"] = _int(draw, 0, 4)
    return out, shape


#: Samples a job trains at most (steps x global batch): the per-sample ledger,
#: written and checked sample by sample, makes a run's cost grow with it.
JOB_SAMPLES = 100_000


def _batch(draw: Callable, shape: Shape, out: dict) -> int:
    """Micro-batch and global batch (or the per-worker helper); the shards per step."""
    w = shape.workers
    micro = _pick(draw, (1, 2, 4, 8)) if _chance(draw, 50) else _int(draw, 1, 64)
    most = max(1, min(4 * w, 256, JOB_SAMPLES // (shape.steps * micro)))
    if most >= w and _chance(draw, 15):
        per = micro * _int(draw, 1, min(4, most // w))
        out["per_worker_batch"] = per
        shards = per // micro * w
    else:
        shards = _int(draw, 1, most)
        out["global_batch"] = micro * shards
    out["micro_batch"] = micro
    batch = micro * shards
    if _chance(draw, 50) or batch > 4096:  # the default, 4096, must hold one batch
        out["dataset_samples"] = (
            batch if _chance(draw, 10)
            else _int(draw, 1_000_001, 2_000_000) if _chance(draw, 5)  # the compact ledger
            else batch * _int(draw, 1, 20) + _int(draw, 0, batch - 1))
    return shards


def _workload(draw: Callable, shape: Shape) -> dict:
    """Steps, batch and the step's cost; sets the job's failure-free time."""
    w = shape.workers
    top = 5 if w > 1000 else 40 if w > 64 else 300 if _chance(draw, 15) else 60
    shape.steps = _int(draw, 1, top)
    out: dict[str, Any] = {"steps": shape.steps}
    shards = _batch(draw, shape, out)
    if _chance(draw, 70):
        out["micro_batch_s"] = _log(draw, 1e-4, 10.0)
    if _chance(draw, 50):
        out["allreduce_s"] = _zero_or_log(draw, 1e-5, 1.0)
    shape.step_s = (math.ceil(shards / w) * out.get("micro_batch_s", 0.02)
                    + out.get("allreduce_s", 0.005))
    if _chance(draw, 15):
        sizes = sorted({_int(draw, max(1, w - 3), w + 2) for _ in range(_int(draw, 1, 3))})
        measured = out["step_s_by_workers"] = {n: _log(draw, 1e-3, 5.0) for n in sizes}
        shape.step_s = measured.get(w, shape.step_s)
    shape.job_s = shape.steps * shape.step_s
    if _chance(draw, 20):
        out["warmup_s"] = _zero_or_log(draw, 1e-3, 10.0)
        shape.job_s += out["warmup_s"]
    if _chance(draw, 25):
        out["model_params"] = 1 if _chance(draw, 10) else _int(draw, 1, 10**10)
    if _chance(draw, 15):
        out["bytes_per_param"] = _log(draw, 0.5, 16.0)
    if _chance(draw, 10):
        out["lr"] = _log(draw, 1e-4, 1.0)
    return out


def _repairs(draw: Callable, shape: Shape) -> dict:
    """A failed machine's way back: never, a fixed time, or the repair pipeline."""
    how = _pick(draw, ("never", "fixed", "pipeline"))
    if how == "never":
        return {}
    if how == "fixed":
        return {"repair_s": _log(draw, 1e-3, 10.0 * shape.scale_s)}
    pipe: dict[str, Any] = {}
    for key in ("auto_s", "manual_s", "reboot_s"):
        if _chance(draw, 60):
            pipe[key] = _log(draw, 1e-3, 10.0 * shape.scale_s)
    for key in ("manual_p", "auto_fail_p", "manual_fail_p", "diagnosis_p", "wrong_blame_p"):
        if _chance(draw, 50):
            pipe[key] = _probability(draw)
    if _chance(draw, 30):
        pipe["retire_after"] = _int(draw, 1, 5)
        if _chance(draw, 50):
            pipe["retire_window_s"] = _log(draw, 0.1, 10.0 * shape.scale_s)
    return {"repair": pipe}


def _service(draw: Callable, shape: Shape) -> dict:
    """``cluster``'s machines in service: repairs, the cold pool, warm
    standbys, start-up, and the real target's device keys."""
    out = _repairs(draw, shape)
    if shape.spare_pool and _chance(draw, 60):
        out["preempt_s"] = _zero_or_log(draw, 1e-3, shape.scale_s)
    if _chance(draw, 20):
        out["launch_s"] = _zero_or_log(draw, 1e-3, 2 * shape.silence_s)
    if _chance(draw, 20):
        out["warm_standbys"] = _int(draw, 0, 3)
        if _chance(draw, 50):
            out["select_s"] = _zero_or_log(draw, 1e-3, shape.scale_s)
    if _chance(draw, 15):
        out["device"], out["backend"] = _pick(draw, (("cpu", "gloo"), ("cuda", "gloo"),
                                                     ("cuda", "nccl")))
    return out


def _detector(draw: Callable, shape: Shape) -> dict:
    """The failure detector; sets the silence it tolerates."""
    out: dict[str, Any] = {}
    if _chance(draw, 40):
        out["kind"] = _pick(draw, ("timeout", "phi"))
    if _chance(draw, 50):
        out["heartbeat_s"] = _log(draw, 0.02, 2.0)
    beat = out.get("heartbeat_s", 0.5)
    if "heartbeat_s" in out or _chance(draw, 40):  # the timeout must exceed the beat
        out["timeout_s"] = max(_round(beat * _log(draw, 1.1, 20.0)), _round(beat * 1.2))
    if _chance(draw, 30):
        out["phi_threshold"] = _log(draw, 0.5, 16.0)
    detector = Detector(**out)
    shape.heartbeat_s, shape.silence_s = detector.heartbeat_s, detector.silence_s
    if _chance(draw, 25):
        out["exit_notice_s"] = _zero_or_log(draw, 1e-4, 2 * shape.silence_s)
    return out


_SHARES = (1.0, 0.1, 0.25, 0.5, 0.75, 0.9, "100%", "50%", "90%", "33.3%", ".5%")


def _rendezvous(draw: Callable, shape: Shape) -> dict:
    """Size bounds (counts, fractions, percentages), last call, join timeout."""
    out: dict[str, Any] = {}
    w, have = shape.workers, shape.workers + shape.spares
    shape.max_workers = w
    if _chance(draw, 40):
        if _chance(draw, 25):
            out["max_workers"] = _pick(draw, (1.0, "100%"))  # a fraction can only be all
        else:
            shape.max_workers = out["max_workers"] = w + _int(draw, 0, 4)
    if _chance(draw, 55):
        out["min_workers"] = (_pick(draw, _SHARES) if _chance(draw, 30)  # rounded up: <= w
                              else _int(draw, 1, min(shape.max_workers, have)))
    elif min(2, shape.max_workers) > have:
        out["min_workers"] = 1  # the default (2) would exceed the workers there are
    if _chance(draw, 30):
        out["last_call_s"] = _zero_or_log(draw, 1e-3, 2.0)
    if _chance(draw, 40):
        out["join_timeout_s"] = None if _chance(draw, 40) else _log(draw, 0.1, 1000.0)
    return out


def _network(draw: Callable) -> dict:
    out: dict[str, Any] = {}
    if _chance(draw, 30):
        out["latency_s"] = _zero_or_log(draw, 1e-5, 0.05)
    if _chance(draw, 20):
        out["bandwidth_Bps"] = _log(draw, 1e6, 1e12)
    return out


_STRATEGY_CHOICES = {"batch": ("constant", "shrink"), "lr_scaling": ("none", "linear"),
                     "reduction": ("fast", "exact"), "restart_failure": ("repeat", "replace"),
                     "stragglers": ("keep", "evict")}


def _strategy(draw: Callable, shape: Shape) -> dict:
    """Recovery strategy, checkpoints, batch policy, restarts, stragglers."""
    out: dict[str, Any] = {"kind": _pick(draw, ("elastic", "checkpoint-restart"))}
    if _chance(draw, 50):
        out["checkpoint_interval_steps"] = _int(draw, 1, shape.steps + 3)
    for key in ("checkpoint_write_s", "checkpoint_read_s"):
        if _chance(draw, 30):
            out[key] = _zero_or_log(draw, 1e-3, 5 * shape.step_s + 1)
    if _chance(draw, 50):
        shape.restart_s = out["restart_s"] = _zero_or_log(draw, 1e-3, 120.0)
    for key, values in _STRATEGY_CHOICES.items():
        if _chance(draw, 35):
            out[key] = _pick(draw, values)
    if _chance(draw, 25):
        out["max_restarts"] = _int(draw, 0, 6)
    if _chance(draw, 20):
        out["max_recoveries_without_progress"] = None if _chance(draw, 30) else _int(draw, 1, 30)
    if _chance(draw, 25):
        out["straggler_factor"] = _big_or_small(draw, 1.05, 10.0, 1000.0)
    if _chance(draw, 25):
        out["straggler_steps"] = _int(draw, 1, 10)
    if _chance(draw, 25):
        out["straggler_holdout_s"] = _log(draw, 0.01, 100.0)
    return out


def _state(draw: Callable, shape: Shape) -> dict:
    """Replicated or sharded state. A sharded job of more than 1000 workers
    names its shards (at most 64): by default it has one per worker, and the
    sim's placement of 10^4 shards takes it a minute or more."""
    out: dict[str, Any] = {}
    if _chance(draw, 40):
        out["sharding"] = _pick(draw, ("replicated", "sharded"))
    if _chance(draw, 30):
        out["replicas"] = _int(draw, 1, 4)
    if _chance(draw, 25) or (out.get("sharding") == "sharded" and shape.workers > 1000):
        out["shards"] = _int(draw, 1, min(2 * shape.workers, 64))
    return out


_ENDPOINTS = ("http://127.0.0.1:2379", "http://localhost:2379", "http://[::1]:2379",
              "http://127.0.0.2:23790")


def _keeper(draw: Callable, shape: Shape) -> dict:
    """The record-keeper: memory, or etcd with standbys, failover and the user's cluster."""
    if not _chance(draw, 35):
        return {"store": "memory", "worker_links": "launcher"} if _chance(draw, 5) else {}
    out: dict[str, Any] = {"store": "etcd"}
    shape.etcd = True
    if _chance(draw, 70):
        shape.standbys = out["standbys"] = _int(draw, 0, 3)
    if _chance(draw, 30):
        out["lease_ttl_s"] = _big_or_small(draw, 1.0, 10.0, 600.0)
    if _chance(draw, 30):
        out["failover_s"] = _log(draw, 1e-3, 10.0)
    takeover = out.get("failover_s", out.get("lease_ttl_s", 2.0))
    if shape.standbys and _chance(draw, 35):
        out["mtbf_s"] = _round(2 * takeover + _log(draw, 0.1, 20.0) * shape.scale_s)
    if _chance(draw, 20):
        shape.endpoints = True
        out["etcd_endpoints"] = sorted({_pick(draw, _ENDPOINTS) for _ in range(_int(draw, 1, 3))})
        if _chance(draw, 60):
            out["etcd_password_file"] = "/etc/rollcall/etcd-password"
            if _chance(draw, 60):
                out["etcd_user"] = _pick(draw, ("root", "rollcall"))
    if _chance(draw, 35):
        links = _pick(draw, ("launcher", "direct"))
        if shape.endpoints and shape.per_host is not None:
            links = "launcher"  # direct links to the user's etcd cannot have hosts
        shape.direct_links = links == "direct"
        out["worker_links"] = links
    return out


# --------------------------------------------------------------------------
# Failures: random lifetimes and slowdowns, and the schedule


def _random_failures(draw: Callable, shape: Shape) -> dict:
    """Random machine deaths (three lifetime laws, lemons, ageing) and slowdowns."""
    out: dict[str, Any] = {}
    in_service = shape.workers + shape.spares
    # the job fails every 0.1 to 100 of its scale_s; a job of more than 64
    # workers at most every one: a storm over hundreds of nodes costs the sim
    # seconds per simulated second (sharded placement is worked out per loss)
    storm = 0.1 if shape.workers <= 64 else 1.0
    if _chance(draw, 55):
        mtbf = _round(in_service * shape.scale_s * _log(draw, storm, 100.0))
        if _chance(draw, 20):
            out["per_1000_node_days"] = _round(86_400_000 / mtbf)
        else:
            out["worker_mtbf_s"] = mtbf
    if _chance(draw, 50):
        out["distribution"] = _pick(draw, ("exponential", "weibull", "lognormal"))
    if _chance(draw, 30):
        out["weibull_shape"] = _log(draw, 0.3, 4.0)
    if _chance(draw, 30):
        out["lognormal_sigma"] = _log(draw, 0.1, 3.0)
    if _chance(draw, 20):
        out["bad_fraction"] = _probability(draw)
    if _chance(draw, 20):
        out["bad_multiplier"] = _big_or_small(draw, 1.0, 20.0, 1000.0)
    if _chance(draw, 25):
        out["age"] = _pick(draw, ("always", "computing"))
    if _chance(draw, 25):
        out["slow_mtbf_s"] = _round(in_service * shape.scale_s * _log(draw, 0.1, 100.0))
    if _chance(draw, 25):
        if _chance(draw, 50):
            out["slow_factor"] = _log(draw, 1.01, 10.0)
        else:
            out["slow_factor"] = {"median": _log(draw, 1.01, 10.0)}
            if _chance(draw, 60):
                out["slow_factor"]["spread"] = _zero_or_log(draw, 0.01, 2.0)
    if _chance(draw, 25):
        out["slow_for_s"] = _log(draw, 0.01, shape.scale_s)
    return out


def _actions(shape: Shape) -> list[str]:
    """The fault families this cluster and keeper admit."""
    out = ["kill", "pause", "slow", "late_heartbeats", "join"]
    if shape.rack_size is not None:
        out.append("kill_rack")
    if shape.per_host is not None:
        out.append("lose_host")
        if not shape.direct_links:
            out += ["partition", "isolate_keeper", "delay", "loss"]
    if shape.etcd:
        if not shape.endpoints:
            out.append("kill_etcd")
        if shape.standbys >= 1:
            out += ["kill_keeper", "partition_keeper"]
    return out


def _trigger(draw: Callable, shape: Shape) -> dict:
    """``at_step``, ``at_s`` or ``at_roll_call``, biased to the job's start
    and its end (a roll call: mostly the first few generations)."""
    steps, end_s = shape.steps, shape.job_s
    if _chance(draw, 15):
        return {"at_roll_call": _int(draw, 1, 3) if _chance(draw, 70) else _int(draw, 1, 40)}
    if _chance(draw, 50):
        return {"at_step": _pick(draw, (0, 1, max(0, steps - 1), steps)) if _chance(draw, 40)
                else _int(draw, 0, steps + 2)}
    where = draw(st.integers(0, 3))
    if where == 0:
        return {"at_s": 0.0}
    if where == 1:  # near the start
        return {"at_s": _log(draw, 1e-6, 3 * shape.heartbeat_s)}
    if where == 2:  # near the end
        return {"at_s": _round(end_s * (0.9 + 0.2 * draw(_UNIT)), 4)}
    return {"at_s": _round(1.2 * end_s * draw(_UNIT) + 1e-3, 4)}


def _duration(draw: Callable, shape: Shape) -> float:
    """A timed fault's ``for_s``: around the detector's silence, or the job's scale."""
    if _chance(draw, 50):
        return _log(draw, 0.05 * shape.silence_s, 3 * shape.silence_s)
    return _log(draw, 1e-3, max(3 * shape.silence_s, min(shape.scale_s, 400 * shape.heartbeat_s)))


def _worker(draw: Callable, shape: Shape, id_limit: int) -> int | str:
    """A worker id that exists (mostly an initial one), or ``random``."""
    if _chance(draw, 25):
        return "random"
    return _int(draw, 0, shape.workers - 1 if _chance(draw, 60) else id_limit - 1)


def _index(draw: Callable, count: int, random: bool = True) -> int | str:
    return "random" if random and _chance(draw, 25) else _int(draw, 0, count - 1)


def _target(draw: Callable, action: str, shape: Shape, id_limit: int) -> Any:
    """What a fault of family ``action`` hits: ids, a rack or hosts that exist."""
    hosts = -(-id_limit // shape.per_host) if shape.per_host else 0
    if action == "kill" and _chance(draw, 30):
        return sorted({_int(draw, 0, id_limit - 1) for _ in range(_int(draw, 1, 4))})
    if action in ("kill", "pause", "slow", "late_heartbeats"):
        return _worker(draw, shape, id_limit)
    if action == "kill_rack":
        return _index(draw, -(-id_limit // shape.rack_size))
    if action in ("lose_host", "delay", "loss", "isolate_keeper"):
        return _index(draw, hosts, random=action != "isolate_keeper")
    if action == "partition":
        return sorted({_int(draw, 0, hosts - 1) for _ in range(_int(draw, 1, 3))})
    if action == "kill_etcd":
        return _int(draw, 0, 2)
    assert action in ("kill_keeper", "partition_keeper"), action
    return "active"


def _parameter(draw: Callable, action: str, shape: Shape) -> tuple[str, float] | None:
    """A fault's own parameter: near the detector's silence, or up to the schema's bound."""
    if action == "delay":
        return "latency_s", _big_or_small(draw, 1e-4, 2 * shape.silence_s, 3600.0)
    if action == "loss":
        return "rate", 0.0 if _chance(draw, 10) else _round(0.99 * draw(_UNIT))
    if action == "slow":
        return "factor", _big_or_small(draw, 1.01, 10.0, 1000.0)
    if action == "late_heartbeats":
        return "delay_s", _big_or_small(draw, 0.01, 3 * shape.silence_s, 3600.0)
    return None


_TIMED = ("pause", "partition", "isolate_keeper", "delay", "loss", "slow", "late_heartbeats",
          "partition_keeper")


def _schedule(draw: Callable, shape: Shape) -> list[dict]:
    """Up to 8 scheduled faults; joins drawn first, so every id a fault names exists."""
    if not _chance(draw, 65):
        return []
    families = _actions(shape)
    actions = [_pick(draw, families) for _ in range(_int(draw, 1, 8))]
    joins = {i: _int(draw, 1, 4) for i, action in enumerate(actions) if action == "join"}
    assert sum(joins.values()) <= MAX_EXTRA_JOINS
    id_limit = shape.workers + shape.spares + sum(joins.values()) + shape.spare_pool
    out = []
    for i, action in enumerate(actions):
        fault = _trigger(draw, shape)
        fault[action] = joins[i] if action == "join" else _target(draw, action, shape, id_limit)
        parameter = _parameter(draw, action, shape)
        if parameter is not None:
            fault[parameter[0]] = parameter[1]
        if action in _TIMED:
            fault["for_s"] = _duration(draw, shape)
        out.append(fault)
    return out


# --------------------------------------------------------------------------
# Whole scenarios


_NAMES = st.from_regex(r"[A-Za-z0-9_.-]{0,12}", fullmatch=True)
_TEXTS = st.text(max_size=30)


def _sections(draw: Callable) -> dict:
    """Every section, in the order a later one needs the earlier ones' shape."""
    cluster, shape = _topology(draw)
    workload = _workload(draw, shape)
    detector = _detector(draw, shape)
    strategy = _strategy(draw, shape)
    cluster.update(_service(draw, shape))
    rendezvous = _rendezvous(draw, shape)
    keeper = _keeper(draw, shape)
    failures = _random_failures(draw, shape)
    schedule = _schedule(draw, shape)
    if schedule:
        failures["schedule"] = schedule
    return {"cluster": cluster, "workload": workload, "failures": failures,
            "detector": detector, "rendezvous": rendezvous, "network": _network(draw),
            "strategy": strategy, "state": _state(draw, shape), "keeper": keeper}


@st.composite
def scenario_dicts(draw: Callable) -> dict:
    """A scenario as the raw mapping a person would write (only the keys drawn)."""
    raw: dict[str, Any] = {"name": f"fuzz-{draw(_NAMES)}"}
    if _chance(draw, 10):
        raw["description"] = f"fuzz {draw(_TEXTS)}"
    if _chance(draw, 40):
        raw["seed"] = _int(draw, 0, 2**32)
    if _chance(draw, 15):
        raw["target"] = "sim"
    raw.update({key: value for key, value in _sections(draw).items() if value})
    return raw


#: libyaml's dumper where there is one: the same text, a third of the time
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def to_yaml(raw: dict) -> str:
    """The YAML a person would write for ``raw`` (flow style for leaves, as the README's)."""
    return yaml.dump(raw, Dumper=_DUMPER, sort_keys=False, default_flow_style=None, width=100)


def validated(text: str, source: str = "<fuzz>") -> Scenario:
    """``text`` through the product's loader for the sim; a refusal is a generator bug."""
    try:
        return parse_scenario(text, source, target="sim")
    except ScenarioError as exc:
        raise GeneratorBug(f"the loader refused a drawn scenario: {exc}\n{text}") from None


@dataclass
class FuzzCase:
    """One drawn scenario: its raw mapping, its YAML, the validated scenario,
    and whether the run is made twice to compare histories."""

    raw: dict
    text: str
    scenario: Scenario
    twice: bool


#: Keeper lives a run may go through before its horizon at most. A keeper
#: that fails at random keeps failing while the job waits (for a repair,
#: say), and each term costs the sim a takeover and a roll call (about
#: 0.3 ms); the horizon grows with the slowest way back, which a pipeline
#: key left at its default (hours) sets however short the job. Measured
#: on one such draw (``keeper.mtbf_s: 4.05``, a default manual repair):
#: 180,000 terms to the horizon took 36 s on a quiet core and over 240 s
#: beside the rest of the suite; at 20,000 terms, 5.8 s quiet.
KEEPER_TERMS = 10_000


def _bounded_keeper_terms(raw: dict, scenario: Scenario) -> dict:
    """``raw`` (validated as ``scenario``) with ``keeper.mtbf_s`` raised,
    where needed, so that at most :data:`KEEPER_TERMS` keeper lives fit
    before the job's horizon; ``raw`` itself when it needs nothing."""
    keeper = raw.get("keeper", {})
    if "mtbf_s" not in keeper:
        return raw
    horizon = horizon_s(scenario)
    if horizon / keeper["mtbf_s"] <= KEEPER_TERMS:
        return raw
    bounded = _round(horizon / KEEPER_TERMS * 1.01)
    return {**raw, "keeper": {**keeper, "mtbf_s": bounded}}


@st.composite
def fuzz_cases(draw: Callable, twice_every: int = 1,
               twice_up_to: int | None = None) -> FuzzCase:
    """A valid scenario; about one in ``twice_every`` is marked to run twice
    (with ``twice_up_to``, only those of at most that many workers)."""
    raw = draw(scenario_dicts())
    text = to_yaml(raw)
    scenario = validated(text)
    bounded = _bounded_keeper_terms(raw, scenario)
    if bounded is not raw:
        raw, text = bounded, to_yaml(bounded)
        scenario = validated(text)
    twice = twice_every <= 1 or _int(draw, 0, twice_every - 1) == 0
    if twice_up_to is not None and scenario.cluster.workers > twice_up_to:
        twice = False
    return FuzzCase(raw, text, scenario, twice)


def import_project_modules() -> None:
    """Import every module of the project before drawing.

    Hypothesis draws some values from the constants of the local modules
    imported so far, so a seed found where other modules were loaded (the
    whole suite, a benchmark) searches differently alone; with every module
    imported first the pool is the same everywhere and a seed replays.
    """
    for package in ("rollcall", "sim", "real"):
        module = importlib.import_module(package)
        for info in pkgutil.walk_packages(module.__path__, prefix=f"{package}."):
            if not info.name.endswith(".__main__"):
                try:
                    importlib.import_module(info.name)
                except ImportError:
                    continue  # a module that does not import is its own tests' failure


# --------------------------------------------------------------------------
# Coverage: what the schema holds, what a draw used


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The scenario sections (pydantic models) an annotation can hold."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _literals_in(annotation: Any) -> set[str]:
    if typing.get_origin(annotation) is Literal:
        return {str(v) for v in typing.get_args(annotation)}
    return {v for arg in typing.get_args(annotation) for v in _literals_in(arg)}


def _schema_fields(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, annotation) of every key of ``model`` and of the sections inside it."""
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        yield path, info.annotation
        for inner in _models_in(info.annotation):
            yield from _schema_fields(inner, f"{path}.")


def fault_families() -> list[str]:
    """Every fault action with every trigger, read from the ``Fault`` union's models."""
    actions = list(FAULT_MODELS)
    triggers = typing.get_args(FaultTrigger)
    assert actions and triggers
    return [f"fault {action} {trigger}" for action in actions for trigger in triggers]


SIZE_TIERS = ((1, 1), (2, 8), (9, 64), (65, 1000), (1001, 10_000))


def expected_features() -> set[str]:
    """What the generator must draw: :func:`schema_features` but :data:`EXCLUDED`."""
    return schema_features() - set(EXCLUDED)


def schema_features() -> set[str]:
    """Every schema key (the scale helpers too), every literal value of
    every key, every fault family with each trigger, faults near the start
    and the end of the job, each size tier."""
    out: set[str] = set()
    for path, annotation in _schema_fields(Scenario):
        out.add(path)
        out.update(f"{path}={value}" for value in _literals_in(annotation))
    for section, helpers in SCALE_HELPERS.items():
        out.update(f"{section}.{helper}" for helper in helpers)
    out.update(fault_families())
    out.update(f"fault near the {where}" for where in ("start", "end"))
    out.update(f"workers {lo}..{hi}" for lo, hi in SIZE_TIERS)
    return out


def _drawn(model: type[BaseModel], data: dict, prefix: str, out: set[str]) -> None:
    for key, value in data.items():
        path = f"{prefix}{key}"
        out.add(path)
        info = model.model_fields.get(key)
        if info is None:
            continue  # a scale helper
        if isinstance(value, str) and value in _literals_in(info.annotation):
            out.add(f"{path}={value}")
        for inner in _models_in(info.annotation):
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, dict):
                    _drawn(inner, item, f"{path}.", out)


def features(case: FuzzCase) -> set[str]:
    """What one drawn case used, in the terms of :func:`expected_features`."""
    out: set[str] = set()
    _drawn(Scenario, case.raw, "", out)
    sc = case.scenario
    end_s = sc.workload.steps * sc.ideal_step_s + sc.workload.warmup_s
    for fault in sc.failures.schedule:
        out.add(f"fault {fault.action} {fault.trigger}")
        if fault.at_step is not None:
            if fault.at_step <= 1:
                out.add("fault near the start")
            if sc.workload.steps - 1 <= fault.at_step <= sc.workload.steps:
                out.add("fault near the end")
        elif fault.at_roll_call is not None:
            if fault.at_roll_call == 1:  # the first roll call forms the job
                out.add("fault near the start")
        elif fault.at_s <= 3 * sc.detector.heartbeat_s:
            out.add("fault near the start")
        elif 0.9 * end_s <= fault.at_s <= 1.1 * end_s:
            out.add("fault near the end")
    out.update(f"workers {lo}..{hi}" for lo, hi in SIZE_TIERS if lo <= sc.cluster.workers <= hi)
    return out


# --------------------------------------------------------------------------
# The runner


class EventBound:
    """The sim's ``stop`` (a :class:`rollcall.interrupts.StopRequest`), made a
    bound on simulated events: its ``reason()`` raises
    :class:`SimulatedHang` once a run has stepped ``SAME_INSTANT_EVENTS`` at
    one simulated instant or ``TOTAL_EVENTS`` in all (raised, not returned
    as a reason: the sim ends a run only once its clock has caught up with
    the job's run-ahead, which a run spinning at an earlier instant never does)."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.polls = 0
        self.instant = -1.0
        self.since = 0  # the poll at which the clock last moved
        self.longest_instant = 0  # the most polls seen at one instant

    def reason(self) -> None:
        self.polls += 1
        now = self.sim.env.now
        if now != self.instant:
            self.instant, self.since = now, self.polls
        self.longest_instant = max(self.longest_instant, self.polls - self.since)
        if self.longest_instant * POLL_EVENTS >= SAME_INSTANT_EVENTS:
            raise SimulatedHang(f"spinning: {SAME_INSTANT_EVENTS} events stepped at simulated "
                                f"t={now!r} without the clock moving (state {self.sim.job.state}, "
                                f"committed {self.sim.job.committed.step} steps)")
        if self.polls * POLL_EVENTS >= TOTAL_EVENTS:
            raise SimulatedHang(f"runaway: {TOTAL_EVENTS} events stepped, simulated t={now!r}")
        return None


@dataclass
class Outcome:
    """How one case ran: its summary (None when the run did not return one)
    and its problems, each a (signature, message); no problem is a pass."""

    summary: dict | None
    problems: list[tuple[str, str]] = field(default_factory=list)
    instant_events: int = 0  # the most events stepped at one simulated instant (to 1024)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def signature(self) -> str:
        """The first problem's signature (numbers masked): one per distinct bug."""
        return self.problems[0][0] if self.problems else ""

    @property
    def end_reason(self) -> str:
        if self.summary is None:
            return "raised: " + self.signature
        return "completed" if self.summary["completed"] else _masked(self.summary["end_reason"])

    def describe(self) -> str:
        return "; ".join(message for _, message in self.problems)


def _masked(text: str) -> str:
    """``text`` with its numbers replaced by N, so one bug has one signature."""
    return re.sub(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?", "N", text)


def _where(exc: BaseException) -> str:
    """The innermost project frame an exception came from: ``file:line in function``."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if f.filename.startswith(str(ROOT)) and "/tests/" not in f.filename]
    if not frames:
        return "outside the project"
    f = frames[-1]
    return f"{Path(f.filename).relative_to(ROOT)}:{f.lineno} in {f.name}"


@dataclass
class _Run:
    """One bounded sim run: the summary, or the problem that stopped it."""

    sim: Simulation | None
    summary: dict | None
    problems: list[tuple[str, str]]
    instant_events: int  # the most events stepped at one simulated instant (to 1024)


def _simulate(scenario: Scenario, out_dir: Path | None) -> _Run:
    """Run ``scenario`` once under an :class:`EventBound`; a raise is a problem."""
    if out_dir is not None:
        out_dir.mkdir(parents=True)
    sim = bound = None
    summary, problems = None, []
    try:
        sim = Simulation(scenario, out_dir)
        bound = EventBound(sim)
        summary = sim.run(WALL_REPORT_S, bound)
    except SimulatedHang as exc:
        problems = [(f"hang: {str(exc).split(':')[0]}", str(exc))]
    except Exception as exc:  # noqa: BLE001 - any raise is the finding
        where = _where(exc)
        message = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        problems = [(f"exception {type(exc).__name__} at {re.sub(r':[0-9]+ ', ' ', where)}",
                     f"{message} (at {where})")]
    finally:
        if sim is not None:
            sim.recorder.close()
    return _Run(sim, summary, problems, bound.longest_instant * POLL_EVENTS if bound else 0)


def end_problems(summary: dict) -> list[tuple[str, str]]:
    """A completed run committed every step; one that did not ended for one
    of :data:`ACCEPTED_END_REASONS`."""
    reason = summary["end_reason"]
    if summary["completed"]:
        if summary["steps_committed"] != summary["steps_target"]:
            return [("completed short", f"completed ({reason}) with {summary['steps_committed']}"
                                        f" of {summary['steps_target']} steps committed")]
        return []
    if any(re.search(pattern, reason) for pattern in ACCEPTED_END_REASONS):
        return []
    return [(f"end: {_masked(reason)}", f"ended: {reason!r} after "
                                        f"{summary['steps_committed']} steps")]


def _where_ended(sim: Simulation, problems: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """A bad end's signature split by whether the machines up at the end
    could hold a generation (fewer than ``min_workers``: a job waiting for
    machines; as many: a job that had what it needed)."""
    up = int((sim.nodes.exists & sim.nodes.hw).sum())
    enough = up >= sim.sc.rendezvous.min_workers
    state = f"{'at least' if enough else 'fewer than'} min_workers machines up"
    detail = f"{up} machines up, min_workers={sim.sc.rendezvous.min_workers}"
    return [(f"{signature} ({state})", f"{message}, {detail}") for signature, message in problems]


def metric_problems(summary: dict) -> list[tuple[str, str]]:
    """``goodput`` and ``ettr`` in [0, 1]; every count and time finite and >= 0;
    the time's five parts sum to ``elapsed_s``."""
    out = []
    for key in ("goodput", "ettr"):
        if not 0.0 <= summary[key] <= 1.0:
            out.append((f"metric {key} out of [0, 1]", f"{key} = {summary[key]!r}"))
    parts = [summary.get(key) for key in TIME_PARTS]
    if all(isinstance(p, (int, float)) for p in parts) and "elapsed_s" in summary:
        total, elapsed = sum(parts), summary["elapsed_s"]
        if not math.isclose(total, elapsed, rel_tol=1e-9, abs_tol=1e-9):
            out.append(("time parts do not sum to elapsed_s", f"{total!r} != {elapsed!r}"))
    for key, value in summary.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and (
                not math.isfinite(value) or value < 0):
            out.append((f"metric {key} negative or not finite", f"{key} = {value!r}"))
    return out


def _history_problems(sim: Simulation, summary: dict) -> list[tuple[str, str]]:
    """The checkers' verdict, and a ledger written for what was committed (the
    checkers prove samples only from the ledger records there are)."""
    out = []
    if not summary["valid"] or summary["violations"]:
        first = summary["violations"][0] if summary["violations"] else "no violation named"
        out.append((f"invalid: {_masked(first)}", f"invalid history: {summary['violations'][:3]}"))
    if summary["steps_committed"]:
        kinds = {"samples" in r for r in sim.records if r["f"] == "contribute"}
        if not kinds:
            out.append(("no ledger", f"{summary['steps_committed']} steps committed, "
                                     "no contribute record"))
        elif sim.ledger.kind == "samples" and True not in kinds:
            out.append(("no per-sample ledger", "the per-sample ledger was not written"))
    return out


def _replay_problems(scenario: Scenario, first: Path, second: Path) -> list[tuple[str, str]]:
    """A second run of the same seed: byte-identical history, which the
    checkers accept when read back from the file."""
    again = _simulate(scenario, second)
    if again.problems:
        return [(f"second run: {sig}", message) for sig, message in again.problems]
    assert again.summary is not None
    a, b = (first / "history.jsonl").read_bytes(), (second / "history.jsonl").read_bytes()
    if a != b:
        line = next((i for i, (x, y) in enumerate(zip(a.splitlines(), b.splitlines())) if x != y),
                    min(a.count(b"\n"), b.count(b"\n")))
        return [("nondeterministic history", f"same seed, histories differ from line {line + 1}")]
    report = check(read_history(first), data_spec(scenario))
    if report.valid != again.summary["valid"]:
        return [("history on disk judged otherwise",
                 f"re-read history valid={report.valid}, in memory {again.summary['valid']}")]
    return []


def run_scenario(scenario: Scenario, twice: bool = False) -> Outcome:
    """Run ``scenario`` on the sim and check how it ended (see the module
    docstring); ``twice``: run it again and compare the histories' bytes."""
    with tempfile.TemporaryDirectory(prefix="rollcall-fuzz-") as tmp:
        first = Path(tmp) / "first" if twice else None
        run = _simulate(scenario, first)
        if run.problems:
            return Outcome(None, run.problems, run.instant_events)
        assert run.sim is not None and run.summary is not None
        problems = (_where_ended(run.sim, end_problems(run.summary))
                    + _history_problems(run.sim, run.summary) + metric_problems(run.summary))
        if twice and not problems:
            assert first is not None
            problems = _replay_problems(scenario, first, Path(tmp) / "second")
        return Outcome(run.summary, problems, run.instant_events)


def run_case(case: FuzzCase) -> Outcome:
    return run_scenario(case.scenario, case.twice)


def _slug(signature: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", signature).strip("-")[:60]


def save_failure(text: str, outcome: Outcome, unique: bool = True,
                 directory: Path = FAILURES_DIR) -> Path:
    """Write a failing scenario as YAML that ``rollcall run FILE --target sim``
    replays: named by its signature, and with ``unique`` by its text too (else
    a later failure of the same signature, a shrunk one, takes its place)."""
    directory.mkdir(parents=True, exist_ok=True)
    digest = f"-{hashlib.sha256(text.encode()).hexdigest()[:10]}" if unique else ""
    path = directory / f"{_slug(outcome.signature)}{digest}.yaml"
    notes = "".join(f"# {line}\n" for line in outcome.describe().splitlines())
    path.write_text(notes + text)
    return path


class FuzzFailure(AssertionError):
    """A fuzzed run failed; :func:`failure_type` gives each signature its own subclass."""


_FAILURE_TYPES: dict[str, type[FuzzFailure]] = {}


def failure_type(signature: str) -> type[FuzzFailure]:
    """An exception class of its own per signature: hypothesis tells bugs apart
    by the exception's type and place, so it shrinks each without sliding
    into another, and reports distinct ones together."""
    if signature not in _FAILURE_TYPES:
        _FAILURE_TYPES[signature] = type(f"FuzzFailure[{signature}]", (FuzzFailure,), {})
    return _FAILURE_TYPES[signature]


def replay_command(path: Path) -> str:
    """The one line that replays a saved scenario."""
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    return f".venv/bin/rollcall run {shown} --target sim"


def check_case(case: FuzzCase) -> Outcome:
    """Run a case; on a failure save its scenario (by signature: the last one
    saved is the one hypothesis shrank to) and raise its :func:`failure_type`
    naming the file and the command that replays it."""
    outcome = run_case(case)
    if not outcome.ok:
        path = save_failure(case.text, outcome, unique=False)
        raise failure_type(outcome.signature)(
            f"{outcome.describe()}\nscenario: {path}\nreplay: {replay_command(path)}\n{case.text}")
    return outcome
