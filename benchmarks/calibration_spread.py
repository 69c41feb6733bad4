"""How far the calibration suite's 15% goal can be seen on this machine (not a test).

``benchmarks/sim_vs_real.py --out DIR --suite FILE`` compares one suite with
one set of real runs. Both are measured once, on a machine whose speed
drifts, so a single table mixes the model's error with the machine's. This
script reads several such sets (the real runs in each DIR) and several
suite files, and prints:

* the real target against itself: for each shipped real scenario, its
  ``elapsed_s`` in every set and their spread, and how many ordered pairs
  of runs (one run taken as the prediction of another) are within 15%:
  the best any model of one run can do here;
* every suite against every set: scenarios within 15%, the mean and worst
  absolute error;
* every suite against the mean of the sets' runs.

Each prediction is a sim run of the scenario calibrated by the suite
(``rollcall.app.suite.calibrated``), as ``sim_vs_real.py`` runs it.

    .venv/bin/python benchmarks/sim_vs_real.py --out D1 --suite S1.yaml   # and D2/S2, D3/S3
    .venv/bin/python benchmarks/calibration_spread.py --runs D1 D2 D3 --suites S1.yaml S2.yaml S3.yaml
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rollcall.app import suite  # noqa: E402
from rollcall.results import SUMMARY_FILE, read_summary  # noqa: E402
from rollcall.scenario import load_scenario  # noqa: E402

import sim_vs_real  # noqa: E402  (this script's folder)

GOAL = 0.15


def _predict(path: Path, doc: dict) -> float:
    """The sim's ``elapsed_s`` for the real scenario at ``path`` under suite
    ``doc``, run as ``sim_vs_real.py`` runs it (its run directory removed)."""
    sc = suite.calibrated(load_scenario(path, [], target="real"), doc)
    with tempfile.TemporaryDirectory(prefix="calspread-") as tmp:
        return float(sim_vs_real._run(sc, Path(tmp) / "sim")["elapsed_s"])


def _real(dirs: list[Path], names: list[str]) -> dict[str, list[float]]:
    out = {}
    for name in names:
        runs = [d / name / "real" for d in dirs]
        if all((r / SUMMARY_FILE).exists() for r in runs):
            out[name] = [float(read_summary(r)["elapsed_s"]) for r in runs]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", nargs="+", required=True, metavar="DIR",
                    help="sim_vs_real.py output directories (their real runs are read)")
    ap.add_argument("--suites", nargs="+", required=True, metavar="FILE",
                    help="calibration suite files (rollcall calibrate --suite --out FILE)")
    args = ap.parse_args(argv)
    dirs = [Path(d) for d in args.runs]
    paths = {p.stem: p for p in sorted((ROOT / "scenarios").glob("real-*.yaml"))}
    real = _real(dirs, sorted(paths))
    if not real:
        print("calibration_spread: no scenario has a real run in every --runs directory",
              file=sys.stderr)
        return 2
    print(f"real against real ({len(dirs)} runs of each of {len(real)} scenarios):")
    within = total = 0
    for name, xs in real.items():
        spread = (max(xs) - min(xs)) / min(xs)
        print(f"  {name:<26} " + " ".join(f"{x:8.3f}" for x in xs) + f"   spread {spread:4.0%}")
        for a, b in itertools.permutations(xs, 2):
            total += 1
            within += abs(a - b) / b <= GOAL
    print(f"  one run as the prediction of another: {within}/{total} within 15%")
    docs = {s: suite.read_any(s) for s in args.suites}
    pred = {(s, n): _predict(paths[n], doc) for s, doc in docs.items() for n in real}
    print("suite against each set of real runs:")
    counts = []
    for s, (i, d) in itertools.product(docs, enumerate(dirs)):
        errs = [(pred[s, n] - xs[i]) / xs[i] for n, xs in real.items()]
        counts.append(sum(abs(e) <= GOAL for e in errs))
        print(f"  {s} vs {d}: {counts[-1]}/{len(errs)} within 15%, mean |error| "
              f"{statistics.mean(map(abs, errs)):.3f}, worst {max(map(abs, errs)):.2f}")
    print(f"  in all: {sum(counts)}/{len(counts) * len(real)} within 15%")
    print("suite against the mean of the real runs:")
    for s in docs:
        errs = {n: (pred[s, n] - statistics.mean(xs)) / statistics.mean(xs) for n, xs in real.items()}
        miss = {n: round(e, 3) for n, e in errs.items() if abs(e) > GOAL}
        print(f"  {s}: {len(errs) - len(miss)}/{len(errs)} within 15%; misses {miss}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
