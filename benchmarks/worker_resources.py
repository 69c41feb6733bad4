"""Open fds and threads of long-lived real workers over many generations (not a test).

    .venv/bin/python benchmarks/worker_resources.py                 # 100 pauses: about 200 generations
    .venv/bin/python benchmarks/worker_resources.py --pauses 20 --hogs 1

The goal: a run of 200 generations should end with the same
open fds and threads per worker as after generation 2, within a few. The
run is ``real-pause-one`` made fast (tests/resource_probe.py): 3 workers, the
last paused past a 0.4 s detector timeout every 0.9 s, so each pause is an
eviction and a rejoin. Worker 0 is never faulted; the paused worker keeps
its process too (SIGSTOP, SIGCONT). Prints, per generation each entered,
the fewest and most fds and threads seen while it was the worker's latest
(sampled every 50 ms from /proc), then each worker's most in its 2nd and
3rd generations against its most in every later one, and the run's summary. ``--hogs`` busy-loop
processes compete for the cores meanwhile (stopped by PID at the end).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from realrun import cpu_hogs  # noqa: E402
from resource_probe import by_generation, pause_scenario, peaks, sample_run  # noqa: E402


def report(samples, worker: int) -> None:
    """Print ``worker``'s table and its peaks (see ``resource_probe.peaks``)."""
    print(f"worker {worker}: generation  fds(min-max)  threads(min-max)")
    for g, (lo_f, hi_f, lo_t, hi_t) in sorted(by_generation(samples, worker).items()):
        print(f"  {g:5d}  {lo_f:4d}-{hi_f:<4d}  {lo_t:3d}-{hi_t:<3d}")
    (f2, t2), (fe, te) = peaks(samples, worker)
    print(f"worker {worker}: most in its generations 2-3: {f2} fds, {t2} threads; "
          f"in every later one: {fe} fds, {te} threads")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/worker_resources.py")
    p.add_argument("--pauses", type=int, default=100, help="pauses of the last worker (2 generations each)")
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--period-s", type=float, default=0.9)
    p.add_argument("--timeout-s", type=float, default=0.4, help="the detector timeout")
    p.add_argument("--hogs", type=int, default=0, help="busy-loop processes beside the run")
    p.add_argument("--out", type=Path, default=None, help="run directory (default: a temporary one)")
    args = p.parse_args(argv)
    if args.pauses < 1 or args.workers < 2 or args.period_s <= 1.6 * args.timeout_s:
        print("worker_resources: need --pauses >= 1, --workers >= 2, --period-s > 1.6 * --timeout-s",
              file=sys.stderr)
        return 2
    scenario, wall_s = pause_scenario(args.pauses, args.workers, args.period_s, args.timeout_s)
    with cpu_hogs(args.hogs), tempfile.TemporaryDirectory(prefix="rollcall-resources-") as tmp:
        out = args.out or Path(tmp) / "run"
        watched = (0, args.workers - 1)
        summary, samples = sample_run(scenario, out, wall_s, watched)
    for w in watched:
        report(samples, w)
    print(f"generations {summary['generations']}, steps {summary['steps_committed']}, "
          f"valid {summary['valid']}, elapsed {summary['elapsed_s']:.1f} s, "
          f"{len(samples)} samples")
    return 0 if summary["valid"] else 1


if __name__ == "__main__":
    sys.exit(main())
