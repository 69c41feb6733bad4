"""The etcd-backed keeper's two costs: failover time and the write.

    .venv/bin/python benchmarks/keeper_failover.py [--ttls 1,2,4] [--runs 1] [--writes 200]
                                                   [--links launcher,direct]

1. **Failover time against the lease TTL.** For each ``keeper.lease_ttl_s``
   a real run (3 gloo workers, one standby) whose active keeper is SIGKILLed
   at step 15: seconds from the kill to the first step committed in the next
   generation (``summary.json``'s ``keeper_failover_s``), and that time over
   the TTL. The lease must lapse before a standby can win, so the floor is
   the TTL etcd granted (whole seconds); the rest is the standby's election,
   its read of the record, the launcher's look in etcd (every 50 ms) and the
   roll call. Side by side for each ``keeper.worker_links``: ``launcher``
   (the launcher relays the workers' traffic and tells them of the new
   keeper) and ``direct`` (each worker watches etcd and links to the keeper
   itself), with their ratio, and the median step time of each.
2. **The steady-state cost of a generation's write.** The compare-and-set a
   keeper makes before announcing each generation, against the run's own
   3-member etcd on loopback: ``--writes`` writes of a recorded generation
   (median and 95th percentile), beside the in-memory store's cost of the
   same generation (none: ``keeper.store: memory`` writes nothing) and the
   run's median step time, so the ratio says what a generation change costs
   more with etcd.

A measurement, not a test: figures depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rollcall.scenario import parse_scenario  # noqa: E402

SCENARIO = """
name: bench-keeper-failover
target: real
cluster: {{workers: 3}}
workload: {{steps: 40, global_batch: 24, micro_batch: 4, dataset_samples: 480,
           model_params: 20000, lr: 0.05}}
detector: {{heartbeat_s: 0.1, timeout_s: 2.0}}
rendezvous: {{min_workers: 2, last_call_s: 0.2, join_timeout_s: 30.0}}
strategy: {{kind: elastic}}
keeper: {{store: etcd, standbys: 1, lease_ttl_s: {ttl}, worker_links: {links}}}
failures:
  schedule: [{{at_step: 15, kill_keeper: active}}]
"""


def failover(ttl: float, links: str, out: Path) -> tuple[float, float]:
    """One run: (kill -> first commit after it, median committed step) in seconds."""
    from real import driver
    from rollcall.results import read_history

    s = driver.run(parse_scenario(SCENARIO.format(ttl=ttl, links=links)), out)
    assert s["valid"] and s["completed"], (s["end_reason"], s["violations"])
    commits = [r for r in read_history(out) if r["f"] == "commit"]
    steps = [(r["t"] - r["t0"]) / (r["last"] - r["step"] + 1) for r in commits]
    return s["keeper_failover_s"][0], statistics.median(steps)


def _record() -> dict:
    """A real generation's record: a 3-member job's, as its keeper would write it."""
    sys.path.insert(0, str(ROOT / "tests"))
    from protocol_net import World  # the in-memory world the core's tests drive
    from rollcall.core.record import record_to_data

    w = World(3, min_workers=2, durable=True)
    w.advance(2.0)
    assert w.stored is not None
    return record_to_data(w.stored)


def write_costs(writes: int) -> list[float]:
    """Seconds per compare-and-set of a generation, on a fresh 3-member etcd."""
    from real.etcd import EtcdCluster
    from real.keeper_store import KeeperStore

    record = _record()
    with tempfile.TemporaryDirectory(prefix="rollcall-bench-etcd-") as tmp:
        secret = "bench-" + str(time.time_ns())
        with EtcdCluster(Path(tmp) / "etcd", members=3, secret=secret) as cluster:
            store = KeeperStore(cluster.endpoints, "/bench", secret=secret, timeout_s=5.0)
            lead = store.campaign("bench", "127.0.0.1:1", 10.0)
            assert lead is not None
            out = []
            for g in range(1, writes + 1):
                t = time.perf_counter()
                assert store.commit_generation(lead, g, {**record, "generation": g})
                out.append(time.perf_counter() - t)
            store.close()
            return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ttls", default="1,2,4", help="lease TTLs to measure, seconds")
    p.add_argument("--runs", type=int, default=1, help="runs per TTL (the median is shown)")
    p.add_argument("--writes", type=int, default=200, help="generation writes to time")
    p.add_argument("--links", default="launcher,direct",
                   help="keeper.worker_links to compare (launcher, direct or both)")
    args = p.parse_args()
    from real.etcd import etcd_binary

    if etcd_binary() is None:
        print("keeper_failover: no etcd binary (Debian's etcd-server); nothing measured")
        return 2
    links = args.links.split(",")
    print("failover: active keeper SIGKILLed at step 15 -> first commit of the next generation")
    print(f"{'lease_ttl_s':>12}" + "".join(f" {k + ' s':>12} {'/ ttl':>6}" for k in links)
          + ("  direct/launcher" if links == ["launcher", "direct"] else ""))
    step_s: dict[str, list[float]] = {k: [] for k in links}
    for ttl in [float(x) for x in args.ttls.split(",")]:
        row = []
        for k in links:
            times = []
            for i in range(args.runs):
                with tempfile.TemporaryDirectory(prefix="rollcall-bench-failover-") as tmp:
                    f, st = failover(ttl, k, Path(tmp) / "run")
                times.append(f)
                step_s[k].append(st)
            row.append(statistics.median(times))
        ratio = f"  {row[1] / row[0]:>15.2f}" if links == ["launcher", "direct"] else ""
        print(f"{ttl:>12g}" + "".join(f" {m:>12.3f} {m / ttl:>6.2f}" for m in row) + ratio)
    print("median step: " + ", ".join(f"{k} {statistics.median(v) * 1e3:.2f} ms"
                                      for k, v in step_s.items()))
    costs = write_costs(args.writes)
    med, p95 = statistics.median(costs), sorted(costs)[int(0.95 * (len(costs) - 1))]
    step = statistics.median(step_s[links[0]])
    print(f"\ngeneration write (etcd compare-and-set, {args.writes} writes, "
          f"{len(json.dumps(_record()))} B record):")
    print(f"  etcd    median {med * 1e3:.2f} ms, p95 {p95 * 1e3:.2f} ms")
    print(f"  memory  0 ms (keeper.store: memory writes nothing)")
    print(f"  ratio   a generation change costs {med / step:.2f} median steps more with etcd "
          f"(step {step * 1e3:.1f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
