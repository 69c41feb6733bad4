"""The real target's machines: which nodes are up, which are lost, and the
repair shop's decisions carried out on the launcher's clock.

What happens to a lost node (repaired at ``back_at_s``, retired, a
healthy one blamed, a cold spare pulled, an idle one made a warm standby)
is the core's :class:`rollcall.core.RepairShop`; this class holds its
answers until they are due and then does them through its :class:`Owner`
(the launcher): a history record, a host brought back, the keeper told a
node is up, a process started.
"""

from __future__ import annotations

from typing import Callable, Optional, Protocol

from rollcall.core import Blame, Pull, Repair, RepairShop, Retire, Warm


class Owner(Protocol):
    """What the nodes need of the launcher."""

    def write(self, record: dict) -> None: ...

    def spawn_node(self, worker: int) -> None:
        """Start a first process on node ``worker``."""

    def node_back(self, now: float, worker: int) -> None:
        """A repaired node is up again: the keeper names its process's life."""

    def host_back(self, worker: int) -> None:
        """Hosts mode: bring back the host of repaired node ``worker``."""


class Nodes:
    """Nodes arrive (a worker, a spare, a join that fired), are lost, and
    come back; ``shop`` decides what a loss leads to."""

    def __init__(self, shop: RepairShop, owner: Owner) -> None:
        self.shop = shop
        self.owner = owner
        # whose hardware is up (the sim's Nodes.hw): arrived and not lost
        # since, or repaired
        self.up: set[int] = set()
        self.down: set[int] = set()  # lost, not given back yet (a new keeper hears of them)
        self.repairs: list[Repair] = []
        self.pulls: list[Pull] = []  # spares from the cold pool, due at their at_s
        self.warms: list[Warm] = []  # idle nodes made warm standbys, due at their at_s

    def arrived(self, now: float, worker: int, joined: bool = False) -> None:
        """Node ``worker`` is up with the job; ``joined``: a scripted join
        brought it (the shop counts it)."""
        self.up.add(worker)
        if joined:
            self.shop.joined(now, worker)

    def lost(self, worker: int) -> None:
        """Node ``worker`` is lost (killed, crashed, or blamed)."""
        assert worker in self.up, worker
        self.up.discard(worker)
        self.down.add(worker)

    def to_shop(self, now: float, worker: int,
                innocents: Callable[[], list[int]]) -> list[Retire | Blame]:
        """Lost node ``worker`` goes to the repair shop (a blamed one went with
        its blame). Returns the shop's answers the fault injector carries out
        (a retirement, a wrong diagnosis); the rest come due here."""
        assert worker in self.down, worker
        answers: list[Retire | Blame] = []
        for act in self.shop.down(now, worker, innocents):
            if isinstance(act, Repair):
                self.repairs.append(act)
            elif isinstance(act, (Retire, Blame)):
                answers.append(act)
            elif isinstance(act, Warm):
                self.warms.append(act)
            else:
                self.pulls.append(act)
        return answers

    def next_time(self) -> Optional[float]:
        """When the next repair, pull or warm-up is due."""
        times = ([r.back_at_s for r in self.repairs] + [p.at_s for p in self.pulls]
                 + [w.at_s for w in self.warms])
        return min(times) if times else None

    def handle_timer(self, now: float) -> None:
        """Carry out every repair, pull and warm-up due by ``now``, in that order."""
        for repair in [r for r in self.repairs if now >= r.back_at_s]:
            self.repairs.remove(repair)
            self.owner.write(repair.record(now))
            self.owner.host_back(repair.worker)
            if self.shop.up(now, repair.worker):  # else it waits idle, no process (warm_standbys)
                self.down.discard(repair.worker)
                self.owner.node_back(now, repair.worker)
        for pull in [p for p in self.pulls if now >= p.at_s]:
            # a cold spare, preempted from other work: a fresh process
            self.pulls.remove(pull)
            self.shop.up(now, pull.worker, pulled=True)
            self.owner.write(pull.record(now))
            self.owner.spawn_node(pull.worker)
        for warm in [w for w in self.warms if now >= w.at_s]:
            # an idle node whose host selection ended starts its process, as a
            # warm standby (one that failed meanwhile not)
            self.warms.remove(warm)
            if not self.shop.warmed(now, warm.worker):
                continue
            self.owner.write(warm.record(now))
            if warm.back:  # back from repair: the keeper names its life
                self.down.discard(warm.worker)
                self.owner.node_back(now, warm.worker)
            else:
                self.owner.spawn_node(warm.worker)
