"""Slow is not dead: detectors and straggler policies, on the sim (not a test).

One job of ``--workers`` (1,000 and 10,000 by default) with a mix of gray and
hard failures, run once per detector setting and once per straggler policy
on the same seed:

* machines that die (``failures.worker_mtbf_s``: ``--crashes`` expected in
  the run, each a ``crash``: no exit notice, only the detector can tell);
* workers whose heartbeats arrive ``--late-s`` late for 10 s while their
  work is on time (``late_heartbeats: random``, ``--late`` of them);
* workers that stop for ``--pause-s`` (``pause: random``, ``--pauses``);
* stragglers: random slowdowns (``failures.slow_mtbf_s``: ``--slowdowns``
  expected in the run, each ``slow_factor`` ``{median: --slow-median,
  spread: 0.5}`` times slower for ``--slow-for-s``);

and for each detector (stragglers kept) (``timeout`` at several ``timeout_s``, ``phi`` at
several thresholds) prints goodput, false evictions (a worker evicted for
silence while its beats were merely late: it comes back as a newcomer, the
job pays a roll call and a state copy), true evictions and how long a dead
machine took to be declared dead on average (the job stalls that long: its
collective waits for the dead member), and the time the job stalled.

The expectation where one exists: a dead member is declared after the
detector's silence (``timeout_s``; phi: ``threshold * ln 10 *
heartbeat_s``) less, on average, half a heartbeat (its last beat came that
long before it died); a late-beat worker is evicted iff ``late_s +
heartbeat_s`` exceeds that silence.

Then, with the default detector (a 3 s timeout), for each straggler policy
(``keep``; ``evict`` at several ``straggler_factor``, ``straggler_steps`` and
``straggler_holdout_s``: ``evict FxK hH``)
the same goodput and stall, the straggler evictions, and the time the job
ran with a slow member. The expectation: with one straggler of factor F the
step is max-bound, ``max(k, F * k) * micro_batch_s + allreduce_s`` for ``k``
micro-batches each; without it, each of the ``n - 1`` others takes
``ceil(k * n / (n - 1))`` (``k + 1`` for ``n > k``), so eviction pays only
for ``F > (k + 1) / k`` (printed per run: ``evict if F >``), and the keeper's
arithmetic evicts exactly those.

    .venv/bin/python benchmarks/detectors.py
    .venv/bin/python benchmarks/detectors.py --workers 1000 --late-s 6
    .venv/bin/python benchmarks/detectors.py --workers 1000 --per-worker 1
    .venv/bin/python benchmarks/detectors.py --workers 1000 --real   # + real runs
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TIMEOUTS = (1.5, 3.0, 6.0)
THRESHOLDS = (2.0, 4.0, 8.0, 16.0)


MICRO_BATCH_S = 0.05 / 4  # the quickstart's 50 ms per worker and step, in 4 micro-batches
# (straggler_factor, straggler_steps, straggler_holdout_s); the first is the default
STRAGGLER_POLICIES = (("keep", ["strategy.stragglers=keep"]),) + tuple(
    (f"evict {f:g}x{k} h{h:g}", ["strategy.stragglers=evict", f"strategy.straggler_factor={f}",
                                f"strategy.straggler_steps={k}", f"strategy.straggler_holdout_s={h}"])
    for f, k, h in ((2.0, 5, 30), (1.5, 5, 30), (3.0, 5, 30), (2.0, 20, 30), (2.0, 5, 10),
                    (2.0, 5, 120)))


def scenario(workers: int, steps: int, args: argparse.Namespace, detector: list[str]):
    from rollcall.scenario import load_scenario

    k = args.per_worker
    mb_s = MICRO_BATCH_S * 4 / k
    step_s = k * mb_s + 0.005
    span = steps * step_s
    faults = [f"{{at_s: {span * (i + 1) / (args.late + 1):.3f}, late_heartbeats: random, "
              f"delay_s: {args.late_s}, for_s: 10.0}}" for i in range(args.late)]
    faults += [f"{{at_s: {span * (i + 0.5) / (args.pauses + 1):.3f}, pause: random, "
               f"for_s: {args.pause_s}}}" for i in range(args.pauses)]
    mtbf = workers * span / max(args.crashes, 1e-9)
    slow = [f"failures.slow_mtbf_s={workers * span / args.slowdowns:.1f}",
            f"failures.slow_factor={{median: {args.slow_median}, spread: 0.5}}",
            f"failures.slow_for_s={args.slow_for_s}"] if args.slowdowns > 0 else []
    return load_scenario(ROOT / "scenarios" / "quickstart.yaml", [
        f"cluster.workers={workers}", "cluster.spares=0", f"rendezvous.max_workers={workers}",
        f"workload.global_batch={8 * k * workers}", f"workload.dataset_samples={64 * k * workers}",
        f"workload.micro_batch_s={mb_s}", f"workload.steps={steps}", *slow,
        f"failures.worker_mtbf_s={mtbf:.1f}", "cluster.repair_s=120",
        "strategy.checkpoint_interval_steps=2000",
        f"failures.schedule=[{', '.join(faults)}]", f"seed={args.seed}", *detector])


def measure(sc) -> dict:
    from rollcall.results import read_history
    from sim.driver import run

    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        summary = run(sc, Path(d))
        wall = time.perf_counter() - t0
        late: dict[int, tuple[float, float]] = {}  # worker -> (from, to) its beats were late
        crashed: dict[int, float] = {}
        false_ev = true_ev = slow_ev = slowdowns = kept = 0
        lags = []
        delays = []
        for r in read_history(d):
            if r["f"] == "fault" and r["kind"] == "slow" and r["workers"]:
                slowdowns += 1
            elif r["f"] == "evict" and r["reason"] == "straggler":
                slow_ev += 1
                lags.append(r["lag"])
            elif r["f"] == "straggler":
                kept += 1
            if r["f"] == "fault" and r["kind"] == "late_heartbeats":
                for w in r["workers"]:
                    late[w] = (r["t"], r["t"] + r["for_s"] + r["delay_s"])
            elif r["f"] == "fault" and r["kind"] == "crash":
                for w in r["workers"]:
                    crashed[w] = r["t"]
            elif r["f"] == "evict" and r["reason"] == "timeout":
                w, t = r["worker"], r["t"]
                if w in crashed:
                    true_ev += 1
                    delays.append(t - crashed.pop(w))
                elif w in late and late[w][0] <= t <= late[w][1]:
                    false_ev += 1
    assert summary["valid"], summary["violations"]
    return {"goodput": summary["goodput"], "false": false_ev, "true": true_ev,
            "detect_s": sum(delays) / len(delays) if delays else math.nan,
            "stall_s": summary["stall_s"], "wall_s": wall, "elapsed_s": summary["elapsed_s"],
            "slowdowns": slowdowns, "slow_ev": slow_ev, "kept": kept,
            "min_lag": min(lags) if lags else math.nan}


REAL_SETTINGS = (("timeout 1 s", ["detector.kind=timeout", "detector.timeout_s=1.0"]),
                 ("timeout 2 s", ["detector.kind=timeout", "detector.timeout_s=2.0"]),
                 ("phi 4", ["detector.kind=phi", "detector.phi_threshold=4"]),
                 ("phi 8", ["detector.kind=phi", "detector.phi_threshold=8"]))


def real_points() -> None:
    """A few points on real processes: ``scenarios/real-late-heartbeats.yaml``
    (worker 2's beats 1.5 s late for 2 s; 100 ms heartbeats) and the same job
    with worker 2 paused for 4 s instead, per detector: whether the late
    worker was evicted (false), and how long the keeper took to evict the
    paused one (from the SIGSTOP)."""
    from realrun import real_records

    print("== real, 4 workers: late beats (+1.5 s) and a 4 s pause, heartbeat_s 0.1")
    print(f"{'detector':>12} {'late: evicted':>13} {'pause: evicted after s':>22}")
    pause = "failures.schedule=[{at_step: 10, pause: 2, for_s: 4.0}]"
    for name, det in REAL_SETTINGS:
        late, _ = real_records("real-late-heartbeats", det)
        paused, _ = real_records("real-late-heartbeats", [*det, pause])
        fault = next(r for r in paused if r["f"] == "fault" and r["kind"] == "pause")
        ev = [r["t"] - fault["t"] for r in paused if r["f"] == "evict" and r["worker"] == 2]
        print(f"{name:>12} {str(any(r['f'] == 'evict' for r in late)):>13} "
              f"{(f'{ev[0]:.2f}' if ev else 'not evicted'):>22}")


def stragglers(n: int, args: argparse.Namespace) -> None:
    """The straggler policies on the same job, the detector a 3 s timeout."""
    k = args.per_worker
    print(f"-- straggler policies ({k} micro-batches each: evict if F > {(k + 1) / k:g})")
    print(f"{'policy':>18} {'goodput':>8} {'elapsed s':>9} {'slowdowns':>9} {'evicted':>7} "
          f"{'min lag':>7} {'kept':>4} {'stall s':>8} {'wall s':>6}")
    base = None
    for name, policy in STRAGGLER_POLICIES:
        m = measure(scenario(n, args.steps, args, ["detector.kind=timeout",
                                                   "detector.timeout_s=3.0", *policy]))
        base = base or m["elapsed_s"]
        print(f"{name:>18} {m['goodput']:>8.4f} {m['elapsed_s']:>9.1f} {m['slowdowns']:>9} "
              f"{m['slow_ev']:>7} {m['min_lag']:>7.2f} {m['kept']:>4} {m['stall_s']:>8.1f} "
              f"{m['wall_s']:>6.1f}   x{m['elapsed_s'] / base:.3f} of keep's time")


def real_stragglers() -> None:
    """``scenarios/real-straggler.yaml`` on real processes with the 4x
    slowdown lasting the whole run: the training time under ``keep`` and
    under ``evict``, and the step's compute the keeper weighed (its evict
    record: with the straggler, without it)."""
    from realrun import real_records

    print("== real, 4 workers: worker 2 computes 4x slower from step 10 to the end")
    print(f"{'policy':>8} {'evicted':>7} {'train s':>8} {'with s':>9} {'without s':>9}")
    lasting = ["failures.schedule=[{at_step: 10, slow: 2, factor: 4, for_s: 1000.0}]",
               "strategy.straggler_holdout_s=1000", "strategy.straggler_factor=3.0"]
    times = {}
    for policy in ("keep", "evict"):
        recs, _ = real_records("real-straggler", [*lasting, f"strategy.stragglers={policy}"])
        start = next(r["t"] for r in recs if r["f"] == "generation")
        end = next(r["t"] for r in recs if r["f"] == "end")
        times[policy] = end - start
        ev = [r for r in recs if r["f"] == "evict" and r["reason"] == "straggler"]
        with_s = f"{ev[0]['step_s'] * 1e3:.2f} ms" if ev else "-"
        without_s = f"{ev[0]['without_s'] * 1e3:.2f} ms" if ev else "-"
        print(f"{policy:>8} {len(ev):>7} {times[policy]:>8.2f} {with_s:>9} {without_s:>9}")
    print(f"evict / keep training time: {times['evict'] / times['keep']:.3f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--crashes", type=float, default=6.0, help="expected machine deaths")
    ap.add_argument("--late", type=int, default=6, help="late_heartbeats faults")
    ap.add_argument("--late-s", type=float, default=4.0)
    ap.add_argument("--pauses", type=int, default=3)
    ap.add_argument("--pause-s", type=float, default=20.0)
    ap.add_argument("--slowdowns", type=float, default=6.0, help="expected random slowdowns")
    ap.add_argument("--slow-median", type=float, default=3.0, help="their median factor")
    ap.add_argument("--slow-for-s", type=float, default=30.0)
    ap.add_argument("--per-worker", type=int, default=4, help="micro-batches per worker and step")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--real", action="store_true", help="also a few points on real processes")
    args = ap.parse_args()
    settings = [(f"timeout {t:g} s", ["detector.kind=timeout", f"detector.timeout_s={t}"])
                for t in TIMEOUTS]
    settings += [(f"phi {p:g}", ["detector.kind=phi", f"detector.phi_threshold={p}"])
                 for p in THRESHOLDS]
    for n in args.workers:
        print(f"== {n} workers, {args.steps} steps, seed {args.seed}: {args.crashes:g} deaths "
              f"expected, {args.late} late-beat workers (+{args.late_s:g} s), "
              f"{args.pauses} pauses of {args.pause_s:g} s, {args.slowdowns:g} slowdowns "
              f"(median {args.slow_median:g}x, {args.slow_for_s:g} s)")
        print(f"{'detector':>14} {'silence s':>9} {'goodput':>8} {'false ev':>8} {'true ev':>7} "
              f"{'detect s':>8} {'stall s':>8} {'wall s':>6}")
        for name, det in settings:
            sc = scenario(n, args.steps, args, det)
            m = measure(sc)
            print(f"{name:>14} {sc.detector.silence_s:>9.2f} {m['goodput']:>8.4f} "
                  f"{m['false']:>8} {m['true']:>7} {m['detect_s']:>8.2f} {m['stall_s']:>8.1f} "
                  f"{m['wall_s']:>6.1f}")
        stragglers(n, args)
    if args.real:
        real_points()
        real_stragglers()
    return 0


if __name__ == "__main__":
    sys.exit(main())
