"""Kill-to-resume on the same model, machine and kill: rollcall vs what people use.

    .venv/bin/python benchmarks/recovery.py [--runs 1] [--steps 150] [--kill-step 75]
                                            [--params 1000000] [--only elastic,checkpoint-restart,torchrun,torchft]

Runs, one after another, with the same ~1M-parameter MLP (``real.model``), the
same data and the same SIGKILL of worker/rank 1 at the same committed step:

- ``elastic``            rollcall's real target, survivors keep going;
- ``elastic-hang``       the same with SIGSTOP instead of SIGKILL (a hung worker);
- ``checkpoint-restart`` rollcall's real target, whole-job restart from the
                         last checkpoint (every ``--ckpt`` steps);
- ``torchrun``           ``torch.distributed.run --max-restarts 3`` around a plain
                         DDP loop that checkpoints every ``--ckpt`` steps.
                         WORKAROUND (visible on purpose): torchrun is started with
                         ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``; with default settings
                         the restarted workers of torch 2.13 pick up stale gloo peer
                         addresses from the reused store and never recover;
- ``torchft``            TorchFT 0.2.0 (installed into a separate venv, ``/tmp/tft-venv``,
                         that sees the project's torch, so the project's pins are untouched):
                         a Lighthouse on loopback (``--min_replicas 2``, default 5 s heartbeat
                         timeout, default 60 s join timeout), ``Manager(timeout=10 s)``, one
                         single-process replica group per worker, gloo on CPU, each step
                         ``start_quorum`` / ``allreduce`` / ``should_commit``.
                         WORKAROUND (visible on purpose): the gradient is allreduced with
                         ``Manager.allreduce`` directly, not through torchft's DDP wrapper,
                         whose communication hook asserts (``fut._fut``) after a gloo peer
                         error and kills the survivors; the killed replica is not restarted
                         (the survivors' resume is what is measured);
- ``torchft-tight``      tuned: 1 s Lighthouse heartbeat timeout and ``Manager(timeout=2 s)``
                         (the collective timeout that frees survivors not adjacent to the
                         dead peer in gloo's ring);
- ``torchft-fastjoin``   (only with ``--only``) tight plus a 100 ms Lighthouse join timeout:
                         on this machine quorums then fragment (2 of 4 replicas) and a
                         kill cost 17 s in one run, so it is not in the default set.
If torchft cannot be installed or run, its line says why.

Prints kill-to-resume seconds (fault -> first step committed after it), steps
lost, training time and the steady-state step time, with ratios to elastic.
This is a measurement, not a test: figures depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


# --- a plain DDP loop for torchrun (run as: recovery.py --ddp-worker DIR ...) -------------

def ddp_worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from real.model import IN_DIM, OUT_DIM, Workload, hidden_for
    from rollcall.core.reshard import plan_step, sample_ids
    from rollcall.core.types import Cursor

    torch.set_num_threads(1)
    run = Path(args.ddp_worker)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    (run / f"pid-rank{rank}.txt").write_text(f"{os.getpid()} {restart}\n")
    data = Workload(args.seed, args.params, args.lr)  # same data generator and init
    torch.manual_seed(args.seed)
    h = hidden_for(args.params)
    model = nn.Sequential(nn.Linear(IN_DIM, h), nn.Tanh(), nn.Linear(h, OUT_DIM))
    ddp = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    step = 0
    ckpts = sorted(run.glob("ckpt-*.pt"))
    if ckpts:
        ck = torch.load(ckpts[-1], weights_only=False)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        step = ck["step"]
    members = tuple(range(world))
    log = open(run / "steps.jsonl", "a") if rank == 0 else None
    while step < args.steps:
        t0 = time.monotonic()
        plan = plan_step(Cursor(step, step * args.global_batch), members,
                         global_batch=args.global_batch, micro_batch=args.micro_batch)
        shards = list(plan.shards_of(rank))
        opt.zero_grad()
        for k, j in enumerate(shards):
            offs = plan.shard_offsets(j)
            x, y = data.batch(sample_ids(args.seed, args.dataset, offs.start, offs.stop))
            loss = nn.functional.mse_loss(ddp(x), y) * (world / plan.n_shards)
            if k < len(shards) - 1:
                with ddp.no_sync():
                    loss.backward()
            else:
                loss.backward()
        opt.step()
        step += 1
        if rank == 0:
            if step % args.ckpt == 0:
                tmp = run / f".ckpt-{step:08d}.tmp"
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
                os.replace(tmp, run / f"ckpt-{step:08d}.pt")
            log.write(json.dumps({"step": step - 1, "t": time.monotonic(), "t0": t0,
                                  "restart": restart}) + "\n")
            log.flush()
    dist.destroy_process_group()


# --- a TorchFT replica group of one process (run with the torchft venv's python) ------------


def tft_replica(args: argparse.Namespace) -> None:
    from datetime import timedelta

    import torch
    from torch.distributed import TCPStore
    from torchft import Manager, ProcessGroupGloo

    from real.model import Workload
    from rollcall.core.reshard import plan_step, sample_ids
    from rollcall.core.types import Cursor

    torch.set_num_threads(1)
    run = Path(args.tft_replica)
    rid = args.replica
    (run / f"pid-r{rid}.txt").write_text(f"{os.getpid()}\n")
    wl = Workload(args.seed, args.params, args.lr)
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    timeout = timedelta(seconds=args.tft_timeout)
    pg = ProcessGroupGloo(timeout=timeout)
    manager = Manager(
        pg=pg, min_replica_size=2,
        load_state_dict=lambda sd: wl.load_state(sd["state"]),
        state_dict=lambda: {"state": wl.state()},
        replica_id=f"replica{rid}", store_addr="127.0.0.1", store_port=store.port,
        rank=0, world_size=1, lighthouse_addr=args.lighthouse, timeout=timeout,
        quorum_timeout=timedelta(seconds=60), heartbeat_interval=timedelta(milliseconds=100))
    log = open(run / f"steps-r{rid}.jsonl", "a")
    while manager.current_step() < args.steps:
        t0 = time.monotonic()
        manager.start_quorum()
        n = manager.num_participants()
        r = manager.participating_rank()
        step = manager.current_step()
        wl.zero_grad()
        plan = plan_step(Cursor(step, step * args.global_batch), tuple(range(max(n, 1))),
                         global_batch=args.global_batch, micro_batch=args.micro_batch)
        if r is not None:
            for j in plan.shards_of(r):
                offs = plan.shard_offsets(j)
                wl.accumulate(sample_ids(args.seed, args.dataset, offs.start, offs.stop))
        g = wl.flat_grad() * (max(n, 1) / plan.n_shards)  # AVG over replicas -> mean over shards
        manager.allreduce(g).wait()
        if manager.should_commit():
            wl.apply(g)
            log.write(json.dumps({"step": step, "t": time.monotonic(), "t0": t0, "n": n}) + "\n")
            log.flush()


# --- helpers ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scenario_text(kind: str, a: argparse.Namespace, fault: str) -> str:
    return f"""
name: bench-recovery-{kind}
seed: {a.seed}
target: real
cluster: {{workers: {a.workers}}}
workload: {{steps: {a.steps}, global_batch: {a.global_batch}, micro_batch: {a.micro_batch},
           dataset_samples: {a.dataset}, model_params: {a.params}, lr: {a.lr}}}
detector: {{heartbeat_s: {a.heartbeat}, timeout_s: {a.timeout}}}
rendezvous: {{min_workers: 2, last_call_s: 0.2, join_timeout_s: 300}}
strategy: {{kind: {kind}, checkpoint_interval_steps: {a.ckpt}, batch: constant}}
failures: {{schedule: [{fault}]}}
"""


def run_rollcall(kind: str, a: argparse.Namespace, hang: bool = False) -> dict[str, Any]:
    from real import driver
    from rollcall.scenario import parse_scenario

    fault = (f"{{at_step: {a.kill_step}, pause: 1, for_s: {a.hang_s}}}" if hang
             else f"{{at_step: {a.kill_step}, kill: 1}}")
    sc = parse_scenario(scenario_text(kind, a, fault), f"<bench {kind}>")
    out = Path(tempfile.mkdtemp(prefix=f"rollcall-bench-{kind}-"))
    s = driver.run(sc, out)
    rec = s["recoveries"][0] if s["recoveries"] else {}
    steady = s.get("ideal_step_s")
    return {"kill_to_resume_s": rec.get("kill_to_resume_s"), "lost_steps": s["lost_steps"],
            "train_s": s["elapsed_s"], "wall_s": s["wall_s"], "step_s": steady,
            "ok": s["completed"] and s["valid"], "out": str(out),
            "survivor_restarts": s["survivor_restarts"]}


def run_torchrun(a: argparse.Namespace) -> dict[str, Any]:
    run = Path(tempfile.mkdtemp(prefix="rollcall-bench-torchrun-"))
    env = dict(os.environ, TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", OMP_NUM_THREADS="1",
               PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
           "--nproc-per-node", str(a.workers), "--max-restarts", "3",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
           "--monitor-interval", "0.1",
           str(Path(__file__).resolve()), "--ddp-worker", str(run),
           "--steps", str(a.steps), "--params", str(a.params), "--seed", str(a.seed),
           "--global-batch", str(a.global_batch), "--micro-batch", str(a.micro_batch),
           "--dataset", str(a.dataset), "--ckpt", str(a.ckpt), "--lr", str(a.lr)]
    t_start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=open(run / "torchrun.log", "wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)

    from rollcall.results import read_jsonl_so_far  # here: the DDP workers never load it

    def steps() -> list[dict]:
        return read_jsonl_so_far(run / "steps.jsonl")

    t_kill: Optional[float] = None
    killed_at_step = None
    deadline = time.monotonic() + a.torchrun_timeout
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            st = steps()
            if t_kill is None and st and st[-1]["step"] + 1 >= a.kill_step:
                pid = int((run / "pid-rank1.txt").read_text().split()[0])
                os.kill(pid, signal.SIGKILL)
                t_kill = time.monotonic()
                killed_at_step = st[-1]["step"] + 1
            time.sleep(0.002)
        timed_out = proc.poll() is None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    st = steps()
    after = [r for r in st if t_kill is not None and r["t"] > t_kill and r["restart"] > 0]
    before = [r for r in st if r["restart"] == 0]
    diffs = [b["t"] - b["t0"] for b in before[5:]]
    first = after[0] if after else None
    done = bool(st) and st[-1]["step"] + 1 >= a.steps
    return {
        "kill_to_resume_s": None if first is None else round(first["t"] - t_kill, 6),
        "lost_steps": None if first is None else killed_at_step - first["step"],
        "train_s": round(st[-1]["t"] - st[0]["t0"], 6) if st else None,
        "wall_s": round(time.monotonic() - t_start, 6),
        "step_s": statistics.median(diffs) if diffs else None,
        "ok": done and not timed_out, "out": str(run), "survivor_restarts": a.workers - 1,
    }


TFT_VENV = Path("/tmp/tft-venv")


def torchft_python() -> tuple[Optional[Path], str]:
    """A venv with torchft 0.2.0 that sees the project's torch through a .pth
    (so pip never pulls another torch and the project's pins stay untouched)."""
    py = TFT_VENV / "bin" / "python"
    if not py.exists():
        r = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(TFT_VENV)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            return None, f"cannot create {TFT_VENV}: {r.stderr.strip()[-300:]}"
    import torch  # noqa: F401 - find the project's site-packages
    site = Path(torch.__file__).resolve().parent.parent
    pth = next((TFT_VENV / "lib").glob("python3*/site-packages"), None)
    if pth is None:
        return None, f"{TFT_VENV} has no site-packages"
    (pth / "project.pth").write_text(str(site) + "\n")
    ok = subprocess.run([str(py), "-c", "import torchft"], capture_output=True, text=True)
    if ok.returncode != 0:
        pip = [str(py), "-m", "pip"]
        if subprocess.run(pip + ["--version"], capture_output=True).returncode != 0:
            pip = [sys.executable, "-m", "pip", "--python", str(py)]
        r = subprocess.run(pip + ["install", "-q", "torchft==0.2.0"], capture_output=True,
                           text=True, timeout=600)
        if r.returncode != 0:
            return None, ("pip install torchft==0.2.0 failed: "
                          + " ".join(r.stderr.strip().splitlines()[-3:])[-400:])
        ok = subprocess.run([str(py), "-c", "import torchft"], capture_output=True, text=True)
        if ok.returncode != 0:
            return None, "torchft installed but does not import: " + ok.stderr.strip()[-300:]
    return py, ""


def run_torchft(a: argparse.Namespace, heartbeat_timeout_ms: int,
                manager_timeout_s: float = 10.0, join_timeout_ms: int = 60000) -> dict[str, Any]:
    py, why = torchft_python()
    if py is None:
        return {"skipped": why}
    run = Path(tempfile.mkdtemp(prefix="rollcall-bench-torchft-"))
    port = free_port()
    lh_bin = TFT_VENV / "bin" / "torchft_lighthouse"
    procs: list[subprocess.Popen] = []
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    t_start = time.monotonic()

    from rollcall.results import read_jsonl_so_far

    def steps(r: int) -> list[dict]:
        return read_jsonl_so_far(run / f"steps-r{r}.jsonl")

    t_kill = None
    killed_at = None
    try:
        procs.append(subprocess.Popen(
            [str(lh_bin), "--bind", f"127.0.0.1:{port}", "--min_replicas", "2",
             "--join_timeout_ms", str(join_timeout_ms), "--quorum_tick_ms", "100",
             "--heartbeat_timeout_ms", str(heartbeat_timeout_ms)],
            stdout=open(run / "lighthouse.log", "wb"), stderr=subprocess.STDOUT))
        for r in range(a.workers):
            procs.append(subprocess.Popen(
                [str(py), str(Path(__file__).resolve()), "--tft-replica", str(run),
                 "--replica", str(r), "--lighthouse", f"http://127.0.0.1:{port}",
                 "--steps", str(a.steps), "--params", str(a.params), "--seed", str(a.seed),
                 "--global-batch", str(a.global_batch), "--micro-batch", str(a.micro_batch),
                 "--dataset", str(a.dataset), "--lr", str(a.lr),
                 "--tft-timeout", str(manager_timeout_s)],
                env=env, cwd=ROOT, stdout=open(run / f"replica-{r}.log", "wb"),
                stderr=subprocess.STDOUT))
        deadline = time.monotonic() + a.torchrun_timeout
        survivors = [r for r in range(a.workers) if r != 1]
        while time.monotonic() < deadline:
            s0 = steps(0)
            if t_kill is None and s0 and s0[-1]["step"] + 1 >= a.kill_step:
                pid = int((run / "pid-r1.txt").read_text().split()[0])
                os.kill(pid, signal.SIGKILL)
                t_kill = time.monotonic()
                killed_at = s0[-1]["step"] + 1
            if all(procs[1 + r].poll() is not None for r in survivors):
                break
            if any(procs[1 + r].poll() not in (None, 0) for r in survivors):
                break
            time.sleep(0.002)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    all_steps = {r: steps(r) for r in range(a.workers)}
    # Resumed = a survivor committed a step in a quorum without the dead replica
    # (a step already in flight, to which it had contributed, is not a recovery).
    after = sorted((x for r in range(a.workers) if r != 1 for x in all_steps[r]
                    if t_kill is not None and x["t"] > t_kill and x["n"] < a.workers),
                   key=lambda x: x["t"])
    s0 = all_steps[0]
    before = [x for x in s0 if t_kill is None or x["t"] < t_kill]
    diffs = [x["t"] - x["t0"] for x in before[5:]]
    crashed = [r for r in range(a.workers) if r != 1 and procs[1 + r].returncode not in (0, None)]
    first = after[0] if after else None
    return {
        "kill_to_resume_s": None if first is None else round(first["t"] - t_kill, 6),
        "lost_steps": None if first is None else max(0, killed_at - first["step"]),
        "train_s": round(s0[-1]["t"] - s0[0]["t0"], 6) if s0 else None,
        "wall_s": round(time.monotonic() - t_start, 6),
        "step_s": statistics.median(diffs) if diffs else None,
        "ok": bool(s0) and s0[-1]["step"] + 1 >= a.steps and not crashed,
        "out": str(run), "survivor_restarts": 0,
        "crashed_survivors": crashed,
    }


def fmt(v: Any, nd: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ddp-worker", help=argparse.SUPPRESS)
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--kill-step", type=int, default=75)
    p.add_argument("--ckpt", type=int, default=50)
    p.add_argument("--params", type=int, default=1_000_000)
    p.add_argument("--global-batch", type=int, default=64)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--dataset", type=int, default=4096)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--heartbeat", type=float, default=0.1)
    p.add_argument("--timeout", type=float, default=1.0)
    p.add_argument("--hang-s", type=float, default=10.0)
    p.add_argument("--torchrun-timeout", type=float, default=600.0)
    p.add_argument("--tft-replica", help=argparse.SUPPRESS)
    p.add_argument("--replica", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--lighthouse", help=argparse.SUPPRESS)
    p.add_argument("--tft-timeout", type=float, default=10.0, help=argparse.SUPPRESS)
    p.add_argument("--only",
                   default="elastic,elastic-hang,checkpoint-restart,torchrun,torchft,torchft-tight")
    a = p.parse_args()
    if a.ddp_worker:
        ddp_worker(a)
        return 0
    if a.tft_replica:
        tft_replica(a)
        return 0
    wanted = a.only.split(",")
    print(f"recovery benchmark: {a.workers} workers, MLP of ~{a.params} params, "
          f"batch {a.global_batch}/{a.micro_batch}, {a.steps} steps, SIGKILL of worker 1 at "
          f"step {a.kill_step}, checkpoints every {a.ckpt} steps, detector "
          f"{a.heartbeat}/{a.timeout} s, {os.cpu_count()} CPUs, {a.runs} run(s) each", flush=True)
    runners = {
        "elastic": lambda: run_rollcall("elastic", a),
        "elastic-hang": lambda: run_rollcall("elastic", a, hang=True),
        "checkpoint-restart": lambda: run_rollcall("checkpoint-restart", a),
        "torchrun": lambda: run_torchrun(a),
        "torchft": lambda: run_torchft(a, 5000, 10.0),
        "torchft-tight": lambda: run_torchft(a, 1000, 2.0),
        "torchft-fastjoin": lambda: run_torchft(a, 1000, 2.0, 100),
    }
    results: dict[str, list[dict]] = {}
    for name in wanted:
        for i in range(a.runs):
            t = time.monotonic()
            r = runners[name]()
            r["bench_s"] = round(time.monotonic() - t, 1)
            results.setdefault(name, []).append(r)
            print(f"  {name} run {i + 1}: {json.dumps(r)}", flush=True)
    med = {}
    for name, rs in results.items():
        if "skipped" in rs[0]:
            continue
        keys = ("kill_to_resume_s", "lost_steps", "train_s", "step_s")
        med[name] = {k: (statistics.median([r[k] for r in rs if r.get(k) is not None])
                         if any(r.get(k) is not None for r in rs) else None) for k in keys}
        med[name]["ok"] = all(r["ok"] for r in rs)
    base = med.get("elastic", {}).get("kill_to_resume_s")
    print()
    print(f"{'target':<20}{'kill->resume s':>15}{'x elastic':>11}{'lost steps':>12}"
          f"{'train s':>10}{'step s':>9}  ok")
    for name, m in med.items():
        ratio = (m["kill_to_resume_s"] / base) if (base and m["kill_to_resume_s"]) else None
        print(f"{name:<20}{fmt(m['kill_to_resume_s']):>15}{fmt(ratio, 1):>11}"
              f"{fmt(m['lost_steps']):>12}{fmt(m['train_s'], 2):>10}{fmt(m['step_s'], 4):>9}  {m['ok']}")
    for name, rs in results.items():
        if "skipped" in rs[0]:
            print(f"{name:<20}not measured: {rs[0]['skipped']}")
    if "torchrun" in med:
        print("note: torchrun ran with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (without it, torch 2.13's "
              "restarted workers reuse stale gloo peer addresses and never recover)")
    if any(k.startswith("torchft") for k in med):
        print("note: torchft gradients go through Manager.allreduce, not its DDP wrapper (whose hook "
              "asserts after a gloo peer error in 0.2.0); the killed replica is not restarted")
    if "elastic" in med and "torchrun" in med and med["torchrun"]["step_s"] and med["elastic"]["step_s"]:
        print(f"steady-state step: elastic / plain DDP = "
              f"{med['elastic']['step_s'] / med['torchrun']['step_s']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
