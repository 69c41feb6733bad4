"""Calibration: measure a real run's costs and express them as sim scenario keys.

Why: the sim is only worth trusting at 10^5 GPUs if, at 4 CPU processes, it
predicts what the real target measured. ``measure(run_dir)`` reads a real
run's history (never its logs) and returns the costs it saw;
``overrides(cal)`` maps them onto the keys the sim's cost model reads;
``apply(scenario, cal)`` returns the scenario with them set.

What is measured, and onto which key it goes:

- step cost: the interval between consecutive commits of one generation
  (compute + exchange + commit round trip), mean per generation without
  stall outliers, fitted
  as ``ceil(shards / members) * micro_batch_s + allreduce_s`` weighted by
  steps. On an oversubscribed CPU a smaller generation may step *faster*
  (fewer processes per core), which the sim's model cannot express; then
  the fit falls back to ``allreduce_s = 0`` and the ``micro_batch_s`` that
  preserves the run's total step time.
- detection: fault -> the roll call it caused (kills: the launcher sees the
  exit; pauses: the heartbeat timeout). A kill is an exit notice on both
  targets, so ``detector.exit_notice_s = kill detection`` (on real mostly
  the killed process's teardown, tens of ms). A pause is the detector's
  (expected delay ``timeout_s - heartbeat_s / 2`` on the sim): measured
  (``pause_detection_s``) but never applied, since the timeout is what the
  scenario means, not a cost of the machine.
- roll call: round opened -> generation formed, for failure rounds that
  did not have to time a silent member out (those measure the detector);
  ``network.latency_s = roll call / 2`` (one message out, one back).
- state transfer: the first step of a generation with newcomers beyond a
  normal step; ``network.bandwidth_Bps = model bytes x states / (transfer -
  latency)``, where ``states`` is the load of the busiest link in the copy:
  ``k`` stale members take stripes from the ``s`` others
  (``rollcall.core.reshard.stripes``), so ``max(1, k / s)`` states
  (median over the copies; 1 for a newcomer or a replaced worker).
- checkpoint write: checkpoint record - commit of its step (0 when the run
  wrote none; both strategies checkpoint, on both targets).
- checkpoint read and restart: ``restart`` record -> next generation
  (``restart_s``), and that generation's first step beyond a normal one
  (``checkpoint_read_s``).
- a fresh process's start-up outside a restart: a ``pull`` or ``repair``
  record -> the growth round that admits the new process, whatever rounds
  left it out before (``cluster.launch_s``, less the one-way latency its
  Join takes; a scripted ``join`` uses a warm process on real and
  measures nothing).

A cost that the run did not exercise is left out, so applying the file keeps
the scenario's own value for it.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

from rollcall.results import SCENARIO_FILE, read_history, read_summary
from rollcall.scenario import Scenario
from rollcall.core.types import from_ranges

__all__ = ["CALIBRATION_FILE", "apply", "measure", "overrides", "read_calibration", "with_keys",
           "write_calibration"]

CALIBRATION_FILE = "calibration.yaml"
_FAILURE_REASONS = {"failure", "step-failed", "exited", "timeout"}


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _fit_step(points: list[tuple[int, float, int]]) -> tuple[float, float]:
    """Weighted least squares of ``step = k * mb + ar`` over (k, median step, steps)."""
    w = sum(n for _, _, n in points)
    total = sum(n * s for _, s, n in points)
    kbar = sum(n * k for k, _, n in points) / w
    sbar = total / w
    var = sum(n * (k - kbar) ** 2 for k, _, n in points)
    if var > 0:
        mb = sum(n * (k - kbar) * (s - sbar) for k, s, n in points) / var
        ar = sbar - mb * kbar
        if mb > 0 and ar >= 0:
            return mb, ar
    return total / sum(n * k for k, _, n in points), 0.0


@dataclass
class _History:
    """A real run's records, indexed by generation the way the measures read them."""

    recs: list[dict[str, Any]]
    gens: dict[int, dict[str, Any]]  # generation -> its ``generation`` record
    opened: dict[int, float]  # generation -> when its round opened
    commits: dict[int, list[dict[str, Any]]]  # generation -> its commit records

    @classmethod
    def of(cls, recs: list[dict[str, Any]]) -> "_History":
        gens: dict[int, dict[str, Any]] = {}
        opened: dict[int, float] = {}
        commits: dict[int, list[dict[str, Any]]] = {}
        for r in recs:
            f = r.get("f")
            if f == "round" and r.get("type") == "invoke":
                opened.setdefault(int(r["gen"]), float(r["t"]))
            elif f == "generation":
                gens[int(r["gen"])] = r
            elif f == "commit":
                commits.setdefault(int(r["gen"]), []).append(r)
        return cls(recs, gens, opened, commits)

    def size(self, g: int) -> int:
        """Generation ``g``'s member count."""
        return len(from_ranges(self.gens[g]["members"]))

    def first_admitting(self, worker: int, after_s: float) -> int | None:
        """The first generation whose round opened at or after ``after_s``
        with ``worker`` among its members."""
        for g in sorted(g for g, t in self.opened.items() if t >= after_s and g in self.gens):
            if worker in from_ranges(self.gens[g]["members"]):
                return g
        return None

    def first_commit(self, g: int) -> float | None:
        cs = self.commits.get(g)
        return min(float(c["t"]) for c in cs) if cs else None


@dataclass
class _StepCost:
    """The measured step cost: per generation, and the fit of the sim's model."""

    micro_batch_s: float
    allreduce_s: float
    per_gen: dict[int, float]  # generation -> its mean step, when it had two commits
    steps: dict[int, int]  # generation -> how many step intervals that mean is over
    by_size: dict[int, list[tuple[float, int]]]  # members -> (mean step, steps) per generation
    shards: int  # micro-batches per global batch

    def of(self, h: _History, g: int) -> float:
        """Generation ``g``'s normal step: measured, or from the fit."""
        if g in self.per_gen:
            return self.per_gen[g]
        return math.ceil(self.shards / h.size(g)) * self.micro_batch_s + self.allreduce_s


def _step_cost(h: _History, shards: int) -> _StepCost:
    """Mean commit interval per generation, fitted as ``k * micro_batch_s + allreduce_s``."""
    points, per_gen, steps = [], {}, {}
    by_size: dict[int, list[tuple[float, int]]] = {}
    for g, cs in h.commits.items():
        size = h.size(g) if g in h.gens else None
        ts = sorted(float(c["t"]) for c in cs)
        deltas = [b - a for a, b in zip(ts, ts[1:])]
        if size and deltas:
            # the mean, not the median: elapsed time is a sum and step times are
            # skewed; but without the outliers (> 5x median) that are a stall on
            # a paused peer, which the sim charges separately until detection.
            cut = 5.0 * statistics.median(deltas)
            kept = [d for d in deltas if d <= cut]
            med = sum(kept) / len(kept)
            points.append((math.ceil(shards / size), med, len(kept)))
            per_gen[g], steps[g] = med, len(kept)
            by_size.setdefault(size, []).append((med, len(kept)))
    if not points:  # one commit per generation: use t - t0
        for g, cs in h.commits.items():
            points.append((math.ceil(shards / h.size(g)), statistics.median(
                float(c["t"]) - float(c["t0"]) for c in cs), len(cs)))
    mb, ar = _fit_step(points)
    return _StepCost(mb, ar, per_gen, steps, by_size, shards)


def _event_costs(h: _History, step: _StepCost) -> dict[str, list[float]]:
    """Samples of the costs that follow one record: a fault's detection, a
    checkpoint's write, a restart and the checkpoint read after it."""
    out: dict[str, list[float]] = {k: [] for k in ("kill", "pause", "write", "restart", "read",
                                                   "failover")}
    takeovers = [float(r["t"]) for r in h.recs if r.get("f") == "takeover"]
    rounds = sorted(h.opened.values())
    commit_t = {int(c["last"]): float(c["t"]) for cs in h.commits.values() for c in cs}
    evicts = [(float(r["t"]), r.get("worker")) for r in h.recs if r.get("f") == "evict"]
    gen_list = sorted(h.gens.items())
    for r in h.recs:
        f, t = r.get("f"), float(r["t"])
        if f == "fault" and r.get("kind") == "kill":
            nxt = next((x for x in rounds if x >= t), None)
            if nxt is not None:
                out["kill"].append(nxt - t)
        elif f == "fault" and r.get("kind") == "kill_keeper":  # to the successor's takeover
            nxt = next((x for x in takeovers if x >= t), None)
            if nxt is not None:
                out["failover"].append(nxt - t)
        elif f == "fault" and r.get("kind") == "pause":
            ws = set(r.get("workers") or [])
            ev = next((x for x, w in evicts if x >= t and w in ws), None)
            if ev is not None:
                out["pause"].append(ev - t)
        elif f == "checkpoint":
            ck_step = int(r["cursor"][0])
            if ck_step - 1 in commit_t:
                out["write"].append(t - commit_t[ck_step - 1])
        elif f == "restart":
            later = next(((g, gr) for g, gr in gen_list if float(gr["t"]) >= t), None)
            if later is not None:
                out["restart"].append(float(later[1]["t"]) - t)
                fc = h.first_commit(later[0])
                if fc is not None:
                    out["read"].append(max(0.0, fc - float(later[1]["t"]) - step.of(h, later[0])))
    return out


def _launch_costs(h: _History) -> list[float]:
    """Samples of a fresh process's start-up outside a restart: a ``pull``,
    ``warm`` or ``repair`` record -> the round that admits the new process,
    when that round is a growth (the one its join opens). Rounds that leave
    it out in between are its failure's own roll call and others held while
    it started: the cluster times a pull from the fault, so the survivors'
    roll call may open after it. A round of another reason that admits it
    may have taken its join in while open, and measures nothing."""
    out = []
    for r in h.recs:
        if r.get("f") != "fault" or r.get("kind") not in ("pull", "warm", "repair"):
            continue
        t = float(r["t"])
        for w in r.get("workers") or []:
            g = h.first_admitting(w, after_s=t)
            if g is not None and h.gens[g].get("reason") == "growth":
                out.append(h.opened[g] - t)
    return out


def _generation_costs(h: _History, step: _StepCost) -> dict[str, list[float]]:
    """Samples of the costs of forming a generation (the roll call) and of its
    first step beyond a normal one (warm-up, state transfer, plain resume)."""
    out: dict[str, list[float]] = {k: [] for k in ("roll", "warmup", "transfer", "resume",
                                                    "stripes")}
    timeouts = [float(r["t"]) for r in h.recs
                if r.get("f") == "evict" and r.get("reason") == "timeout"]
    for g, gr in sorted(h.gens.items()):
        if g in h.opened and gr.get("reason") in _FAILURE_REASONS:
            # a round that had to time a silent member out measures the detector, not the roll call
            if not any(h.opened[g] < x <= float(gr["t"]) for x in timeouts):
                out["roll"].append(float(gr["t"]) - h.opened[g])
        fc = h.first_commit(g)
        if fc is not None and gr.get("reason") == "start":
            out["warmup"].append(max(0.0, fc - float(gr["t"]) - step.of(h, g)))
        if fc is None or gr.get("reason") in ("start", "restart"):
            continue
        extra = max(0.0, fc - float(gr["t"]) - step.of(h, g))
        out["transfer" if gr.get("stale") else "resume"].append(extra)
        if gr.get("stale"):  # k stale members take stripes from the s others: max(1, k / s) states
            k = int(gr["stale"])
            out["stripes"].append(max(1.0, k / max(1, h.size(g) - k)))
    return out


def _run_target(run_dir: Path, scenario: Any) -> str:
    """The target that made the run: its summary's word, else the resolved scenario's."""
    try:
        summary = read_summary(run_dir)
    except (OSError, ValueError):
        summary = {}
    target = summary.get("target") if isinstance(summary, dict) else None
    if target is None and isinstance(scenario, dict):
        target = scenario.get("target")
    return str(target)


def measure(run_dir: str | Path) -> dict[str, Any]:
    """The costs a real run exhibited, in seconds (see the module docstring)."""
    run_dir = Path(run_dir)
    sc = yaml.safe_load((run_dir / SCENARIO_FILE).read_text(encoding="utf-8"))
    target = _run_target(run_dir, sc)
    if target != "real":
        raise ValueError(f"a {target} run: calibrate measures a real run (a sim run's "
                         f"timings are its scenario's own model, not a machine's)")
    recs = list(read_history(run_dir))
    if not any(r.get("f") == "commit" for r in recs):
        raise ValueError("no committed step in the history: nothing to calibrate")
    wl = sc["workload"]
    h = _History.of(recs)
    step = _step_cost(h, wl["global_batch"] // wl["micro_batch"])
    ev = _event_costs(h, step)
    gc = _generation_costs(h, step)
    strategy = sc["strategy"]["kind"]
    return {
        "source_run": str(run_dir),
        "scenario": sc.get("name"),
        "strategy": strategy,
        "micro_batch_s": step.micro_batch_s,
        "allreduce_s": step.allreduce_s,
        "step_s_by_generation": {int(g): v for g, v in sorted(step.per_gen.items())},
        "steps_by_generation": {int(g): n for g, n in sorted(step.steps.items())},
        # the same, pooled by member count (weighted by steps): what the sim takes
        "step_s_by_workers": {n: sum(m * k for m, k in v) / sum(k for _, k in v)
                              for n, v in sorted(step.by_size.items())},
        "kill_detection_s": _median(ev["kill"]),
        "pause_detection_s": _median(ev["pause"]),
        "roll_call_s": _median(gc["roll"]),
        "state_transfer_s": _median(gc["transfer"]),
        # states over the busiest link in those copies (sim.sharded.replicated_copy_time)
        "state_transfer_states": _median(gc["stripes"]),
        "resume_s": _median(gc["resume"]),
        "warmup_s": _median(gc["warmup"]),
        "checkpoint_write_s": _median(ev["write"]) if ev["write"]
        else (0.0 if strategy == "elastic" else None),
        "checkpoint_read_s": _median(ev["read"]),
        "restart_s": _median(ev["restart"]),
        "keeper_failover_s": _median(ev["failover"]),
        "launch_s": _median(_launch_costs(h)),
        "heartbeat_s": sc["detector"]["heartbeat_s"],
        "model_bytes": wl["model_params"] * wl["bytes_per_param"],
    }


def overrides(cal: Mapping[str, Any]) -> dict[str, Any]:
    """Dotted scenario keys -> values for the sim; unmeasured costs are left out."""
    out: dict[str, Any] = {
        "workload.micro_batch_s": round(max(cal["micro_batch_s"], 1e-6), 9),
        "workload.allreduce_s": round(cal["allreduce_s"], 9),
    }
    if cal.get("step_s_by_workers"):
        out["workload.step_s_by_workers"] = {int(n): round(max(v, 1e-6), 9)
                                             for n, v in cal["step_s_by_workers"].items()}
    if cal.get("warmup_s") is not None:
        out["workload.warmup_s"] = round(cal["warmup_s"], 9)
    if cal.get("kill_detection_s") is not None:  # an exit notice, not the detector
        out["detector.exit_notice_s"] = round(cal["kill_detection_s"], 9)
    # detection by timeout is the scenario's own setting (what it means), not a
    # cost: it is measured (pause_detection_s) and never written
    latency = None
    if cal.get("roll_call_s") is not None:
        latency = max(cal["roll_call_s"] / 2.0, 1e-6)
        out["network.latency_s"] = round(latency, 9)
    if cal.get("state_transfer_s"):
        xfer = max(cal["state_transfer_s"] - (latency or 0.0), 1e-6)
        states = cal.get("state_transfer_states") or 1.0  # striped: the busiest link's load
        out["network.bandwidth_Bps"] = float(f"{cal['model_bytes'] * states / xfer:.6g}")
    for key in ("checkpoint_write_s", "checkpoint_read_s", "restart_s"):
        if cal.get(key) is not None:
            out[f"strategy.{key}"] = round(cal[key], 9)
    if cal.get("launch_s") is not None:  # to the join's arrival: less its one way
        out["cluster.launch_s"] = round(max(0.0, cal["launch_s"] - (latency or 0.0)), 9)
    if cal.get("keeper_failover_s") is not None:  # applies to an etcd-backed keeper only
        out["keeper.failover_s"] = round(cal["keeper_failover_s"], 9)
    return out


def apply(scenario: Scenario, cal: Mapping[str, Any], target: str = "sim") -> Scenario:
    """``scenario`` with the calibrated keys set (and its target switched to ``target``)."""
    return with_keys(scenario, overrides(cal), target)


def with_keys(scenario: Scenario, keys: Mapping[str, Any], target: str = "sim") -> Scenario:
    """``scenario`` with dotted ``keys`` set and its target switched to ``target``."""
    data = scenario.to_dict()
    data["target"] = target
    for dotted, value in keys.items():
        if dotted.startswith("keeper.") and data["keeper"]["store"] == "memory":
            continue  # a keeper without a successor has no failover to model
        node = data
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return Scenario.model_validate(data)


def write_calibration(cal: Mapping[str, Any], path: str | Path) -> Path:
    """``calibration.yaml``: the measurements and, under ``overrides``, the scenario keys."""
    path = Path(path)
    doc = {"measured": dict(cal), "overrides": overrides(cal)}
    path.write_text(yaml.safe_dump(doc, sort_keys=True), encoding="utf-8")
    return path


def read_calibration(path: str | Path) -> dict[str, Any]:
    """The ``measured`` part of a ``calibration.yaml`` (feed it to :func:`apply`)."""
    doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    return dict(doc["measured"])
