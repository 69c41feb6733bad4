"""How good is ``validate --plan``'s wall-time estimate of the sim? (not a test)

For each scenario and strategy: calibrate the unit costs as ``--plan``
does, estimate, then run the sim for real (history written and checked, as
a user's run) and print estimate, measured ``wall_s`` and their ratio. The
goal is a ratio within 10x either way; a row outside it is
marked and the exit status is 1.

    .venv/bin/python benchmarks/plan_estimate.py             # quickstart, llama-like small, llama3-54d
    .venv/bin/python benchmarks/plan_estimate.py --big       # and gpu100k-30d

Tests do not time anything (wall time is the machine's, not the code's);
tests/test_plan.py checks the model's arithmetic on given unit costs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rollcall.app.plan import calibrate, plan, sim_wall_estimate, sim_work  # noqa: E402
from rollcall.scenario import load_scenario  # noqa: E402
from sim.driver import LEDGER_SAMPLES, run  # noqa: E402

#: a Llama-3-like job scaled down: 256 servers, a tenth of the steps, same failure rate
LLAMA_SMALL = ["cluster.gpus=2048", "rendezvous.min_workers=75%", "rendezvous.max_workers=100%",
               "workload.per_worker_batch=16", "workload.steps=51840", "cluster.spares=8",
               "failures.per_1000_node_days=3.8"]
CASES = [("quickstart", "quickstart.yaml", []),
         ("llama-small", "llama3-54d.yaml", LLAMA_SMALL),
         ("llama3-54d", "llama3-54d.yaml", [])]
BIG = [("gpu100k-30d", "gpu100k-30d.yaml", [])]
FACTOR = 10.0


def one(label: str, file: str, sets: list[str], strategy: str) -> bool:
    sc = load_scenario(ROOT / "scenarios" / file, sets, strategy=strategy)
    costs = calibrate(sc)
    est = sim_wall_estimate(sim_work(sc, plan(sc), LEDGER_SAMPLES), costs)
    with tempfile.TemporaryDirectory(prefix="plan-estimate-") as tmp:
        measured = run(sc, Path(tmp))
    ratio = est["wall_s"] / measured["wall_s"]
    ok = 1 / FACTOR <= ratio <= FACTOR
    print(f"{label:12s} {strategy:18s} estimate {est['wall_s']:8.3f} s  measured "
          f"{measured['wall_s']:8.3f} s  ratio {ratio:5.2f}  failures {est['failures']:7.1f} "
          f"est / {measured['failures']:5d} seen{'' if ok else '  OUTSIDE 10x'}", flush=True)
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--big", action="store_true", help="also the 100k-GPU scenario (a few s)")
    args = ap.parse_args()
    good = True
    for label, file, sets in CASES + (BIG if args.big else []):
        for strategy in ("elastic", "checkpoint-restart"):
            good = one(label, file, sets, strategy) and good
    return 0 if good else 1


if __name__ == "__main__":
    raise SystemExit(main())
