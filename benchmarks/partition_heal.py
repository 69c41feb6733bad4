"""A healed partition on the real target: fenced workers back as newcomers (not a test).

Runs ``scenarios/real-partition.yaml`` (4 workers on 2 hosts; at step 8
host 1 is cut off, nftables rules in its namespace, from host 0 and the
keeper for ``for_s``; the keeper evicts its two workers for their silence,
host 0 goes on) ``--runs`` times, beside ``--hogs`` CPU hogs, at each
``--for-s`` given, and prints per run:

- heal -> readmitted: from the ``heal`` record to the generation that has
  both fenced workers back as members (what the partition costs after it
  is over);
- heal -> heard: from the heal to the first record a fenced worker sends
  once it hears the keeper again (its ``abort`` of the generation the cut
  caught it in, or ``fenced``): mostly TCP's retransmission backoff, which
  counts from the cut (0.2, 0.4, 0.8 ... s), so it grows with ``for_s``;
- the rest (readmitted - heard): the newcomers' rejoin round (it closes
  once both have joined, within ``rendezvous.last_call_s``) and their state copy.

    .venv/bin/python benchmarks/partition_heal.py                  # 3 runs, for_s 2.5 s
    .venv/bin/python benchmarks/partition_heal.py --runs 5 --for-s 1.5 2.5 5 --hogs 1

Needs root or CAP_NET_ADMIN (the hosts are network namespaces); says so and
exits 2 without.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from realrun import cpu_hogs, namespaces_refused, real_records

CUT = (2, 3)  # host 1's workers


def members(r: dict) -> set[int]:
    return {w for lo, hi in r["members"] for w in range(lo, hi + 1)}


def one_run(for_s: float) -> tuple[float, float]:
    """(heal -> the generation readmitting both, heal -> first word from a fenced worker)."""
    recs, _ = real_records("real-partition",
                           [f"failures.schedule=[{{at_step: 8, partition: [1], for_s: {for_s}}}]"])
    heal = next(r for r in recs if r["f"] == "fault" and r["kind"] == "heal")
    back = next(r for r in recs if r["f"] == "generation" and r["t"] > heal["t"]
                and set(CUT) <= members(r))
    heard = min(r["t"] for r in recs if r["t"] > heal["t"] and r.get("process") in CUT)
    return back["t"] - heal["t"], heard - heal["t"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--for-s", type=float, nargs="+", default=[2.5])
    ap.add_argument("--hogs", type=int, default=0, help="CPU hog processes beside the runs")
    args = ap.parse_args()
    why = namespaces_refused("partition_heal", "real-partition")
    if why is not None:
        print(why, file=sys.stderr)
        return 2
    with cpu_hogs(args.hogs):
        print(f"{'for_s':>6} {'run':>3} {'heal->readmitted s':>18} {'heal->heard s':>13} {'rejoin s':>8}")
        for for_s in args.for_s:
            back = []
            for i in range(args.runs):
                took, heard = one_run(for_s)
                back.append(took)
                print(f"{for_s:>6.2f} {i:>3} {took:>18.3f} {heard:>13.3f} {took - heard:>8.3f}")
            print(f"== for_s {for_s:g} s: median heal -> readmitted {statistics.median(back):.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
