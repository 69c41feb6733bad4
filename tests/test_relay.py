"""The host agent's relay of the keeper link (real/relay.py): what the real
target's ``delay`` fault rests on. Driven here on loopback by the selector
loop the agent runs, without namespaces: bytes pass through unchanged and in
order, a delay holds each chunk back at least that long (and keeps the order
across a change of delay), an end of stream follows the data before it, and
a peer that stops reading loses its connection pair, not the relay."""

from __future__ import annotations

import selectors
import socket
import time
from typing import Callable

import pytest

from real import relay as relay_mod
from real.relay import Relay

LIMIT_S = 30.0  # every wait's bound (generous: the suite runs beside a CPU hog)


@pytest.fixture
def keeper():
    """A listening socket standing in for the keeper service."""
    srv = socket.create_server(("127.0.0.1", 0))
    yield srv
    srv.close()


@pytest.fixture
def sel():
    s = selectors.DefaultSelector()
    yield s
    s.close()


def pump(sel: selectors.BaseSelector, relay: Relay, until: Callable[[], bool]) -> None:
    """Run the agent's loop (select, events, flush) until ``until()``; bounded."""
    deadline = time.monotonic() + LIMIT_S
    while not until():
        assert time.monotonic() < deadline, "the relay did not get there in time"
        due = relay.next_due()
        wait = 0.05 if due is None else min(0.05, max(0.0, due - time.monotonic()))
        for key, mask in sel.select(wait):
            relay.event(key.data, mask, time.monotonic())
        relay.flush(time.monotonic())


def connect(sel, relay, keeper) -> tuple[socket.socket, socket.socket]:
    """A worker's connection through the relay, and the keeper's side of it."""
    worker = socket.create_connection(("127.0.0.1", relay.port), timeout=LIMIT_S)
    pump(sel, relay, lambda: bool(relay.pairs))
    upstream, _ = keeper.accept()
    upstream.settimeout(LIMIT_S)
    return worker, upstream


def recv_exactly(sel, relay, sock: socket.socket, n: int) -> bytes:
    sock.setblocking(False)
    got = bytearray()

    def done() -> bool:
        try:
            data = sock.recv(1 << 16)
        except BlockingIOError:
            return False
        assert data, "the stream ended early"
        got.extend(data)
        return len(got) >= n

    pump(sel, relay, done)
    return bytes(got)


def test_bytes_pass_both_ways_unchanged(sel, keeper) -> None:
    relay = Relay(sel, keeper.getsockname())
    worker, up = connect(sel, relay, keeper)
    payload = bytes(range(256)) * 1000
    worker.sendall(payload)
    assert recv_exactly(sel, relay, up, len(payload)) == payload
    up.sendall(b"membership")
    assert recv_exactly(sel, relay, worker, 10) == b"membership"
    relay.close()
    worker.close()
    up.close()


def test_a_delay_holds_each_chunk_back_and_keeps_the_order(sel, keeper) -> None:
    relay = Relay(sel, keeper.getsockname())
    worker, up = connect(sel, relay, keeper)
    relay.set_delay(0.3)
    sent = time.monotonic()
    worker.sendall(b"beat-1")
    got = recv_exactly(sel, relay, up, 6)
    assert got == b"beat-1" and time.monotonic() - sent >= 0.3
    # a chunk read after the delay ends still leaves after the held one
    worker.sendall(b"beat-2")
    pump(sel, relay, lambda: relay.next_due() is not None)
    relay.set_delay(0.0)
    worker.sendall(b"beat-3")
    assert recv_exactly(sel, relay, up, 12) == b"beat-2beat-3"
    relay.close()
    worker.close()
    up.close()


def test_an_end_of_stream_follows_the_data_before_it(sel, keeper) -> None:
    relay = Relay(sel, keeper.getsockname())
    worker, up = connect(sel, relay, keeper)
    relay.set_delay(0.2)
    worker.sendall(b"last words")
    worker.close()
    assert recv_exactly(sel, relay, up, 10) == b"last words"
    up.setblocking(True)
    assert up.recv(16) == b""  # then the end, as the worker's close would arrive
    up.close()
    pump(sel, relay, lambda: not relay.pairs)  # both ends over: the pair is gone
    relay.close()


def test_a_peer_that_stops_reading_loses_its_pair_not_the_relay(sel, keeper, monkeypatch) -> None:
    monkeypatch.setattr(relay_mod, "MAX_QUEUED", 1 << 20)
    relay = Relay(sel, keeper.getsockname())
    worker, up = connect(sel, relay, keeper)
    relay.set_delay(3600.0)  # nothing is passed on: the backlog only grows
    worker.setblocking(False)
    chunk = b"x" * 65536

    def flood() -> bool:
        try:
            worker.send(chunk)
        except BlockingIOError:
            pass
        except OSError:
            return True  # the relay dropped the connection
        return not relay.pairs

    pump(sel, relay, flood)
    assert not relay.pairs
    other, up2 = connect(sel, relay, keeper)  # the relay still serves
    relay.set_delay(0.0)
    other.sendall(b"ok")
    assert recv_exactly(sel, relay, up2, 2) == b"ok"
    for s in (worker, up, other, up2):
        s.close()
    relay.close()
