"""Frames between the launcher and its workers: length-prefixed JSON, checked.

Every frame is a 4-byte big-endian length and a JSON array whose first item
names the kind; each kind has a fixed list of fields, checked on arrival
(:data:`TO_LAUNCHER`, :data:`TO_WORKER`). Protocol messages travel in the
core's plain-data form (``rollcall.core.message_to_data``), history records as
JSON objects. Nothing is unpickled: a peer's bytes can only ever become one
of these tuples, or a :class:`WireError`.

Connections are authenticated with the run's secret (a random key the
launcher writes to a 0600 file, :func:`write_secret`): the launcher opens
every connection with a ``challenge`` (a fresh nonce and the run's id) and
the first frame back must be a ``hello`` carrying the HMAC-SHA256 of both
and of the hello's own fields (:func:`hello_mac`). A frame recorded from
another run, or forged without the key, fails the check.

worker -> launcher
    ("hello", worker, incarnation, pid, spare, mac)   first frame on a connection
    ("ready",)                                   torch imported, model built
    ("msg", ToKeeper)                            a protocol message for the keeper
    ("rec", dict)                                a history record to append
    ("commit", worker, incarnation, gen, step, record, compute_s, load)
                                                 may step ``step`` of ``gen`` commit? (and
                                                 its gradients took compute_s over load
                                                 micro-batches: the straggler policy's input)
    ("fatal", worker, reason)                    no retry can help (diverged)
    ("final", worker, incarnation, [step, sample], sha256)
host agent -> launcher (see real/host.py; the same connection kinds, the
first frame tells a worker from a host agent)
    ("host_hello", host, pid, mac)               first frame on a host agent's connection
    ("started", worker, incarnation, pid)        a worker process it was told to start runs
    ("exited", worker, incarnation, returncode)  ... and is gone (returncode < 0: -signal)
launcher -> host agent
    ("challenge", nonce, run)                    first frame on a connection
    ("setup", run_dir, t0, keeper_now, boot_id)  where the run lives; the clock (see host.py)
    ("start", worker, incarnation, spare)        start this worker life
    ("signal", worker, incarnation, signum)      SIGKILL, SIGSTOP or SIGCONT one of them
    ("lose",)                                    die now with every worker, reporting nothing
launcher -> worker
    ("challenge", nonce, run)                    first frame on a connection
    ("welcome", store_port)                      where the per-generation stores live
    ("msg", ToWorker)                            the keeper's answer
    ("ack", gen, step, accepted)                 answer to a commit request
    ("activate",)                                a standby spare becomes a worker
    ("keeper", term)                             a new keeper serves (keeper.store: etcd)
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import signal
import socket
import struct
from pathlib import Path
from typing import Any, Callable, Optional

import orjson

from rollcall.core import (
    TO_KEEPER_TYPES, TO_WORKER_TYPES, WIRE_MESSAGE_TYPES, CodecError, check_cursor, check_flag,
    check_nat, check_text, message_from_data, message_to_data,
)
from rollcall.scenario import MAX_LATENCY_S

_LEN = struct.Struct(">I")
MAX_FRAME = 16 << 20  # an authenticated peer's frame
MAX_HELLO = 4096  # any frame before the peer is authenticated
SECRET_BYTES = 32


class WireError(ValueError):
    """Bytes that are not a frame of this protocol (what was wrong)."""


def _record(v: Any, where: str) -> dict:
    # decoded JSON: an object's keys are strings already
    if not isinstance(v, dict) or not isinstance(v.get("f"), str):
        raise CodecError(f"{where}: a history record is an object with a string 'f'")
    return v


def _hexdigest(v: Any, where: str) -> str:
    s = check_text(v, where, 128)
    if any(c not in "0123456789abcdef" for c in s):
        raise CodecError(f"{where}: expected lowercase hex")
    return s


def _int(v: Any, where: str) -> int:
    """Any int (not a bool): a return code, negative for a signal."""
    if type(v) is not int or abs(v) > 1 << 31:
        raise CodecError(f"{where}: expected an integer, got {v!r:.40}")
    return v


def _number(v: Any, where: str) -> float:
    """A finite float or int (not a bool): a clock reading."""
    if type(v) not in (int, float) or not abs(v) < 1e15:
        raise CodecError(f"{where}: expected a finite number, got {v!r:.40}")
    return float(v)


def _delay_s(v: Any, where: str) -> float:
    """A link delay: 0 <= seconds <= the schema's limit (bounded: the relay holds what it delays)."""
    x = _number(v, where)
    if not 0.0 <= x <= MAX_LATENCY_S:
        raise CodecError(f"{where}: expected a delay in [0, {MAX_LATENCY_S:g}] s, got {v!r:.40}")
    return x


def _compute_s(v: Any, where: str) -> float:
    """A step's compute: 0 <= seconds <= a day (a longer one is not a step)."""
    x = _number(v, where)
    if not 0.0 <= x <= 86400.0:
        raise CodecError(f"{where}: expected seconds in [0, 86400], got {v!r:.40}")
    return x


def _factor(v: Any, where: str) -> float:
    """A slowdown: 1 <= times slower <= 1000 (1: none; the schema's bounds)."""
    x = _number(v, where)
    if not 1.0 <= x <= 1000.0:
        raise CodecError(f"{where}: expected a factor in [1, 1000], got {v!r:.40}")
    return x


#: the signals a host agent may be told to send to its workers
HOST_SIGNALS = frozenset({signal.SIGKILL, signal.SIGSTOP, signal.SIGCONT})


def _signum(v: Any, where: str) -> int:
    if type(v) is not int or v not in HOST_SIGNALS:
        raise CodecError(f"{where}: expected SIGKILL, SIGSTOP or SIGCONT, got {v!r:.40}")
    return v


def _message(allowed: frozenset[str]) -> Callable[[Any, str], Any]:
    return lambda v, where: message_from_data(v, allowed)


nat, flag, text = check_nat, check_flag, check_text

TO_LAUNCHER: dict[str, tuple[Callable[[Any, str], Any], ...]] = {
    "hello": (nat, nat, nat, flag, _hexdigest),
    "ready": (),
    "msg": (_message(TO_KEEPER_TYPES),),
    "rec": (_record,),
    "commit": (nat, nat, nat, nat, _record, _compute_s, nat),
    "fatal": (nat, text),
    "final": (nat, nat, lambda v, w: check_cursor(v, w).to_json(), _hexdigest),
    "host_hello": (nat, nat, _hexdigest),
    "started": (nat, nat, nat),
    "exited": (nat, nat, _int),
}
TO_HOST: dict[str, tuple[Callable[[Any, str], Any], ...]] = {
    "challenge": (_hexdigest, _hexdigest),
    "setup": (lambda v, w: check_text(v, w, 4096), _number, _number, text),
    "start": (nat, nat, flag),
    "signal": (nat, nat, _signum),
    "lose": (),
    "delay": (_delay_s,),
}
TO_WORKER: dict[str, tuple[Callable[[Any, str], Any], ...]] = {
    "challenge": (_hexdigest, _hexdigest),
    "welcome": (nat,),
    "msg": (_message(TO_WORKER_TYPES),),
    "ack": (nat, nat, flag),
    "activate": (),
    "late_beats": (_delay_s,),  # a late_heartbeats fault: hold each heartbeat this long (0: on time)
    # a slow fault: compute this many times slower (1: full speed) from this step on
    "slow": (_factor, nat),
    # keeper.store: etcd: a keeper of this term serves now (after a failover):
    # ask again what went unanswered (Agent.reconnected)
    "keeper": (nat,),
}


# keeper.worker_links: direct: a worker's own link to the active keeper
# process (real/keeper_proc.py), whose address it found in etcd
WORKER_TO_KEEPER: dict[str, tuple[Callable[[Any, str], Any], ...]] = {
    "hello": TO_LAUNCHER["hello"],
    "msg": TO_LAUNCHER["msg"],
    "commit": TO_LAUNCHER["commit"],
}
KEEPER_TO_WORKER: dict[str, tuple[Callable[[Any, str], Any], ...]] = {
    "challenge": TO_WORKER["challenge"],
    "msg": TO_WORKER["msg"],
    "ack": TO_WORKER["ack"],
    "keeper": TO_WORKER["keeper"],  # the keeper's term, once it serves this link
}


def encode(frame: tuple) -> bytes:
    """One frame: its kind, then its fields (messages in their plain-data form)."""
    items = [message_to_data(x) if isinstance(x, WIRE_MESSAGE_TYPES) else x for x in frame]
    # orjson: compact JSON; it refuses what is not JSON (NaN is written null)
    data = orjson.dumps(items)
    assert len(data) <= MAX_FRAME, ("frame too large to send", frame[0], len(data))
    return _LEN.pack(len(data)) + data


_WHERE: dict[str, tuple[str, ...]] = {}  # kind -> its fields' names in errors, made once


def decode(data: bytes, kinds: dict[str, tuple]) -> tuple:
    """The frame ``data`` holds, every field checked against its kind's schema."""
    try:
        # strict JSON: bad UTF-8, NaN and Infinity, and nesting past 1024 levels are refused
        items = orjson.loads(data)
    except (orjson.JSONDecodeError, RecursionError) as exc:
        raise WireError(f"not JSON: {str(exc)[:80]}") from None
    if not isinstance(items, list) or not items or not isinstance(items[0], str):
        raise WireError("a frame is a list that starts with its kind")
    kind, args = items[0], items[1:]
    fields = kinds.get(kind)
    if fields is None:
        raise WireError(f"unknown frame kind {kind!r:.40}")
    if len(args) != len(fields):
        raise WireError(f"{kind}: {len(args)} fields, expected {len(fields)}")
    where = _WHERE.get(kind)
    if where is None:
        where = _WHERE[kind] = tuple(f"{kind}[{i}]" for i in range(len(fields)))
    try:
        return (kind, *[check(v, w) for check, v, w in zip(fields, args, where)])
    except CodecError as exc:
        raise WireError(str(exc)) from None


class FrameReader:
    """Incremental decoder: feed bytes, take whole checked frames.

    ``limit`` bounds one frame (and so the buffer); :meth:`authenticated`
    raises it from :data:`MAX_HELLO` to :data:`MAX_FRAME`.
    """

    def __init__(self, kinds: dict[str, tuple], limit: int = MAX_HELLO) -> None:
        self._buf = bytearray()
        self.kinds = kinds
        self.limit = limit

    def authenticated(self) -> None:
        self.limit = MAX_FRAME

    def feed(self, data: bytes) -> list[tuple]:
        self._buf += data
        out = []
        while len(self._buf) >= 4:
            (n,) = _LEN.unpack_from(self._buf, 0)
            if n > self.limit:
                raise WireError(f"frame of {n} bytes is over the limit of {self.limit}")
            if len(self._buf) < 4 + n:
                break
            out.append(decode(bytes(self._buf[4:4 + n]), self.kinds))
            del self._buf[:4 + n]
            if out[-1][0] in ("hello", "host_hello", "sup_hello", "challenge"):
                break  # the rest waits for the caller to authenticate (and call again)
        return out

    def more(self) -> list[tuple]:
        """Frames already buffered (after a ``hello`` or ``challenge`` stopped :meth:`feed`)."""
        return self.feed(b"")


def send_some(sock: Any, out: bytearray, limit: int) -> Optional[str]:
    """Send what a non-blocking socket takes of ``out`` now (and drop it from
    ``out``). Returns why the link is over, or None: ``send-failed`` (the
    socket broke), ``backlog`` (the peer stopped reading and more than
    ``limit`` bytes wait: a peer that does not read must not stall us)."""
    try:
        n = sock.send(out) if out else 0
    except BlockingIOError:
        n = 0
    except OSError:
        return "send-failed"
    del out[:n]
    return "backlog" if len(out) > limit else None


def connect_to(address: str, timeout_s: float) -> socket.socket:
    """A TCP connection to ``host:port`` (the address a keeper published in
    etcd); OSError if nothing answers in time."""
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=timeout_s)


def recv_some(sock: Any) -> Optional[bytes]:
    """What a non-blocking socket holds now: None if nothing yet, ``b""`` at
    its end (or on an error: the link is over either way)."""
    try:
        return sock.recv(1 << 20)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError:
        return b""


def close_watched(sel: Any, sock: Any) -> None:
    """Stop watching ``sock`` in selector ``sel`` (if it was watched) and close it."""
    try:
        sel.unregister(sock)
    except (KeyError, ValueError):
        pass
    sock.close()


def feed_frames(reader: FrameReader, data: bytes, handle: Callable[[tuple], Any],
                alive: Callable[[], bool] = lambda: True) -> None:
    """Hand each whole frame of ``data`` to ``handle`` in order, while
    ``alive()``: after a hello the reader stops until the handler has
    authenticated the peer, then goes on (:meth:`FrameReader.more`).
    A :class:`WireError` propagates: the caller drops the peer."""
    frames = reader.feed(data)
    while frames and alive():
        for frame in frames:
            handle(frame)
            if not alive():
                return
        frames = reader.more()


# --- the run's secret and the handshake ----------------------------------------


def write_secret(path: Path) -> bytes:
    """A fresh random key, written to ``path`` readable by its owner only."""
    key = secrets.token_bytes(SECRET_BYTES)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(key)
    return key


def read_secret(path: str | Path) -> bytes:
    key = Path(path).read_bytes()
    if len(key) != SECRET_BYTES:
        raise WireError(f"{path}: not a run secret ({len(key)} bytes)")
    return key


def new_nonce() -> str:
    return secrets.token_hex(16)


def hello_mac(key: bytes, nonce: str, run: str, worker: int, incarnation: int, pid: int,
              spare: bool) -> str:
    """The HMAC a ``hello`` carries: of the challenge and of the hello's fields."""
    msg = json.dumps(["rollcall-hello", nonce, run, worker, incarnation, pid, spare],
                     separators=(",", ":")).encode("utf-8")
    return hmac.new(key, msg, hashlib.sha256).hexdigest()


def hello_ok(key: bytes, nonce: str, run: str, frame: tuple) -> bool:
    _, worker, incarnation, pid, spare, mac = frame
    want = hello_mac(key, nonce, run, worker, incarnation, pid, spare)
    return hmac.compare_digest(want, mac)


def host_mac(key: bytes, nonce: str, run: str, host: int, pid: int) -> str:
    """The HMAC a ``host_hello`` carries: of the challenge and of its fields
    (a tag of its own, so a worker's hello can never pass for a host's)."""
    msg = json.dumps(["rollcall-host", nonce, run, host, pid], separators=(",", ":")).encode("utf-8")
    return hmac.new(key, msg, hashlib.sha256).hexdigest()


def host_hello_ok(key: bytes, nonce: str, run: str, frame: tuple) -> bool:
    _, host, pid, mac = frame
    return hmac.compare_digest(host_mac(key, nonce, run, host, pid), mac)
