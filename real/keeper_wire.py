"""Frames between the launcher and a keeper process (``keeper.store: etcd``).

The same framing and checks as :mod:`real.wire` (length-prefixed JSON, every
field checked on arrival, nothing unpickled), with kinds of their own. The
keeper process serves; the launcher (the supervisor) connects to the address
the active keeper published in etcd. The keeper opens with a ``challenge``;
the launcher's first frame is a ``sup_hello`` carrying the HMAC of the
challenge under the run's secret, then a ``report`` of what it knows
physically (the lives it started, the nodes that are down, the lives whose
process exited, the repair shop's capacity): the new keeper's
:meth:`Keeper.take_over` input.

launcher -> keeper
    ("sup_hello", pid, mac)
    ("report", [[worker, life]...], [down worker...], [[worker, life]...], capacity)
    ("msgs", [ToKeeper...])                     messages that arrived together
    ("exited", worker, incarnation)
    ("node_down", worker)
    ("node_up", worker)                         answered by ("life", worker, life)
    ("capacity", nodes)                         the fleet's nodes in service or to come
    ("commit", ask, worker, incarnation, gen, step, compute_s, load)
    ("batch", [[worker, life]...], until)       direct links: hold these lives' Joins
    ("gate", step)                              direct links: the next step a fault waits for
    ("release", worker, life, gen, step, freeze)  direct links: send the ack held at a gate
                                                 (freeze: hear no worker until "resume")
    ("resume",)                                 direct links: the gate's later faults are in
keeper -> launcher
    ("challenge", nonce, run)
    ("term", term)                               this keeper's term, once
    ("send", worker, ToWorker)
    ("broadcast", [[lo, hi]...], ToWorker)
    ("rec", record)
    ("formed", gen, [[lo, hi]...])               the generation and its members
    ("restart", gen, reason, [[lo, hi]...])      tear these members down
    ("relaunch", gen, [[worker, life]...])
    ("job_failed", reason)
    ("verdict", ask, ok, first, complete, reason)
    ("life", worker, life)
    ("committed", worker, life, gen, step, ok, first, complete, reason, record, held)
                                                 direct links: a commit a worker asked
    ("released", worker, life, gen, step)        direct links: the held ack went (frozen)

``keeper.worker_links: direct``: each worker also links to the active keeper
itself, found through etcd (:mod:`real.worker`), with the frames of
:data:`real.wire.WORKER_TO_KEEPER` and :data:`real.wire.KEEPER_TO_WORKER`
(a worker's ``hello`` instead of the ``sup_hello``). The keeper answers its
commits; the launcher hears each (``committed``: the history's record, the
scripted faults of a step) and, at a gate step (one a scripted fault waits
for), the keeper holds the last member's ack until the launcher has put the
fault in (``release``), as the launcher did when it relayed.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any, Callable

from rollcall.core import (
    TO_KEEPER_TYPES, TO_WORKER_TYPES, CodecError, check_flag, check_id_set, check_list,
    check_nat, check_text, message_from_data,
)
from real.wire import _compute_s, _hexdigest, _number, _record

nat, flag, text, listed = check_nat, check_flag, check_text, check_list
MAX_LIST = 1 << 20  # ids or lives in one frame


def _pairs(v: Any, where: str) -> list[tuple[int, int]]:
    items = listed(v, where)
    if len(items) > MAX_LIST:
        raise CodecError(f"{where}: more than {MAX_LIST} items")
    out = []
    for i, x in enumerate(items):
        pair = listed(x, f"{where}[{i}]")
        if len(pair) != 2:
            raise CodecError(f"{where}[{i}]: a pair")
        out.append((nat(pair[0], where), nat(pair[1], where)))
    return out


def _nats(v: Any, where: str) -> list[int]:
    items = listed(v, where)
    if len(items) > MAX_LIST:
        raise CodecError(f"{where}: more than {MAX_LIST} items")
    return [nat(x, f"{where}[{i}]") for i, x in enumerate(items)]


def _ids(v: Any, where: str) -> Any:
    """An id set as its inclusive runs ``[[lo, hi], ...]`` (at most MAX_LIST)."""
    if len(listed(v, where)) > MAX_LIST:
        raise CodecError(f"{where}: more than {MAX_LIST} items")
    return check_id_set(v, where)


def _messages(v: Any, where: str) -> list:
    items = listed(v, where)
    if len(items) > MAX_LIST:
        raise CodecError(f"{where}: more than {MAX_LIST} messages")
    return [message_from_data(x, TO_KEEPER_TYPES) for x in items]


def _to_worker(v: Any, where: str) -> Any:
    return message_from_data(v, TO_WORKER_TYPES)


TO_KEEPER_PROC: dict[str, tuple[Callable[[Any, str], Any], ...]] = {
    "sup_hello": (nat, _hexdigest),
    "report": (_pairs, _nats, _pairs, nat),
    "msgs": (_messages,),
    "exited": (nat, nat),
    "node_down": (nat,),
    "node_up": (nat,),
    "capacity": (nat,),
    "commit": (nat, nat, nat, nat, nat, _compute_s, nat),
    "batch": (_pairs, _number),
    "gate": (nat,),
    "release": (nat, nat, nat, nat, flag),
    "resume": (),
}
TO_SUPERVISOR: dict[str, tuple[Callable[[Any, str], Any], ...]] = {
    "challenge": (_hexdigest, _hexdigest),
    "term": (nat,),
    "send": (nat, _to_worker),
    "broadcast": (_ids, _to_worker),
    "rec": (_record,),
    "formed": (nat, _ids),
    "restart": (nat, text, _ids),
    "relaunch": (nat, _pairs),
    "job_failed": (lambda v, w: check_text(v, w, 1024),),
    "verdict": (nat, flag, flag, flag, text),
    "life": (nat, nat),
    "committed": (nat, nat, nat, nat, flag, flag, flag, text, _record, flag),
    "released": (nat, nat, nat, nat),
}


def supervisor_mac(key: bytes, nonce: str, run: str, pid: int) -> str:
    """The HMAC a ``sup_hello`` carries (a tag of its own: a worker's or a
    host agent's hello never passes for it)."""
    msg = json.dumps(["rollcall-supervisor", nonce, run, pid], separators=(",", ":")).encode()
    return hmac.new(key, msg, hashlib.sha256).hexdigest()


def supervisor_ok(key: bytes, nonce: str, run: str, frame: tuple) -> bool:
    _, pid, mac = frame
    return hmac.compare_digest(supervisor_mac(key, nonce, run, pid), mac)
