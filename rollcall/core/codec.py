"""The protocol's messages as plain data, and back, checked field by field.

A message that crosses a process boundary (the real target's wire) travels
as JSON, never as pickle: nothing a peer sends may become code. This module
turns each message dataclass of :mod:`rollcall.core.messages` into a dict
of ints, strings, bools and lists (:func:`message_to_data`), and such a dict back into
the message (:func:`message_from_data`), refusing anything that is not exactly a
message of a known type with fields of the right kinds: a
:class:`CodecError` names what was wrong. Pure: no I/O, no JSON itself.

Shapes: a :class:`Cursor` is ``[step, sample]``; an id set (members,
stale) is its inclusive runs ``[[lo, hi], ...]``; incarnations a list paired
with the members; a :class:`RecoveryPlan` a dict of its parts.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

from rollcall.core.idset import IdRuns
from rollcall.core.messages import (
    Checkpointed, Heartbeat, Join, Leave, Membership, Refused, RollCall, StepFailed,
    ToKeeper, ToWorker,
)
from rollcall.core.placement import Copy, Placement, RecoveryPlan, Reload
from rollcall.core.types import Cursor

__all__ = ["CodecError", "WIRE_MESSAGE_TYPES", "TO_KEEPER_TYPES", "TO_WORKER_TYPES", "check_cursor",
           "plan_data", "plan_from_data", "check_id_set", "check_list",
           "check_flag", "check_nat", "check_text", "message_from_data", "message_to_data"]

Message = Union[ToKeeper, ToWorker]
#: the message types with a wire form (a simulator's JoinBatch never crosses one)
WIRE_MESSAGE_TYPES = (Join, Heartbeat, Leave, StepFailed, Checkpointed, RollCall, Refused, Membership)


class CodecError(ValueError):
    """Data that is not a message this protocol sends (what, and where)."""


# --- field kinds -----------------------------------------------------------------


def nat(v: Any, where: str) -> int:
    """A non-negative int (not a bool): ids, lives, generations, steps."""
    if type(v) is not int or v < 0:
        raise CodecError(f"{where}: expected a non-negative integer, got {v!r:.40}")
    return v


def text(v: Any, where: str, max_len: int = 256) -> str:
    if not isinstance(v, str) or len(v) > max_len:
        raise CodecError(f"{where}: expected a string of at most {max_len} characters")
    return v


def flag(v: Any, where: str) -> bool:
    if not isinstance(v, bool):
        raise CodecError(f"{where}: expected true or false, got {v!r:.40}")
    return v


def listed(v: Any, where: str) -> list:
    if not isinstance(v, list):
        raise CodecError(f"{where}: expected a list, got {type(v).__name__}")
    return v


def cursor(v: Any, where: str) -> Cursor:
    items = listed(v, where)
    if len(items) != 2:
        raise CodecError(f"{where}: a cursor is [step, sample]")
    return Cursor(nat(items[0], where + ".step"), nat(items[1], where + ".sample"))


def maybe(kind: Callable[[Any, str], Any]) -> Callable[[Any, str], Any]:
    return lambda v, where: None if v is None else kind(v, where)


def id_set(v: Any, where: str) -> IdRuns:
    runs = []
    for i, run in enumerate(listed(v, where)):
        pair = listed(run, f"{where}[{i}]")
        if len(pair) != 2:
            raise CodecError(f"{where}[{i}]: a run is [lo, hi]")
        runs.append((nat(pair[0], f"{where}[{i}]"), nat(pair[1], f"{where}[{i}]")))
    try:
        return IdRuns(runs)
    except ValueError as exc:
        raise CodecError(f"{where}: {exc}") from None


def nats(v: Any, where: str) -> tuple[int, ...]:
    return tuple(nat(x, f"{where}[{i}]") for i, x in enumerate(listed(v, where)))


def holders(v: Any, where: str) -> tuple[tuple[int, ...], ...]:
    return tuple(nats(h, f"{where}[{i}]") for i, h in enumerate(listed(v, where)))


# --- the messages ----------------------------------------------------------------

# type name -> (class, [(field, kind)]): the fields of each message in order
_STAMPED = [("worker", nat), ("incarnation", nat)]
_SCHEMAS: dict[str, tuple[type, list[tuple[str, Callable[[Any, str], Any]]]]] = {
    "Join": (Join, _STAMPED + [("cursor", maybe(cursor)), ("generation", nat)]),
    "Heartbeat": (Heartbeat, _STAMPED + [("generation", nat), ("counter", nat)]),
    "Leave": (Leave, list(_STAMPED)),
    "StepFailed": (StepFailed, _STAMPED + [("generation", nat), ("step", nat)]),
    "Checkpointed": (Checkpointed, _STAMPED + [("generation", nat), ("cursor", cursor)]),
    "RollCall": (RollCall, [("generation", nat), ("reason", text), ("term", nat)]),
    "Refused": (Refused, _STAMPED + [("generation", nat), ("reason", text), ("term", nat)]),
}


def message_to_data(message: Message) -> dict[str, Any]:
    """``message`` as plain data (what :func:`message_from_data` reads back)."""
    name = type(message).__name__
    if isinstance(message, Membership):
        return _membership_data(message)
    if name not in _SCHEMAS:
        raise CodecError(f"no wire form for {name}")
    out: dict[str, Any] = {"type": name}
    for field, _ in _SCHEMAS[name][1]:
        v = getattr(message, field)
        out[field] = v.to_json() if isinstance(v, Cursor) else v
    return out


def message_from_data(data: Any, allowed: Optional[frozenset[str]] = None) -> Message:
    """The message ``data`` describes, checked; ``allowed`` limits the types
    (a worker sends only its own kinds)."""
    if not isinstance(data, dict):
        raise CodecError("a message is an object")
    name = data.get("type")
    if not isinstance(name, str) or (allowed is not None and name not in allowed):
        raise CodecError(f"message type {name!r:.40} is not accepted here")
    if name == "Membership":
        return _membership(data)
    if name not in _SCHEMAS:
        raise CodecError(f"unknown message type {name!r:.40}")
    cls, fields = _SCHEMAS[name]
    _exact_keys(data, ["type"] + [f for f, _ in fields], name)
    return cls(**{f: kind(data[f], f"{name}.{f}") for f, kind in fields})


TO_KEEPER_TYPES = frozenset(("Join", "Heartbeat", "Leave", "StepFailed", "Checkpointed"))
TO_WORKER_TYPES = frozenset(("RollCall", "Refused", "Membership"))


def _exact_keys(data: dict, keys: list[str], name: str) -> None:
    if set(data) != set(keys):
        missing, extra = set(keys) - set(data), set(data) - set(keys)
        raise CodecError(f"{name}: missing {sorted(missing)}, unexpected {sorted(extra)[:5]}")


# --- Membership (ids as runs, the shard plan as nested lists) --------------------

_MEMBERSHIP = ["type", "generation", "members", "incarnations", "cursor", "source", "stale",
               "placement", "recovery", "fallback", "term"]


def _membership_data(m: Membership) -> dict[str, Any]:
    members = IdRuns.of(m.members)
    return {
        "type": "Membership", "generation": m.generation, "members": members.runs(),
        "incarnations": list(m.incarnations), "cursor": m.cursor.to_json(),
        "source": m.source, "stale": IdRuns.of(m.stale).runs(),
        "placement": None if m.placement is None else [list(h) for h in m.placement],
        "recovery": None if m.recovery is None else plan_data(m.recovery),
        "fallback": m.fallback, "term": m.term,
    }


def _membership(data: dict) -> Membership:
    _exact_keys(data, _MEMBERSHIP, "Membership")
    members = id_set(data["members"], "Membership.members")
    lives = nats(data["incarnations"], "Membership.incarnations")
    if len(lives) != len(members):
        raise CodecError("Membership.incarnations: one per member")
    stale = id_set(data["stale"], "Membership.stale")
    if not stale <= members:
        raise CodecError("Membership.stale: not all members")
    source = maybe(nat)(data["source"], "Membership.source")
    if source is not None and source not in members:
        raise CodecError("Membership.source: not a member")
    recovery = data["recovery"]
    return Membership(
        nat(data["generation"], "Membership.generation"), members, lives,
        cursor(data["cursor"], "Membership.cursor"), source, stale,
        maybe(holders)(data["placement"], "Membership.placement"),
        None if recovery is None else plan_from_data(recovery, "Membership.recovery"),
        flag(data["fallback"], "Membership.fallback"), nat(data["term"], "Membership.term"))


def plan_data(plan: RecoveryPlan) -> dict[str, Any]:
    return {"placement": [list(h) for h in plan.placement.shards],
            "copies": [[c.shard, c.src, c.dst] for c in plan.copies],
            "reloads": [[r.shard, r.dst] for r in plan.reloads],
            "lost": list(plan.lost), "promoted": list(plan.promoted)}


def plan_from_data(data: Any, where: str) -> RecoveryPlan:
    """The recovery plan :func:`plan_data` wrote, checked (``where``: for errors)."""
    if not isinstance(data, dict):
        raise CodecError(f"{where}: an object")
    _exact_keys(data, ["placement", "copies", "reloads", "lost", "promoted"], "RecoveryPlan")
    copies = [nats(c, f"{where}.copies[{i}]") for i, c in enumerate(listed(data["copies"], where))]
    reloads = [nats(r, f"{where}.reloads[{i}]")
               for i, r in enumerate(listed(data["reloads"], where))]
    if any(len(c) != 3 for c in copies) or any(len(r) != 2 for r in reloads):
        raise CodecError(f"{where}: a copy is [shard, src, dst], a reload [shard, dst]")
    try:
        placement = Placement(holders(data["placement"], where + ".placement"))
    except ValueError as exc:
        raise CodecError(f"{where}.placement: {exc}") from None
    return RecoveryPlan(placement, tuple(Copy(*c) for c in copies),
                        tuple(Reload(*r) for r in reloads),
                        nats(data["lost"], where + ".lost"),
                        nats(data["promoted"], where + ".promoted"))


# the field checks a wire of a driver's reuses for its own frames' fields
check_nat, check_text, check_flag, check_cursor = nat, text, flag, cursor
check_list, check_id_set = listed, id_set
