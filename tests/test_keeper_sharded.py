"""The record-keeper's decision for sharded state (rollcall.core.sharding via Keeper._close).

Each rule is shown by feeding messages and reading the outputs, as in
tests/test_keeper.py: the first generation places the shards, a later one
copies a dead worker's shards from its buddies, and falls back on the
checkpoint exactly when every holder of some shard is gone.
"""

from __future__ import annotations

from itertools import chain

from hypothesis import given, settings, strategies as st

from rollcall.core.agent import Agent, Enter
from rollcall.core.detector import TimeoutDetector
from rollcall.core.keeper import Broadcast, Formed, Keeper, KeeperConfig, Record
from rollcall.core.messages import Checkpointed, Join, JoinBatch, Membership
from rollcall.core.placement import Copy, Placement
from rollcall.core.sharding import ShardSpec, split_bytes
from rollcall.core.types import Cursor

SHARD_BYTES = 100


def sharded(n: int, r: int, shards: int | None = None, rack_size: int | None = None,
            strategy: str = "elastic") -> Keeper:
    spec = ShardSpec(shards or n, r, rack_size, SHARD_BYTES)
    return Keeper(KeeperConfig(min_workers=1, max_workers=n, last_call_s=0.5,
                               detector=TimeoutDetector(0.5, 3.0), strategy=strategy,
                               sharding=spec))


def formed(out: list) -> Formed:
    return [o for o in out if isinstance(o, Formed)][-1]


def recovery_records(out: list) -> list[dict]:
    return [o.record for o in out if isinstance(o, Record) and o.record["f"] == "recovery"]


def start(k: Keeper, n: int) -> tuple[Formed, list]:
    out = k.receive(0.0, JoinBatch(tuple(range(n)), None))
    out += k.handle_timer(1.0)
    return formed(out), out


def lose(k: Keeper, dead: set[int], alive: dict[int, Cursor | None], t: float = 5.0) -> list:
    """``dead`` exit; the rest answer the roll call with the cursor each holds."""
    out: list = []
    for w in sorted(dead):
        out += k.exited(t, w, 0)
    by_cursor: dict[Cursor | None, list[int]] = {}
    for w, c in sorted(alive.items()):
        by_cursor.setdefault(c, []).append(w)
    out += k.receive_many(t, [JoinBatch(tuple(ws), c) for c, ws in by_cursor.items()])
    return out


def test_first_generation_places_every_shard_without_recovery() -> None:
    k = sharded(4, 2, shards=8)
    f, out = start(k, 4)
    assert f.placement is not None and len(f.placement) == 8
    assert all(len(h) == 2 and set(h) <= set(f.members) for h in f.placement)
    assert f.recovery is None and not f.fallback
    (m,) = [o.message for o in out if isinstance(o, Broadcast) and isinstance(o.message, Membership)]
    assert (m.placement, m.recovery, m.fallback) == (f.placement, None, False)
    (r,) = recovery_records(out)
    assert r["initial"] and not r["fallback"] and r["bytes_moved"] == 0


def test_replicated_state_carries_no_placement_and_writes_no_recovery_record() -> None:
    k = Keeper(KeeperConfig(min_workers=1, max_workers=3, last_call_s=0.5,
                            detector=TimeoutDetector(0.5, 3.0)))
    f, out = start(k, 3)
    assert (f.placement, f.recovery, f.fallback) == (None, None, False)
    assert not recovery_records(out)
    out = lose(k, {2}, {0: Cursor(5, 40), 1: Cursor(5, 40)})
    assert formed(out).placement is None and not recovery_records(out)


def test_losing_one_worker_copies_its_shards_from_buddies_and_resumes_from_a_survivor() -> None:
    k = sharded(4, 2, shards=8)
    f1, _ = start(k, 4)
    c = Cursor(7, 56)
    out = lose(k, {1}, {0: c, 2: c, 3: c})
    f = formed(out)
    assert not f.fallback and f.cursor == c and f.source == 0 and tuple(f.stale) == ()
    plan = f.recovery
    assert plan is not None and not plan.reloads and not plan.lost
    old = Placement(f1.placement)
    assert {x.shard for x in plan.copies} == set(old.shards_of(1))
    for x in plan.copies:  # from a surviving holder to a member that lacked it
        assert x.src in old.holders(x.shard) and x.src != 1
        assert x.dst not in old.holders(x.shard) and x.dst in f.members
    assert all(len(h) == 2 and 1 not in h for h in f.placement)
    assert plan.placement.shards == f.placement
    (r,) = recovery_records(out)
    assert (r["fallback"], r["copies"], r["reloads"], r["lost"]) == (False, len(plan.copies), 0, [])
    assert r["bytes_moved"] == SHARD_BYTES * len(plan.copies) and r["steps_lost"] == 0


def test_without_buddies_a_loss_falls_back_to_the_last_checkpoint() -> None:
    k = sharded(3, 1)
    start(k, 3)
    k.receive(2.0, Checkpointed(0, 0, 1, Cursor(4, 32)))
    out = lose(k, {2}, {0: Cursor(9, 72), 1: Cursor(9, 72)})
    f = formed(out)
    assert f.fallback and f.cursor == Cursor(4, 32) and f.source is None
    assert tuple(f.stale) == tuple(f.members) == (0, 1)  # everybody reloads the checkpoint
    plan = f.recovery
    assert plan is not None and plan.lost == (2,) and not plan.copies
    assert sorted((x.shard, x.dst) for x in plan.reloads) == sorted(
        (s, w) for s, h in enumerate(f.placement) for w in h)
    (r,) = recovery_records(out)
    assert r["fallback"] and r["lost"] == [[2, 2]] and r["steps_lost"] == 5
    assert r["bytes_reloaded"] == 3 * SHARD_BYTES and r["bytes_moved"] == 0
    gen = [o.record for o in out if isinstance(o, Record) and o.record["f"] == "generation"][-1]
    assert gen["cursor"] == Cursor(4, 32).to_json() and gen["source"] is None
    assert k.resumes[-1] == (f.generation, 4)


def test_fallback_without_any_checkpoint_starts_over_from_the_origin() -> None:
    k = sharded(2, 1)
    start(k, 2)
    f = formed(lose(k, {1}, {0: Cursor(3, 24)}))
    assert f.fallback and f.cursor == Cursor() and f.source is None and tuple(f.stale) == (0,)


def test_a_member_still_copying_holds_nothing_its_shard_is_lost_with_the_others() -> None:
    k = sharded(3, 2, shards=3)
    f1, _ = start(k, 3)
    k.receive(2.0, Checkpointed(0, 0, 1, Cursor(2, 16)))
    old = Placement(f1.placement)
    s = 0
    a, b = old.holders(s)
    (c,) = set(range(3)) - {a, b}
    # a is dead; b answers without state (its copy was not done): shard s exists nowhere
    f = formed(lose(k, {a}, {b: None, c: Cursor(6, 48)}))
    assert f.fallback and s in f.recovery.lost and f.cursor == Cursor(2, 16)


def holders_of(placement: tuple[tuple[int, ...], ...]) -> list[set[int]]:
    return [set(h) for h in placement]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 7), r=st.integers(1, 3), shards=st.integers(1, 10), data=st.data())
def test_fallback_exactly_when_every_holder_of_some_shard_died(
        n: int, r: int, shards: int, data: st.DataObject) -> None:
    k = sharded(n, r, shards=shards)
    f1, _ = start(k, n)
    k.receive(2.0, Checkpointed(0, 0, 1, Cursor(1, 8)))
    dead = data.draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=n - 1))
    c = Cursor(3, 24)
    f = formed(lose(k, dead, {w: c for w in range(n) if w not in dead}))
    lost = [s for s, h in enumerate(holders_of(f1.placement)) if h <= dead]
    assert f.fallback == bool(lost)
    assert f.recovery is not None and list(f.recovery.lost) == lost
    if lost:
        assert f.cursor == Cursor(1, 8) and f.source is None and not f.recovery.copies
    else:
        assert f.cursor == c and f.source is not None and not f.recovery.reloads
        want = min(r, n - len(dead))
        assert all(len(h) == want for h in f.placement)
        # minimal: exactly one copy per replica the dead took with them
        assert len(f.recovery.copies) == sum(
            min(want, len(h)) - len(h - dead) for h in holders_of(f1.placement))


def test_racks_spread_replicas_so_a_rack_loss_needs_no_fallback() -> None:
    # 8 workers in racks of 2: each shard's two holders are in different racks
    k = sharded(8, 2, shards=8, rack_size=2)
    f1, _ = start(k, 8)
    assert all(len({w // 2 for w in h}) == 2 for h in f1.placement)
    c = Cursor(5, 40)
    f = formed(lose(k, {2, 3}, {w: c for w in (0, 1, 4, 5, 6, 7)}))
    assert not f.fallback and f.cursor == c
    assert all(len({w // 2 for w in h}) == 2 for h in f.placement)


def test_checkpoint_restart_places_anew_and_never_calls_it_a_fallback() -> None:
    k = sharded(3, 1, strategy="checkpoint-restart")
    f1, _ = start(k, 3)
    k.receive(2.0, Checkpointed(0, 0, 1, Cursor(4, 32)))
    k.node_down(5.0, 2)  # worker 2's machine is lost: not relaunched
    out = k.exited(5.0, 2, 0)  # the job restarts: the others come back as new lives
    out += k.receive(6.0, JoinBatch((0, 1), None, (1, 1)))
    out += k.handle_timer(6.5)  # the last call for more new lives
    f = formed(out)
    assert tuple(f.members) == (0, 1) and f.cursor == Cursor(4, 32) and f.source is None
    assert not f.fallback and f.recovery is None
    assert sorted(chain.from_iterable(f.placement)) == [0, 0, 1]  # r=1: three shards on two
    (r,) = recovery_records(out)
    assert r["initial"]


def test_growth_copies_nothing_while_every_shard_has_its_replicas() -> None:
    k = sharded(4, 2, shards=4)
    k.receive_many(0.0, [JoinBatch((0, 1, 2), None)])
    f1 = formed(k.handle_timer(1.0))
    out = k.receive(3.0, Join(3, 0, None))
    out += k.receive(3.0, JoinBatch((0, 1, 2), Cursor(6, 48)))
    out += k.handle_timer(10.0)
    f = formed(out)
    assert tuple(f.members) == (0, 1, 2, 3) and not f.fallback and tuple(f.stale) == (3,)
    assert f.recovery.copies == () and f.placement == f1.placement


def test_the_agent_hands_the_fields_to_its_trainer() -> None:
    k = sharded(2, 1)
    start(k, 2)
    k.receive(2.0, Checkpointed(0, 0, 1, Cursor(1, 8)))
    out = lose(k, {1}, {0: Cursor(3, 24)})
    (m,) = [o.message for o in out if isinstance(o, Broadcast) and isinstance(o.message, Membership)]
    a = Agent(0, 0, 0.5)
    a.start(0.0)
    (enter,) = [x for x in a.receive(6.0, m) if isinstance(x, Enter)]
    assert enter.fallback and enter.sync and enter.source is None and enter.cursor == Cursor(1, 8)
    assert enter.placement == m.placement == ((0,), (0,))
    assert enter.recovery == m.recovery and {x.shard for x in enter.recovery.reloads} == {0, 1}


def test_copy_sources_are_spread_over_the_surviving_holders() -> None:
    k = sharded(4, 3, shards=8)
    start(k, 4)
    c = Cursor(2, 16)
    f = formed(lose(k, {0}, {1: c, 2: c, 3: c}))
    srcs = [x.src for x in f.recovery.copies]
    assert srcs and max(srcs.count(w) for w in set(srcs)) - min(srcs.count(w) for w in set(srcs)) <= 1
    assert all(isinstance(x, Copy) for x in f.recovery.copies)


def test_split_bytes_is_even_and_exact() -> None:
    assert split_bytes(10, 4) == (3, 3, 2, 2) and sum(split_bytes(10**9 + 7, 13)) == 10**9 + 7
    spec = ShardSpec(4, 2, None, split_bytes(10, 4))
    assert spec.domains([0, 1]) is None
    assert ShardSpec(2, 1, 3).domains([0, 4]) == {0: "0", 4: "1"}


def test_a_copy_counts_only_once_a_step_proves_it_done() -> None:
    def scenario(advanced: bool) -> Formed:
        k = sharded(4, 2, shards=4)
        f1, _ = start(k, 4)
        k.receive(2.0, Checkpointed(0, 0, 1, Cursor(1, 8)))
        c = Cursor(3, 24)
        f2 = formed(lose(k, {3}, {0: c, 1: c, 2: c}))
        x = f2.recovery.copies[0]
        # the source of that copy dies next; its destination is the shard's other holder
        assert set(f2.placement[x.shard]) == {x.src, x.dst}
        later = Cursor(5, 40) if advanced else c
        rest = {w: later for w in (0, 1, 2) if w != x.src}
        f3 = formed(lose(k, {x.src}, rest, t=9.0))
        assert (x.shard in f3.recovery.lost) == (not advanced)
        return f3

    assert scenario(advanced=False).fallback  # resumed where gen 2 did: the copy may be torn
    assert not scenario(advanced=True).fallback  # gen 2 committed steps: the copy was done


def test_a_member_answering_from_before_the_previous_generation_holds_nothing() -> None:
    """Regression (stateful test, seed 2155524081): worker 1 was told to
    reload shard 0 in generation 2, but its answer to round 3 is a copy of a
    Join stamped generation 1, sent before it heard of generation 2: the
    shard placed on it in generation 2 is not there, so it is lost."""
    k = sharded(2, 1, shards=1)
    k.receive_many(0.0, [Join(0, 0, None), Join(1, 0, None)])
    k.handle_timer(1.0)
    assert k.placement.shards == ((0,),)
    out = k.exited(2.0, 0, 0)
    out += k.receive(2.0, Join(1, 0, Cursor(), 1))
    f = formed(out)
    assert (f.generation, f.placement, f.fallback) == (2, ((1,),), True)
    out = k.receive(3.0, Join(0, 1, Cursor(), 1))  # growth: a round is open
    out += k.receive(3.0, Join(1, 0, Cursor(), 1))  # the late copy from before gen 2
    out += k.handle_timer(4.0)
    f = formed(out)
    assert f.generation == 3 and f.fallback and f.source is None
    assert [r.dst for r in f.recovery.reloads] == list(f.placement[0])
