"""Predicted (sim, calibrated) vs measured (real) ``elapsed_s`` for every shipped real scenario.

For each ``scenarios/real-*.yaml``: run it on the real target, measure its
costs (``rollcall.app.calibrate``), run the same scenario on the sim with those
costs and print both elapsed times, the error, and whether the two agree on
the sequence of generations and member lists. Two predictions per scenario:

- ``self``: calibrated on the same run (what ``rollcall calibrate RUN_DIR``
  then ``--set`` gives; the goal is within 15%);
- ``xfer``: calibrated on ``real-kill-one``'s run (out of sample: does one
  calibration carry over to the other scenarios?);
- ``suite`` (with ``--suite FILE``): the calibration suite's model
  (``rollcall calibrate --suite --out FILE``), evaluated at each scenario's
  size: none of these runs was measured for it.

Usage::

    .venv/bin/python benchmarks/sim_vs_real.py [--out DIR] [--reuse] [--suite FILE] [SCENARIO ...]

``--reuse`` keeps real runs already in DIR (a real run costs ~30-60 s, most
of it ``import torch`` in each worker). Output: a table on stdout and
``sim_vs_real.csv`` in DIR.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rollcall.app import analysis, calibrate, suite  # noqa: E402
from rollcall.results import SUMMARY_FILE, prepare_out_dir, read_summary  # noqa: E402
from rollcall.scenario import load_scenario  # noqa: E402

REFERENCE = "real-kill-one"


def _gens(run_dir: Path) -> list[tuple[int, tuple[int, ...]]]:
    g = analysis.generations(run_dir)
    return [(int(a), tuple(b)) for a, b in zip(g.gen, g.members)]


def _run(scenario, out: Path) -> dict:
    prepare_out_dir(out, scenario)
    driver = __import__(f"{scenario.target}.driver", fromlist=["run"])
    return driver.run(scenario, out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenarios", nargs="*", help="real scenario files (default scenarios/real-*.yaml)")
    ap.add_argument("--out", help="directory for the runs (default: a temporary directory)")
    ap.add_argument("--reuse", action="store_true", help="reuse real runs already in --out")
    ap.add_argument("--suite", metavar="FILE", help="also predict with this calibration suite file")
    args = ap.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="sim-vs-real-"))
    paths = [Path(p) for p in args.scenarios] or sorted((ROOT / "scenarios").glob("real-*.yaml"))
    paths.sort(key=lambda p: p.stem != REFERENCE)  # the reference first: others use its calibration
    ref_cal = None
    suite_doc = suite.read_any(args.suite) if args.suite else None
    rows = []
    for path in paths:
        sc = load_scenario(path, [], target="real")
        real_dir = out / sc.name / "real"
        reusable = args.reuse and (real_dir / SUMMARY_FILE).exists() \
            and read_summary(real_dir).get("result") != "error"
        if not reusable:
            try:
                _run(sc, real_dir)
            except Exception as exc:  # noqa: BLE001 - one scenario's failure ends no other
                print(f"{sc.name}: real run failed: {exc}", flush=True)
                continue
        real = read_summary(real_dir)
        cal = calibrate.measure(real_dir)
        calibrate.write_calibration(cal, out / sc.name / calibrate.CALIBRATION_FILE)
        if sc.name == REFERENCE:
            ref_cal = cal
        row = {"scenario": sc.name, "strategy": sc.strategy.kind, "real_completed": real["completed"],
               "real_elapsed_s": real["elapsed_s"], "real_wall_s": real["wall_s"]}
        predictions = [("self", cal and calibrate.apply(sc, cal)),
                       ("xfer", ref_cal and calibrate.apply(sc, ref_cal)),
                       ("suite", suite_doc and suite.calibrated(sc, suite_doc))]
        for label, sim_sc in predictions:
            if not sim_sc:
                continue
            sim = _run(sim_sc, out / sc.name / f"sim-{label}")
            row[f"sim_{label}_elapsed_s"] = sim["elapsed_s"]
            row[f"err_{label}"] = (sim["elapsed_s"] - real["elapsed_s"]) / real["elapsed_s"]
            row[f"gens_agree_{label}"] = _gens(out / sc.name / f"sim-{label}") == _gens(real_dir)
        rows.append(row)
        print(pd.DataFrame([row]).to_string(index=False, float_format=lambda x: f"{x:.3f}"), flush=True)
    df = pd.DataFrame(rows)
    df.to_csv(out / "sim_vs_real.csv", index=False)
    print()
    print(df.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    for label in ("self", "xfer", "suite"):
        if f"err_{label}" in df:
            within = (df[f"err_{label}"].abs() <= 0.15).sum()
            agree = df[f"gens_agree_{label}"].sum()
            print(f"{label}: within 15% {within}/{df[f'err_{label}'].notna().sum()}, "
                  f"same generations {agree}")
    print(f"runs in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
