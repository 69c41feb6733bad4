"""The replicated state's copy on the real target, in stripes.

When members are stale (newcomers), every member that holds the state sends
one stripe of it (``rollcall.core.reshard.stripes``) to each stale member,
all at once, point to point over gloo: the copy is spread over the holders'
links, as the sim prices it (``sim.sharded.replicated_copy_time``). Each
stale member records a ``copy`` (bytes, stripes, seconds). The test grows a
job by two newcomers at once, then by one, and checks that the run is valid
with the per-sample ledger, that every replica ends with the same weights
(a stripe lost or misplaced would show there), and that each copy took one
stripe from each holder.
"""

from __future__ import annotations

from pathlib import Path

from real_processes import REAL_PROCESSES
from rollcall.core import from_ranges
from rollcall.results import read_history
from rollcall.scenario import parse_scenario

pytestmark = REAL_PROCESSES

SCENARIO = """
name: real-copy-stripes
target: real
cluster: {workers: 2}
workload: {steps: 60, global_batch: 24, micro_batch: 4, dataset_samples: 480, model_params: 20000}
detector: {heartbeat_s: 0.1, timeout_s: 2.0}
rendezvous: {min_workers: 2, max_workers: 5, last_call_s: 0.2, join_timeout_s: 10.0}
strategy: {kind: elastic, batch: constant}
failures:
  schedule:
    - {at_step: 10, join: 2}
    - {at_step: 30, join: 1}
"""


def test_newcomers_take_the_state_in_stripes_from_every_holder(tmp_path: Path) -> None:
    from real import driver

    s = driver.run(parse_scenario(SCENARIO), tmp_path)
    assert s["completed"] and s["valid"], (s["end_reason"], s["violations"])
    assert s["final_weights_agree"], "a replica differs: a stripe went wrong"
    recs = list(read_history(tmp_path))
    gens = {r["gen"]: r for r in recs if r["f"] == "generation"}
    copies = [r for r in recs if r["f"] == "copy"]
    grown = [g for g in gens.values() if g["stale"]]
    assert [len(from_ranges(g["members"])) for g in grown] == [4, 5], grown
    for g in grown:
        mine = [c for c in copies if c["gen"] == g["gen"]]
        holders = len(from_ranges(g["members"])) - g["stale"]
        assert len(mine) == g["stale"], (g, mine)  # one per stale member
        assert all(c["stripes"] == holders and c["bytes"] > 0 for c in mine), mine
