"""A lost host on the real target: survivors' resume against the detector timeout (not a test).

Runs ``scenarios/real-lose-host.yaml`` (4 workers on 2 hosts, host 1 lost at
step 15: both its processes SIGKILLed at once and no exit reported, as when
a machine loses power) ``--runs`` times, beside ``--hogs`` CPU hogs, at each
``--timeout-s`` given, and prints per run the time from the fault to the
first step the survivors commit in the generation without the lost host,
and that time minus ``detector.timeout_s``: what recovery costs beyond the
silence the detector must wait out.

    .venv/bin/python benchmarks/host_loss.py                       # 3 runs at timeout 1.5 s
    .venv/bin/python benchmarks/host_loss.py --runs 5 --timeout-s 0.5 1.0 2.0 --hogs 1

Goal: ``timeout_s`` + at most 0.1 s. The difference can be
negative: the detector counts the timeout from the host's last heartbeat,
which came up to one ``heartbeat_s`` before the fault. The hosts run as
network namespaces with a host agent each (needs root or CAP_NET_ADMIN; it
says so and exits 2 without): the lost host's link goes down and every
process in its namespace is SIGKILLed at once, so nothing reports an exit
and only the detector sees it.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from realrun import cpu_hogs, namespaces_refused, real_records


def one_run(timeout_s: float) -> tuple[float, float]:
    """(fault -> first commit of the generation without the lost host, its timeout)."""
    recs, timeout = real_records("real-lose-host", [f"detector.timeout_s={timeout_s}"])
    fault = next(r for r in recs if r["f"] == "fault" and r["kind"] == "lose_host")
    gen = next(r["gen"] for r in recs if r["f"] == "generation" and r["t"] > fault["t"])
    first = min(r["t"] for r in recs if r["f"] == "commit" and r["gen"] == gen)
    return first - fault["t"], timeout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--timeout-s", type=float, nargs="+", default=[1.5])
    ap.add_argument("--hogs", type=int, default=0, help="CPU hog processes beside the runs")
    args = ap.parse_args()
    why = namespaces_refused("host_loss", "real-lose-host")
    if why is not None:
        print(why, file=sys.stderr)
        return 2
    with cpu_hogs(args.hogs):
        print(f"{'timeout_s':>9} {'run':>3} {'fault->resume s':>15} {'beyond timeout s':>16}")
        for timeout in args.timeout_s:
            extra = []
            for i in range(args.runs):
                took, t = one_run(timeout)
                extra.append(took - t)
                print(f"{t:>9.2f} {i:>3} {took:>15.3f} {took - t:>16.3f}")
            print(f"== timeout {timeout:g} s: median beyond the timeout "
                  f"{statistics.median(extra):.3f} s (goal <= 0.1 s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
