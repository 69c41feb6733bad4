"""A slow worker on the real target: does its compute follow ``factor``? (not a test)

Runs ``scenarios/real-late-heartbeats.yaml``'s job (4 workers) with worker 2
slowed ``factor`` times (``slow: 2``; real: the worker waits ``factor - 1``
times its compute after each step's gradients, ``real.trainer.Trainer.stretch``) for
``--for-s`` seconds from step 20, once per ``--factor``, and prints, from
the history:

* worker 2's gradient compute per step (its ``contribute`` records'
  ``compute_s``) while slowed, over the same before: the measured slowdown,
  beside ``factor`` (goal: the ratio follows ``factor``);
* the job's step time (commit ``t - t0``) while slowed, over before: what
  one straggler costs everyone in synchronous data parallelism, beside the
  max-bound expectation ``(rest + factor * compute) / (rest + compute)``
  with ``compute`` the slow worker's compute before and ``rest`` the rest
  of a step (exchange, commit vote).

    .venv/bin/python benchmarks/slow_worker.py                   # factors 2 4 8
    .venv/bin/python benchmarks/slow_worker.py --factor 3 --hogs 1
"""

from __future__ import annotations

import argparse
import statistics
import sys

from realrun import cpu_hogs, real_records


def ratios(recs: list[dict]) -> tuple[float, float, float]:
    fault = next(r for r in recs if r["f"] == "fault" and r["kind"] == "slow")
    heal = next(r for r in recs if r["f"] == "fault" and r["kind"] == "heal")
    lo, hi = fault["t"] + 0.2, heal["t"]  # a step in flight at the fault is half slow

    def med(xs: list[float]) -> float:
        assert xs, "no sample: a longer --for-s"
        return statistics.median(xs)

    mine = [r for r in recs if r["f"] == "contribute" and r["process"] == 2]
    c_before = med([r["compute_s"] for r in mine if r["t"] < fault["t"]])
    c_during = med([r["compute_s"] for r in mine if lo < r["t"] < hi])
    steps = [r for r in recs if r["f"] == "commit"]
    s_before = med([r["t"] - r["t0"] for r in steps if r["t"] < fault["t"]])
    s_during = med([r["t"] - r["t0"] for r in steps if lo < r["t"] < hi])
    rest = max(0.0, s_before - c_before)
    factor = fault["factor"]
    return c_during / c_before, s_during / s_before, (rest + factor * c_before) / (rest + c_before)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--factor", type=float, nargs="+", default=[2.0, 4.0, 8.0])
    ap.add_argument("--for-s", type=float, default=4.0)
    ap.add_argument("--hogs", type=int, default=0, help="CPU hog processes beside the runs")
    args = ap.parse_args()
    with cpu_hogs(args.hogs):
        print(f"{'factor':>6} {'compute x':>9} {'/factor':>7} {'step x':>6} {'max-bound x':>11}")
        for factor in args.factor:
            recs, _ = real_records("real-late-heartbeats", [
                f"failures.schedule=[{{at_step: 20, slow: 2, factor: {factor}, "
                f"for_s: {args.for_s}}}]", "workload.steps=600"])
            c, s, bound = ratios(recs)
            print(f"{factor:>6g} {c:>9.2f} {c / factor:>7.2f} {s:>6.2f} {bound:>11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
