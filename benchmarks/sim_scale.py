"""Scale benchmark of the sim target (not a test).

Runs the Llama-3-sized scenario (scenarios/llama3-54d.yaml: 2,048 workers x
8 GPUs, 54 days of work, 3.8 failures per 1,000 worker-days) and the
100,000-GPU one (scenarios/gpu100k-30d.yaml: 12,500 x 8 GPUs, 30 days) with
both strategies, each replicate in a fresh child process so that its peak
resident memory is its own, and prints per run: wall seconds, simulated
seconds per wall second, simpy events per second, and simpy's raw event rate
measured in the same process just before (the ceiling: a bare timeout loop).

    .venv/bin/python benchmarks/sim_scale.py                 # both scenarios, 1 replicate
    .venv/bin/python benchmarks/sim_scale.py --replicates 3 --only llama3-54d
    .venv/bin/python benchmarks/sim_scale.py --profile llama3-54d elastic   # cProfile top 25
    .venv/bin/python benchmarks/sim_scale.py --against 2e38b0a --replicates 3 --only llama3-54d

``--against REV`` runs the same children on a ``git archive`` of REV too
(through this script, so a case it names runs on an older tree that did
not), alternating the two trees replicate by replicate (so load hits both
alike), and prints each row's cpu ratio (this tree / REV) and the median
per scenario and strategy: the side-by-side no-regression check. With
``--together`` each replicate runs the two trees' children at the same
time, one per core, the first launched alternating: a machine whose speed
drifts between children (a shared virtual machine's does, by up to 2x)
then slows both alike.

    .venv/bin/python benchmarks/sim_scale.py --against 6dbbc3b --together --replicates 10 --only gpu1m-30d --strategy elastic

Goals: Llama-3 < 1 s per replicate per strategy (aim 0.4 s); 100k GPUs
< 5 s and < 1 GiB resident; at 10^6 GPUs (``gpu1m-30d``: the 100k scenario
at 125,000 nodes) checkpoint-restart ends "not expected to finish" within
10 s and 1 GiB. ``cpu s`` is the child's CPU time (a
busy machine inflates wall time); ``keeper%`` is the share of the wall time
spent inside the core's Keeper (measured by the driver around each call).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = {"llama3-54d": ROOT / "scenarios" / "llama3-54d.yaml",
             "gpu100k-30d": ROOT / "scenarios" / "gpu100k-30d.yaml",
             "gpu1m-30d": ROOT / "scenarios" / "gpu100k-30d.yaml"}  # paths in this tree
# 10^6 GPUs: the 100k scenario at 125,000 nodes. Its job MTBF (176 s) is far
# below its restart (600 s): checkpoint-restart is not expected to finish,
# and the keeper's rule (rollcall.core.progress) must say so early (goal:
# within 10 s and 1 GiB); elastic runs the 30 days.
OVERRIDES = {"gpu1m-30d": ["cluster.workers=125000", "cluster.spares=4000",
                           "workload.global_batch=2000000", "rendezvous.min_workers=110000",
                           "rendezvous.max_workers=125000"]}
STRATEGIES = ("checkpoint-restart", "elastic")


def simpy_raw_rate(n: int = 200_000) -> float:
    """Events per second of a bare simpy process yielding timeouts."""
    import simpy

    env = simpy.Environment()

    def proc(env):
        for _ in range(n):
            yield env.timeout(1.0)

    env.process(proc(env))
    t = time.perf_counter()
    env.run()
    return n / (time.perf_counter() - t)


def child(name: str, strategy: str, seed: int, history: bool, root: Path = ROOT) -> dict:
    """One run of case ``name`` on the tree at ``root`` (its scenario file and code)."""
    sys.path.insert(0, str(root))
    from rollcall.scenario import load_scenario
    from sim.driver import Simulation

    raw = simpy_raw_rate()
    path = root / SCENARIOS[name].relative_to(ROOT)
    sc = load_scenario(path, OVERRIDES.get(name, ()), seed=seed, strategy=strategy)
    out = None
    if history:
        out = Path(tempfile.mkdtemp(prefix=f"simscale-{name}-"))
    t, c = time.perf_counter(), time.process_time()
    sim = Simulation(sc, out)
    s = sim.run()
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    if out is not None:
        shutil.rmtree(out, ignore_errors=True)  # the history was written: that was the cost
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB (Linux)
    return {"scenario": name, "strategy": strategy, "seed": seed, "wall_s": wall, "cpu_s": cpu,
            "keeper_wall_s": s["keeper_wall_s"], "check_wall_s": s["check_wall_s"],
            "sim_s": s["end_s"], "events": s["events"], "raw_events_per_s": raw,
            "failures": s["failures"], "generations": s["generations"], "restarts": s["restarts"],
            "valid": s["valid"], "completed": s["completed"], "goodput": s["goodput"],
            "end_reason": s["end_reason"],
            "peak_rss_mib": rss, "keeper_calls": s["keeper_calls"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicates", type=int, default=1)
    ap.add_argument("--only", choices=sorted(SCENARIOS))
    ap.add_argument("--strategy", choices=STRATEGIES)
    ap.add_argument("--timeout", type=float, default=600.0, help="per child run, seconds")
    ap.add_argument("--no-history", action="store_true",
                    help="keep the history in memory instead of writing history.jsonl")
    ap.add_argument("--child", nargs=3, metavar=("SCENARIO", "STRATEGY", "SEED"), help=argparse.SUPPRESS)
    ap.add_argument("--profile", nargs=2, metavar=("SCENARIO", "STRATEGY"))
    ap.add_argument("--against", metavar="REV", help="also run git revision REV, side by side")
    ap.add_argument("--together", action="store_true",
                    help="with --against: run the two trees' children at the same time")
    ap.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)  # a child's tree
    args = ap.parse_args()
    if args.together and not args.against:
        ap.error("--together compares two trees: give --against REV")
    if args.child:
        name, strategy, seed = args.child
        print(json.dumps(child(name, strategy, int(seed), not args.no_history, args.root)))
        return 0
    if args.profile:
        import cProfile
        import pstats
        cProfile.runctx("child(a, b, 0, False)", globals(), {"a": args.profile[0], "b": args.profile[1]},
                        "/tmp/sim_scale.prof")
        pstats.Stats("/tmp/sim_scale.prof").sort_stats("tottime").print_stats(25)
        return 0
    with tempfile.TemporaryDirectory(prefix="simscale-") as tmp:
        args.tmp = tmp  # the children's TMPDIR too: what a tree's child leaves goes with it
        trees = [("this", ROOT)]
        if args.against:
            base = archive(args.against, Path(tmp) / "base")
            if base is None:
                return 2
            trees.append((args.against, base))
        try:
            _compare(args, trees)
        except KeyboardInterrupt:  # the rows printed so far stand; no child is left
            print("sim_scale: interrupted", file=sys.stderr)
            return 2
    return 0


def _compare(args: argparse.Namespace, trees: list[tuple[str, Path]]) -> None:
    """Every scenario and strategy asked, each tree's child per replicate, side by side."""
    names = [args.only] if args.only else list(SCENARIOS)
    strategies = [args.strategy] if args.strategy else list(STRATEGIES)
    print(f"{'tree':<8} {'scenario':<12} {'strategy':<19} {'seed':>4} {'wall s':>8} {'cpu s':>7} "
          f"{'keeper%':>7} {'sim s/wall s':>13} {'events/s':>9} {'simpy raw/s':>11} {'fail':>5} "
          f"{'gens':>5} {'peak MiB':>9}  ok")
    for name in names:
        for strategy in strategies:
            ratios = []
            for seed in range(args.replicates):
                # the first launched alternates: neither tree always starts on a fresh machine
                order = trees if seed % 2 == 0 else trees[::-1]
                cpu = _replicate(order, name, strategy, seed, args)
                if args.against and None not in cpu.values():
                    ratios.append(cpu["this"] / cpu[args.against])
                    print(f"{'':<8} {'':<12} {'':<19} {seed:>4} cpu ratio this/{args.against}: "
                          f"{ratios[-1]:.2f}")
            if ratios:
                how = "run together" if args.together else "alternating"
                print(f"== {name} {strategy}: median cpu ratio this/{args.against} "
                      f"{statistics.median(ratios):.2f} over {len(ratios)} replicate(s) "
                      f"({how}; min {min(ratios):.2f}, max {max(ratios):.2f})")


def _replicate(trees: list[tuple[str, Path]], name: str, strategy: str, seed: int,
               args: argparse.Namespace) -> dict[str, Optional[float]]:
    """One replicate on each tree (one after the other, or with ``--together``
    at the same time), printed as rows: each tree's cpu seconds."""
    cpu: dict[str, Optional[float]] = {}
    launched: list[subprocess.Popen] = []
    try:
        for tag, root in trees:
            launched.append(_launch(root, name, strategy, seed, args))
            if not args.together:  # this one ends before the next starts
                cpu[tag] = _finish(tag, launched[-1], name, strategy, seed, args)
        if args.together:
            for (tag, _), child_process in zip(trees, launched):
                cpu[tag] = _finish(tag, child_process, name, strategy, seed, args)
    finally:  # interrupted: no child outlives this script
        for child_process in launched:
            if child_process.poll() is None:
                child_process.kill()
                child_process.wait()
    return cpu


def archive(rev: str, dest: Path) -> Optional[Path]:
    """A ``git archive`` of ``rev`` in ``dest``, or None (and why)."""
    git = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True)
    dest.mkdir()
    if git.returncode != 0:
        print(f"sim_scale: cannot archive {rev!r}: {git.stderr.decode().strip()}", file=sys.stderr)
        return None
    subprocess.run(["tar", "-x", "-C", str(dest)], input=git.stdout, check=True)
    return dest


def _launch(root: Path, name: str, strategy: str, seed: int,
            args: argparse.Namespace) -> subprocess.Popen:
    """A child of this script running case ``name`` on the tree at ``root``."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", name, strategy, str(seed),
           "--root", str(root)]
    if args.no_history:
        cmd.append("--no-history")
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": args.tmp})


def _finish(tag: str, child_process: subprocess.Popen, name: str, strategy: str, seed: int,
            args: argparse.Namespace) -> Optional[float]:
    """Wait for a child (``--timeout`` seconds at most), print its row: its cpu seconds."""
    lead = f"{tag:<8} {name:<12} {strategy:<19} {seed:>4}"
    try:
        out, err = child_process.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        child_process.kill()
        child_process.communicate()
        print(f"{lead} {'> ' + str(int(args.timeout)):>8}  (timed out)")
        return None
    if child_process.returncode != 0:
        print(f"{lead} failed: {err.strip().splitlines()[-1:]}")
        return None
    r = json.loads(out.strip().splitlines()[-1])
    keeper = 100 * r.get("keeper_wall_s", 0.0) / r["wall_s"]
    print(f"{lead} {r['wall_s']:>8.3f} "
          f"{r.get('cpu_s', float('nan')):>7.3f} {keeper:>6.0f}% "
          f"{r['sim_s'] / r['wall_s']:>13.3g} {r['events'] / r['wall_s']:>9.0f} "
          f"{r['raw_events_per_s']:>11.0f} {r['failures']:>5} {r['generations']:>5} "
          f"{r['peak_rss_mib']:>9.0f}  {_outcome(r)}", flush=True)
    return r.get("cpu_s")


def _outcome(r: dict) -> str:
    """``yes``: completed and valid; else what ended the run."""
    if r["valid"] and r["completed"]:
        return "yes"
    reason = r.get("end_reason", "")
    return f"{'valid' if r['valid'] else 'INVALID'}, not completed: {reason[:160]}"

if __name__ == "__main__":
    raise SystemExit(main())
