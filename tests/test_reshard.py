"""Property tests of the resharding planner and the batch policy.

The central property is "no sample skipped or counted twice, whatever the
failure timing": a training-loop model built from ``plan_step`` (commit moves
the cursor, an interrupted step is planned, partly run and dropped, then redone
with whoever is left) must consume every completed epoch's dataset indices
exactly once.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollcall.core.reshard import (
    LR_SCALINGS,
    BatchPolicy,
    StepPlan,
    assign,
    describe_assignment,
    epoch_permutation,
    epochs_covered,
    lr_scale,
    plan_step,
    rank_range,
    sample_ids,
    step_batch,
    stripes,
)
from rollcall.core.types import Cursor

ROOT = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------- strategies

world_sizes = st.integers(1, 128)
micro_batches = st.integers(1, 16)
# Shard counts chosen so that they rarely divide the world size evenly.
shard_counts = st.integers(1, 64)
dataset_sizes = st.integers(1, 600)
seeds = st.integers(0, 2**32)
policies = st.sampled_from(list(BatchPolicy))


@st.composite
def batch_configs(draw) -> tuple[int, int]:
    """(global_batch, micro_batch) with global_batch a multiple of micro_batch."""
    micro = draw(micro_batches)
    return draw(shard_counts) * micro, micro


def members_of(size: int, seed: int) -> tuple[int, ...]:
    """A member list of ``size`` distinct, unordered worker ids.

    Ids are drawn from a wider range than the size so that rank and worker id
    differ, and survivors/newcomers look like a real membership change.
    """
    return tuple(random.Random(seed).sample(range(4 * size + 8), size))


# One membership round: (world size, id seed, step abandoned after which
# fraction of its members had "processed" their shards, or None to commit).
rounds = st.tuples(world_sizes, st.integers(0, 2**16), st.none() | st.floats(0, 1))


def committed_samples(plan: StepPlan, seed: int, n: int) -> list[tuple[int, int]]:
    """(stream offset, dataset index) of every shard of every member of ``plan``."""
    out: list[tuple[int, int]] = []
    for worker in plan.members:
        for offsets in plan.offsets_of(worker):
            ids = sample_ids(seed, n, offsets.start, offsets.stop)
            out.extend(zip(offsets, ids))
    return out


def check_plan_shape(plan: StepPlan) -> None:
    """(b)/(c): members' shards partition the step's shards; loads within one."""
    shards = [j for w in plan.members for j in plan.shards_of(w)]
    assert sorted(shards) == list(range(plan.n_shards))  # union exact, disjoint
    offsets = [q for w in plan.members for r in plan.offsets_of(w) for q in r]
    assert sorted(offsets) == list(plan.offsets)
    loads = [plan.load(w) for w in plan.members]
    assert sum(loads) == plan.n_shards
    assert max(loads) - min(loads) <= 1
    assert plan.accumulation == max(loads)


# ------------------------------------------------- (a) training-loop model


@given(
    seed=seeds,
    n=dataset_sizes,
    batch=batch_configs(),
    policy=policies,
    history=st.lists(rounds, min_size=1, max_size=20),
)
def test_training_loop_consumes_each_epoch_exactly_once(seed, n, batch, policy, history):
    global_batch, micro = batch
    full = history[0][0]  # the job's nominal size is its first membership
    cursor = Cursor()
    consumed: list[tuple[int, int]] = []
    for size, id_seed, abandon_at in history:
        members = members_of(size, id_seed)
        plan = plan_step(
            cursor, members, global_batch=global_batch, micro_batch=micro,
            policy=policy, full_workers=full,
        )
        check_plan_shape(plan)
        if abandon_at is not None:
            # Interrupted: some members ran their shards, but the step never
            # committed, so their work is dropped and the cursor stays put.
            partial = members[: int(abandon_at * len(members))]
            for w in partial:
                plan.offsets_of(w)
            continue
        if policy is BatchPolicy.CONSTANT:
            assert plan.global_batch == global_batch
        consumed.extend(committed_samples(plan, seed, n))
        nxt = plan.next_cursor()
        assert nxt == Cursor(cursor.step + 1, cursor.sample + plan.global_batch)
        cursor = nxt

    consumed.sort()
    # Stream positions: exactly [0, cursor.sample), none skipped or repeated.
    assert [q for q, _ in consumed] == list(range(cursor.sample))
    ids = [i for _, i in consumed]
    full_epochs, rest = divmod(len(ids), n)
    for e in range(full_epochs):
        assert sorted(ids[e * n : (e + 1) * n]) == list(range(n))
    tail = ids[full_epochs * n :]
    assert len(set(tail)) == len(tail) == rest


@given(
    start_step=st.integers(0, 10**6),
    batch=batch_configs(),
    first=world_sizes,
    second=world_sizes,
    id_seeds=st.tuples(st.integers(0, 2**16), st.integers(0, 2**16)),
)
def test_redo_after_interruption_covers_same_offsets_under_constant(
    start_step, batch, first, second, id_seeds
):
    global_batch, micro = batch
    cursor = Cursor(start_step, start_step * global_batch)
    a = plan_step(cursor, members_of(first, id_seeds[0]), global_batch=global_batch, micro_batch=micro)
    b = plan_step(cursor, members_of(second, id_seeds[1]), global_batch=global_batch, micro_batch=micro)
    offs_a = sorted(q for w in a.members for r in a.offsets_of(w) for q in r)
    offs_b = sorted(q for w in b.members for r in b.offsets_of(w) for q in r)
    assert offs_a == offs_b == list(range(cursor.sample, cursor.sample + global_batch))
    assert a.next_cursor() == b.next_cursor()


# --------------------------------------- (b)/(c) assignment and plan shape


@given(batch=batch_configs(), size=world_sizes, id_seed=st.integers(0, 2**16),
       sample=st.integers(0, 10**9), step=st.integers(0, 10**6))
def test_constant_plan_partitions_the_global_batch(batch, size, id_seed, sample, step):
    global_batch, micro = batch
    members = members_of(size, id_seed)
    plan = plan_step(Cursor(step, sample), members, global_batch=global_batch, micro_batch=micro)
    assert (plan.step, plan.sample_start) == (step, sample)
    assert plan.global_batch == global_batch
    assert plan.n_shards == global_batch // micro
    assert plan.members == members
    check_plan_shape(plan)


@given(n_shards=st.integers(0, 300), size=world_sizes)
def test_assign_is_contiguous_balanced_and_rank_ordered(n_shards, size):
    members = list(range(size))
    ranges = assign(n_shards, members)
    assert len(ranges) == size
    lo = 0
    base, extra = divmod(n_shards, size)
    for rank, (r_lo, r_hi) in enumerate(ranges):
        assert r_lo == lo  # contiguous, in rank order
        assert r_hi - r_lo == base + (rank < extra)  # first `extra` ranks get one more
        assert (r_lo, r_hi) == rank_range(n_shards, size, rank)
        lo = r_hi
    assert lo == n_shards
    if size > n_shards:
        assert all(lo == hi for lo, hi in ranges[n_shards:])


@given(batch=batch_configs(), size=world_sizes, step=st.integers(0, 10**6))
def test_describe_assignment_is_small_and_reconstructs_ranges(batch, size, step):
    global_batch, micro = batch
    plan = plan_step(Cursor(step, step * global_batch), range(size),
                     global_batch=global_batch, micro_batch=micro)
    d = describe_assignment(plan)
    assert d == json.loads(json.dumps(d))
    assert d["shards"] == plan.n_shards and d["members"] == size
    rebuilt = tuple(
        (r * d["base"] + min(r, d["extra"]), (r + 1) * d["base"] + min(r + 1, d["extra"]))
        for r in range(d["members"])
    )
    assert rebuilt == plan.ranges


def test_describe_assignment_stays_small_at_scale():
    plan = plan_step(Cursor(3, 3 * 65536), range(10_000), global_batch=65536, micro_batch=4)
    assert len(json.dumps(describe_assignment(plan))) < 80
    assert describe_assignment(plan) == {"shards": 16384, "members": 10_000, "base": 1, "extra": 6384}
    assert plan.accumulation == 2 and plan.load(9_999) == 1


def test_planning_never_materializes_a_permutation():
    epoch_permutation.cache_clear()
    plan = plan_step(Cursor(5, 10**9), range(1000), global_batch=4096, micro_batch=8,
                     policy="shrink", full_workers=2000)
    for w in plan.members:
        plan.offsets_of(w)
    describe_assignment(plan)
    epochs_covered(plan.sample_start, plan.next_cursor().sample, 10**7)
    info = epoch_permutation.cache_info()
    assert info.hits == info.misses == 0


def test_plan_rejects_bad_input():
    with pytest.raises(ValueError):
        plan_step(Cursor(), [1, 2, 1], global_batch=8, micro_batch=2)
    with pytest.raises(ValueError):
        plan_step(Cursor(), [], global_batch=8, micro_batch=2)
    with pytest.raises(ValueError):
        plan_step(Cursor(), [0], global_batch=10, micro_batch=3)
    with pytest.raises(ValueError):
        plan_step(Cursor(), [0], global_batch=8, micro_batch=2, policy="shrink")
    plan = plan_step(Cursor(), [7], global_batch=8, micro_batch=2)
    with pytest.raises(KeyError):
        plan.shards_of(8)
    with pytest.raises(IndexError):
        plan.shard_offsets(4)


# ----------------------------------------------------- (d) batch policy


@given(batch=batch_configs(), full=world_sizes, size=world_sizes)
def test_shrink_batch_bounds(batch, full, size):
    global_batch, micro = batch
    b = step_batch(BatchPolicy.SHRINK, global_batch, micro, size, full)
    assert b % micro == 0
    assert micro <= b <= global_batch
    # Largest such multiple: one more micro-batch would exceed the share.
    assert b == micro or (b + micro) * full > global_batch * min(size, full)
    assert b * full <= max(micro * full, global_batch * min(size, full))
    if size >= full:
        assert b == global_batch
    assert step_batch(BatchPolicy.CONSTANT, global_batch, micro, size, full) == global_batch


@given(batch=batch_configs(), full=world_sizes, sizes=st.tuples(world_sizes, world_sizes))
def test_shrink_batch_is_monotone_in_members(batch, full, sizes):
    global_batch, micro = batch
    small, large = sorted(sizes)
    assert step_batch("shrink", global_batch, micro, small, full) <= step_batch(
        "shrink", global_batch, micro, large, full
    )


@given(batch=batch_configs(), full=world_sizes, size=world_sizes, id_seed=st.integers(0, 2**16))
def test_shrink_plan_keeps_per_worker_load(batch, full, size, id_seed):
    global_batch, micro = batch
    members = members_of(size, id_seed)
    plan = plan_step(Cursor(), members, global_batch=global_batch, micro_batch=micro,
                     policy=BatchPolicy.SHRINK, full_workers=full)
    check_plan_shape(plan)
    full_plan = plan_step(Cursor(), range(full), global_batch=global_batch, micro_batch=micro)
    # No survivor works more than a worker of the full-size job would.
    assert plan.accumulation <= full_plan.accumulation


@given(batch=batch_configs(), full=world_sizes, size=world_sizes,
       scaling=st.sampled_from(LR_SCALINGS))
def test_lr_scale(batch, full, size, scaling):
    global_batch, micro = batch
    b = step_batch("shrink", global_batch, micro, size, full)
    expected = b / global_batch if scaling == "linear" else 1.0
    assert lr_scale(BatchPolicy.SHRINK, scaling, b, global_batch) == expected
    assert lr_scale(BatchPolicy.CONSTANT, scaling, global_batch, global_batch) == 1.0
    assert 0 < lr_scale("shrink", scaling, b, global_batch) <= 1.0


def test_lr_scale_rejects_unknown_scaling():
    with pytest.raises(ValueError):
        lr_scale("shrink", "cubic", 4, 8)


# ---------------------------------------------- (e) permutation determinism


@given(seed=seeds, epoch=st.integers(0, 1000), n=st.integers(0, 300))
def test_epoch_permutation_is_a_permutation(seed, epoch, n):
    perm = epoch_permutation(seed, epoch, n)
    assert isinstance(perm, tuple)
    assert sorted(perm) == list(range(n))
    assert perm == epoch_permutation(seed, epoch, n)


# n >= 16: a collision between two given seeds has probability 1/16! (~5e-14),
# so this cannot flake; n = 8 (1/40320 per pair) is checked on a fixed grid.
@given(a=seeds, delta=st.integers(1, 2**32), epoch=st.integers(0, 1000), n=st.integers(16, 300))
def test_different_seeds_give_different_orders(a, delta, epoch, n):
    b = a + delta
    assert epoch_permutation(a, epoch, n) != epoch_permutation(b, epoch, n)
    assert epoch_permutation(a, epoch, n) != epoch_permutation(a, epoch + 1, n)


def test_different_seeds_differ_at_n_8():
    # Only neighbouring pairs: among many seeds some pair of 8! = 40320 orders
    # must collide (birthday bound), which is no defect.
    for n in (8, 9, 10):
        for s in range(100):
            assert epoch_permutation(s, 0, n) != epoch_permutation(s + 1, 0, n)
            assert epoch_permutation(s, s, n) != epoch_permutation(s, s + 1, n)


def test_epoch_permutation_is_stable_across_processes():
    cases = [(0, 0, 10), (7, 3, 257), (2**31, 12, 1000)]
    code = (
        "import json, sys; from rollcall.core.reshard import epoch_permutation; "
        "print(json.dumps([epoch_permutation(*c) for c in json.loads(sys.argv[1])]))"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(cases)],
        cwd=ROOT, env=env, capture_output=True, text=True, check=True,
    ).stdout
    assert json.loads(out) == [list(epoch_permutation(*c)) for c in cases]


def test_epoch_permutation_golden_values():
    # Pinned: a change here silently reorders every run's data (and breaks
    # resuming a checkpoint taken by an older version), so it must be deliberate.
    assert epoch_permutation(0, 0, 10) == (4, 5, 2, 3, 9, 7, 1, 0, 8, 6)
    assert epoch_permutation(7, 3, 16) == (8, 4, 13, 10, 12, 1, 14, 11, 5, 3, 2, 7, 15, 0, 6, 9)


def test_epoch_permutation_is_uniform_enough():
    # Fixed seeds, so deterministic: each of the 3! orders about 1000 times in
    # 6000 (sd ~29). Catches a biased shuffle (e.g. Sattolo's off-by-one gives
    # only the two cyclic orders).
    counts: dict[tuple[int, ...], int] = {}
    for s in range(6000):
        p = epoch_permutation(s, 0, 3)
        counts[p] = counts.get(p, 0) + 1
    assert len(counts) == 6
    assert all(850 <= c <= 1150 for c in counts.values()), counts


# ----------------------------------------------- (f) epoch boundaries


@given(seed=seeds, n=st.integers(1, 200), start=st.integers(0, 2000), length=st.integers(0, 700))
def test_sample_ids_matches_per_offset_definition(seed, n, start, length):
    stop = start + length
    expected = [epoch_permutation(seed, q // n, n)[q % n] for q in range(start, stop)]
    assert sample_ids(seed, n, start, stop) == expected


@given(seed=seeds, n=st.integers(2, 300), before=st.integers(1, 300), after=st.integers(1, 300))
def test_sample_ids_across_one_epoch_boundary(seed, n, before, after):
    before, after = min(before, n), min(after, n)
    epoch = 3
    boundary = (epoch + 1) * n
    ids = sample_ids(seed, n, boundary - before, boundary + after)
    assert ids[:before] == list(epoch_permutation(seed, epoch, n)[n - before :])
    assert ids[before:] == list(epoch_permutation(seed, epoch + 1, n)[:after])
    # Within one epoch no index repeats; across the boundary it may.
    assert len(set(ids[:before])) == before and len(set(ids[before:])) == after


@given(n=st.integers(1, 500), start=st.integers(0, 5000), length=st.integers(0, 3000))
def test_epochs_covered_splits_at_boundaries(n, start, length):
    stop = start + length
    parts = epochs_covered(start, stop, n)
    q = start
    for epoch, lo, hi in parts:
        assert 0 <= lo < hi <= n
        assert epoch * n + lo == q
        q += hi - lo
    assert q == stop
    assert [e for e, _, _ in parts] == list(range(start // n, start // n + len(parts)))


@given(st.data())
def test_stripes_cover_the_state_once_from_every_holder(data) -> None:
    """A replicated copy's stripes: each member that is not stale sends one
    contiguous part (in rank order), the parts cover the flat state exactly
    once, and no stale member sends."""
    members = data.draw(st.lists(st.integers(0, 50), min_size=2, max_size=12, unique=True))
    stale = data.draw(st.sets(st.sampled_from(members), min_size=1, max_size=len(members) - 1))
    size = data.draw(st.integers(0, 200))
    plan = stripes(members, stale, size)
    holders = [w for w in members if w not in stale]
    assert [h for h, _, _ in plan] == holders[:len(plan)]
    assert len(plan) == min(size, len(holders))
    pos = 0
    for _, lo, hi in plan:
        assert lo == pos and hi > lo
        pos = hi
    assert pos == size
