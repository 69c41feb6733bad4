"""Cost curve of the sim target against cluster size and failures (not a test).

The question is how the sim's cost grows, not just what it is at two sizes
(benchmarks/sim_scale.py). This runs scenarios/gpu100k-30d.yaml (30 days of
work) scaled with ``--set`` overrides to 10^3 .. 10^6 GPUs (8 per worker),
keeping the shipped file's ratios (spares per worker, batch per worker,
rendezvous min/max as fractions of the workers), then at the shipped 12,500
workers with the node MTBF varied over a factor 16, so that the number of
failures varies. Each run is a fresh child process (its CPU time and peak
resident memory are its own) writing its history and summary.json into a
temporary directory that is then removed. It prints one row per run, fits
cost ~ a * N^b and cost ~ a * failures^c by least squares on log-log, and
draws both in a PNG (two log-log panels).

    .venv/bin/python benchmarks/sim_cost_curve.py                 # full: 10^3 .. 10^6 GPUs, ~1 min
    .venv/bin/python benchmarks/sim_cost_curve.py --replicates 3  # least CPU of 3 per point, ~2.5 min
    .venv/bin/python benchmarks/sim_cost_curve.py --quick --png /tmp/cost.png   # smoke: 10^3..10^5, 3 MTBFs
    .venv/bin/python benchmarks/sim_cost_curve.py --max-gpus 320000 --png /tmp/cost.png

The PNG goes to docs/sim-cost.png unless ``--png``. Besides the fit over
every size, cost against N is fitted over sizes of at least
``--fit-from-gpus`` (10^4): small runs are mostly fixed cost. Each row's
``slope`` is the local exponent from the previous point of its series.

Elastic is run at every size. Checkpoint-restart is run only up to
``--cr-max-gpus`` (100k): beyond, the job's MTBF falls below its 600 s
restart, so the job does not finish (docs/limitations.md, "10^6 GPUs") and the
run would only measure the wall limit. The failure sweep is elastic only
for the same reason (at MTBF / 4 the job's MTBF is ~440 s).
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from sim_scale import ROOT, SCENARIOS

SCENARIO = SCENARIOS["gpu100k-30d"]
FULL_WORKERS = (125, 400, 1250, 4000, 12500, 40000, 125000)
QUICK_WORKERS = (125, 1250, 12500)
FULL_MTBF_FACTORS = (4.0, 2.0, 1.0, 0.5, 0.25)
QUICK_MTBF_FACTORS = (2.0, 1.0, 0.5)


@dataclass(frozen=True)
class Base:
    """The shipped scenario's values that the scaled runs keep in proportion."""

    workers: int
    gpus_per_worker: int
    spares: int
    global_batch: int
    min_workers: int
    max_workers: int
    mtbf_s: float


@dataclass(frozen=True)
class Point:
    """One measured child run: its label, its overrides and what it cost."""

    sweep: str
    strategy: str
    gpus: int
    mtbf_s: float
    result: Optional[dict]


def read_base() -> Base:
    """The shipped file's values, read rather than copied so that a retuned file is followed."""
    sys.path.insert(0, str(ROOT))
    from rollcall.scenario import load_scenario

    sc = load_scenario(SCENARIO)
    return Base(sc.cluster.workers, sc.cluster.gpus_per_worker, sc.cluster.spares,
                sc.workload.global_batch, sc.rendezvous.min_workers, sc.rendezvous.max_workers,
                float(sc.failures.worker_mtbf_s))


def scaled(base: Base, workers: int) -> list[str]:
    """``--set`` items for ``workers`` servers with the shipped ratios, so sizes stay comparable.

    The batch per worker is kept (the step time does not change with N), and
    spares and the rendezvous bounds stay the same fractions of the workers.
    """
    f = workers / base.workers
    return [f"cluster.workers={workers}",
            f"cluster.spares={max(1, round(base.spares * f))}",
            f"workload.global_batch={round(base.global_batch * f)}",
            f"rendezvous.min_workers={max(1, round(base.min_workers * f))}",
            f"rendezvous.max_workers={round(base.max_workers * f)}"]


def child(overrides: Sequence[str], strategy: str, seed: int, max_wall_s: float) -> dict:
    """One run in this (fresh) process: CPU seconds, peak RSS and the summary's counts."""
    sys.path.insert(0, str(ROOT))
    from rollcall.scenario import load_scenario
    from sim.driver import run

    sc = load_scenario(SCENARIO, list(overrides), seed=seed, strategy=strategy)
    with tempfile.TemporaryDirectory(prefix="simcost-") as out:
        t, c = time.perf_counter(), time.process_time()
        run(sc, out, max_wall_s=max_wall_s)
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        s = json.loads((Path(out) / "summary.json").read_text())
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB (Linux)
    return {"wall_s": wall, "cpu_s": cpu, "peak_rss_mib": rss, "failures": s["failures"],
            "generations": s["generations"], "restarts": s["restarts"],
            "ok": bool(s["valid"] and s["completed"])}


def measure(overrides: Sequence[str], strategy: str, args: argparse.Namespace) -> Optional[dict]:
    """The least-CPU of ``--replicates`` runs: a shared machine only ever adds time."""
    runs = [once(overrides, strategy, args) for _ in range(args.replicates)]
    done = [r for r in runs if r is not None]
    return min(done, key=lambda r: r["cpu_s"]) if len(done) == len(runs) else None


def once(overrides: Sequence[str], strategy: str, args: argparse.Namespace) -> Optional[dict]:
    """Run :func:`child` in a new interpreter, so that RSS and CPU time are this run's only."""
    spec = json.dumps({"overrides": list(overrides), "strategy": strategy, "seed": args.seed,
                       "max_wall_s": args.max_wall_s})
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", spec]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.max_wall_s + 120)
    except subprocess.TimeoutExpired:
        return None
    if p.returncode != 0:
        print(f"  child failed: {p.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    return json.loads(p.stdout.strip().splitlines()[-1])


def row(pt: Point, prev: Optional[Point]) -> str:
    """A table line; '-' where the child gave no result (timed out or failed).

    ``slope`` is the local exponent from the series' previous point (d log cpu
    / d log x, x the GPUs or the failures): it shows where one power law stops
    describing the curve, which a single fitted exponent hides.
    """
    lead = f"{pt.sweep:<9} {pt.strategy:<19} {pt.gpus:>9,} {pt.mtbf_s:>12.4g}"
    r = pt.result
    if r is None:
        return f"{lead} {'-':>8} {'-':>8} {'-':>9} {'-':>7} {'-':>7} {'-':>6}  NO (no result)"
    k = local_slope(prev, pt)
    return (f"{lead} {r['wall_s']:>8.2f} {r['cpu_s']:>8.2f} {r['peak_rss_mib']:>9.0f} "
            f"{r['failures']:>7} {r['generations']:>7} {'-' if k is None else f'{k:.2f}':>6}  "
            f"{'yes' if r['ok'] else 'NO'}")


def local_slope(prev: Optional[Point], pt: Point) -> Optional[float]:
    """d log cpu / d log x between two points of a series, None without both."""
    if prev is None or prev.result is None or pt.result is None:
        return None
    x0, x1 = ((prev.gpus, pt.gpus) if pt.sweep == "size"
              else (prev.result["failures"], pt.result["failures"]))
    if x0 == x1:
        return None
    return math.log(pt.result["cpu_s"] / prev.result["cpu_s"]) / math.log(x1 / x0)


HEADER = (f"{'sweep':<9} {'strategy':<19} {'GPUs':>9} {'node MTBF s':>12} {'wall s':>8} "
          f"{'cpu s':>8} {'peak MiB':>9} {'fails':>7} {'gens':>7} {'slope':>6}  ok")


def fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """(a, b) of y ~ a * x^b by least squares on log-log: the growth exponent is the question."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    b = sum((u - mx) * (v - my) for u, v in zip(lx, ly)) / sum((u - mx) ** 2 for u in lx)
    return math.exp(my - b * mx), b


def usable(points: Sequence[Point], strategy: str, sweep: str) -> list[Point]:
    """The points of one series that finished and are valid: a cut-off run's cost means nothing."""
    return [p for p in points if p.sweep == sweep and p.strategy == strategy
            and p.result is not None and p.result["ok"]]


@dataclass(frozen=True)
class Fit:
    """cost ~ a * x^b over the x range [lo, hi] of one series of one strategy."""

    series: str
    strategy: str
    cost: str
    a: float
    b: float
    lo: float
    hi: float


def fits(points: Sequence[Point], tail_gpus: int) -> list[Fit]:
    """Fits of each series with at least 3 points, for CPU seconds and peak RSS.

    ``size`` fits every size; ``size>=T`` only those of at least ``tail_gpus``
    GPUs, because a small run's cost is mostly fixed (start, scenario, check)
    and flattens the whole-range fit below the large-N growth rate.
    """
    out = []
    for strategy in ("elastic", "checkpoint-restart"):
        size = usable(points, strategy, "size")
        series = {"size": [(p.gpus, p) for p in size],
                  f"size>={tail_gpus:,}": [(p.gpus, p) for p in size if p.gpus >= tail_gpus],
                  "failures": [(p.result["failures"], p) for p in usable(points, strategy, "failures")]}
        for name, xp in series.items():
            if len(xp) < 3:
                continue
            xs = [x for x, _ in xp]
            for cost in ("cpu_s", "peak_rss_mib"):
                a, b = fit(xs, [p.result[cost] for _, p in xp])
                out.append(Fit(name, strategy, cost, a, b, min(xs), max(xs)))
    return out


def plot(points: Sequence[Point], fitted: Sequence[Fit], png: Path) -> None:
    """Two log-log panels, CPU s against GPUs and against failures, points and fitted lines."""
    import matplotlib
    import matplotlib.ticker
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, sweep, label in ((axes[0], "size", "GPUs (8 per worker)"),
                             (axes[1], "failures", "failures in the run")):
        var = "N" if sweep == "size" else "failures"
        for strategy, colour in (("elastic", "tab:blue"), ("checkpoint-restart", "tab:orange")):
            pts = usable(points, strategy, sweep)
            if not pts:
                continue
            xs = [p.gpus if sweep == "size" else p.result["failures"] for p in pts]
            ax.plot(xs, [p.result["cpu_s"] for p in pts], "o", color=colour, label=strategy)
            for f in fitted:
                if f.strategy == strategy and f.cost == "cpu_s" and f.series.startswith(sweep):
                    ax.plot([f.lo, f.hi], [f.a * f.lo ** f.b, f.a * f.hi ** f.b],
                            "-" if f.series == sweep else "--", color=colour, alpha=0.6,
                            label=f"fit {f.series}: {f.a:.3g} {var}^{f.b:.2f}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel(label)
        ax.set_ylabel("CPU seconds per run")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_title("gpu100k-30d scaled: cost against N")
    axes[1].set_title("12,500 workers, node MTBF varied: cost against failures")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)


def add(points: list[Point], pt: Point) -> None:
    """Append ``pt`` and print its row at once (a full run takes minutes)."""
    prev = [p for p in points if p.sweep == pt.sweep and p.strategy == pt.strategy]
    points.append(pt)
    print(row(pt, prev[-1] if prev else None), flush=True)


def sweep(base: Base, args: argparse.Namespace) -> list[Point]:
    """Run both sweeps, printing each row as it comes (a full run takes minutes)."""
    workers = [w for w in (QUICK_WORKERS if args.quick else FULL_WORKERS)
               if w * base.gpus_per_worker <= args.max_gpus]
    factors = QUICK_MTBF_FACTORS if args.quick else FULL_MTBF_FACTORS
    points: list[Point] = []
    print(HEADER, flush=True)
    for w in workers:
        gpus = w * base.gpus_per_worker
        for strategy in ("elastic", "checkpoint-restart"):
            if strategy == "checkpoint-restart" and gpus > args.cr_max_gpus:
                continue
            add(points, Point("size", strategy, gpus, base.mtbf_s,
                              measure(scaled(base, w), strategy, args)))
    for f in factors:
        mtbf = base.mtbf_s * f
        sets = scaled(base, base.workers) + [f"failures.worker_mtbf_s={mtbf}"]
        add(points, Point("failures", "elastic", base.workers * base.gpus_per_worker, mtbf,
                          measure(sets, "elastic", args)))
    return points


def report(fitted: Sequence[Fit], args: argparse.Namespace) -> None:
    """The fitted exponents, and what was left out and why."""
    print()
    for f in fitted:
        x = "failures" if f.series == "failures" else "N"
        print(f"fit {f.series:<14} {f.strategy:<19} {f.cost:<12} ~ {f.a:.3g} * {x}^{f.b:.3f}")
    print(f"\ncheckpoint-restart only up to {args.cr_max_gpus:,} GPUs: beyond, the job's MTBF "
          f"falls below its restart time and it does not finish; failure sweep elastic only.")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 sizes up to 100k GPUs, 3 MTBFs")
    ap.add_argument("--max-gpus", type=int, default=1_000_000)
    ap.add_argument("--cr-max-gpus", type=int, default=100_000,
                    help="largest size at which checkpoint-restart is run")
    ap.add_argument("--png", type=Path, default=ROOT / "docs" / "sim-cost.png")
    ap.add_argument("--fit-from-gpus", type=int, default=10_000,
                    help="also fit cost against N over sizes of at least this many GPUs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--replicates", type=int, default=1,
                    help="runs per point, the least CPU kept (same seed: same failures)")
    ap.add_argument("--max-wall-s", type=float, default=300.0, help="per child run")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        spec = json.loads(args.child)
        print(json.dumps(child(spec["overrides"], spec["strategy"], spec["seed"], spec["max_wall_s"])))
        return 0
    if args.quick:
        args.max_gpus = min(args.max_gpus, 100_000)
    points = sweep(read_base(), args)
    fitted = fits(points, args.fit_from_gpus)
    report(fitted, args)
    plot(points, fitted, args.png)
    print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
