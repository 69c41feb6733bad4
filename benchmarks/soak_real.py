"""Soak of the real target: one scenario run N times, beside a CPU hog (not a test).

    .venv/bin/python benchmarks/soak_real.py                       # the issue-14 scenario, 20 runs, one hog
    .venv/bin/python benchmarks/soak_real.py --runs 5 --hogs 0 scenarios/real-kill-one.yaml

Each run is a fresh ``rollcall run --target real`` of the same file (same
seed: what varies is the timing the machine gives it, which is what made
scripted kills land differently before issue 14). ``--hogs`` busy-loop
processes compete for the cores meanwhile. Prints one line per run
(completed, valid, restarts, generations, elapsed) and the tally; a run that
did not complete or was not valid prints its run directory, which keeps its
history (``rollcall run`` replays the same file). Exit status 1 if any run
failed, so a soak can gate a release by hand; it is not in the test suite
(minutes of real processes).

Stops only what it started (the hogs, by PID) on success, failure and Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from realrun import cpu_hogs

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ROOT / "scenarios" / "chaos-cr-kill-join-kill.yaml"
RUN_TIMEOUT_S = 300.0


def one_run(scenario: Path, out: Path) -> dict:
    """One real run; its summary, or why there is none."""
    cmd = [sys.executable, "-m", "rollcall", "run", str(scenario), "--target", "real",
           "--out", str(out), "--quiet"]
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                              timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"completed": False, "valid": False, "reason": f"over {RUN_TIMEOUT_S:.0f} s"}
    summary = out / "summary.json"
    if not summary.exists():
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"completed": False, "valid": False, "reason": f"rc {done.returncode}: {tail[0]}"}
    return json.loads(summary.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario", nargs="?", type=Path, default=DEFAULT)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--hogs", type=int, default=1, help="busy-loop processes beside the runs")
    ap.add_argument("--out", type=Path, default=None, help="where the run directories go")
    args = ap.parse_args()
    if not args.scenario.is_file():
        print(f"soak_real: no such scenario file: {args.scenario}", file=sys.stderr)
        return 2
    if args.runs < 1 or args.hogs < 0:
        print("soak_real: --runs must be >= 1 and --hogs >= 0", file=sys.stderr)
        return 2
    root = args.out or Path(tempfile.mkdtemp(prefix="rollcall-soak-"))
    print(f"soak: {args.scenario.name}, {args.runs} runs, {args.hogs} hog(s); runs in {root}")
    failed: list[Path] = []
    with cpu_hogs(args.hogs):
        for i in range(args.runs):
            out = root / f"run-{i:02d}"
            s = one_run(args.scenario, out)
            ok = s.get("completed") is True and s.get("valid") is True
            if not ok:
                failed.append(out)
            print(f"run {i:2d}: completed={s.get('completed')} valid={s.get('valid')} "
                  f"restarts={s.get('restarts')} generations={s.get('generations')} "
                  f"elapsed_s={s.get('elapsed_s', float('nan')):.2f} "
                  f"{'' if ok else 'FAILED ' + str(s.get('end_reason')) + ' ' + str(out)}")
    print(f"{args.runs - len(failed)}/{args.runs} completed and valid")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
