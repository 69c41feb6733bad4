"""``real.driver.run(scenario, out_dir) -> summary``: the real target's entry point.

Runs the launcher (record-keeper service, workers, faults), merges the
history by time, checks it with the core's checkers and writes
``summary.json`` with the same keys as the sim target (times in real
seconds) plus ``final_weights_sha256``, ``survivor_restarts``,
``recoveries`` and what it ran on (``torch_version``, ``backend``,
``device``, ``nccl_version``).

Clock zero for ``at_s`` faults and for ``elapsed_s`` is the moment the first
generation formed (training start), so the seconds in a scenario are seconds
of training, not of ``import torch``; ``wall_s`` includes process start-up.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional

from rollcall import interrupts
from rollcall.config import data_spec
from rollcall.core import FailureTally, check, summarize_report, time_account
from rollcall.results import HISTORY_FILE, check_summary_keys, ettr, goodput, history_line, write_summary
from rollcall.scenario import Scenario

from real.device import device_problem, platform_keys
from real.launcher import Launcher
from real.netns import netns_available


def merge_history(out_dir: Path) -> list[dict]:
    """Sort ``history.jsonl`` by time (stable: arrival order breaks ties) in place."""
    path = out_dir / HISTORY_FILE
    records = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a torn last line of an interrupted write
    records.sort(key=lambda r: r.get("t", 0.0))
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=".history.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        for r in records:
            fh.write(history_line(r))
    os.replace(tmp, path)
    return records


def recoveries(records: list[dict]) -> list[dict]:
    """One entry per fault: the time from it to the first step committed after it.

    "After it" means in a generation formed after the fault when one was
    (a step of the old generation finishing a few ms after a kill is not a
    recovery); when the fault caused no new generation (a short pause), the
    first commit after the fault.
    """
    commits = [r for r in records if r.get("f") == "commit"]
    out = []
    for f in records:
        if f.get("f") != "fault" or f.get("kind") in ("resume", "repair"):
            continue  # a pause's end, a node's return: not faults to recover from
        t, gen = f["t"], f.get("gen", 0)
        later = [c for c in commits if c["t"] > t and c["gen"] > gen]
        if not later:
            later = [c for c in commits if c["t"] > t]
        first = min(later, key=lambda c: c["t"]) if later else None
        out.append({
            "kind": f.get("kind"), "workers": f.get("workers"), "at_s": t,
            "origin": f.get("origin"),
            "kill_to_resume_s": None if first is None else round(first["t"] - t, 6),
            "resumed_gen": None if first is None else first["gen"],
            "resumed_step": None if first is None else first["step"],
        })
    return out


def failover_times(records: list[dict]) -> list[float]:
    """For each ``kill_keeper`` fault: seconds from the kill to the first step
    committed in a generation formed after it (the failover time)."""
    out = []
    kills = [r["t"] for r in records if r.get("f") == "fault" and r.get("kind") == "kill_keeper"]
    for t in kills:
        later = [r for r in records if r.get("f") == "generation" and r.get("type") == "ok"
                 and r["t"] > t]
        if not later:
            continue
        gen = later[0]["gen"]
        first = min((r["t"] for r in records if r.get("f") == "commit" and r.get("gen", 0) >= gen),
                    default=None)
        if first is not None:
            out.append(round(first - t, 6))
    return out


def summarize(scenario: Scenario, launcher: Launcher, records: list[dict]) -> dict[str, Any]:
    report = check(records, data_spec(scenario))
    s = summarize_report(report)
    lineage = report.lineage
    account = time_account(records, lineage, launcher.result == "completed")
    end_t = launcher.end_t if launcher.end_t is not None else launcher.now()
    # The ideal step: median committed step with the full initial cluster.
    formed = {g: members for _, g, members in launcher.outputs.formed}
    full = [c["t"] - c["t0"] for c in lineage
            if len(formed.get(c["gen"], ())) == scenario.cluster.workers]
    ideal = statistics.median(full) if full else (
        statistics.median([c["t"] - c["t0"] for c in lineage]) if lineage else None)
    recs = recoveries(records)
    finals = launcher.completion.finals
    shas = {final.digest for final in finals.values()}
    final_sha = finals[min(finals)].digest if finals else None
    summary: dict[str, Any] = {
        "scenario": scenario.name,
        "target": "real",
        "strategy": scenario.strategy.kind,
        "seed": scenario.seed,
        "completed": launcher.result == "completed",
        "steps_target": scenario.workload.steps,
        "elapsed_s": round(account.elapsed_s, 6),
        "productive_s": round(account.productive_s, 6),
        "ettr": round(ettr(account.productive_s, account.elapsed_s), 6),
        "goodput": round(goodput(s["steps_committed"], ideal, account.elapsed_s), 6),
        "lost_work_s": round(account.lost_work_s, 6),
        "stall_s": round(account.stall_s, 6),
        "recovery_s": round(account.recovery_s, 6),
        "checkpoint_s": round(account.checkpoint_s, 6),
        "failures": FailureTally.of(records),
        "wall_s": round(end_t, 6),
        "ideal_step_s": round(ideal, 6) if ideal else None,
        "final_weights_sha256": final_sha,
        "final_weights_agree": len(shas) <= 1,
        "survivor_restarts": launcher.outputs.survivor_restarts,
        "recoveries": recs,
        "keeper_failovers": sum(1 for r in records if r.get("f") == "takeover"
                                and r.get("term", 0) > 1),
        "keeper_failover_s": failover_times(records),
        "end_reason": launcher.reason,
        "result": launcher.result,
        "processes": [
            {"worker": p.worker, "incarnation": p.incarnation, "pid": p.pid,
             "spare": p.spare, "fault": p.fault, "returncode": p.returncode,
             "started_s": round(p.started_t, 6)}
            for p in launcher.procs],
    }
    summary.update(s)
    summary.update(platform_keys(scenario.cluster.device, scenario.cluster.backend))
    if launcher.result == "completed" and len(shas) > 1:
        summary["valid"] = False
        summary["violations"] = list(summary["violations"]) + [
            f"members ended with different weights: {sorted(shas)}"]
    check_summary_keys(summary, "real")
    return summary


KEEPER_FILE = "keeper.json"  # rollcall keeper: where it listens, and the token file


def announce(out: Path, launcher: Launcher) -> Callable[[str, int], None]:
    """``rollcall keeper``'s notice, once it listens: one line on stdout and
    ``real/keeper.json`` (written whole, then renamed, so a reader never sees half)."""
    def listening(addr: str, port: int) -> None:
        doc = {"address": f"{addr}:{port}", "token_file": str(launcher.secret_path.resolve())}
        tmp = out / "real" / f".{KEEPER_FILE}.tmp"
        tmp.write_text(json.dumps(doc) + "\n")
        os.replace(tmp, out / "real" / KEEPER_FILE)
        print(f"rollcall keeper: listening on {doc['address']}; token file {doc['token_file']} "
              f"(0600; copy it to each host, never put it on a command line)", flush=True)
    return listening


#: after a second SIGINT/SIGTERM every process of the run is SIGKILLed at once; the
#: launcher then has this long to clean up and write the summary before it exits regardless
SECOND_SIGNAL_EXIT_S = 4.0


def run(scenario: Scenario, out_dir: str | Path, max_wall_s: Optional[float] = None,
        bind: Optional[tuple[str, int]] = None, external_hosts: bool = False,
        stop: Optional[interrupts.Stop] = None,
        ledger: Optional[bool] = None) -> dict[str, Any]:
    """Run ``scenario`` as real processes; ``max_wall_s``: end it (not
    completed, result failed) after that many wall seconds, as on the sim.
    ``bind`` and ``external_hosts``: ``rollcall keeper`` (see :class:`Launcher`).
    ``stop``: the caller's record of SIGINT/SIGTERM (:func:`interrupts.catch`),
    which may hold a signal that came before; else the run handles them itself.
    A signal ends the run with ``result: interrupted``, the summary written.
    ``ledger``: as the sim's; the real workers always write the per-sample
    ledger (every member's ``contribute`` of every step), so True is what
    the run does and False is refused."""
    if ledger is False:
        raise ValueError("the real target always writes the per-sample ledger")
    problem = device_problem(scenario)  # the CLI says it first (exit 2); a direct caller here
    if problem is None and scenario.cluster.workers_per_host is not None and not external_hosts:
        why = netns_available()  # hosts as namespaces, faults as nftables rules
        problem = None if why is None else f"{scenario.name}: hosts as network namespaces: {why}"
    if problem is not None:
        raise ValueError(problem)
    out = Path(out_dir)
    with interrupts.catch(immediate=False, stop=stop) as stop:
        stop.exit_within_s = SECOND_SIGNAL_EXIT_S
        with stop.shielded(then_raise=False):  # a second signal here: the launcher ends at once
            out.mkdir(parents=True, exist_ok=True)
            launcher = Launcher(scenario, out, max_wall_s, bind=bind,
                                external_hosts=external_hosts)
        if external_hosts:
            launcher.on_listening = announce(out, launcher)
        raised: Optional[BaseException] = None
        try:
            launcher.run(stop)
        except BaseException as exc:  # noqa: BLE001 - keep the results, then re-raise
            raised = exc
        with stop.shielded(then_raise=False):  # what a later signal would stop has stopped
            summary = finish(scenario, launcher, out)
    if raised is not None:
        raise raised
    return summary


def finish(scenario: Scenario, launcher: Launcher, out: Path) -> dict[str, Any]:
    """Merge and check the history, write ``summary.json``, say how the run ended."""
    records = merge_history(out)
    summary = summarize(scenario, launcher, records)
    write_summary(out, summary)
    if launcher.result == "failed":
        print(f"rollcall real: {launcher.reason} (completed: false; results kept in {out})")
    elif launcher.result in ("interrupted", "error"):
        print(f"rollcall real: {launcher.reason}; every worker stopped, results kept in {out}")
    return summary
