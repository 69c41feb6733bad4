"""Sim cost model of state copies: sharded state's plans, replicated state's stripes.

The keeper decides (``rollcall.core.sharding``): which shards are copied from whom
to whom, or that the job falls back on the checkpoint. This module only
prices those decisions; it decides nothing about membership (who a rack
failure hits is ``Scenario.rack_workers``).

Recovery time of a plan without fallback. Copies run in parallel over a
non-blocking fabric where each worker has one full-duplex link of
``network.bandwidth_Bps``; a link carries its transfers one after the other.
The recovery therefore ends when the busiest endpoint is done: the largest
number of bytes any one worker sends or receives, over the bandwidth, plus
one network latency. A plan with no copies costs nothing (every replica
stayed where it was). A fallback is priced by the driver as any checkpoint
resume (``strategy.checkpoint_read_s``, and the steps since the checkpoint
are redone).

Replicated state (:func:`replicated_copy_time`): every member that is not
stale holds the whole state, so the ``k`` stale members each pull a stripe
of ``1 / s`` of it from each of the ``s`` holders in parallel, over the same
per-worker links: a receiver takes in the whole state, a holder sends ``k /
s`` of it, and the copy ends with the busier of the two, ``bytes * max(1, k
/ s) / bandwidth_Bps`` plus one latency. With fewer receivers than holders
(a failure replaced, a newcomer) that is one state over one link, bounded
by the receiver's link, whatever the number of holders; a growth by many
newcomers at once is bounded by the holders' links.

Bytes per shard: ``workload.model_params * workload.bytes_per_param`` is the
whole training state, what the replicated sim copies to a newcomer; sharded,
it is split evenly over ``state.shards`` (``rollcall.core.sharding.split_bytes``),
so ``r`` replicas cost ``r`` times the state in memory across the job and a
lost worker's slice costs ``1/shards`` of a full copy to restore.
"""

from __future__ import annotations

from collections import Counter
from typing import Optional, Sequence

from rollcall.core import Cursor, Formed, RecoveryPlan, ShardSpec
from rollcall.scenario import Scenario

__all__ = ["copy_time", "entry_cost_s", "replicated_copy_time"]


def entry_cost_s(formed: Formed, sc: Scenario, sharding: Optional[ShardSpec],
                 latency_s: float) -> float:
    """Seconds before the members of generation ``formed`` compute: the
    checkpoint's load (no source holds the state), the peer copies of a
    sharded plan, or the stale members' copy of the replicated state; and
    the warm-up at the job's start."""
    bandwidth_Bps = sc.network.bandwidth_Bps
    state_bytes = sc.workload.model_params * sc.workload.bytes_per_param
    if formed.source is None and formed.cursor != Cursor():
        cost = sc.strategy.checkpoint_read_s
    elif formed.recovery is not None:  # sharded: only the plan's peer copies move
        assert sharding is not None, "a recovery plan is sharded state's"
        cost = copy_time(formed.recovery, sharding.shard_bytes, bandwidth_Bps, latency_s)
    elif formed.source is not None and formed.stale:
        k, n = len(formed.stale), len(formed.members)  # striped over every member that holds it
        cost = state_bytes / bandwidth_Bps + latency_s if k <= n - k else replicated_copy_time(
            state_bytes, k, n - k, bandwidth_Bps, latency_s)
    else:
        cost = 0.0
    if formed.reason == "start":
        cost += sc.workload.warmup_s
    return cost


def copy_time(plan: RecoveryPlan, shard_bytes: Sequence[int], bandwidth_Bps: float,
              latency_s: float) -> float:
    """Seconds until every peer copy of ``plan`` is done (see the module docstring)."""
    if not plan.copies:
        return 0.0
    load: Counter[tuple[str, int]] = Counter()
    for c in plan.copies:
        size = shard_bytes[c.shard]
        load[("out", c.src)] += size
        load[("in", c.dst)] += size
    return max(load.values()) / bandwidth_Bps + latency_s


def replicated_copy_time(state_bytes: float, stale: int, holders: int, bandwidth_Bps: float,
                         latency_s: float) -> float:
    """Seconds until ``stale`` members hold the replicated state, striped over
    ``holders`` (see the module docstring)."""
    assert stale >= 1 and holders >= 1, (stale, holders)
    return state_bytes * max(1.0, stale / holders) / bandwidth_Bps + latency_s
