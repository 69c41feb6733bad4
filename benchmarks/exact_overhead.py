"""Step time of exact vs fast reduction on the real target (not a test).

    .venv/bin/python benchmarks/exact_overhead.py [--workers 4] [--steps 150]
                                                  [--params 20000,1000000] [--runs 3] [--lr 0.005]

For each model size, runs the real target (``--workers`` gloo processes on CPU,
no faults) alternately with ``strategy.reduction: fast`` and ``exact``,
``--runs`` times each, on the same data and seed, and prints the median step
time of each (the worker's step start to the keeper's commit, first 10 steps
skipped as warm-up) and the ratio exact / fast. Alternating the runs spreads
any change in machine load over both modes. Goal: under 1.3x.

What exact mode adds per step (see ``real/reduce.py``): a gradient per
micro-batch instead of one accumulated gradient, four or five passes over
each to find its largest entry and encode it as int32 fixed point into the
step's sum (a worker's first is converted straight into it), one to decode;
the same bytes on the wire (int32); a scalar MAX allreduce only when the
scale guessed from the momentum fails (the first step, a gradient spike).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rollcall.results import read_history  # noqa: E402
from rollcall.scenario import parse_scenario  # noqa: E402

WARMUP_STEPS = 10


def scenario(reduction: str, workers: int, steps: int, params: int, lr: float):
    raw = {
        "name": f"exact-overhead-{reduction}",
        "seed": 3,
        "target": "real",
        "cluster": {"workers": workers},
        "workload": {"steps": steps, "global_batch": 64, "micro_batch": 8,
                     "dataset_samples": 4096, "model_params": params, "lr": lr},
        "detector": {"heartbeat_s": 0.1, "timeout_s": 5.0},
        "rendezvous": {"last_call_s": 0.2},
        "strategy": {"kind": "elastic", "reduction": reduction},
    }
    return parse_scenario(yaml.safe_dump(raw), "<exact_overhead>")


def step_times(out: Path) -> list[float]:
    return [r["t"] - r["t0"] for r in read_history(out)
            if r["f"] == "commit" and r["step"] >= WARMUP_STEPS]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--params", default="20000,1000000",
                   help="comma-separated model sizes (parameters)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.005,
                   help="learning rate (0.05 diverges for the 1M-parameter MLP)")
    args = p.parse_args(argv)
    from real import driver

    print(f"{args.workers} workers, {args.steps} steps, global batch 64 in 8 micro-batches, "
          f"{args.runs} runs per mode, median step time after {WARMUP_STEPS} warm-up steps")
    print(f"{'params':>10} {'fast ms':>9} {'exact ms':>9} {'exact/fast':>10}  sha equal across runs")
    worst = 0.0
    with tempfile.TemporaryDirectory(prefix="rollcall-exact-") as tmp:
        for params in (int(x) for x in args.params.split(",")):
            times: dict[str, list[float]] = {"fast": [], "exact": []}
            shas: dict[str, set[str]] = {"fast": set(), "exact": set()}
            for i in range(args.runs):
                for mode in ("fast", "exact"):
                    out = Path(tmp) / f"{params}-{mode}-{i}"
                    s = driver.run(scenario(mode, args.workers, args.steps, params, args.lr), out)
                    if not s["completed"]:
                        print(f"  {mode} run {i} did not complete: {s['end_reason']}")
                        return 1
                    times[mode].append(statistics.median(step_times(out)))
                    shas[mode].add(s["final_weights_sha256"])
            fast = statistics.median(times["fast"])
            exact = statistics.median(times["exact"])
            ratio = exact / fast
            worst = max(worst, ratio)
            same = ", ".join(f"{m}: {'yes' if len(v) == 1 else 'no'}" for m, v in shas.items())
            print(f"{params:>10} {fast * 1e3:>9.2f} {exact * 1e3:>9.2f} {ratio:>9.2f}x  {same}")
    print(f"worst ratio {worst:.2f}x (goal < 1.3x): {'met' if worst < 1.3 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
