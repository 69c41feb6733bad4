"""rollcall's sim against AIReSim on the Llama-3 job, timed side by side (not a test).

The goal is a speed lead: rollcall's replicate of scenarios/llama3-54d.yaml
(2,048 servers x 8 GPUs, 64 hot spares, 54 days of work, node MTBF 263 days)
should take at most half the CPU time AIReSim (github.com/karthikp-ubc/airesim,
MIT, simpy only) takes for the same job. AIReSim is installed from its public
source into a scratch virtualenv (``python -m venv``, ``simpy==4.1.2``, then
``pip install --no-deps`` of the source), removed at the end, also on failure.

    .venv/bin/python benchmarks/vs_airesim.py                    # 5 replicates, both strategies
    .venv/bin/python benchmarks/vs_airesim.py --replicates 3 --strategy elastic
    .venv/bin/python benchmarks/vs_airesim.py --airesim-src ~/src/airesim      # a checkout
    .venv/bin/python benchmarks/vs_airesim.py --keep-env /tmp/airesim-env      # build once, reuse
    .venv/bin/python benchmarks/vs_airesim.py --cold-spares      # the 64 spares as AIReSim's spare pool

``--airesim-src`` is a git directory (its HEAD is archived; the default is
the local mirror) or a plain checkout (copied, so the build leaves it alone).
Every replicate runs in a fresh child process and only the simulation call
inside it is timed (``time.process_time`` and ``time.perf_counter``), not the
interpreter's start-up or imports. Replicates alternate between the two
simulators, and which of the pair goes first alternates too, so that load on
a shared machine hits both alike. rollcall's child is ``child`` of
benchmarks/sim_scale.py with the history kept in memory (AIReSim writes
nothing either). The summary gives, per rollcall strategy, the median ratio of
CPU seconds AIReSim / rollcall (the speed lead, goal >= 2) and the failure
counts of both, each next to what its own model expects.

The 64 hot spares map to AIReSim's warm standbys (a failed server's place is
taken at once, no host selection), which is what they are in rollcall.
``--cold-spares`` maps them instead to AIReSim's spare pool (working pool
2,048, no standbys, no preemption wait): every failure then costs AIReSim a
host selection over the whole pool, which makes its replicate about 2.8x
slower (~0.43 s against ~0.155 s of CPU here) for the same failures.

What differs between the two models on this job (the parameter mapping in
``airesim_params`` says where each AIReSim value comes from):

- Who fails: in AIReSim only the 2,048 job servers fail, and only while the
  job computes, so it expects 2,048 x 54 d / 263.2 d = 420 failures whatever
  the recovery costs. In rollcall every node that is up fails (the 64 hot
  spares too, ``failures.age: always``) for the whole run, restarts included,
  so the count grows with the run's length: ~450 elastic (~57 days),
  ~500 checkpoint-restart (~65 days).
- Lost work and checkpoints: AIReSim credits work up to the instant of a
  failure and writes no checkpoints. rollcall's checkpoint-restart pays 60 s
  every 128 steps and redoes the steps since the last checkpoint. The
  mapping folds the mean redo (half an interval) into AIReSim's fixed
  ``recovery_time``; the checkpoint writes (~5% of the run) have no
  counterpart.
- Recovery: AIReSim pays one fixed ``recovery_time`` per failure (its model
  of "reload the checkpoint and restart"). rollcall detects a crash by
  heartbeat timeout, then restarts (checkpoint-restart: ``restart_s`` +
  ``checkpoint_read_s``, started over when a node fails during it) or holds a
  roll call and copies the state to the newcomer (elastic: about a minute,
  with no restart). AIReSim has no elastic recovery: its one mapping is the
  checkpoint-restart one, and the elastic rows time the same AIReSim run.
- Elastic shrink: rollcall's elastic job may train on 1,536..2,048 servers
  (``rendezvous.min_workers``); AIReSim's job always needs all 2,048.
- Repair: rollcall's node is back after exactly 3 days; AIReSim's repair is
  exponential (mean 3 days here, no manual stage). With 64 hot spares and
  ~25 nodes in repair at a time, neither job ever waits for one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Optional

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = "llama3-54d"  # a key of sim_scale.SCENARIOS
MIRROR = Path("/work/.mirror/karthikp-ubc+airesim/repo")
SIMPY = "simpy==4.1.2"
STRATEGIES = ("checkpoint-restart", "elastic")
GOAL = 2.0  # AIReSim cpu s / rollcall cpu s


def airesim_params(sc: Any) -> dict[str, Any]:
    """AIReSim's ``Params`` for the rollcall scenario ``sc`` (units: minutes, failures per
    minute per server). Derived from the loaded scenario so it follows the yaml file."""
    # workload.*: ceil(global_batch / micro_batch / workers) x micro_batch_s + allreduce_s = 9 s
    step_s = sc.ideal_step_s
    detect_s = sc.detector.timeout_s + sc.detector.heartbeat_s / 2  # a crash is seen by timeout: ~32.5 s
    redo_s = sc.strategy.checkpoint_interval_steps * step_s / 2  # mean work lost since the last checkpoint
    return {
        "job_size": sc.cluster.workers,  # cluster.workers (= rendezvous.max_workers)
        "warm_standbys": sc.cluster.spares,  # cluster.spares: hot spares, swapped in at no host-selection cost
        "working_pool_size": sc.cluster.workers + sc.cluster.spares,  # cluster.workers + cluster.spares
        "spare_pool_size": sc.cluster.spare_pool,  # cluster.spare_pool (0: no cold pool)
        "preemption_wait_time": sc.cluster.preempt_s / 60,  # cluster.preempt_s (unused: no cold pool)
        "job_length": sc.workload.steps * step_s / 60,  # workload.steps x step time = 54 days of compute
        "random_failure_rate": 60 / sc.failures.worker_mtbf_s,  # failures.worker_mtbf_s
        "failure_distribution": sc.failures.distribution,  # failures.distribution (exponential)
        "systematic_failure_fraction": sc.failures.bad_fraction,  # failures.bad_fraction (0: no bad servers)
        # failures.bad_multiplier = AIReSim's 1 + m (unused at fraction 0)
        "systematic_failure_rate_multiplier": sc.failures.bad_multiplier - 1,
        "recovery_time": (detect_s + sc.strategy.restart_s + sc.strategy.checkpoint_read_s + redo_s) / 60,
        # ^ detector.timeout_s + heartbeat_s / 2, strategy.restart_s, strategy.checkpoint_read_s and half of
        #   strategy.checkpoint_interval_steps x step time redone (AIReSim loses no work); checkpoint-restart only,
        #   AIReSim has no elastic recovery; strategy.checkpoint_write_s has no counterpart
        # rendezvous.last_call_s (a roll call's wait; with warm standbys only paid at the start)
        "host_selection_time": sc.rendezvous.last_call_s / 60,
        "auto_repair_time": sc.cluster.repair_s / 60,  # cluster.repair_s, but the mean of an exponential, not fixed
        "prob_auto_to_manual": 0.0,  # cluster.repair_s: one repair stage (no cluster.repair pipeline)
        "manual_repair_time": sc.cluster.repair_s / 60,  # cluster.repair_s (unused: no manual stage)
        "auto_repair_fail_prob": 0.0,  # cluster.repair_s: a repaired node comes back sound
        "manual_repair_fail_prob": 0.0,  # as above (unused)
        "diagnosis_probability": 1.0,  # cluster.repair.diagnosis_p's 1.0: the crashed node itself goes to repair
        "diagnosis_uncertainty": 0.0,  # no counterpart: rollcall never blames the wrong node
        "bad_server_regeneration": False,  # no counterpart: a good node never turns bad
    }


def cold_spares(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with the hot spares moved to AIReSim's spare pool (``--cold-spares``): the job's
    pool is only its own servers, so every failure goes through host selection and pulls a spare."""
    spares = params["warm_standbys"]
    return {**params, "working_pool_size": params["job_size"], "warm_standbys": 0,
            "spare_pool_size": params["spare_pool_size"] + spares,
            "preemption_wait_time": 0.0}  # hot spares: nothing to preempt


def rollcall_scenario(strategy: str, seed: int) -> Any:
    """The scenario a rollcall replicate runs (also the source of the AIReSim mapping)."""
    sys.path.insert(0, str(ROOT))
    from rollcall.scenario import load_scenario

    return load_scenario(ROOT / "scenarios" / f"{SCENARIO}.yaml", seed=seed, strategy=strategy)


def airesim_child(params: dict[str, Any], seed: int) -> dict[str, Any]:
    """One AIReSim replicate, run by the scratch env's python: only ``Simulator.run`` is timed."""
    from airesim.params import Params
    from airesim.simulator import Simulator

    sim = Simulator(Params(**params), seed=seed)
    t, c = time.perf_counter(), time.process_time()
    stats = sim.run()
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    return {"wall_s": wall, "cpu_s": cpu, "failures": stats.total_failures,
            "days": stats.total_training_time / 1440, "compute_min": stats.total_compute_time}


def rollcall_child(strategy: str, seed: int) -> dict[str, Any]:
    """One rollcall replicate: benchmarks/sim_scale.py's own child, history kept in memory."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from sim_scale import child

    r = child(SCENARIO, strategy, seed, False)
    return {"wall_s": r["wall_s"], "cpu_s": r["cpu_s"], "failures": r["failures"],
            "days": r["sim_s"] / 86400, "ok": r["valid"] and r["completed"]}


def _source(src: Path, dest: Path) -> str:
    """Put AIReSim's source into ``dest``; return what it is (a commit, or the checkout's path)."""
    if (src / "HEAD").is_file() and (src / "objects").is_dir():  # a git directory: archive HEAD
        tar = subprocess.run(["git", "--git-dir", str(src), "archive", "HEAD"], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(dest)], input=tar.stdout, check=True)
        head = subprocess.run(["git", "--git-dir", str(src), "rev-parse", "HEAD"],
                              capture_output=True, text=True, check=True)
        return f"commit {head.stdout.strip()}"
    if (src / "pyproject.toml").is_file() or (src / "setup.py").is_file():  # a checkout: copy it
        shutil.copytree(src, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".git"))
        return f"checkout {src}"
    raise SystemExit(f"vs_airesim: {src} is neither a git directory nor a checkout of AIReSim")


def _install(env: Path, src: Path) -> str:
    """A virtualenv at ``env`` with simpy and AIReSim (no other dependency); what was installed."""
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    py = str(env / "bin" / "python")
    pip = [py, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run(pip + [SIMPY], check=True)
    with tempfile.TemporaryDirectory(prefix="airesim-src-") as tmp:
        what = _source(src.expanduser().resolve(), Path(tmp))
        subprocess.run(pip + ["--no-deps", tmp], check=True)
    return what


def _usable(env: Path) -> bool:
    """Whether ``env`` already holds a python that imports AIReSim and simpy (``--keep-env`` reuse)."""
    py = env / "bin" / "python"
    return py.is_file() and subprocess.run([str(py), "-c", "import airesim.simulator, simpy"],
                                           capture_output=True).returncode == 0


@contextlib.contextmanager
def scratch_env(src: Path, keep: Optional[Path]) -> Iterator[Path]:
    """The scratch env's python: a temporary one removed on the way out (also on failure),
    or ``keep``, built there if it is not usable yet and left in place."""
    if keep is not None:
        if not _usable(keep):
            print(f"installing AIReSim ({_install(keep, src)}) into {keep}", flush=True)
        yield keep / "bin" / "python"
        return
    with tempfile.TemporaryDirectory(prefix="vs-airesim-env-") as tmp:
        print(f"installing AIReSim ({_install(Path(tmp), src)}) into scratch env {tmp}", flush=True)
        yield Path(tmp) / "bin" / "python"


def _spawn(cmd: list[str], timeout: float) -> Optional[dict[str, Any]]:
    """Run one child; its JSON line, or None (and why, on stderr)."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"vs_airesim: timed out after {timeout:g} s: {cmd[2:]}", file=sys.stderr)
        return None
    if p.returncode != 0:
        print(f"vs_airesim: child failed: {cmd[2:]}: {p.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    return json.loads(p.stdout.strip().splitlines()[-1])


def _print_row(sim: str, strategy: str, seed: int, r: Optional[dict[str, Any]]) -> None:
    """One replicate's row of the table."""
    lead = f"{sim:<8} {strategy:<19} {seed:>4}"
    if r is None:
        print(f"{lead}  failed", flush=True)
        return
    ok = "" if r.get("ok", True) else "  NOT VALID/COMPLETED"
    print(f"{lead} {r['wall_s']:>8.3f} {r['cpu_s']:>8.3f} {r['failures']:>6} {r['days']:>8.2f}{ok}", flush=True)


def _pair(py: Path, params: dict[str, Any], strategy: str, seed: int,
          timeout: float) -> dict[str, Optional[dict[str, Any]]]:
    """One AIReSim and one rollcall replicate, one after the other, first one swapped every other
    pair (so a slow or quick spell of a shared machine does not favour either)."""
    me = str(Path(__file__).resolve())
    cmds = {"AIReSim": [str(py), me, "--airesim-child", json.dumps(params), str(seed)],
            "rollcall": [sys.executable, me, "--rollcall-child", strategy, str(seed)]}
    order = list(cmds) if (seed + STRATEGIES.index(strategy)) % 2 == 0 else list(cmds)[::-1]
    out = {}
    for sim in order:
        out[sim] = _spawn(cmds[sim], timeout)
        _print_row(sim, strategy, seed, out[sim])
    return out


def _summary(strategy: str, pairs: list[dict[str, Optional[dict[str, Any]]]],
             params: dict[str, Any], mtbf_s: float, nodes: int) -> None:
    """Per strategy: median CPU and wall ratios AIReSim / rollcall, and both failure counts next to
    what each model expects (AIReSim: job servers x compute time; rollcall: all nodes x run length)."""
    done = [p for p in pairs if None not in p.values()]
    if not done:
        print(f"== {strategy}: no complete pair")
        return
    a, r = [p["AIReSim"] for p in done], [p["rollcall"] for p in done]
    cpu = statistics.median(x["cpu_s"] / y["cpu_s"] for x, y in zip(a, r))
    wall = statistics.median(x["wall_s"] / y["wall_s"] for x, y in zip(a, r))
    verdict = "met" if cpu >= GOAL else "NOT met"
    print(f"== {strategy}: speed lead (median cpu AIReSim / rollcall) {cpu:.2f}x over {len(done)} pair(s), "
          f"wall {wall:.2f}x; goal >= {GOAL:g}x {verdict}")
    a_exp = params["job_size"] * params["job_length"] * params["random_failure_rate"]
    r_exp = nodes * statistics.median(y["days"] for y in r) * 86400 / mtbf_s
    print(f"   failures: AIReSim {[x['failures'] for x in a]} (expects {a_exp:.0f}), "
          f"rollcall {[y['failures'] for y in r]} (expects {r_exp:.0f} over its median run)")


def compare(py: Path, replicates: int, strategies: list[str], timeout: float, cold: bool) -> None:
    """The side-by-side run: the mapping, one row per replicate, then the summaries."""
    sc = rollcall_scenario(strategies[0], 0)
    params = cold_spares(airesim_params(sc)) if cold else airesim_params(sc)
    print("AIReSim params for", SCENARIO, json.dumps(params, indent=1))
    print(f"{'sim':<8} {'strategy':<19} {'seed':>4} {'wall s':>8} {'cpu s':>8} {'fails':>6} {'days':>8}")
    pairs: dict[str, list[dict[str, Optional[dict[str, Any]]]]] = {s: [] for s in strategies}
    for seed in range(replicates):
        for strategy in strategies:
            pairs[strategy].append(_pair(py, params, strategy, seed, timeout))
    for strategy in strategies:
        _summary(strategy, pairs[strategy], params, sc.failures.worker_mtbf_s,
                 sc.cluster.workers + sc.cluster.spares)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--airesim-src", type=Path, default=MIRROR,
                    help="AIReSim's source: a git directory (HEAD) or a checkout (default: %(default)s)")
    ap.add_argument("--keep-env", type=Path, metavar="DIR",
                    help="build the AIReSim env here (or reuse it) and keep it")
    ap.add_argument("--replicates", type=int, default=5)
    ap.add_argument("--strategy", choices=STRATEGIES)
    ap.add_argument("--cold-spares", action="store_true",
                    help="map cluster.spares to AIReSim's spare pool instead of its warm standbys")
    ap.add_argument("--timeout", type=float, default=600.0, help="per child run, seconds")
    ap.add_argument("--airesim-child", nargs=2, metavar=("PARAMS", "SEED"), help=argparse.SUPPRESS)
    ap.add_argument("--rollcall-child", nargs=2, metavar=("STRATEGY", "SEED"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.airesim_child:
        print(json.dumps(airesim_child(json.loads(args.airesim_child[0]), int(args.airesim_child[1]))))
        return 0
    if args.rollcall_child:
        print(json.dumps(rollcall_child(args.rollcall_child[0], int(args.rollcall_child[1]))))
        return 0
    strategies = [args.strategy] if args.strategy else list(STRATEGIES)
    with scratch_env(args.airesim_src, args.keep_env) as py:
        compare(py, args.replicates, strategies, args.timeout, args.cold_spares)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
