"""Hostile connections to a real run's record-keeper service (the wire).

On the old wire any local process could run code as the launcher's user
with one pickled frame, end the run with 9 bytes of garbage, or join as
"worker 0" with a forged hello. Here a real run is attacked with each of
those (and an oversize length, a frame before the hello, a hello replayed
from another challenge) while it starts, and must complete, valid, with one
``reject`` record per attack and no forged membership change.
"""

from __future__ import annotations

import json
import pickle
import socket
import struct
import threading
from pathlib import Path
from typing import Callable

import pytest

from rollcall.core import Leave, message_to_data
from rollcall.results import read_history
from rollcall.scenario import load_scenario
from polling import wait_for
from real_processes import REAL_PROCESSES

ROOT = Path(__file__).resolve().parent.parent
pytestmark = REAL_PROCESSES


def _frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


def _json(items: list) -> bytes:
    return _frame(json.dumps(items).encode())


class _Touch:
    """Unpickling this creates ``path``: the proof that a pickle ran."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def _attack(port: int, send: Callable[[dict], bytes]) -> bool:
    """Connect, read the challenge, send what ``send`` makes of it; whether the
    service then closed the connection (bounded)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        buf = b""
        while len(buf) < 4 or len(buf) < 4 + struct.unpack(">I", buf[:4])[0]:
            chunk = s.recv(4096)
            assert chunk, "closed before the challenge"
            buf += chunk
        kind, nonce, run = json.loads(buf[4:4 + struct.unpack(">I", buf[:4])[0]])
        assert kind == "challenge"
        s.sendall(send({"nonce": nonce, "run": run}))
        try:
            while s.recv(4096):
                pass  # anything the service still sends before it closes
        except socket.timeout:
            return False
        return True


@pytest.mark.timeout(180)
def test_hostile_connections_lose_themselves_not_the_run(tmp_path: Path) -> None:
    from real import wire
    from real.driver import merge_history, summarize
    from real.launcher import Launcher

    sc = load_scenario(ROOT / "scenarios" / "real-kill-one.yaml",
                       ["failures.schedule=[]", "workload.steps=60"])
    out = tmp_path / "run"
    marker = tmp_path / "pwned"
    launcher = Launcher(sc, out)
    runner = threading.Thread(target=launcher.run, daemon=True)
    runner.start()
    try:
        port = wait_for(lambda: getattr(launcher, "port", None), 60, "the service's port")
        other_key = b"k" * wire.SECRET_BYTES

        def forged(c: dict) -> bytes:  # worker 0's hello, without the run's key
            return _json(["hello", 0, 0, 1, False, wire.hello_mac(other_key, c["nonce"], c["run"],
                                                                   0, 0, 1, False)])

        def replayed(c: dict) -> bytes:  # a hello that answered another challenge
            return _json(["hello", 0, 0, 1, False, wire.hello_mac(launcher.secret, wire.new_nonce(),
                                                                   c["run"], 0, 0, 1, False)])

        attacks = {
            "pickle": lambda c: _frame(pickle.dumps(_Touch(marker))),
            "garbage": lambda c: b"garbage!!",
            "oversize": lambda c: struct.pack(">I", 2**31 - 1),
            "before-hello": lambda c: _json(["msg", message_to_data(Leave(0, 0))]),
            "forged-hello": forged,
            "replayed-hello": replayed,
        }
        closed = {name: _attack(port, send) for name, send in attacks.items()}
        assert all(closed.values()), closed
        runner.join(150)
        assert not runner.is_alive(), "the run did not end"
    finally:
        if runner.is_alive():
            launcher.finish("interrupted", "test cleanup")
            runner.join(60)
    assert not marker.exists(), "a pickled frame ran code"
    records = merge_history(out)
    summary = summarize(sc, launcher, records)
    assert summary["completed"] is True and summary["valid"] is True, summary["violations"]
    rejects = [r for r in read_history(out) if r["f"] == "reject"]
    assert len(rejects) == len(attacks), rejects
    assert all(r["authenticated"] is False and r["worker"] is None for r in rejects), rejects
    assert summary["generations"] == 1  # no forged worker changed the membership
    assert not (out / "real" / "secret").exists(), "the run's key outlived the run"
