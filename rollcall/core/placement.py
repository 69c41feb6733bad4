"""Shard placement: who holds which replica of sharded state, and how to recover it.

Why: under ZeRO/FSDP-style sharding a dead worker takes a slice of the state
that exists nowhere else, unless buddies were given copies in advance. This
module places ``n_shards`` shards on ``min(r, members)`` distinct workers each
(the owner first, then ``r - 1`` buddies), spread over failure domains (racks),
and after a membership change says which surviving holder copies what to whom,
which shards are gone (every holder dead: checkpoint fallback), and the bytes.

Everything is a pure, deterministic function of its arguments: every choice is
a minimum over a key that ends in the worker id, so no randomness is needed.

**Placing one replica (the greedy rule).** Among the members that do not hold
the shard yet, take the one whose domain holds the fewest replicas of this
shard, then whose domain holds the fewest replicas per member, then the one
holding the fewest replicas overall, then the lowest id. What follows (and what
``tests/test_placement.py`` checks):

* *Spread.* In a placement built by :func:`initial_placement`, for every shard
  and domains ``a``, ``b``: ``count(a) <= count(b) + 1`` whenever ``b`` still
  has a member not holding the shard. Hence, when the members span at least
  ``min(r, members)`` domains, each shard's holders lie in distinct domains.
  :func:`replan` places new replicas by the same rule next to survivors that
  stay put, so a shard whose survivors were in distinct domains stays so
  whenever the members still span ``min(r, members)`` domains.
* *Balance.* In :func:`initial_placement` every worker holds ``floor`` or
  ``ceil`` of ``n_shards * min(r, m) / m`` replicas, without domains (or with
  one) and with equal-sized domains numbering at least ``min(r, m)`` (domains
  balance first, then workers inside them). Otherwise spread wins over balance
  (a lone worker in its own rack gets a replica of most shards): no bound.
* The owner of a shard is the holder owning the fewest shards so far (ties:
  placement order). Without domains this gave ``floor`` or ``ceil`` of
  ``n_shards / m`` owned shards per worker in every test (not proven).

**Minimal movement** (:func:`replan`):

1. Every surviving replica stays where it is. The only replicas dropped are
   those beyond ``min(r, members)`` (``r`` lowered), and such a shard gets no
   copy.
2. A shard is *lost* exactly when none of its holders is a member any more; it
   gets fresh holders that reload it from the checkpoint (``reloads``), never
   copies.
3. ``len(copies)`` equals the replica deficit
   ``sum(max(0, min(r, m) - survivors(s)) for every non-lost shard s)``: one
   copy per missing replica, each from a surviving holder of that shard to a
   member that does not hold it. Nothing else moves, so joins alone copy only
   the replicas a job smaller than ``r`` lacked.
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Iterable, Mapping, Sequence

from rollcall.core.types import WorkerId

__all__ = [
    "Copy",
    "Placement",
    "RecoveryPlan",
    "Reload",
    "initial_placement",
    "replan",
]

ShardBytes = int | Sequence[int]


def _size(shard_bytes: ShardBytes, shard: int) -> int:
    """Bytes of one shard: one size for all, or a size per shard (ragged last slice)."""
    return shard_bytes if isinstance(shard_bytes, int) else int(shard_bytes[shard])


@dataclass(frozen=True)
class Placement:
    """``shards[s]`` is the holder tuple of shard ``s``: owner first, then buddies."""

    shards: tuple[tuple[WorkerId, ...], ...]

    def __post_init__(self) -> None:
        for s, holders in enumerate(self.shards):
            if len(set(holders)) != len(holders):
                raise ValueError(f"shard {s} has a repeated holder: {holders}")

    @property
    def n_shards(self) -> int:
        return len(self.shards)

    def holders(self, shard: int) -> tuple[WorkerId, ...]:
        return self.shards[shard]

    def owner(self, shard: int) -> WorkerId:
        return self.shards[shard][0]

    def shards_of(self, worker: WorkerId) -> tuple[int, ...]:
        """Shards of which ``worker`` holds a replica (owned or buddy), ascending."""
        return tuple(s for s, h in enumerate(self.shards) if worker in h)

    def owned_by(self, worker: WorkerId) -> tuple[int, ...]:
        return tuple(s for s, h in enumerate(self.shards) if h and h[0] == worker)

    def loads(self) -> dict[WorkerId, int]:
        """Replica count per holder (workers holding nothing are absent)."""
        return dict(sorted(Counter(w for h in self.shards for w in h).items()))

    def bytes_on(self, worker: WorkerId, shard_bytes: ShardBytes) -> int:
        return sum(_size(shard_bytes, s) for s in self.shards_of(worker))

    def to_json(self) -> list[list[int]]:
        return [list(h) for h in self.shards]

    @classmethod
    def from_json(cls, value: Iterable[Iterable[int]]) -> "Placement":
        return cls(tuple(tuple(int(w) for w in h) for h in value))


@dataclass(frozen=True, order=True)
class Copy:
    """Peer copy of ``shard`` from surviving holder ``src`` to ``dst``."""

    shard: int
    src: WorkerId
    dst: WorkerId


@dataclass(frozen=True, order=True)
class Reload:
    """``dst`` loads lost ``shard`` from the last checkpoint."""

    shard: int
    dst: WorkerId


@dataclass(frozen=True)
class RecoveryPlan:
    """What a membership change costs: peer copies, checkpoint reloads, new placement.

    Apply as: do every copy and reload (sources still hold everything), then
    switch to ``placement``; holders absent from it drop their replica.
    """

    placement: Placement
    copies: tuple[Copy, ...]
    reloads: tuple[Reload, ...]
    lost: tuple[int, ...]
    promoted: tuple[int, ...]

    @property
    def fallback(self) -> bool:
        """Some shard exists nowhere: the job must go back to the checkpoint."""
        return bool(self.lost)

    def bytes_moved(self, shard_bytes: ShardBytes) -> int:
        """Bytes sent peer to peer."""
        return sum(_size(shard_bytes, c.shard) for c in self.copies)

    def bytes_reloaded(self, shard_bytes: ShardBytes) -> int:
        """Bytes read back from the checkpoint."""
        return sum(_size(shard_bytes, r.shard) for r in self.reloads)

    def to_json(self) -> dict[str, Any]:
        return {
            "placement": self.placement.to_json(),
            "copies": [[c.shard, c.src, c.dst] for c in self.copies],
            "reloads": [[r.shard, r.dst] for r in self.reloads],
            "lost": list(self.lost),
            "promoted": list(self.promoted),
        }

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> "RecoveryPlan":
        return cls(
            Placement.from_json(value["placement"]),
            tuple(Copy(int(s), int(a), int(b)) for s, a, b in value["copies"]),
            tuple(Reload(int(s), int(d)) for s, d in value["reloads"]),
            tuple(int(s) for s in value["lost"]),
            tuple(int(s) for s in value["promoted"]),
        )


# --------------------------------------------------------------------------
# Planning
# --------------------------------------------------------------------------


def _check(members: Iterable[WorkerId], r: int, domains: Mapping[WorkerId, str] | None) -> tuple[WorkerId, ...]:
    ms = tuple(sorted(set(members)))
    if not ms:
        raise ValueError("need at least one member")
    if r < 1:
        raise ValueError(f"r must be >= 1, got {r}")
    if domains is not None:
        missing = [w for w in ms if w not in domains]
        if missing:
            raise ValueError(f"members without a domain: {missing}")
    return ms


class _Greedy:
    """The greedy rule, kept in heaps so that a pick costs ``O(log m)``.

    Key: replicas of this shard already in the domain, then the domain's replicas
    per member, then the worker's replicas, then the lowest id. The second term
    balances domains first, so with equal-sized domains the workers balance too.

    Each domain has a heap of ``(replicas, worker)`` and one current entry
    ``(replicas per member, replicas, worker, domain)`` in a heap of domains,
    naming its least loaded worker. A pick for a shard whose holders leave some
    domain unused is the top current entry of a domain it does not use; when
    the holders use every domain (fewer domains than replicas) the few domains
    are ranked in full. Entries made stale by :meth:`add` stay in the heaps and
    are dropped when they surface.
    """

    def __init__(self, members: Sequence[WorkerId], loads: Counter[WorkerId],
                 domains: Mapping[WorkerId, str] | None) -> None:
        self.loads = loads
        self.dom = {w: (domains[w] if domains is not None else "") for w in members}
        self.groups: dict[str, list[WorkerId]] = {}
        self.dload: Counter[str] = Counter()
        for w in members:
            self.groups.setdefault(self.dom[w], []).append(w)
            self.dload[self.dom[w]] += loads[w]
        # a sorted list is a heap
        self.workers = {d: sorted((loads[w], w) for w in ws) for d, ws in self.groups.items()}
        self.current: dict[str, tuple[Fraction, int, WorkerId, str]] = {}
        for d in self.groups:
            self.current[d] = self._entry(d)
        self.ranked = list(self.current.values())
        heapq.heapify(self.ranked)

    def _least_loaded(self, d: str, taken: set[WorkerId]) -> tuple[int, WorkerId] | None:
        """Domain ``d``'s ``(replicas, worker)`` least, among workers not ``taken``."""
        heap, aside = self.workers[d], []
        while heap and (heap[0][0] != self.loads[heap[0][1]] or heap[0][1] in taken):
            entry = heapq.heappop(heap)
            if entry[0] == self.loads[entry[1]]:  # taken, not stale: it stays
                aside.append(entry)
        best = heap[0] if heap else None
        for entry in aside:
            heapq.heappush(heap, entry)
        return best

    def _entry(self, d: str) -> tuple[Fraction, int, WorkerId, str]:
        least = self._least_loaded(d, set())
        assert least is not None, f"domain {d!r} has no worker"
        return (Fraction(self.dload[d], len(self.groups[d])), least[0], least[1], d)

    def add(self, w: WorkerId) -> None:
        d = self.dom[w]
        self.loads[w] += 1
        self.dload[d] += 1
        heapq.heappush(self.workers[d], (self.loads[w], w))
        self.current[d] = self._entry(d)
        heapq.heappush(self.ranked, self.current[d])

    def pick(self, holders: Sequence[WorkerId]) -> WorkerId:
        used = {self.dom[h] for h in holders}
        if len(used) < len(self.groups):
            return self._pick_unused(used)
        return self._pick_among(holders)

    def _pick_unused(self, used: set[str]) -> WorkerId:
        """The least loaded worker of the domains ``used`` leaves out (no holder there)."""
        aside = []
        while True:
            entry = self.ranked[0]
            if entry is not self.current[entry[3]]:
                heapq.heappop(self.ranked)
            elif entry[3] in used:
                aside.append(heapq.heappop(self.ranked))
            else:
                break
        for each in aside:
            heapq.heappush(self.ranked, each)
        return entry[2]

    def _pick_among(self, holders: Sequence[WorkerId]) -> WorkerId:
        """The rule in full, when the holders use every domain (so there are few)."""
        taken = set(holders)
        uses = Counter(self.dom[h] for h in holders)
        keys = []
        for d in self.groups:
            least = self._least_loaded(d, taken)
            if least is not None:
                keys.append((uses[d], Fraction(self.dload[d], len(self.groups[d])), least))
        assert keys, "every member already holds the shard"
        return min(keys)[2][1]

    def fill(self, holders: list[WorkerId], want: int) -> list[WorkerId]:
        """Add holders until there are ``want``; returns the added ones."""
        added = []
        while len(holders) < want:
            w = self.pick(holders)
            holders.append(w)
            self.add(w)
            added.append(w)
        return added


def _owner_first(holders: list[WorkerId], owned: Counter[WorkerId]) -> tuple[WorkerId, ...]:
    """Put the holder owning the fewest shards first (ties: current order); count it."""
    best = min(range(len(holders)), key=lambda i: (owned[holders[i]], i))
    owned[holders[best]] += 1
    return (holders[best],) + tuple(holders[:best] + holders[best + 1:])


def initial_placement(n_shards: int, members: Iterable[WorkerId], r: int,
                      domains: Mapping[WorkerId, str] | None = None) -> Placement:
    """Place each shard on ``min(r, m)`` members by the greedy rule, shard by shard."""
    if n_shards < 1:
        raise ValueError(f"n_shards must be >= 1, got {n_shards}")
    ms = _check(members, r, domains)
    want = min(r, len(ms))
    greedy = _Greedy(ms, Counter(), domains)
    owned: Counter[WorkerId] = Counter()
    shards = []
    for _ in range(n_shards):
        holders: list[WorkerId] = []
        greedy.fill(holders, want)
        shards.append(_owner_first(holders, owned))
    return Placement(tuple(shards))


def replan(placement: Placement, members_after: Iterable[WorkerId], r: int,
           domains: Mapping[WorkerId, str] | None = None) -> RecoveryPlan:
    """Recovery plan after a membership change (losses and/or joins).

    Survivors keep their replicas; each missing replica is one copy from the
    surviving holder that has sent the fewest copies so far (ties: lowest id).
    A shard whose owner died is promoted: the surviving holder owning the
    fewest shards becomes owner (ties: holder order).
    """
    ms = _check(members_after, r, domains)
    alive = set(ms)
    want = min(r, len(ms))
    survivors = [[w for w in h if w in alive][:want] for h in placement.shards]
    loads: Counter[WorkerId] = Counter(w for h in survivors for w in h)
    owned: Counter[WorkerId] = Counter(h[0] for h, old in zip(survivors, placement.shards) if h and h[0] == old[0])
    greedy = _Greedy(ms, loads, domains)
    sent: Counter[WorkerId] = Counter()
    copies: list[Copy] = []
    reloads: list[Reload] = []
    lost: list[int] = []
    promoted: list[int] = []
    shards: list[tuple[WorkerId, ...]] = []
    for s, (old, holders) in enumerate(zip(placement.shards, survivors)):
        if not holders:
            lost.append(s)
            added = greedy.fill(holders, want)
            reloads.extend(Reload(s, w) for w in added)
            shards.append(_owner_first(holders, owned))
            continue
        keep = list(holders)
        for dst in greedy.fill(holders, want):
            src = min(keep, key=lambda w: (sent[w], w))
            sent[src] += 1
            copies.append(Copy(s, src, dst))
        if holders[0] == old[0]:
            shards.append(tuple(holders))
        else:
            promoted.append(s)
            shards.append(_owner_first(keep, owned) + tuple(holders[len(keep):]))
    return RecoveryPlan(Placement(tuple(shards)), tuple(copies), tuple(reloads), tuple(lost), tuple(promoted))


