"""Where the sim's time goes, this tree against another (not a test).

The speed goal compares the Llama-3 case with the tree before the core's
agents and commit votes (2e38b0a). ``sim_scale.py --against`` gives the ratio; this script
says which part of a run holds the difference. Each tree runs in a child
process (a ``git archive`` of REV for the other), the same seeds one after
the other, and the child times, around the calls the driver makes:

* ``keeper``: every input to the core's Keeper (the driver's own
  ``keeper_wall_s``);
* ``commit``: the commit votes (``Keeper.commit``, which the driver calls
  directly; 2e38b0a had no commit vote);
* ``agents``: the bulk agents' answers (:class:`rollcall.core.agents.AgentBatch`,
  which 2e38b0a's driver wrote by hand);
* ``check``: the history checkers at the end of the run (``check_wall_s``);
* ``rest``: the driver, simpy and the history writer.

Times are seconds per run (wall, perf_counter: a busy machine inflates them; run it quiet), the median over the seeds; the wrappers add
well under a millisecond per run.

    .venv/bin/python benchmarks/sim_breakdown.py --against 2e38b0a --seeds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from sim_scale import archive  # this script's folder: a git archive of another tree

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("total", "keeper", "commit", "agents", "check", "rest")
AGENT_CALLS = ("receive", "step_committed", "start", "discard", "take", "absorb", "reconnected",
               "state_ready", "step_failed", "checkpointed", "leave", "handle_timer")


def child(root: Path, strategy: str, seeds: int) -> dict[str, list[float]]:
    sys.path.insert(0, str(root))
    from rollcall.scenario import load_scenario
    from sim.driver import Simulation

    spent = {"agents": 0.0, "commit": 0.0}

    def timed(cls: Any, name: str, part: str) -> None:
        fn = getattr(cls, name, None)
        if fn is None:
            return

        def wrapper(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[part] += time.perf_counter() - t
        setattr(cls, name, wrapper)

    try:
        from rollcall.core.agents import AgentBatch
    except ImportError:  # the tree has no bulk agents
        AgentBatch = None
    for name in AGENT_CALLS if AgentBatch is not None else ():
        timed(AgentBatch, name, "agents")
    from rollcall.core.keeper import Keeper
    timed(Keeper, "commit", "commit")
    out: dict[str, list[float]] = {p: [] for p in PARTS}
    for seed in range(seeds):
        sc = load_scenario(root / "scenarios" / "llama3-54d.yaml", seed=seed, strategy=strategy)
        spent.update(agents=0.0, commit=0.0)
        sim = Simulation(sc, None)
        t = time.perf_counter()
        s = sim.run()
        total = time.perf_counter() - t
        parts = {"total": total, "keeper": s["keeper_wall_s"], "commit": spent["commit"],
                 "agents": spent["agents"], "check": s["check_wall_s"]}
        parts["rest"] = total - sum(parts[p] for p in PARTS[1:-1])
        for p in PARTS:
            out[p].append(parts[p])
    return out


def _run_child(root: Path, strategy: str, seeds: int) -> dict[str, list[float]]:
    p = subprocess.run([sys.executable, __file__, "--child", str(root), strategy, str(seeds)],
                       capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise SystemExit(f"sim_breakdown: child failed: {p.stderr.strip().splitlines()[-1:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", metavar="REV", default="2e38b0a")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        root, strategy, seeds = args.child
        print(json.dumps(child(Path(root), strategy, int(seeds))))
        return 0
    with tempfile.TemporaryDirectory(prefix="simbreak-") as tmp:
        base = archive(args.against, Path(tmp) / "base")
        return 2 if base is None else _compare(args, base)


def _compare(args: argparse.Namespace, base: Path) -> int:
    med: Callable[[list[float]], float] = statistics.median
    print(f"llama3-54d, {args.seeds} seeds per tree, ms per run (median)")
    print(f"{'strategy':<19} {'tree':<8} " + " ".join(f"{p:>8}" for p in PARTS))
    for strategy in ("checkpoint-restart", "elastic"):
        this = _run_child(ROOT, strategy, args.seeds)
        that = _run_child(base, strategy, args.seeds)
        for tag, r in (("this", this), (args.against, that)):
            print(f"{strategy:<19} {tag:<8} " + " ".join(f"{1000 * med(r[p]):>8.1f}" for p in PARTS))
        gap = med(this["total"]) - med(that["total"])
        print(f"{strategy:<19} {'delta':<8} " + " ".join(
            f"{1000 * (med(this[p]) - med(that[p])):>+8.1f}" for p in PARTS)
            + f"   ratio {med(this['total']) / med(that['total']):.2f}, "
              f"gap {1000 * gap:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
