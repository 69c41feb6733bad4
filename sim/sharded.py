"""Sim cost model of sharded state and rack failures.

The keeper decides (``rollcall.sharding``): which shards are copied from whom
to whom, or that the job falls back on the checkpoint. This module only
prices those decisions and finds who a rack failure hits; it decides nothing
about membership.

Recovery time of a plan without fallback. Copies run in parallel over a
non-blocking fabric where each worker has one full-duplex link of
``network.bandwidth_Bps``; a link carries its transfers one after the other.
The recovery therefore ends when the busiest endpoint is done: the largest
number of bytes any one worker sends or receives, over the bandwidth, plus
one network latency. A plan with no copies costs nothing (every replica
stayed where it was). A fallback is priced by the driver as any checkpoint
resume (``strategy.checkpoint_read_s``, and the steps since the checkpoint
are redone).

Bytes per shard: ``workload.model_params * workload.bytes_per_param`` is the
whole training state, what the replicated sim copies to a newcomer; sharded,
it is split evenly over ``state.shards`` (``rollcall.sharding.split_bytes``),
so ``r`` replicas cost ``r`` times the state in memory across the job and a
lost worker's slice costs ``1/shards`` of a full copy to restore.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Sequence

from rollcall.placement import RecoveryPlan

__all__ = ["copy_time", "rack_victims", "racks_with"]


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


def rack_victims(rack: int, rack_size: int, up: Sequence[bool]) -> list[int]:
    """Ids of ``rack`` whose hardware is up (``up[w]``), ascending: a rack failure takes them all."""
    lo, hi = rack * rack_size, min((rack + 1) * rack_size, len(up))
    return [w for w in range(lo, hi) if up[w]]


def racks_with(workers: Iterable[int], rack_size: int) -> list[int]:
    """The racks holding at least one of ``workers``, ascending (where a random rack failure may hit)."""
    return sorted({w // rack_size for w in workers})
