"""The record-keeper's decision for sharded state when a generation forms.

Why a module of its own: under ``state.sharding: sharded`` a dead worker may
take the last copy of a slice of the state, and whether the job can go on
from a survivor or must fall back on the checkpoint is a membership-level
decision that every member must see the same way. It therefore lives in the
core, next to the keeper that calls it (:meth:`rollcall.core.keeper.Keeper._close`),
and never in a driver. The placement arithmetic itself is
:mod:`rollcall.core.placement`; this module only says which holders still count
and what a fallback means.

Rules (checked in ``tests/test_keeper_sharded.py``):

* **Fresh placement** at the first generation, and whenever no state
  survives by design (checkpoint-restart: every member reloads): the shards
  are placed anew with :func:`~rollcall.core.placement.initial_placement`; there
  is no recovery plan and no fallback.
* **Replan** at every later generation. A holder still counts only if it is
  a member of the new generation *and* answered the roll call holding the
  state at the resume cursor (a member still copying its state when the
  round opened holds nothing usable). A replica that the previous
  generation's plan was copying (``in_flight``) counts only once that
  generation committed a step: nobody steps before every member is ready,
  so a committed step proves the copies done, while a round that resumes
  where the previous one did cannot tell a finished copy from a broken one.
  With the other holders struck out, :func:`~rollcall.core.placement.replan`
  says what to copy from whom.
* **Fallback** exactly when the plan loses a shard (every holder gone): the
  generation resumes from the last checkpoint and every holder reloads every
  shard it holds in the new placement, so the recovery plan lists reloads
  only (no peer copies: the survivors' newer slices would not match the
  checkpoint's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from rollcall.core.placement import Placement, RecoveryPlan, Reload, initial_placement, replan
from rollcall.core.types import WorkerId

__all__ = ["ShardDecision", "ShardSpec", "decide", "split_bytes"]


def split_bytes(total: int, n_shards: int) -> tuple[int, ...]:
    """``total`` bytes cut into ``n_shards`` slices that differ by at most one byte.

    The first ``total % n_shards`` slices carry the extra byte (a ragged cut
    as ZeRO/FSDP flatten-and-split produce), so the sizes sum to ``total``.
    """
    if n_shards < 1:
        raise ValueError(f"n_shards must be >= 1, got {n_shards}")
    base, extra = divmod(int(total), n_shards)
    return tuple(base + 1 if s < extra else base for s in range(n_shards))


@dataclass(frozen=True)
class ShardSpec:
    """What the keeper needs to place sharded state.

    ``shard_bytes``: one size for every shard, or one per shard; only used to
    write the bytes a recovery moves into the history.
    """

    n_shards: int
    replicas: int
    rack_size: Optional[int] = None
    shard_bytes: int | tuple[int, ...] = 0

    def __post_init__(self) -> None:
        if self.n_shards < 1 or self.replicas < 1:
            raise ValueError("need n_shards >= 1 and replicas >= 1")
        if self.rack_size is not None and self.rack_size < 1:
            raise ValueError("rack_size must be >= 1")

    def domains(self, members: Iterable[WorkerId]) -> Optional[dict[WorkerId, str]]:
        """Failure domain of each member: its rack ``w // rack_size`` (None: no domains)."""
        if self.rack_size is None:
            return None
        size = self.rack_size
        return {w: str(w // size) for w in members}


@dataclass(frozen=True)
class ShardDecision:
    """The sharded-state part of one generation's decision.

    ``recovery`` is None for a fresh placement; ``fallback`` is true when a
    shard was lost and the generation must resume from the checkpoint.
    """

    placement: Placement
    recovery: Optional[RecoveryPlan]
    fallback: bool
    fresh: bool


def decide(spec: ShardSpec, previous: Optional[Placement], members: Sequence[WorkerId],
           holding: Iterable[WorkerId], fresh: bool,
           in_flight: Iterable[tuple[int, WorkerId]] = ()) -> ShardDecision:
    """Place or replan the shards for a generation of ``members``.

    ``holding``: the workers that hold the state at the resume cursor (only
    those of them in ``previous`` matter). ``in_flight``: ``(shard, worker)``
    replicas not known to have arrived (struck out too). ``fresh``: no state
    survives whatever the placement (checkpoint-restart), so place anew.
    """
    domains = spec.domains(members)
    if previous is None or fresh:
        placement = initial_placement(spec.n_shards, members, spec.replicas, domains)
        return ShardDecision(placement, None, False, True)
    keep = set(holding)
    gone = set(in_flight)
    stripped = Placement(tuple(tuple(w for w in h if w in keep and (s, w) not in gone)
                               for s, h in enumerate(previous.shards)))
    plan = replan(stripped, members, spec.replicas, domains)
    if not plan.fallback:
        return ShardDecision(plan.placement, plan, False, False)
    reloads = tuple(Reload(s, w) for s, h in enumerate(plan.placement.shards) for w in h)
    everything = RecoveryPlan(plan.placement, (), reloads, plan.lost, plan.promoted)
    return ShardDecision(plan.placement, everything, True, False)
