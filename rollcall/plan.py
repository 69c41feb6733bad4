"""What a scenario will do, before running it: ``rollcall validate --plan``.

Read from the resolved scenario alone (no target runs): the worker id
ranges, the scripted fault timeline, the failure-free time of the job
(every step at ``Scenario.ideal_step_s`` plus its checkpoint writes) and
the expected number of random failures over that time. The expectation is
a floor: failures lengthen the run, and a longer run sees more failures.
A wall-time estimate of the simulator is not given: it depends on the
failures and the machine far more than on the scenario's size
(``benchmarks/sim_scale.py`` measures it).
"""

from __future__ import annotations

from typing import Any

from rollcall.scenario import Scenario

__all__ = ["plan", "format_plan"]

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
        if f.action == "join":
            entry["workers"] = [nxt, nxt + f.join - 1]
            ids.append({"ids": [nxt, nxt + f.join - 1], "what": f"newcomers ({f.trigger} {f.when})"})
            nxt += f.join
        elif f.action == "kill_rack":
            entry["rack"] = f.kill_rack
        else:
            t = f.targets
            entry["workers"] = t if t == "random" else list(t)
            if f.action == "pause":
                entry["for_s"] = f.for_s
        timeline.append(entry)
    st = sc.strategy
    steps = sc.workload.steps
    checkpoints = max(0, (steps - 1) // st.checkpoint_interval_steps)  # none after the last step
    free_s = steps * sc.ideal_step_s + checkpoints * st.checkpoint_write_s
    mtbf = sc.failures.worker_mtbf_s
    expected = None if mtbf is None else w * free_s / mtbf
    return {"scenario": sc.name, "target": sc.target, "strategy": st.kind, "seed": sc.seed,
            "ids": ids, "worker_id_limit": sc.worker_id_limit, "timeline": timeline,
            "steps": steps, "ideal_step_s": sc.ideal_step_s, "checkpoints": checkpoints,
            "failure_free_s": free_s, "expected_random_failures": expected}


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
    lines.append("wall time: not estimated (see benchmarks/sim_scale.py)")
    return "\n".join(lines)
