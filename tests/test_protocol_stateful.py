"""Stateful property test of the rendezvous protocol.

Hypothesis drives the core's keeper and agents through an in-memory network
(tests/protocol_net.py) and injects every fault the protocol must survive:
crashes (noticed by the host or not), pauses long enough to be evicted,
restarts as a new incarnation, leaves, message delay, reordering, loss and
duplication, and clock jumps. Safety is checked after every step; liveness
whenever the ``heal`` rule runs: once faults stop and enough workers live,
a generation of exactly the live workers must close within a bounded time.

A failure prints the rule sequence and a ``@reproduce_failure`` blob.
"""

from __future__ import annotations

import heapq

import pytest

from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine, initialize, invariant, precondition, rule,
)

from protocol_net import KEEPER, Flight, World
from rollcall.core.agent import Phase

N_MAX = 5
HEARTBEAT_S = 0.25
TIMEOUT_S = 1.0
HEAL_LIMIT_S = 30.0


class Rendezvous(RuleBasedStateMachine):
    world: World

    @initialize(n=st.integers(2, N_MAX), min_workers=st.integers(1, 3),
                latency=st.sampled_from([0.0, 0.01, 0.2]),
                strategy=st.sampled_from(["elastic", "checkpoint-restart"]))
    def start(self, n: int, min_workers: int, latency: float, strategy: str) -> None:
        self.world = World(n, min_workers=min(min_workers, n), heartbeat_s=HEARTBEAT_S,
                           timeout_s=TIMEOUT_S, last_call_s=0.1, latency_s=latency,
                           strategy=strategy)
        self.keeper_gens = [0]
        self.agent_gens: dict[int, int] = {}

    # --- time and network faults ----------------------------------------------

    @rule(dt=st.floats(0.01, 2.0))
    def advance(self, dt: float) -> None:
        self.world.advance(dt)

    @precondition(lambda self: self.world.flights)
    @rule(i=st.integers(0, 10_000))
    def deliver_out_of_order(self, i: int) -> None:
        flights = self.world.flights
        flight = flights.pop(i % len(flights))
        heapq.heapify(flights)
        self.world.deliver(flight)

    @precondition(lambda self: self.world.flights)
    @rule(i=st.integers(0, 10_000))
    def lose(self, i: int) -> None:
        flights = self.world.flights
        flights.pop(i % len(flights))
        heapq.heapify(flights)

    @precondition(lambda self: self.world.flights)
    @rule(i=st.integers(0, 10_000), extra=st.floats(0.0, 3.0))
    def duplicate(self, i: int, extra: float) -> None:
        w = self.world
        f = w.flights[i % len(w.flights)]
        heapq.heappush(w.flights, Flight(f.at + extra, next(w._seq), f.dst, f.msg))

    @precondition(lambda self: self.world.flights)
    @rule(i=st.integers(0, 10_000), extra=st.floats(0.0, 3.0))
    def delay(self, i: int, extra: float) -> None:
        flights = self.world.flights
        f = flights[i % len(flights)]
        f.at += extra
        heapq.heapify(flights)

    # --- process faults -------------------------------------------------------

    def _pick(self, i: int, pool: set[int]) -> int | None:
        return sorted(pool)[i % len(pool)] if pool else None

    @rule(i=st.integers(0, N_MAX), noticed=st.booleans(), node_lost=st.booleans())
    def crash(self, i: int, noticed: bool, node_lost: bool) -> None:
        w = self._pick(i, self.world.live() | self.world.paused)
        if w is None:
            return
        self.world.crashed.add(w)
        self.world.paused.discard(w)
        if node_lost:  # its machine is gone too: no restart may relaunch it
            self.world.nodes_lost.add(w)
            self.world.keeper.node_down(self.world.now, w)
        if noticed:  # the host saw the process exit
            self.world._apply_keeper(self.world.keeper.exited(
                self.world.now, w, self.world.agents[w].incarnation))

    @rule(i=st.integers(0, N_MAX))
    def pause(self, i: int) -> None:
        w = self._pick(i, self.world.live())
        if w is not None:
            self.world.paused.add(w)

    @rule(i=st.integers(0, N_MAX))
    def resume(self, i: int) -> None:
        w = self._pick(i, self.world.paused)
        if w is not None:
            self.world.resume(w)

    @rule(i=st.integers(0, N_MAX))
    def restart(self, i: int) -> None:
        """A crashed worker's process (or its repaired machine) starts again,
        as the life the keeper hands out."""
        w = self._pick(i, self.world.crashed)
        if w is not None:
            self.world.nodes_lost.discard(w)
            inc = self.world.keeper.node_up(self.world.now, w)
            assert inc > self.world.agents[w].incarnation, (w, inc)
            self.world.spawn(w, inc)

    @rule(i=st.integers(0, N_MAX))
    def leave(self, i: int) -> None:
        w = self._pick(i, self.world.live())
        if w is not None:
            self.world._apply_agent(w, self.world.agents[w].leave(self.world.now))
            self.world.left.add(w)

    # --- training -------------------------------------------------------------

    @rule(i=st.integers(0, N_MAX))
    def contribute(self, i: int) -> None:
        """Any unpaused, uncrashed worker offers a gradient, stale or not."""
        w = self._pick(i, self.world.live())
        if w is not None:
            self.world.contribute(w)

    @rule(i=st.integers(0, N_MAX))
    def step_failed(self, i: int) -> None:
        w = self._pick(i, {x for x in self.world.live() if self.world.agents[x].may_step(self.world.agents[x].generation)})
        if w is not None:
            agent = self.world.agents[w]
            step = self.world.exchange.step if self.world.exchange else 0
            self.world._apply_agent(w, agent.step_failed(self.world.now, step))

    # --- liveness -------------------------------------------------------------

    @precondition(lambda self: len(self.world.live() | self.world.paused)
                  >= self.world.keeper.config.min_workers)
    @rule()
    def heal(self) -> None:
        """Faults stop: within a bounded time the live workers form a generation."""
        w = self.world
        for p in sorted(w.paused):
            w.resume(p)
        deadline = w.now + HEAL_LIMIT_S
        while w.now < deadline:
            w.advance(HEARTBEAT_S)
            live = w.live()
            if len(live) < w.keeper.config.min_workers:
                return  # a woken worker learned it was an older life and stopped
            k = w.keeper
            if (k.round is None and set(k.members) == live and live
                    and all(w.agents[x].phase is Phase.ACTIVE
                            and w.agents[x].generation == k.generation for x in live)):
                return
        raise AssertionError(
            f"no generation of the live workers {sorted(w.live())} within {HEAL_LIMIT_S}s: "
            f"keeper gen {w.keeper.generation} members {w.keeper.members} "
            f"round {w.keeper.round}, agents "
            f"{ {x: (a.phase.value, a.generation) for x, a in w.agents.items()} }")

    # --- safety ---------------------------------------------------------------

    @invariant()
    def one_view_per_generation(self) -> None:
        assert not self.world.acted_outside, self.world.acted_outside

    @invariant()
    def generations_only_go_up(self) -> None:
        k = self.world.keeper
        assert k.generation >= self.keeper_gens[-1]
        self.keeper_gens.append(k.generation)
        for x, a in self.world.agents.items():
            key = (x, a.incarnation)
            assert a.generation >= self.agent_gens.get(key, 0)
            self.agent_gens[key] = a.generation
            assert a.generation <= k.generation

    @invariant()
    def only_members_act(self) -> None:
        w = self.world
        for x, a in w.agents.items():
            if a.may_step(a.generation):
                assert x in w.views[a.generation], (x, a.generation, w.views[a.generation])

    @invariant()
    def no_stale_contribution_counted(self) -> None:
        for worker, gen, _step in self.world.accepted:
            assert worker in self.world.views[gen]
        if self.world.accepted:
            assert self.world.accepted[-1][1] <= self.world.keeper.generation



TestRendezvous = pytest.mark.timeout(900)(Rendezvous.TestCase)


def test_keeper_never_sends_to_nobody() -> None:
    """A smoke check that the harness delivers keeper traffic at all."""
    w = World(3, min_workers=2)
    w.advance(1.0)
    assert w.keeper.generation == 1 and tuple(w.keeper.members) == (0, 1, 2)
    assert KEEPER == -1
