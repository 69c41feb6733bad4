"""The keeper's durable record: what a new keeper needs to take over.

A record-keeper whose record lives in a store (etcd) writes
one :class:`KeeperRecord` each time it decides a generation, before it tells
any worker (:class:`rollcall.core.keeper.Persist`). When it dies, a standby
that wins the next term rebuilds the keeper from the last record written
(:meth:`rollcall.core.keeper.Keeper.restored`) and opens a roll call: the
survivors answer with the state they hold, so steps committed after the
record was written are not lost (each survivor holds them), and a step in
flight is redone, as after any roll call.

What it holds is what the keeper's decisions depend on beyond the members'
answers: the member list and their lives, where the generation resumed, the
latest checkpoint, the lineage of resume points (a state of an abandoned
branch must not win a later roll call), every worker's latest life (never
the same life twice, also across keepers), the nodes that are down or left,
and with sharded state the placement and the recovery plan in flight.

Plain data only, checked field by field when read back
(:func:`record_from_data`): a record comes from outside the process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from rollcall.core.codec import (
    CodecError, cursor, flag, holders, id_set, listed, maybe, nat, plan_data, plan_from_data,
    text,
)
from rollcall.core.idset import IdRuns
from rollcall.core.lives import LifeTable
from rollcall.core.placement import RecoveryPlan
from rollcall.core.types import Cursor, WorkerId

__all__ = ["KeeperRecord", "record_from_data", "record_to_data"]


@dataclass(frozen=True)
class KeeperRecord:
    """Generation ``generation`` as keeper ``term`` decided it, and what
    the keeper knew then that a successor needs."""

    generation: int
    term: int
    reason: str
    members: IdRuns
    cursor: Cursor
    source: Optional[WorkerId]
    stale: IdRuns
    checkpoint: Optional[Cursor]
    resumes: tuple[tuple[int, int], ...]  # (generation, resume step), in order
    lives: LifeTable
    awaiting_relaunch: IdRuns
    down: IdRuns
    left: tuple[tuple[WorkerId, int], ...]  # (worker, its life that left)
    promised: tuple[tuple[WorkerId, int], ...]  # node_up lives not joined yet
    placement: Optional[tuple[tuple[WorkerId, ...], ...]] = None
    recovery: Optional[RecoveryPlan] = None
    fallback: bool = False
    restarts: int = 0  # restarts ordered so far (checkpoint-restart's max_restarts budget)
    # the job's progress rule (rollcall.core.progress): the furthest step ever
    # committed (None: none yet) and the recoveries begun since it moved
    furthest_step: Optional[int] = None
    recoveries_without_progress: int = 0

    def __post_init__(self) -> None:
        assert self.generation >= 1 and self.term >= 0, (self.generation, self.term)
        assert self.restarts >= 0, self.restarts
        assert self.recoveries_without_progress >= 0, self.recoveries_without_progress
        assert self.stale.issubset(self.members), "stale members are members"
        assert self.source is None or self.source in self.members, "the source is a member"
        assert all(g <= self.generation for g, _ in self.resumes), "no resume after the record"


def record_to_data(r: KeeperRecord) -> dict[str, Any]:
    """``r`` as JSON-ready data (what :func:`record_from_data` reads back)."""
    return {
        "generation": r.generation, "term": r.term, "reason": r.reason,
        "members": r.members.runs(), "cursor": r.cursor.to_json(), "source": r.source,
        "stale": r.stale.runs(),
        "checkpoint": None if r.checkpoint is None else r.checkpoint.to_json(),
        "resumes": [list(x) for x in r.resumes], "lives": r.lives.to_data(),
        "awaiting_relaunch": r.awaiting_relaunch.runs(), "down": r.down.runs(),
        "left": [list(x) for x in r.left], "promised": [list(x) for x in r.promised],
        "placement": None if r.placement is None else [list(h) for h in r.placement],
        "recovery": None if r.recovery is None else plan_data(r.recovery),
        "fallback": r.fallback, "restarts": r.restarts,
        "furthest_step": r.furthest_step,
        "recoveries_without_progress": r.recoveries_without_progress,
    }


_KEYS = frozenset(("generation", "term", "reason", "members", "cursor", "source", "stale",
                   "checkpoint", "resumes", "lives", "awaiting_relaunch", "down", "left",
                   "promised", "placement", "recovery", "fallback", "restarts",
                   "furthest_step", "recoveries_without_progress"))


def record_from_data(data: Any) -> KeeperRecord:
    """The record ``data`` describes; :class:`CodecError` names what is wrong."""
    if not isinstance(data, dict) or set(data) != _KEYS:
        keys = sorted(data)[:20] if isinstance(data, dict) else type(data).__name__
        raise CodecError(f"a keeper record is an object with keys {sorted(_KEYS)}, got {keys}")
    members = id_set(data["members"], "record.members")
    stale = id_set(data["stale"], "record.stale")
    source = maybe(nat)(data["source"], "record.source")
    if not stale.issubset(members) or (source is not None and source not in members):
        raise CodecError("record: the source and the stale members must be members")
    generation = nat(data["generation"], "record.generation")
    resumes = tuple(_pair(x, f"record.resumes[{i}]", nat)
                    for i, x in enumerate(listed(data["resumes"], "record.resumes")))
    if generation < 1 or any(g > generation for g, _ in resumes):
        raise CodecError("record: a generation >= 1, and no resume after it")
    recovery = data["recovery"]
    return KeeperRecord(
        generation, nat(data["term"], "record.term"), text(data["reason"], "record.reason"),
        members, cursor(data["cursor"], "record.cursor"), source, stale,
        maybe(cursor)(data["checkpoint"], "record.checkpoint"), resumes,
        _lives(data["lives"]), id_set(data["awaiting_relaunch"], "record.awaiting_relaunch"),
        id_set(data["down"], "record.down"), _pairs(data["left"], "record.left"),
        _pairs(data["promised"], "record.promised"),
        maybe(holders)(data["placement"], "record.placement"),
        None if recovery is None else plan_from_data(recovery, "record.recovery"),
        flag(data["fallback"], "record.fallback"), nat(data["restarts"], "record.restarts"),
        maybe(nat)(data["furthest_step"], "record.furthest_step"),
        nat(data["recoveries_without_progress"], "record.recoveries_without_progress"))


def _pair(v: Any, where: str, second: Any) -> tuple[int, int]:
    items = listed(v, where)
    if len(items) != 2:
        raise CodecError(f"{where}: a pair")
    return nat(items[0], where), second(items[1], where)


def _pairs(v: Any, where: str) -> tuple[tuple[int, int], ...]:
    return tuple(_pair(x, f"{where}[{i}]", nat) for i, x in enumerate(listed(v, where)))


def _signed(v: Any, where: str) -> int:
    if type(v) is not int:
        raise CodecError(f"{where}: expected an integer, got {v!r:.40}")
    return v


def _lives(v: Any) -> LifeTable:
    where = "record.lives"
    if not isinstance(v, dict) or set(v) != {"own", "cohort", "base", "delta"}:
        raise CodecError(f"{where}: an object with own, cohort, base, delta")
    own = _pairs(v["own"], where + ".own")
    cohort = id_set(v["cohort"], where + ".cohort")
    base = nat(v["base"], where + ".base")
    delta = tuple(_pair(x, f"{where}.delta[{i}]", _signed)
                  for i, x in enumerate(listed(v["delta"], where + ".delta")))
    if any(life == 0 for _, life in own) or \
            any(w not in cohort or base + d < 0 for w, d in delta):
        raise CodecError(f"{where}: a life is never negative, a delta is a cohort member's")
    return LifeTable.from_data(list(own), cohort, base, list(delta))
