"""Property tests of the shard placement planner (``rollcall.core.placement``).

A scenario is an initial placement followed by a random sequence of joins and
losses: single workers, runs of consecutive ids (which hit owner and buddies
together, so shards do get lost) and whole failure domains at once. Every
replan in the sequence is checked against the guarantees in the module
docstring: full replication, exact loss detection, minimal and valid copies,
domain spread, determinism and balance.
"""

from __future__ import annotations

import json
from collections import Counter
from fractions import Fraction
from dataclasses import dataclass

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from rollcall.core.placement import (Copy, Placement, RecoveryPlan, Reload, _Greedy, initial_placement,
                                     replan)


# --------------------------------------------------------------------------
# Scenarios
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    before: Placement
    alive_before: tuple[int, ...]
    alive: tuple[int, ...]
    plan: RecoveryPlan


@dataclass(frozen=True)
class Scenario:
    n_shards: int
    r: int
    domains: dict[int, str] | None
    members: tuple[int, ...]
    placement: Placement
    steps: tuple[Step, ...]


_events = st.one_of(
    st.tuples(st.just("lose"), st.lists(st.integers(0, 10**6), min_size=1, max_size=4)),
    st.tuples(st.just("run"), st.integers(0, 10**6), st.integers(2, 8)),
    st.tuples(st.just("rack"), st.integers(0, 7)),
    st.tuples(st.just("join"), st.lists(st.integers(0, 7), min_size=1, max_size=8)),
)


@st.composite
def scenarios(draw, max_members: int = 64, max_shards: int = 256) -> Scenario:
    n_shards = draw(st.integers(1, max_shards))
    r = draw(st.integers(1, 4))
    m0 = draw(st.integers(1, max_members))
    n_domains = draw(st.integers(0, 8))
    racks = draw(st.lists(st.integers(0, 7), min_size=m0, max_size=m0))
    events = draw(st.lists(_events, max_size=6))
    domains = {w: f"rack{racks[w] % n_domains}" for w in range(m0)} if n_domains else None
    members = tuple(range(m0))
    placement = initial_placement(n_shards, members, r, domains)
    alive, current, next_id, steps = members, placement, m0, []
    for event in events:
        if event[0] == "join":
            new = tuple(range(next_id, next_id + len(event[1])))
            next_id += len(new)
            if domains is not None:
                domains.update({w: f"rack{d % n_domains}" for w, d in zip(new, event[1])})
            after = alive + new
        else:
            if event[0] == "lose":
                dead = {alive[i % len(alive)] for i in event[1]}
            elif event[0] == "run":
                start = event[1] % len(alive)
                dead = set(alive[start:start + event[2]])
            else:
                rack = domains[alive[event[1] % len(alive)]] if domains is not None else None
                dead = {w for w in alive if domains is not None and domains[w] == rack}
            after = tuple(w for w in alive if w not in dead)
            if not after:
                continue  # the job is gone; nothing to plan
        plan = replan(current, after, r, domains)
        steps.append(Step(current, alive, after, plan))
        alive, current = after, plan.placement
    return Scenario(n_shards, r, domains, members, placement, tuple(steps))


def _survivors(holders: tuple[int, ...], alive: tuple[int, ...]) -> list[int]:
    return [w for w in holders if w in set(alive)]


def _deficit(step: Step, r: int) -> int:
    want = min(r, len(step.alive))
    return sum(
        max(0, want - len(_survivors(h, step.alive)))
        for h in step.before.shards
        if _survivors(h, step.alive)
    )


def _spread_ok(holders: tuple[int, ...], members: tuple[int, ...], domains: dict[int, str]) -> bool:
    """count(a) <= count(b) + 1 whenever domain b has a member not holding the shard."""
    count = Counter(domains[h] for h in holders)
    open_ = {domains[w] for w in members if w not in holders}
    return all(count[a] <= count[b] + 1 for a in count for b in open_)


# --------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------


@given(scenarios())
def test_full_replication(sc: Scenario) -> None:
    """(1) Every shard has exactly min(r, m) distinct holders, all members.

    Asserted after every replan, lost or not (lost shards get reload holders);
    "when no shard was lost" is the special case.
    """
    for placement, alive in [(sc.placement, sc.members)] + [(s.plan.placement, s.alive) for s in sc.steps]:
        assert placement.n_shards == sc.n_shards
        for holders in placement.shards:
            assert len(set(holders)) == len(holders) == min(sc.r, len(alive))
            assert set(holders) <= set(alive)


@given(scenarios())
def test_lost_exactly_when_all_holders_died(sc: Scenario) -> None:
    """(2) A shard is lost iff none of its holders survived; lost shards are reloaded, not copied."""
    for step in sc.steps:
        plan = step.plan
        expected = tuple(s for s, h in enumerate(step.before.shards) if not _survivors(h, step.alive))
        assert plan.lost == expected
        assert plan.fallback == bool(expected)
        event("fallback" if expected else "no fallback")
        want = min(sc.r, len(step.alive))
        assert sorted(plan.reloads) == sorted(Reload(s, w) for s in expected for w in plan.placement.holders(s))
        assert len(plan.reloads) == want * len(expected)
        assert not {c.shard for c in plan.copies} & set(expected)
        assert plan.promoted == tuple(
            s for s, h in enumerate(step.before.shards) if s not in expected and h[0] not in step.alive
        )


@given(scenarios())
def test_copies_are_valid_and_minimal(sc: Scenario) -> None:
    """(3) Copies go from a surviving holder to a non-holder, and there are exactly deficit many.

    With r fixed, survivors always keep their replicas, so the new holders of a
    shard are exactly its survivors plus the copies' destinations.
    """
    for step in sc.steps:
        plan = step.plan
        for c in plan.copies:
            assert c.src in step.alive and c.src in step.before.holders(c.shard)
            assert c.dst in step.alive and c.dst not in step.before.holders(c.shard)
        assert len(set(plan.copies)) == len({(c.shard, c.dst) for c in plan.copies})
        assert len(plan.copies) == _deficit(step, sc.r)
        assert plan.bytes_moved(3) == 3 * len(plan.copies)
        for s, holders in enumerate(step.before.shards):
            if s in plan.lost:
                continue
            dsts = [c.dst for c in plan.copies if c.shard == s]
            assert sorted(plan.placement.holders(s)) == sorted(_survivors(holders, step.alive) + dsts)


@given(scenarios())
def test_domain_spread(sc: Scenario) -> None:
    """(4) Replicas spread over failure domains.

    Initial placement: for every shard, no domain has two more replicas than a
    domain that still has a non-holder member; so with >= min(r, m) domains
    among the members, the holders are in distinct domains. After a replan: a
    shard whose survivors were in distinct domains has all its holders in
    distinct domains whenever the members span >= min(r, m) domains.
    """
    if sc.domains is None:
        return
    doms = sc.domains
    want = min(sc.r, len(sc.members))
    spanned = len({doms[w] for w in sc.members})
    for holders in sc.placement.shards:
        assert _spread_ok(holders, sc.members, doms)
        if spanned >= want:
            assert len({doms[h] for h in holders}) == len(holders)
    for step in sc.steps:
        want = min(sc.r, len(step.alive))
        if len({doms[w] for w in step.alive}) < want:
            continue
        for s, holders in enumerate(step.before.shards):
            kept = _survivors(holders, step.alive)
            if len({doms[h] for h in kept}) == len(kept) and kept:
                event("spread checked after replan")
                new = step.plan.placement.holders(s)
                assert len({doms[h] for h in new}) == len(new), (s, kept, new)


@given(scenarios(max_shards=64, max_members=32), st.randoms(use_true_random=False))
def test_determinism(sc: Scenario, rnd) -> None:
    """(5) Same inputs, same outputs: also whatever the order of the member list
    and whatever extra (dead) workers the domain map names."""
    again = initial_placement(sc.n_shards, list(reversed(sc.members)), sc.r, sc.domains)
    assert again == sc.placement
    for step in sc.steps:
        shuffled = list(step.alive)
        rnd.shuffle(shuffled)
        doms = {w: sc.domains[w] for w in step.alive} if sc.domains is not None else None
        assert replan(step.before, shuffled, sc.r, doms) == step.plan
        assert replan(step.before, step.alive, sc.r, sc.domains) == step.plan


@given(st.integers(1, 256), st.integers(1, 4), st.integers(1, 64))
def test_initial_balance(n_shards: int, r: int, m: int) -> None:
    """(6) Without domains, each worker holds floor or ceil of n * min(r, m) / m
    replicas and owns floor or ceil of n / m shards."""
    p = initial_placement(n_shards, range(m), r)
    total = n_shards * min(r, m)
    counts = [len(p.shards_of(w)) for w in range(m)]
    assert total // m <= min(counts) and max(counts) <= -(-total // m)
    owned = [len(p.owned_by(w)) for w in range(m)]
    assert n_shards // m <= min(owned) and max(owned) <= -(-n_shards // m)


@given(st.integers(1, 256), st.integers(1, 4), st.integers(1, 8), st.integers(1, 8), st.booleans())
def test_initial_balance_equal_domains(n_shards: int, r: int, n_domains: int, size: int, striped: bool) -> None:
    """(6) The same replica bound with equal-sized domains numbering >= min(r, m)."""
    m = n_domains * size
    if n_domains < min(r, m):
        return
    doms = {w: f"rack{w % n_domains if striped else w // size}" for w in range(m)}
    p = initial_placement(n_shards, range(m), r, doms)
    total = n_shards * min(r, m)
    counts = [len(p.shards_of(w)) for w in range(m)]
    assert total // m <= min(counts) and max(counts) <= -(-total // m)


@given(scenarios(max_shards=64, max_members=32))
def test_json_round_trip(sc: Scenario) -> None:
    assert Placement.from_json(json.loads(json.dumps(sc.placement.to_json()))) == sc.placement
    for step in sc.steps:
        assert RecoveryPlan.from_json(json.loads(json.dumps(step.plan.to_json()))) == step.plan


# --------------------------------------------------------------------------
# Worked examples
# --------------------------------------------------------------------------


def test_example_placement() -> None:
    p = initial_placement(4, [3, 1, 0, 2], 2)
    assert p.shards == ((0, 1), (2, 3), (1, 0), (3, 2))
    assert p.shards_of(1) == (0, 2) and p.owned_by(1) == (2,)
    assert p.bytes_on(1, 100) == 200 and p.bytes_on(1, [10, 20, 30, 40]) == 40
    assert p.to_json() == [[0, 1], [2, 3], [1, 0], [3, 2]]


def test_kill_one_worker_restores_from_buddies() -> None:
    p = initial_placement(4, range(4), 2)
    plan = replan(p, [0, 2, 3], 2)
    assert not plan.fallback and plan.lost == () and plan.reloads == ()
    # Worker 1 held shard 0 (buddy of 0) and shard 2 (owner, buddy 0): both come from 0.
    assert plan.copies == (Copy(0, 0, 2), Copy(2, 0, 3))
    assert plan.promoted == (2,)
    assert plan.placement.shards == ((0, 2), (2, 3), (0, 3), (3, 2))
    assert plan.bytes_moved(1 << 20) == 2 << 20


def test_kill_worker_and_all_buddies_falls_back() -> None:
    p = initial_placement(4, range(4), 2)
    plan = replan(p, [2, 3], 2)
    assert plan.fallback and plan.lost == (0, 2)
    assert plan.copies == ()
    assert sorted(plan.reloads) == [Reload(0, 2), Reload(0, 3), Reload(2, 2), Reload(2, 3)]
    assert plan.bytes_reloaded(10) == 40 and plan.bytes_moved(10) == 0
    assert [len(h) for h in plan.placement.shards] == [2, 2, 2, 2]


def test_rack_loss_with_spread_loses_nothing() -> None:
    doms = {w: f"rack{w % 3}" for w in range(9)}
    p = initial_placement(30, range(9), 3, doms)
    plan = replan(p, [w for w in range(9) if doms[w] != "rack1"], 3, doms)
    assert not plan.fallback
    assert len(plan.copies) == 30  # every shard lost exactly its rack1 replica
    assert all(doms[c.dst] != "rack1" for c in plan.copies)


def test_single_loss_keeps_racks_distinct() -> None:
    doms = {w: f"rack{w % 3}" for w in range(9)}
    p = initial_placement(30, range(9), 3, doms)
    for dead in range(9):
        plan = replan(p, [w for w in range(9) if w != dead], 3, doms)
        assert len(plan.copies) == len(p.shards_of(dead))
        for holders in plan.placement.shards:
            assert sorted(doms[h] for h in holders) == ["rack0", "rack1", "rack2"]


def test_joins_alone_move_nothing() -> None:
    p = initial_placement(16, range(4), 2)
    plan = replan(p, range(6), 2)
    assert plan.copies == plan.reloads == plan.lost == plan.promoted == ()
    assert plan.placement == p


def test_joins_fill_replicas_a_small_job_lacked() -> None:
    p = initial_placement(4, [0], 3)
    assert p.shards == ((0,),) * 4
    plan = replan(p, [0, 1, 2], 3)
    assert len(plan.copies) == 8 and all(c.src == 0 for c in plan.copies)


def test_lower_r_drops_extras_without_copies() -> None:
    p = initial_placement(8, range(4), 3)
    plan = replan(p, range(4), 2)
    assert plan.copies == () and plan.lost == ()
    assert plan.placement.shards == tuple(h[:2] for h in p.shards)


def test_bad_inputs() -> None:
    with pytest.raises(ValueError):
        initial_placement(0, range(3), 2)
    with pytest.raises(ValueError):
        initial_placement(4, [], 2)
    with pytest.raises(ValueError):
        initial_placement(4, range(3), 0)
    with pytest.raises(ValueError):
        initial_placement(4, range(3), 2, {0: "a", 1: "b"})
    with pytest.raises(ValueError):
        Placement(((0, 0),))


def _rule_pick(loads: Counter, domains: dict[int, str], holders: list[int]) -> int:
    """The greedy rule as the module states it, by brute force: among members
    not holding the shard, the fewest replicas of it in the domain, then the
    domain's replicas per member, then the worker's replicas, then the id."""
    size = Counter(domains.values())
    domain_load: Counter = Counter()
    for w, d in domains.items():
        domain_load[d] += loads[w]
    uses = Counter(domains[h] for h in holders)
    free = [w for w in domains if w not in holders]
    return min(free, key=lambda w: (uses[domains[w]], Fraction(domain_load[domains[w]], size[domains[w]]),
                                    loads[w], w))


@given(st.lists(st.integers(0, 5), min_size=1, max_size=40),
       st.lists(st.integers(0, 3), max_size=40),
       st.lists(st.tuples(st.lists(st.integers(0, 39), max_size=3), st.integers(1, 4)),
                min_size=1, max_size=30),
       st.booleans())
def test_greedy_picks_as_the_rule_says(racks: list[int], start_loads: list[int],
                                       fills: list[tuple[list[int], int]], no_domains: bool) -> None:
    """The heap-kept picker chooses exactly what the rule, computed in full, chooses."""
    members = list(range(len(racks)))
    domains = None if no_domains else {w: f"rack{racks[w]}" for w in members}
    seen = {w: (domains[w] if domains else "") for w in members}
    loads = Counter({w: start_loads[w] for w in members if w < len(start_loads)})
    reference = Counter(loads)
    greedy = _Greedy(members, loads, domains)
    for wanted, extra in fills:
        holders = list(dict.fromkeys(w % len(members) for w in wanted))
        theirs = list(holders)
        want = min(len(holders) + extra, len(members))
        added = greedy.fill(holders, want)
        while len(theirs) < want:
            w = _rule_pick(reference, seen, theirs)
            theirs.append(w)
            reference[w] += 1
        assert holders == theirs, (added, theirs)
