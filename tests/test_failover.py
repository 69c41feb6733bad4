"""The keeper's durable record and failover, in the core.

A keeper whose record lives in a store writes each generation before any
worker hears of it (``Persist``), stops deciding when its lease lapses or
the store refuses it (``Deposed``), and a successor of the next term rebuilds
it from the last record (``Keeper.restored``) and holds a roll call
(``take_over``). Workers drop what an older term says. The stateful model
(tests/test_protocol_stateful.py, ``durable``) kills the keeper among every
other fault; these are the examples that pin each piece down.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, strategies as st

from protocol_net import DATA, World
from rollcall.core.agent import Agent, Enter
from rollcall.core.checkers import check
from rollcall.core.codec import CodecError, message_from_data, message_to_data
from rollcall.core.detector import TimeoutDetector
from rollcall.core.idset import IdRuns
from rollcall.core.keeper import (
    RENEW_SHARE, Broadcast, Deposed, Keeper, KeeperConfig, Persist, Record, last_renewal,
)
from rollcall.core.lives import LifeTable
from rollcall.core.messages import Join, Membership, Refused, RollCall
from rollcall.core.record import record_from_data, record_to_data
from rollcall.core.sharding import ShardSpec
from rollcall.core.types import Cursor

HEAL_S = 30.0


def _config(**kw) -> KeeperConfig:
    return KeeperConfig(min_workers=3, max_workers=3, last_call_s=0.0,
                        detector=TimeoutDetector(0.5, 3.0), durable=True, **kw)


def _first_generation(k: Keeper) -> list:
    """Three workers join at t=0; the outputs up to the store's answer."""
    out = []
    for w in range(3):
        out += k.receive(0.0, Join(w, 0, None))
    return out


def _settle_and_train(w: World, steps: int = 3) -> None:
    """Run until the live workers form a generation and commit ``steps`` steps in it."""
    deadline = w.now + HEAL_S
    before = len(w.accepted)
    while w.now < deadline:
        w.advance(0.25)
        if w.settled():
            gen = w.keeper.generation
            if sum(1 for *_, g, _ in w.accepted[before:] if g == gen) >= steps * len(w.keeper.members):
                return
            w.train_members()
    raise AssertionError(f"not settled: keeper gen {w.keeper.generation}, round {w.keeper.round}")


def test_a_generation_is_announced_only_once_the_store_holds_it() -> None:
    k = Keeper(_config())
    out = _first_generation(k)
    assert isinstance(out[-1], Persist) and out[-1].generation == 1
    assert not any(isinstance(o, Broadcast) and isinstance(o.message, Membership) for o in out)
    with pytest.raises(RuntimeError, match="Persist of generation 1"):
        k.receive(0.1, Join(3, 0, None))
    after = k.persisted(0.0, 1, True)
    sent = [o for o in after if isinstance(o, Broadcast) and isinstance(o.message, Membership)]
    assert len(sent) == 1 and sent[0].message.generation == 1
    assert [r.record["f"] for r in after if isinstance(r, Record)] == ["generation"]


def test_a_refused_write_deposes_the_keeper_and_decides_nothing() -> None:
    k = Keeper(_config())
    _first_generation(k)
    out = k.persisted(0.0, 1, False)
    assert any(isinstance(o, Deposed) and o.reason == "store-refused" for o in out)
    assert not any(isinstance(o, Broadcast) for o in out), "the generation was never decided"
    fails = [o.record for o in out if isinstance(o, Record) and o.record["type"] == "fail"]
    assert fails and fails[0]["f"] == "generation" and fails[0]["gen"] == 1
    assert k.receive(1.0, Join(3, 0, None)) == []
    assert k.commit(1.0, 0, 0, 1, 0).reason == "deposed"
    assert k.get_timer() is None


def test_a_lapsed_lease_deposes_the_keeper_on_its_own_clock() -> None:
    k = Keeper(_config())
    _first_generation(k)
    k.persisted(0.0, 1, True)
    k.hold(0.0, 2.0)
    assert k.commit(1.0, 0, 0, 1, 0).ok
    assert k.get_timer() == 2.0, "the lease's end is a deadline even when nothing arrives"
    out = k.handle_timer(2.0)
    assert [o.reason for o in out if isinstance(o, Deposed)] == ["lease-lapsed"]
    assert k.commit(2.5, 1, 0, 1, 0).reason == "deposed"


@given(took_over_at=st.floats(0.0, 1e6), after_s=st.floats(0.0, 1e5),
       ttl_s=st.floats(0.01, 100.0))
def test_the_last_renewal_is_on_the_keepers_cadence_and_at_most_now(
        took_over_at: float, after_s: float, ttl_s: float) -> None:
    """The renewals a keeper sends every quarter TTL from its takeover, in
    bulk: the last one is at or before ``now``, less than one period before,
    a whole number of periods after the takeover."""
    now = took_over_at + after_s
    renewed = last_renewal(took_over_at, now, ttl_s)
    period_s = RENEW_SHARE * ttl_s
    assert took_over_at <= renewed <= now
    assert now - renewed < period_s * (1 + 1e-9) + 1e-9 * now
    periods = (renewed - took_over_at) / period_s
    assert abs(periods - round(periods)) < 1e-6 * max(1.0, periods)


def test_a_record_survives_json_and_restores_the_same_keeper() -> None:
    w = World(4, min_workers=2, durable=True, sharding=ShardSpec(4, 2, None, 100))
    _settle_and_train(w)
    w.crash(w.latest(3))
    _settle_and_train(w)
    stored = w.stored
    assert stored is not None and stored.generation == w.keeper.generation >= 2
    data = json.loads(json.dumps(record_to_data(stored)))
    again = record_from_data(data)
    assert record_to_data(again) == data
    k = Keeper.restored(w.keeper.config, again, term=1)
    assert (k.generation, k.members, k.cursor, k.placement) == \
        (w.keeper.generation, w.keeper.members, stored.cursor, w.keeper.placement)
    assert all(k.incarnation_of(x) == w.keeper.incarnation_of(x) for x in range(4))


@pytest.mark.parametrize("mutate, match", [
    (lambda d: d.pop("term"), "keys"),
    (lambda d: d.update(generation=0), "generation >= 1"),
    (lambda d: d.update(source=99), "source"),
    (lambda d: d.update(members=[[3, 1]]), "members"),
    (lambda d: d.update(cursor=[1]), "cursor"),
    (lambda d: d.update(lives={"own": [[1, 0]], "cohort": [], "base": 0, "delta": []}),
     "never negative"),
    (lambda d: d.update(resumes=[[99, 0]]), "no resume after"),
])
def test_a_malformed_record_is_refused_with_what_is_wrong(mutate, match) -> None:
    w = World(3, min_workers=2, durable=True)
    _settle_and_train(w, steps=1)
    data = record_to_data(w.stored)
    mutate(data)
    with pytest.raises(CodecError, match=match):
        record_from_data(data)


def test_a_life_table_round_trips_through_its_data() -> None:
    t = LifeTable()
    t.set(5, 2)
    t.bump(IdRuns([(0, 3)]))
    t.set(1, 7)
    t.set(9, 1)
    data = json.loads(json.dumps(t.to_data()))
    u = LifeTable.from_data(data["own"], IdRuns(data["cohort"]), data["base"], data["delta"])
    assert [u.get(x) for x in range(12)] == [t.get(x) for x in range(12)]


@pytest.mark.parametrize("strategy", ["elastic", "checkpoint-restart"])
def test_a_standby_takes_over_and_committed_steps_stay_committed(strategy: str) -> None:
    w = World(3, min_workers=2, durable=True, strategy=strategy)
    _settle_and_train(w)
    gen, lineage_end = w.keeper.generation, w.lineage[-1]
    w.fail_keeper(1.5)
    w.advance(0.3)  # a step in flight: its commit requests find no keeper
    w.train_members()
    _settle_and_train(w)
    k = w.keeper
    assert k.term == 1 and w.takeovers == 1 and k.generation == gen + 1
    assert w.views[gen + 1].cursor >= lineage_end, "no committed step was lost"
    assert not w.violations, w.violations
    report = check(w.records, DATA)
    assert report.valid, report.violations
    kinds = [r["f"] for r in w.records if r.get("process") == "keeper"]
    assert "takeover" in kinds
    gens = [r["gen"] for r in w.records if r["f"] == "generation" and r["type"] == "ok"]
    assert len(gens) == len(set(gens)), "no generation number decided twice"


def test_a_keeper_lost_before_any_generation_is_replaced_by_a_fresh_term() -> None:
    w = World(3, min_workers=2, durable=True, latency_s=0.2)
    w.fail_keeper(1.0)  # the first joins are in flight: lost with the keeper
    _settle_and_train(w, steps=1)
    assert w.keeper.term == 1 and w.keeper.generation == 1


def test_a_takeover_counts_lives_started_after_the_last_record() -> None:
    """A life a predecessor handed out after its last record is the latest
    of its id for the successor: the older life's messages are refused and
    the next life handed out is newer still."""
    k = Keeper(_config())
    _first_generation(k)
    k.persisted(0.0, 1, True)
    record = k.durable_record("start")
    k2 = Keeper.restored(_config(), record, term=1)
    k2.take_over(1.0, {0: 0, 1: 2, 2: 0})
    out = k2.receive(1.1, Join(1, 1, Cursor()))
    assert any(isinstance(o.message, Refused) and o.message.reason == "stale-incarnation"
               for o in out if hasattr(o, "message"))
    assert k2.node_up(1.2, 1) == 3


def test_workers_drop_what_a_deposed_keeper_says() -> None:
    a = Agent(0, 0, 0.5)
    a.start(0.0)
    newer = Membership(1, IdRuns([(0, 1)]), (0, 0), Cursor(), None, term=2)
    acts = a.receive(0.1, newer)
    assert any(isinstance(x, Enter) for x in acts) and a.term == 2
    assert a.receive(0.2, RollCall(2, "failure", term=1)) == [], "an older term's roll call"
    assert a.receive(0.2, Refused(0, 0, 5, "not-member", term=1)) == []
    assert a.receive(0.3, RollCall(2, "failover", term=3)) != []


@pytest.mark.parametrize("msg", [
    RollCall(3, "failover", term=4),
    Refused(1, 2, 3, "not-member", term=4),
    Membership(2, IdRuns([(0, 1)]), (0, 1), Cursor(4, 32), 0, IdRuns([(1, 1)]), term=4),
])
def test_the_term_crosses_the_wire(msg) -> None:
    back = message_from_data(json.loads(json.dumps(message_to_data(msg))))
    assert back.term == 4 and message_to_data(back) == message_to_data(msg)
