"""The repair shop's node accounting (:mod:`rollcall.core.repairs`), against a
model that keeps each node in one place: running a process, warming (its
host selection under way), idle in the working pool, in repair, or coming
from the cold pool. A hypothesis state machine fails, repairs, warms, pulls
and joins nodes in any order; after each step the shop must agree with the
model, and with warm standbys no node may wait idle while a place for a
process is free. The shop's capacity (nodes in service or that may yet
come) is the model's count of every node not retired.
"""

from __future__ import annotations

from typing import Optional

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from rollcall.core import Draws, Pull, Repair, RepairPolicy, RepairShop, Retire, Warm

FIRST_POOL_ID = 1000


class ShopVersusModel(RuleBasedStateMachine):
    @initialize(want=st.integers(1, 6), spares=st.integers(0, 5), warm=st.none() | st.integers(0, 4),
                pool=st.integers(0, 4), retire_after=st.none() | st.integers(1, 3))
    def setup(self, want: int, spares: int, warm: Optional[int], pool: int,
              retire_after: Optional[int]) -> None:
        up = want + spares
        policy = RepairPolicy(fixed_s=10.0, retire_after=retire_after)
        self.shop = RepairShop(Draws(0, None), policy, up=up, want=want,
                               target=up, pool=pool, preempt_s=5.0, first_pool_id=FIRST_POOL_ID,
                               warm=warm, select_s=3.0)
        self.want, self.target, self.pool_left = want, up, pool
        self.places = None if warm is None else want + warm
        first = up if self.places is None else min(up, self.places)
        assert self.shop.initial == first
        self.running = set(range(first))
        self.idle = list(range(first, up))
        self.warming: set[int] = set()
        self.down: set[int] = set()
        self.coming: set[int] = set()
        self.failed_once: set[int] = set()
        self.failures: dict[int, int] = {}
        self.retire_after = retire_after
        self.retired: set[int] = set()
        self.joins = 0
        self.next_join = 500
        self.now = 0.0

    def _tick(self) -> float:
        self.now += 1.0
        return self.now

    def _in_service(self) -> int:
        return len(self.running) + len(self.warming) + len(self.idle)

    def _expect_pulls(self) -> int:
        have = self._in_service() + len(self.coming)
        if have >= self.want or not self.pool_left:
            return 0
        top = self.target if self.places is None else min(self.target, self.places)
        return max(0, min(top - have, self.pool_left))

    @rule(data=st.data())
    def fail(self, data: st.DataObject) -> None:
        nodes = sorted(self.running | self.warming | set(self.idle))
        if not nodes:
            return
        w = data.draw(st.sampled_from(nodes))
        if w in self.idle:
            self.idle.remove(w)
        self.running.discard(w)
        self.warming.discard(w)
        self.failed_once.add(w)
        self.failures[w] = self.failures.get(w, 0) + 1
        pulls = None
        acts = self.shop.down(self._tick(), w)
        if self.retire_after is not None and self.failures[w] >= self.retire_after:
            assert isinstance(acts[0], Retire) and acts[0].worker == w, acts
            self.retired.add(w)
        else:
            assert isinstance(acts[0], Repair) and acts[0].worker == w, acts
            self.down.add(w)
        for act in acts[1:]:
            if isinstance(act, Warm):
                assert pulls is None, "warm standbys come before pulls"
                assert act.worker == self.idle.pop(0), "the idle node that waited longest"
                assert act.back == (act.worker in self.failed_once)
                assert act.at_s == self.now + 3.0
                self.warming.add(act.worker)
            else:
                assert isinstance(act, Pull), act
                if pulls is None:
                    pulls = self._expect_pulls()
                    assert pulls > 0
                pulls -= 1
                self.pool_left -= 1
                self.coming.add(act.worker)
        assert pulls in (None, 0), "as many pulls as the pool tops up"
        assert self._expect_pulls() == 0

    @precondition(lambda self: self.down)
    @rule(data=st.data())
    def repaired(self, data: st.DataObject) -> None:
        w = data.draw(st.sampled_from(sorted(self.down)))
        self.down.remove(w)
        free = self.places is None or self.shop.busy < self.places
        starts = self.shop.up(self._tick(), w)
        assert starts == free
        if starts:
            self.running.add(w)
        else:
            self.idle.append(w)

    @precondition(lambda self: self.warming)
    @rule(data=st.data())
    def warmed(self, data: st.DataObject) -> None:
        w = data.draw(st.sampled_from(sorted(self.warming)))
        self.warming.remove(w)
        assert self.shop.warmed(self._tick(), w)
        self.running.add(w)

    @rule(w=st.integers(0, 12))
    def warmed_too_late(self, w: int) -> None:
        """A selection that ended for a node no longer warming starts nothing."""
        if w not in self.warming:
            assert not self.shop.warmed(self._tick(), w)

    @precondition(lambda self: self.coming)
    @rule(data=st.data())
    def pulled(self, data: st.DataObject) -> None:
        w = data.draw(st.sampled_from(sorted(self.coming)))
        self.coming.remove(w)
        assert self.shop.up(self._tick(), w, pulled=True)
        self.running.add(w)

    @rule()
    def join(self) -> None:
        w, self.next_join = self.next_join, self.next_join + 1
        self.shop.joined(self._tick(), w)
        self.running.add(w)
        self.joins += 1

    @invariant()
    def agrees(self) -> None:
        shop = self.shop
        assert shop.idle == self.idle
        assert shop.busy == len(self.running) + len(self.warming) + len(self.coming)
        assert shop.in_service == self._in_service()
        assert shop.coming == len(self.coming)
        assert shop.retired == self.retired
        assert shop.capacity == self._in_service() + len(self.down) + len(self.coming) \
            + self.pool_left, "every node not retired"
        if self.places is not None:
            assert not self.idle or shop.busy >= self.places, "an idle node beside a free place"
            assert shop.busy <= self.places + self.joins  # only a scripted join goes beyond
        else:
            assert not self.idle


TestShopVersusModel = ShopVersusModel.TestCase
