"""Sweep throughput by engine, side by side in one run (not a test).

Replicates per second of a sweep with 1 and 2 local processes
and with Ray on 2 local workers. Each engine runs the same points (one
scenario, both strategies, ``--seeds`` seeds) into a fresh directory; the
rows must come out equal (wall-clock columns aside) or the run fails. A
Ray head's start-up (its own network namespace, token, processes) is timed
apart from the sweep, since a long sweep pays it once.

    .venv/bin/python benchmarks/sweep_throughput.py                    # llama3-54d, 8 seeds
    .venv/bin/python benchmarks/sweep_throughput.py --scenario scenarios/quickstart.yaml --seeds 40

Slurm is not measured: no Slurm cluster is reachable from this machine.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rollcall.app import sweeps as sweep  # noqa: E402
from rollcall.app.engines import open_engine  # noqa: E402

WALL = ("wall_s", "check_wall_s", "keeper_wall_s", "sim_per_wall")


def _run(scenario: str, seeds: int, out: Path, engine: Any, jobs: int) -> tuple[float, pd.DataFrame]:
    """Seconds the sweep took, and its rows without the wall-clock columns."""
    t = time.perf_counter()
    df = sweep.sweep(scenario, {}, seeds=seeds, out=out, jobs=jobs, progress=False, engine=engine)
    took = time.perf_counter() - t
    rows = df.drop(columns=[c for c in WALL if c in df.columns]).sort_values("run_dir",
                                                                              ignore_index=True)
    return took, rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", default=str(ROOT / "scenarios" / "llama3-54d.yaml"))
    p.add_argument("--seeds", type=int, default=8, help="seeds per strategy (default 8)")
    args = p.parse_args()
    n = 2 * args.seeds
    scratch = Path(tempfile.mkdtemp(prefix="rollcall-throughput-"))
    results: list[tuple[str, float, float]] = []
    try:
        took, ref = _run(args.scenario, args.seeds, scratch / "here", None, 1)
        results.append(("1 process (here)", took, 0.0))
        for label, name in (("2 local processes", "local"), ("Ray, 2 local workers", "ray")):
            t = time.perf_counter()
            engine = open_engine(name, jobs=2, log_path=str(scratch / f"{name}.log"))
            start = time.perf_counter() - t
            try:
                took, rows = _run(args.scenario, args.seeds, scratch / name, engine, 2)
            finally:
                engine.close()
            pd.testing.assert_frame_equal(rows, ref)  # the same rows wherever they ran
            results.append((label, took, start))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    base = n / results[0][1]
    print(f"{Path(args.scenario).name}: {n} replicates (2 strategies x {args.seeds} seeds), "
          f"rows identical across engines")
    print(f"{'engine':<24}{'start s':>9}{'sweep s':>9}{'reps/s':>9}{'x 1 proc':>10}")
    for label, took, start in results:
        print(f"{label:<24}{start:>9.2f}{took:>9.2f}{n / took:>9.2f}{n / took / base:>10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
