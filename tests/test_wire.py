"""The real target's wire: JSON frames checked by schema, and the handshake.

Every protocol message survives the trip exactly (a property over random
messages); every malformed, oversize, unknown or ill-typed frame is a
WireError, never an object; pickle bytes are not even read as one. The
hello's HMAC binds the run's key, the challenge's nonce and run id, and the
hello's own fields. The hostile-connection test with real processes is in
tests/test_real_hostile.py.
"""

from __future__ import annotations

import json
import os
import pickle
import stat
import struct
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from rollcall.core import (
    Checkpointed, Copy, Cursor, Heartbeat, IdRuns, Join, Leave, Membership, RecoveryPlan,
    Refused, Reload, RollCall, StepFailed, message_from_data, message_to_data,
)
from rollcall.core.placement import Placement
from real import wire

nat = st.integers(0, 10**6)
cursors = st.builds(Cursor, nat, nat)
to_keeper = st.one_of(
    st.builds(Join, nat, nat, st.none() | cursors, nat),
    st.builds(Heartbeat, nat, nat, nat, nat),
    st.builds(Leave, nat, nat),
    st.builds(StepFailed, nat, nat, nat, nat),
    st.builds(Checkpointed, nat, nat, nat, cursors),
)


@st.composite
def memberships(draw) -> Membership:
    members = IdRuns.of(draw(st.lists(st.integers(0, 300), min_size=1, max_size=40)))
    ids = list(members)
    stale = IdRuns.of(draw(st.lists(st.sampled_from(ids), max_size=5)))
    source = draw(st.none() | st.sampled_from(ids))
    lives = tuple(draw(st.lists(st.integers(0, 9), min_size=len(ids), max_size=len(ids))))
    placement = recovery = None
    if draw(st.booleans()):
        shards = tuple((ids[i % len(ids)],) for i in range(draw(st.integers(1, 6))))
        placement = shards
        recovery = RecoveryPlan(Placement(shards), (Copy(0, ids[0], ids[-1]),),
                                (Reload(0, ids[0]),), (1,), ())
    return Membership(draw(nat), members, lives, draw(cursors), source, stale, placement,
                      recovery, draw(st.booleans()))


to_worker = st.one_of(st.builds(RollCall, nat, st.sampled_from(["failure", "growth"])),
                      st.builds(Refused, nat, nat, nat, st.sampled_from(["not-member"])),
                      memberships())


@given(st.one_of(to_keeper, to_worker))
def test_every_message_crosses_the_wire_unchanged(message) -> None:
    data = json.loads(json.dumps(message_to_data(message)))  # what JSON can carry
    assert message_from_data(data) == message


@given(st.lists(st.one_of(to_keeper.map(lambda m: ("msg", m)),
                          st.just(("ready",)),
                          st.builds(lambda i: ("rec", {"f": "contribute", "samples": list(range(i))}),
                                    st.integers(0, 200))), max_size=8),
       st.integers(1, 50))
def test_frames_survive_any_split(frames: list[tuple], chunk: int) -> None:
    hello = ("hello", 1, 0, 123, False, "ab" * 32)
    data = b"".join(wire.encode(f) for f in [hello, *frames])
    reader = wire.FrameReader(wire.TO_LAUNCHER)
    got: list[tuple] = []
    for i in range(0, len(data), chunk):
        got += reader.feed(data[i:i + chunk])
        if got and got[0] == hello and len(got) == 1:
            reader.authenticated()  # the caller checked the hello: the rest may be large
            got += reader.more()
    assert got == [hello, *frames]


def _frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


@pytest.mark.parametrize("payload, why", [
    (pickle.dumps(("msg", Leave(1, 0))), "not JSON"),
    (b"\x00garbage", "not JSON"),
    (b'{"kind": "msg"}', "starts with its kind"),
    (b'["shout", 1]', "unknown frame kind"),
    (b'["ready", 1]', "1 fields, expected 0"),
    (b'["msg", {"type": "Leave", "worker": true, "incarnation": 0}]', "non-negative integer"),
    (b'["msg", {"type": "Leave", "worker": -1, "incarnation": 0}]', "non-negative integer"),
    (b'["msg", {"type": "Leave", "worker": 1}]', "missing"),
    (b'["msg", {"type": "Leave", "worker": 1, "incarnation": 0, "x": 1}]', "unexpected"),
    (b'["msg", {"type": "RollCall", "generation": 1, "reason": "x"}]', "not accepted here"),
    (b'["msg", {"type": "__import__"}]', "not accepted here"),
    (b'["rec", ["not", "a", "record"]]', "history record"),
    (b'["commit", 1, 0, 2, 3, {"no": "f"}, 0.1, 2]', "history record"),
    (b'["commit", 1, 0, 2, 3, {"f": "commit"}, -1, 2]', "seconds in"),
    (b'["commit", 1, 0, 2, 3, {"f": "commit"}, 1e9, 2]', "seconds in"),
    (b'["commit", 1, 0, 2, 3, {"f": "commit"}, 0.1, -2]', "non-negative integer"),
    (b'[' * 100_000 + b']' * 100_000, "not JSON"),
])
def test_a_bad_frame_is_an_error_not_an_object(payload: bytes, why: str) -> None:
    reader = wire.FrameReader(wire.TO_LAUNCHER, wire.MAX_FRAME)
    with pytest.raises(wire.WireError, match=why):
        reader.feed(_frame(payload))


def test_a_membership_that_contradicts_itself_is_refused() -> None:
    good = message_to_data(Membership(2, IdRuns.of([0, 1]), (0, 0), Cursor(), 0, IdRuns.of([1])))
    for bad, why in [({"incarnations": [0]}, "one per member"),
                     ({"stale": [[5, 5]]}, "not all members"),
                     ({"source": 7}, "not a member"),
                     ({"members": [[3, 1]]}, "empty run")]:
        frame = json.dumps(["msg", {**good, **bad}]).encode()
        with pytest.raises(wire.WireError, match=why):  # a reader per connection: it is dropped
            wire.FrameReader(wire.TO_WORKER, wire.MAX_FRAME).feed(_frame(frame))


def test_oversize_frames_are_refused_before_they_are_read() -> None:
    reader = wire.FrameReader(wire.TO_LAUNCHER)  # not authenticated yet: small frames only
    with pytest.raises(wire.WireError, match="over the limit"):
        reader.feed(struct.pack(">I", wire.MAX_HELLO + 1))
    reader = wire.FrameReader(wire.TO_LAUNCHER, wire.MAX_FRAME)
    with pytest.raises(wire.WireError, match="over the limit"):
        reader.feed(struct.pack(">I", 2**31))


def test_the_hello_mac_binds_key_challenge_and_fields(tmp_path: Path) -> None:
    key = wire.write_secret(tmp_path / "secret")
    assert stat.S_IMODE(os.stat(tmp_path / "secret").st_mode) == 0o600
    assert wire.read_secret(tmp_path / "secret") == key
    nonce, run = wire.new_nonce(), wire.new_nonce()
    mac = wire.hello_mac(key, nonce, run, 3, 1, 999, False)
    hello = ("hello", 3, 1, 999, False, mac)
    assert wire.hello_ok(key, nonce, run, hello)
    other = wire.write_secret(tmp_path / "other")
    assert not wire.hello_ok(other, nonce, run, hello)  # another run's key
    assert not wire.hello_ok(key, wire.new_nonce(), run, hello)  # replayed: another challenge
    assert not wire.hello_ok(key, nonce, wire.new_nonce(), hello)  # another run's id
    assert not wire.hello_ok(key, nonce, run, ("hello", 0, 1, 999, False, mac))  # worker forged
    with pytest.raises(FileExistsError):
        wire.write_secret(tmp_path / "secret")  # never over an existing key
