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


class Bench:
    """A relay on loopback, a listening socket standing in for the keeper
    service, and the agent's loop driving them; every socket it opens is
    closed at the end of the test, passed or failed."""

    def __init__(self) -> None:
        self.sel = selectors.DefaultSelector()
        self.keeper = socket.create_server(("127.0.0.1", 0))
        self.relay = Relay(self.sel, self.keeper.getsockname())
        self.socks: list[socket.socket] = []

    def close(self) -> None:
        for s in self.socks:
            s.close()
        self.relay.close()
        self.keeper.close()
        self.sel.close()

    def pump(self, until: Callable[[], bool]) -> None:
        """Run the agent's loop (select, events, flush) until ``until()``; bounded."""
        relay, deadline = self.relay, time.monotonic() + LIMIT_S
        while not until():
            assert time.monotonic() < deadline, "the relay did not get there in time"
            due = relay.next_due()
            wait = 0.05 if due is None else min(0.05, max(0.0, due - time.monotonic()))
            for key, mask in self.sel.select(wait):
                relay.event(key.data, mask, time.monotonic())
            relay.flush(time.monotonic())

    def connect(self) -> tuple[socket.socket, socket.socket]:
        """A worker's connection through the relay, and the keeper's side of it."""
        worker = socket.create_connection(("127.0.0.1", self.relay.port), timeout=LIMIT_S)
        self.socks.append(worker)
        n = len(self.relay.pairs)
        self.pump(lambda: len(self.relay.pairs) > n)
        upstream, _ = self.keeper.accept()
        self.socks.append(upstream)
        upstream.settimeout(LIMIT_S)
        return worker, upstream

    def recv_exactly(self, sock: socket.socket, n: int) -> bytes:
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

        self.pump(done)
        return bytes(got)

    def recv_end(self, sock: socket.socket) -> None:
        """Run the loop until ``sock`` reads the end of its stream (the relay
        passes it on only when due, as late as the data before it)."""
        sock.setblocking(False)

        def ended() -> bool:
            try:
                data = sock.recv(16)
            except BlockingIOError:
                return False
            assert not data, f"data after the last: {data!r}"
            return True

        self.pump(ended)


@pytest.fixture
def bench():
    b = Bench()
    yield b
    b.close()


def test_bytes_pass_both_ways_unchanged(bench: Bench) -> None:
    worker, up = bench.connect()
    payload = bytes(range(256)) * 1000
    worker.sendall(payload)
    assert bench.recv_exactly(up, len(payload)) == payload
    up.sendall(b"membership")
    assert bench.recv_exactly(worker, 10) == b"membership"


def test_a_delay_holds_each_chunk_back_and_keeps_the_order(bench: Bench) -> None:
    relay = bench.relay
    worker, up = bench.connect()
    relay.set_delay(0.3)
    sent = time.monotonic()
    worker.sendall(b"beat-1")
    got = bench.recv_exactly(up, 6)
    assert got == b"beat-1" and time.monotonic() - sent >= 0.3
    # a chunk read after the delay ends still leaves after the held one
    worker.sendall(b"beat-2")
    bench.pump(lambda: relay.next_due() is not None)
    relay.set_delay(0.0)
    worker.sendall(b"beat-3")
    assert bench.recv_exactly(up, 12) == b"beat-2beat-3"


def test_an_end_of_stream_follows_the_data_before_it(bench: Bench) -> None:
    relay = bench.relay
    worker, up = bench.connect()
    relay.set_delay(0.2)
    worker.sendall(b"last words")
    worker.shutdown(socket.SHUT_WR)
    assert bench.recv_exactly(up, 10) == b"last words"
    bench.recv_end(up)  # then the end, as the worker's close would arrive
    up.shutdown(socket.SHUT_WR)
    bench.pump(lambda: not relay.pairs)  # both ends over: the pair is gone


def test_a_peer_that_stops_reading_loses_its_pair_not_the_relay(bench: Bench, monkeypatch) -> None:
    monkeypatch.setattr(relay_mod, "MAX_QUEUED", 1 << 20)
    relay = bench.relay
    worker, _ = bench.connect()
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

    bench.pump(flood)
    assert not relay.pairs
    other, up2 = bench.connect()  # the relay still serves
    relay.set_delay(0.0)
    other.sendall(b"ok")
    assert bench.recv_exactly(up2, 2) == b"ok"
