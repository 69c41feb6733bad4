"""The prepared GPU check (run it through ``benchmarks/gpu_check.sh``).

Prints one line per check, ``PASS``/``FAIL``/``SKIP`` and what; exits 1 if
any check failed, else 0 (a machine without CUDA: every line ``SKIP``).

- One GPU (``CUDA_VISIBLE_DEVICES`` narrowed to the first): four workers
  share it, gloo over CUDA tensors (``benchmarks/gpu-gloo-one-gpu.yaml``):
  one killed, then one paused past the detector timeout. The run completes,
  the per-sample ledger says every sample exactly once (the summary's
  ``valid``, from the core's checkers over ``history.jsonl``), kill ->
  resume and pause -> resume are printed, and exact mode's final weights
  equal those of the same run without faults (a different membership history).
  Then the same with sharded state (two replicas of each ZeRO-1 slice) and
  one kill: the slices come back from their other holders, no fallback, and
  the final weights equal the replicated fault-free run's. And under
  checkpoint-restart: the kill restarts the group from the checkpoint of
  step 10, loaded onto the GPU, and the final weights are the same again.
- One GPU, NCCL: the worker's own NCCL calls (``real.device``) in one
  process, a one-rank group per generation built, used, aborted from the
  abort thread and never destroyed, three in a row (NCCL refuses two ranks
  on one GPU; what a peer's death does is the next checks').
- Two or more GPUs: the same over NCCL, one worker per GPU
  (``benchmarks/gpu-nccl-kill.yaml``, ``gpu-nccl-pause.yaml``: one run
  each, a slowed peer SIGKILLed or SIGSTOPped), plus: the fault lands while
  the survivors are inside the allreduce (their ledger record of the step
  in flight precedes the fault, its commit does not), they resume within
  the detector timeout + 1 s, and no survivor was torn down.

Each run goes through ``rollcall run`` (what a user runs), bounded by
``--max-wall-s``; the results stay in the directory printed last.

``--rehearse-on-cpu N`` runs the same checks as if there were N GPUs, on
the CPU over gloo (``cluster.device=cpu``, ``cluster.backend=gloo``): it
tests this harness, not the GPU paths, on a machine without one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
MAX_WALL_S = 50  # one run (about 10-20 s here); five runs fit the 5 minutes
NCCL_MAX_WORKERS = 8

ONE_GPU_CHECKS = ("gloo-cuda run completes", "gloo-cuda exactly-once", "gloo-cuda kill -> resume",
                  "gloo-cuda pause -> resume", "gloo-cuda exact hash equal across histories",
                  "gloo-cuda sharded kill restored from replicas",
                  "gloo-cuda checkpoint-restart from a checkpoint",
                  "nccl one-rank build/abort/rebuild")
NCCL_CHECKS = ("nccl-kill run completes", "nccl-kill exactly-once", "nccl SIGKILL mid-allreduce",
               "nccl-kill survivors never torn down", "nccl-pause run completes",
               "nccl-pause exactly-once", "nccl SIGSTOP mid-allreduce",
               "nccl-pause survivors never torn down", "nccl exact hash equal across histories")


class Report:
    """The check lines, and whether any failed."""

    def __init__(self) -> None:
        self.failed = 0

    def line(self, status: str, what: str) -> None:
        self.failed += status == "FAIL"
        print(f"{status} {what}", flush=True)

    def check(self, ok: bool, what: str, detail: str) -> None:
        self.line("PASS" if ok else "FAIL", f"{what}: {detail}")


def cuda_count() -> tuple[int, str]:
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return n, str(torch.__version__)


#: ``--set`` overrides every run gets (``--rehearse-on-cpu``: the CPU and gloo)
REHEARSAL: list[str] = []


def run(scenario: Path, out: Path, sets: list[str], env: Optional[dict[str, str]] = None,
        ) -> tuple[Optional[dict], list[dict], str]:
    """``rollcall run`` on the real target: its summary (None if it wrote
    none), its history records and the last line it printed on stderr."""
    cmd = [sys.executable, "-m", "rollcall", "run", str(scenario), "--target", "real",
           "--out", str(out), "--quiet", "--max-wall-s", str(MAX_WALL_S)]
    for s in sets + REHEARSAL:
        cmd += ["--set", s]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                          timeout=MAX_WALL_S + 60, env={**os.environ, **(env or {})})
    err = (proc.stderr.strip().splitlines() or [""])[-1]
    if not (out / "summary.json").exists():
        return None, [], err or f"exit {proc.returncode}"
    sys.path.insert(0, str(ROOT))
    from rollcall.results import read_history

    return json.loads((out / "summary.json").read_text()), list(read_history(out)), err


#: one process, the worker's own NCCL calls (real.device) on one GPU: a
#: one-rank group per generation, built, used, aborted and never destroyed,
#: three generations in a row on fresh store prefixes
NCCL_ONE_RANK = r"""
import os, sys, time, datetime
import torch, torch.distributed as dist
from real.device import Communicators, nccl_backend, worker_env
os.environ.update(worker_env("cuda", "nccl", 60.0))
dev = torch.device("cuda:0")
torch.cuda.set_device(dev)
store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=30))
comms = Communicators()
for gen in (1, 2, 3):
    pre = dist.PrefixStore(f"rollcall/gen{gen}/", store)
    t0 = time.monotonic()
    b = nccl_backend(dist, pre, 0, 1, dev, 60.0, lambda x, g=gen: comms.add(g, x))
    x = torch.full((1 << 20,), float(gen), device=dev)
    b.allreduce([x]).wait()
    torch.cuda.synchronize()
    assert float(x[0]) == gen, (gen, float(x[0]))
    comms.abort_through(gen)
    assert comms.wait_idle(30.0), f"the abort of generation {gen} did not return in 30 s"
    print(f"gen {gen}: built, allreduced, aborted in {time.monotonic() - t0:.2f} s", flush=True)
print(f"graveyard {len(comms.graveyard)} errors {comms.errors} nccl {torch.cuda.nccl.version()}")
os._exit(0 if len(comms.graveyard) == 3 and not comms.errors else 1)
"""


def nccl_one_rank(rep: Report) -> None:
    """The NCCL calls of ``real.device`` on this machine's torch and NCCL:
    options, eager connect, a collective, abort from the abort thread, and
    a fresh communicator on the same GPU afterwards (what each generation
    does). One rank: NCCL refuses two ranks on one GPU, so a peer's death
    is the 2-GPU checks' to show."""
    try:
        proc = subprocess.run([sys.executable, "-c", NCCL_ONE_RANK], cwd=ROOT, text=True,
                              capture_output=True, timeout=120)
    except subprocess.TimeoutExpired:
        rep.line("FAIL", "nccl one-rank build/abort/rebuild: hung past 120 s")
        return
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    rep.check(proc.returncode == 0, "nccl one-rank build/abort/rebuild",
              "; ".join(lines[-4:]) if lines else f"exit {proc.returncode}")


def faults(recs: list[dict], kind: str) -> list[dict]:
    return [r for r in recs if r.get("f") == "fault" and r.get("kind") == kind]


def mid_allreduce(recs: list[dict], fault: dict) -> tuple[bool, str]:
    """Whether every survivor of ``fault``'s generation was inside the step's
    exchange when it struck: its ledger record of the step in flight (written
    just before the exchange) came before the fault, the step's commit not."""
    gen, t, hit = fault.get("gen"), fault["t"], set(fault.get("workers") or [])
    formed = [r for r in recs if r.get("f") == "generation" and r.get("type") == "ok"
              and r["gen"] == gen]
    if not formed or not hit:
        return False, f"no generation {gen} or no worker hit"
    members = {w for lo, hi in formed[0]["members"] for w in range(lo, hi + 1)}
    survivors = members - hit
    done = [r["step"] for r in recs if r.get("f") == "commit" and r["gen"] == gen and r["t"] < t]
    step = max(done) + 1 if done else None
    if step is None or not survivors:
        return False, f"no step of generation {gen} in flight with survivors"
    waiting = {r["process"] for r in recs if r.get("f") == "contribute" and r["gen"] == gen
               and r["step"] == step and r["t"] < t}
    inside = survivors <= waiting
    return inside, (f"survivors {sorted(survivors)} {'were' if inside else 'were NOT all'} "
                    f"in step {step}'s allreduce")


def resume_of(summary: dict, kind: str) -> Optional[float]:
    got = [r["kill_to_resume_s"] for r in summary.get("recoveries", []) if r["kind"] == kind]
    return got[0] if got else None


def common_checks(rep: Report, tag: str, summary: Optional[dict], err: str) -> bool:
    """Completed and exactly-once; False when there is nothing more to check."""
    if summary is None:
        rep.check(False, f"{tag} run completes", f"no summary ({err})")
        return False
    rep.check(summary["completed"], f"{tag} run completes",
              f"{summary['steps_committed']}/{summary['steps_target']} steps, "
              f"{summary['generations']} generations, torch {summary.get('torch_version')}, "
              f"{summary.get('device')}/{summary.get('backend')}, nccl {summary.get('nccl_version')}"
              + ("" if summary["completed"] else f" ({summary['end_reason']})"))
    once = (summary["valid"] and summary["samples_duplicated"] == 0
            and summary["samples_skipped"] == 0)
    rep.check(once, f"{tag} exactly-once",
              f"valid {summary['valid']}, {summary['samples_consumed']} samples, "
              f"{summary['samples_duplicated']} duplicated, {summary['samples_skipped']} skipped"
              + ("" if once else f"; {summary['violations'][:2]}"))
    return True


def hash_check(rep: Report, tag: str, runs: list[tuple[Optional[dict], list[dict]]]) -> None:
    """Exact mode: one final hash over runs whose membership histories differ."""
    what = f"{tag} exact hash equal across histories"
    if len(runs) < 2 or any(s is None for s, _ in runs):
        rep.check(False, what, "a run wrote no summary")
        return
    hashes = [s["final_weights_sha256"] for s, _ in runs if s is not None]
    gens = [[r["members"] for r in recs if r.get("f") == "generation" and r.get("type") == "ok"]
            for _, recs in runs]
    differ = len({json.dumps(g) for g in gens}) > 1
    rep.check(all(hashes) and len(set(hashes)) == 1 and differ, what,
              f"{' vs '.join((h or 'none')[:16] for h in hashes)} after "
              f"{' and '.join(str(len(g)) for g in gens)} generations"
              + ("" if differ else " (the histories did not differ)"))


def one_gpu(rep: Report, out: Path) -> None:
    scenario, env = HERE / "gpu-gloo-one-gpu.yaml", {"CUDA_VISIBLE_DEVICES": "0"}
    s, recs, err = run(scenario, out / "gloo-faults", [], env)
    if not common_checks(rep, "gloo-cuda", s, err):
        for what in ONE_GPU_CHECKS[2:]:
            rep.line("FAIL", f"{what}: the run wrote no summary")
        return
    timeout = 2.0
    for kind, what in (("kill", "gloo-cuda kill -> resume"), ("pause", "gloo-cuda pause -> resume")):
        r = resume_of(s, kind)
        rep.check(r is not None, what, f"{r} s (detector timeout {timeout} s)")
    twin, twin_recs, _ = run(scenario, out / "gloo-no-faults", ["failures.schedule=[]"], env)
    hash_check(rep, "gloo-cuda", [(s, recs), (twin, twin_recs)])
    sharded_kill(rep, out, scenario, env, twin)
    restart_kill(rep, out, scenario, env, twin)


def one_kill_run(rep: Report, what: str, scenario: Path, out: Path, env: dict[str, str],
                 sets: list[str]) -> Optional[tuple[dict, list[dict]]]:
    """The scenario with ``sets`` and one fault, worker 1 killed at step 15:
    its summary and records, or None (and a FAIL line) if it wrote none."""
    s, recs, err = run(scenario, out, sets + ["failures.schedule=[{at_step: 15, kill: 1}]"], env)
    if s is None:
        rep.line("FAIL", f"{what}: the run wrote no summary ({err})")
        return None
    return s, recs


def restart_kill(rep: Report, out: Path, scenario: Path, env: dict[str, str],
                 twin: Optional[dict]) -> None:
    """Checkpoint-restart: a kill tears the group down, the relaunched
    processes load the last checkpoint onto the GPU (written from a CPU
    copy) and redo the steps since; exact mode's final weights equal the
    fault-free run's."""
    what = "gloo-cuda checkpoint-restart from a checkpoint"
    got = one_kill_run(rep, what, scenario, out / "gloo-restart", env, [
        "strategy.kind=checkpoint-restart", "strategy.checkpoint_interval_steps=10"])
    if got is None:
        return
    s, recs = got
    restarts = [r for r in recs if r.get("f") == "restart"]
    resumed = [r for r in recs if r.get("f") == "generation" and r.get("reason") == "restart"]
    cursor = resumed[0].get("cursor") if resumed else None
    same = twin is not None and s.get("final_weights_sha256") == twin.get("final_weights_sha256")
    ok = bool(s["completed"] and s["valid"] and restarts and cursor and cursor[0] == 10 and same)
    rep.check(ok, what, f"completed {s['completed']}, valid {s['valid']}, {len(restarts)} "
              f"restart(s), resumed at step {cursor[0] if cursor else None} (checkpoint 10), "
              f"final weights {'equal' if same else 'NOT equal'} to the fault-free run's")


def sharded_kill(rep: Report, out: Path, scenario: Path, env: dict[str, str],
                 twin: Optional[dict]) -> None:
    """Sharded state (ZeRO-1 slices on the GPU, two replicas of each): the
    killed worker's slices are restored from their other holders, no step
    is lost to a fallback, and exact mode's final weights equal the
    replicated fault-free run's."""
    what = "gloo-cuda sharded kill restored from replicas"
    got = one_kill_run(rep, what, scenario, out / "gloo-sharded", env,
                       ["state.sharding=sharded", "state.replicas=2"])
    if got is None:
        return
    s, recs = got
    recovery = [r for r in recs if r.get("f") == "recovery"]
    last = recovery[-1] if recovery else {}
    same = twin is not None and s.get("final_weights_sha256") == twin.get("final_weights_sha256")
    ok = bool(s["completed"] and s["valid"] and recovery and last.get("fallback") is False
              and not last.get("lost") and s.get("fallbacks") == 0 and same)
    rep.check(ok, what, f"completed {s['completed']}, valid {s['valid']}, "
              f"{len(recovery)} recoveries, last copies {last.get('copies')} lost "
              f"{last.get('lost')} fallback {last.get('fallback')}, final weights "
              f"{'equal' if same else 'NOT equal'} to the replicated fault-free run's")


def survivors_kept(rep: Report, tag: str, s: dict, recs: list[dict]) -> None:
    """Every worker no fault touched ran as one process: torch's watchdog
    tore none down (a torn-down survivor would be relaunched or missing)."""
    hit = {w for r in recs if r.get("f") == "fault" for w in (r.get("workers") or [])}
    lives: dict[int, list[dict]] = {}
    for p in s["processes"]:
        lives.setdefault(p["worker"], []).append(p)
    torn = sorted(w for w, ps in lives.items() if w not in hit and len(ps) != 1)
    kept = len([w for w in lives if w not in hit])
    rep.check(not torn and kept > 0 and s["survivor_restarts"] == 0,
              f"{tag} survivors never torn down",
              f"{kept} unfaulted workers, each one process" if not torn
              else f"workers {torn} ran as more than one process")


def nccl(rep: Report, out: Path, gpus: int) -> None:
    n = min(gpus, NCCL_MAX_WORKERS)
    limit = 2.0 + 1.0  # the scenarios' detector timeout + 1 s
    runs = []
    for kind, signal_name in (("kill", "SIGKILL"), ("pause", "SIGSTOP")):
        tag = f"nccl-{kind}"
        s, recs, err = run(HERE / f"gpu-nccl-{kind}.yaml", out / tag, [f"cluster.workers={n}"])
        if not common_checks(rep, tag, s, err):
            rep.line("FAIL", f"nccl {signal_name} mid-allreduce: the run wrote no summary")
            rep.line("FAIL", f"{tag} survivors never torn down: the run wrote no summary")
            continue
        assert s is not None
        fs, r = faults(recs, kind), resume_of(s, kind)
        inside, why = mid_allreduce(recs, fs[0]) if fs else (False, "no such fault happened")
        rep.check(inside and r is not None and r <= limit, f"nccl {signal_name} mid-allreduce",
                  f"survivors resumed in {r} s (limit {limit} s); {why}")
        survivors_kept(rep, tag, s, recs)
        runs.append((s, recs))
    twin, twin_recs, _ = run(HERE / "gpu-nccl-kill.yaml", out / "nccl-no-faults",
                             [f"cluster.workers={n}", "failures.schedule=[]"])
    hash_check(rep, "nccl", runs + [(twin, twin_recs)])


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/gpu_check.sh", description=__doc__.split("\n")[0])
    p.add_argument("--rehearse-on-cpu", type=int, metavar="N", default=None,
                   help="run the checks on the CPU over gloo as if there were N GPUs "
                        "(tests this harness, not the GPU paths)")
    args = p.parse_args(argv)
    rep = Report()
    gpus, torch_version = cuda_count()
    if args.rehearse_on_cpu is not None:
        gpus = args.rehearse_on_cpu
        REHEARSAL[:] = ["cluster.device=cpu", "cluster.backend=gloo"]
        rep.line("INFO", f"CPU rehearsal as if {gpus} GPU(s): gloo on CPU, not a GPU check")
    if gpus < 1:
        for what in ONE_GPU_CHECKS + NCCL_CHECKS:
            rep.line("SKIP", f"{what}: no CUDA device here (torch {torch_version})")
        return 0
    out = Path(tempfile.mkdtemp(prefix="gpu-check-", dir=os.environ.get("TMPDIR")))
    began = time.monotonic()
    one_gpu(rep, out)
    if not REHEARSAL:
        nccl_one_rank(rep)
    if gpus < 2:
        for what in NCCL_CHECKS:
            rep.line("SKIP", f"{what}: needs 2 or more GPUs, this machine has {gpus}")
    else:
        nccl(rep, out, gpus)
    print(f"INFO {gpus} GPU(s), torch {torch_version}, {time.monotonic() - began:.0f} s; "
          f"runs in {out}", flush=True)
    return 1 if rep.failed else 0


if __name__ == "__main__":
    sys.exit(main())
