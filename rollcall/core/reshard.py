"""Resharding: data order, virtual shards, shard assignment and batch policy.

The training position is one stream offset ``q`` (``Cursor.sample``) into an
endless stream made of one seeded permutation of the dataset per epoch. Each
global batch is cut into fixed *virtual shards* of ``micro_batch`` samples,
whose number does not depend on how many workers there are; a step's shards
are dealt out to the current members in contiguous runs. Because the cursor
only moves when a step commits, and a step is always redone whole from the
same cursor, no sample is skipped or consumed twice, whatever the timing of a
failure or the membership of the redo.

Everything here is a pure function of its arguments: the simulator drives it
with millions of samples and never needs the permutation itself (it works on
ranges of offsets); only :func:`sample_ids` materializes a permutation.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from enum import Enum
from functools import cached_property, lru_cache
from typing import Collection, Iterator, Sequence

from rollcall.core.types import Cursor, WorkerId

__all__ = [
    "BatchPolicy",
    "LR_SCALINGS",
    "StepPlan",
    "assign",
    "describe_assignment",
    "epoch_permutation",
    "epochs_covered",
    "lr_scale",
    "plan_step",
    "rank_range",
    "sample_ids",
    "step_batch",
]


# --------------------------------------------------------------------------
# Data order
# --------------------------------------------------------------------------


_CHUNK = 1 << 16  # random words drawn per hashlib call: bounded memory, few calls


def _stream_key(seed: int, epoch: int) -> bytes:
    # A namespaced string through hashlib, never ``hash()``: the same in every
    # process, Python run (``PYTHONHASHSEED``) and host.
    return f"rollcall/data/{seed}/{epoch}".encode()


def _random_words(key: bytes, count: int) -> Iterator[int]:
    """``count`` uniform 64-bit words: SHAKE-128 of ``key/chunk``, little-endian.

    Written out here instead of using :mod:`random` because the core may not
    import it, and so the data order does not hang on CPython's shuffle
    internals staying the same across versions.
    """
    for chunk in range(-(-count // _CHUNK)):
        m = min(_CHUNK, count - chunk * _CHUNK)
        digest = hashlib.shake_128(key + b"/%d" % chunk).digest(8 * m)
        yield from struct.unpack(f"<{m}Q", digest)


@lru_cache(maxsize=4)
def epoch_permutation(seed: int, epoch: int, n: int) -> tuple[int, ...]:
    """The order in which epoch ``epoch`` visits the ``n`` dataset indices.

    Fisher-Yates driven by :func:`_random_words` (index drawn by 64-bit
    multiply-shift; its bias, below n / 2**64, is immaterial). Memoized with a
    small cache: a worker reads the current epoch (and the next one across a
    boundary) over and over, but a long run must not keep every epoch alive.
    """
    if n < 0:
        raise ValueError(f"dataset size must be >= 0, got {n}")
    if epoch < 0:
        raise ValueError(f"epoch must be >= 0, got {epoch}")
    order = list(range(n))
    for i, word in zip(range(n - 1, 0, -1), _random_words(_stream_key(seed, epoch), n - 1)):
        j = (word * (i + 1)) >> 64
        order[i], order[j] = order[j], order[i]
    return tuple(order)


def epochs_covered(start: int, stop: int, n: int) -> list[tuple[int, int, int]]:
    """Split the stream range ``[start, stop)`` at epoch boundaries.

    Returns ``(epoch, lo, hi)`` triples in stream order, where ``[lo, hi)``
    are positions *within* that epoch's permutation (``0 <= lo < hi <= n``).
    Checkers use it to tell which epochs a run has completed without touching
    any permutation.
    """
    if n <= 0:
        raise ValueError(f"dataset size must be > 0, got {n}")
    if not 0 <= start <= stop:
        raise ValueError(f"need 0 <= start <= stop, got [{start}, {stop})")
    out: list[tuple[int, int, int]] = []
    q = start
    while q < stop:
        epoch, lo = divmod(q, n)
        hi = min(n, lo + (stop - q))
        out.append((epoch, lo, hi))
        q += hi - lo
    return out


def sample_ids(seed: int, n: int, start: int, stop: int) -> list[int]:
    """Dataset indices of stream offsets ``[start, stop)``, in stream order.

    Offset ``q`` is ``epoch_permutation(seed, q // n, n)[q % n]``; a range
    that crosses an epoch boundary continues in the next epoch's order.
    """
    ids: list[int] = []
    for epoch, lo, hi in epochs_covered(start, stop, n):
        ids.extend(epoch_permutation(seed, epoch, n)[lo:hi])
    return ids


# --------------------------------------------------------------------------
# Assignment of virtual shards to members
# --------------------------------------------------------------------------


def rank_range(n_shards: int, n_members: int, rank: int) -> tuple[int, int]:
    """The half-open shard range of ``rank`` in O(1).

    The same rule as :func:`assign` (first ``n_shards % n_members`` ranks get
    one more), so a worker of a 10^5-member job, or a reader of
    :func:`describe_assignment`, finds its shards without building the list.
    """
    if n_shards < 0:
        raise ValueError(f"n_shards must be >= 0, got {n_shards}")
    if n_members <= 0:
        raise ValueError(f"need at least one member, got {n_members}")
    if not 0 <= rank < n_members:
        raise ValueError(f"rank {rank} out of range for {n_members} members")
    base, extra = divmod(n_shards, n_members)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


def stripes(members: Sequence[WorkerId], stale: Collection[WorkerId],
            size: int) -> list[tuple[WorkerId, int, int]]:
    """Who sends which part of a replicated state to the stale members:
    ``(holder, lo, hi)``, elements ``lo..hi-1`` of the flat state from each
    member that is not stale, in rank order (the split of :func:`rank_range`).

    Every stale member takes every stripe, each from its holder, so a copy
    is spread over all the holders' links instead of one source's (the sim
    prices it so: ``sim.sharded.replicated_copy_time``). Empty stripes
    (more holders than elements) are left out.
    """
    holders = [w for w in members if w not in stale]
    assert holders and len(holders) < len(members), "a copy needs a holder and a stale member"
    assert size >= 0, size
    out = []
    for j, w in enumerate(holders):
        lo, hi = rank_range(size, len(holders), j)
        if hi > lo:
            out.append((w, lo, hi))
    return out


def assign(n_shards: int, members: Sequence[WorkerId]) -> tuple[tuple[int, int], ...]:
    """Deal ``n_shards`` shards to ``members`` as contiguous runs, in rank order.

    Rank ``r`` is the position in ``members``. Loads differ by at most one
    micro-batch, which is what bounds the step time of the slowest worker;
    members beyond ``n_shards`` get empty ranges (``lo == hi``) and still take
    part in the collective with a zero contribution.
    """
    n_members = len(members)
    if n_members == 0:
        raise ValueError("cannot assign shards to an empty member list")
    if n_shards < 0:
        raise ValueError(f"n_shards must be >= 0, got {n_shards}")
    base, extra = divmod(n_shards, n_members)
    ranges: list[tuple[int, int]] = []
    lo = 0
    for rank in range(n_members):
        hi = lo + base + (1 if rank < extra else 0)
        ranges.append((lo, hi))
        lo = hi
    return tuple(ranges)


# --------------------------------------------------------------------------
# Batch policy
# --------------------------------------------------------------------------


class BatchPolicy(str, Enum):
    """What a smaller job does with the global batch.

    ``constant`` keeps it, survivors accumulating more micro-batches, so the
    optimizer sees the same batch whatever the membership; ``shrink`` keeps
    each survivor's load and takes fewer samples per step, which is faster
    per step but changes the optimization (optionally compensated by scaling
    the learning rate).
    """

    CONSTANT = "constant"
    SHRINK = "shrink"


#: Accepted values of the ``lr_scaling`` knob of :func:`lr_scale`.
LR_SCALINGS: tuple[str, ...] = ("none", "linear")


def _check_batch(global_batch: int, micro_batch: int) -> None:
    if micro_batch <= 0:
        raise ValueError(f"micro_batch must be > 0, got {micro_batch}")
    if global_batch <= 0 or global_batch % micro_batch:
        # A remainder would either be skipped every step or need a ragged
        # shard; requiring a multiple keeps "fixed virtual shards" exact.
        raise ValueError(
            f"global_batch ({global_batch}) must be a positive multiple of "
            f"micro_batch ({micro_batch})"
        )


def step_batch(
    policy: BatchPolicy | str,
    global_batch: int,
    micro_batch: int,
    n_members: int,
    full_workers: int,
) -> int:
    """Samples consumed by one step with ``n_members`` workers.

    ``constant``: ``global_batch`` always (held by gradient accumulation).
    ``shrink``: the largest multiple of ``micro_batch`` not above
    ``global_batch * min(n_members, full_workers) / full_workers``, at least
    one micro-batch, so each survivor keeps its per-worker load.
    """
    policy = BatchPolicy(policy)
    _check_batch(global_batch, micro_batch)
    if n_members <= 0:
        raise ValueError(f"n_members must be > 0, got {n_members}")
    if policy is BatchPolicy.CONSTANT:
        return global_batch
    if full_workers <= 0:
        raise ValueError(f"full_workers must be > 0, got {full_workers}")
    # Integer arithmetic only: floor(floor(x) / m) == floor(x / m).
    scaled = global_batch * min(n_members, full_workers) // full_workers
    return max(micro_batch, scaled // micro_batch * micro_batch)


def lr_scale(
    policy: BatchPolicy | str, lr_scaling: str, batch: int, global_batch: int
) -> float:
    """Learning-rate multiplier for a step of ``batch`` samples.

    1.0 except under ``shrink`` with ``linear`` scaling, where it is
    ``batch / global_batch`` (the linear scaling rule: a smaller batch takes a
    proportionally smaller step).
    """
    policy = BatchPolicy(policy)
    if lr_scaling not in LR_SCALINGS:
        raise ValueError(f"lr_scaling must be one of {LR_SCALINGS}, got {lr_scaling!r}")
    if global_batch <= 0:
        raise ValueError(f"global_batch must be > 0, got {global_batch}")
    if policy is BatchPolicy.SHRINK and lr_scaling == "linear":
        return batch / global_batch
    return 1.0


# --------------------------------------------------------------------------
# Step plan
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class StepPlan:
    """Who processes which virtual shards of one step, and where it starts.

    ``global_batch`` is the batch of *this* step (under ``shrink`` it may be
    smaller than the configured one). ``ranges[r]`` is the half-open shard
    range of ``members[r]``. The plan holds offsets only; dataset indices come
    from :func:`sample_ids` when a worker actually loads data.
    """

    step: int
    sample_start: int
    global_batch: int
    micro_batch: int
    members: tuple[WorkerId, ...]
    ranges: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        _check_batch(self.global_batch, self.micro_batch)
        if self.step < 0 or self.sample_start < 0:
            raise ValueError("step and sample_start must be >= 0")
        if len(self.ranges) != len(self.members):
            raise ValueError("one shard range per member is required")

    @cached_property
    def _rank(self) -> dict[WorkerId, int]:
        # cached_property writes the instance __dict__ directly, so it works
        # on a frozen dataclass and does not take part in == or hash.
        return {w: r for r, w in enumerate(self.members)}

    @property
    def n_shards(self) -> int:
        """Virtual shards in this step."""
        return self.global_batch // self.micro_batch

    @property
    def offsets(self) -> range:
        """All stream offsets of this step."""
        return range(self.sample_start, self.sample_start + self.global_batch)

    def rank_of(self, worker: WorkerId) -> int:
        """Rank of ``worker``; a non-member asking is a bug, so it raises."""
        try:
            return self._rank[worker]
        except KeyError:
            raise KeyError(f"worker {worker} is not a member of step {self.step}") from None

    def shards_of(self, worker: WorkerId) -> range:
        """Shard indices of ``worker`` (empty when there are more members than shards)."""
        lo, hi = self.ranges[self.rank_of(worker)]
        return range(lo, hi)

    def shard_offsets(self, j: int) -> range:
        """Stream offsets of shard ``j``."""
        if not 0 <= j < self.n_shards:
            raise IndexError(f"shard {j} out of range for {self.n_shards} shards")
        lo = self.sample_start + j * self.micro_batch
        return range(lo, lo + self.micro_batch)

    def offsets_of(self, worker: WorkerId) -> list[range]:
        """Stream offsets of ``worker``, one range per micro-batch (accumulation step)."""
        return [self.shard_offsets(j) for j in self.shards_of(worker)]

    def load(self, worker: WorkerId) -> int:
        """Micro-batches ``worker`` processes in this step."""
        return len(self.shards_of(worker))

    @property
    def accumulation(self) -> int:
        """Micro-batches of the busiest worker: it sets the step time."""
        return max((hi - lo for lo, hi in self.ranges), default=0)

    def next_cursor(self) -> Cursor:
        """Where training stands once this step commits."""
        return Cursor(self.step + 1, self.sample_start + self.global_batch)


def plan_step(
    cursor: Cursor,
    members: Sequence[WorkerId],
    *,
    global_batch: int,
    micro_batch: int,
    policy: BatchPolicy | str = BatchPolicy.CONSTANT,
    full_workers: int | None = None,
) -> StepPlan:
    """Plan the step at ``cursor`` for ``members`` (rank order = given order).

    Depends only on the cursor and the member list, so an interrupted step
    redone from the same cursor covers the same offsets under ``constant``
    whoever the survivors are. ``full_workers`` (the job's nominal size) is
    required by ``shrink``.
    """
    policy = BatchPolicy(policy)
    members = tuple(members)
    if len(set(members)) != len(members):
        raise ValueError("member list has duplicates")
    if policy is BatchPolicy.SHRINK and full_workers is None:
        raise ValueError("the shrink policy needs full_workers")
    batch = step_batch(
        policy,
        global_batch,
        micro_batch,
        len(members),
        full_workers if full_workers is not None else len(members),
    )
    return StepPlan(
        step=cursor.step,
        sample_start=cursor.sample,
        global_batch=batch,
        micro_batch=micro_batch,
        members=members,
        ranges=assign(batch // micro_batch, members),
    )


def describe_assignment(plan: StepPlan) -> dict[str, int]:
    """Compact, JSON-ready form of ``plan``'s assignment for the history.

    Four integers whatever the job size: rank ``r`` holds
    ``rank_range(shards, members, r)`` (the first ``extra`` ranks get
    ``base + 1`` shards). The member list itself is recorded elsewhere.
    """
    n_members = len(plan.members)
    base, extra = divmod(plan.n_shards, n_members)
    return {"shards": plan.n_shards, "members": n_members, "base": base, "extra": extra}
