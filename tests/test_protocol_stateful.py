"""Stateful property test of the rendezvous protocol.

Hypothesis drives the core's keeper and agents through an in-memory network
(tests/protocol_net.py) and injects every fault the protocol must survive:
crashes (noticed by the host or not, with the node or not), pauses long
enough to be evicted, stragglers (evicted by the straggler policy, benched,
readmitted), restarts as a new incarnation (of a crashed process,
or of a paused one whose old life then wakes up as a zombie), leaves,
newcomers, message delay, reordering, loss and duplication, and clock jumps.
Training runs too: members recover the state they are told to (copies from
the source, shard copies, checkpoint loads), contribute to an all-or-nothing
exchange, commit through the keeper's commit vote, and write checkpoints.

Each example runs the simulator's driver styles or the real target's
(``batched`` joins, ``bulk`` liveness), replicated or sharded state
(``test_rendezvous[sharded]``), elastic or checkpoint-restart. Safety is checked
after every step, and at the moment each generation is decided against what
the processes really hold; the history's checkers (``rollcall.core.check``)
run on the model's records at the end of every example. Liveness is checked
whenever ``heal`` runs: once faults stop and enough workers live, a
generation of the live workers closes and commits a step within a bounded time.

A failure prints the rule sequence, a ``@reproduce_failure`` blob, and the
seed with a one-line command that replays the whole search (a failure is
also kept in the example database, ``.hypothesis/``, and replayed first).

Each gap in the core the model found is fixed and kept as an example test
at the end; the model tolerates none of them.
"""

from __future__ import annotations

import heapq
import importlib
import os
import pkgutil
import random
import shlex
import sys

import pytest

from hypothesis import seed, settings, strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test,
)

from protocol_net import (
    CRASHED, DATA, KEEPER, PAUSED, Ask, Flight, Proc, World,
)
from rollcall.core.agent import Phase
from rollcall.core.checkers import check
from rollcall.core.detector import TimeoutDetector
from rollcall.core.keeper import Keeper, KeeperConfig, Relaunch
from rollcall.core.progress import NOT_EXPECTED, RECOVERY_WINDOW
from rollcall.core.messages import Join, JoinBatch, Leave
from rollcall.core.sharding import ShardSpec
from rollcall.core.types import Cursor

N_MAX = 5
N_IDS = N_MAX + 3  # brand-new workers may join up to this many ids
HEARTBEAT_S = 0.25
TIMEOUT_S = 1.0
HEAL_LIMIT_S = 30.0
NOT_A_LOSS = {"start", "growth", "restart", "failover"}  # the other rounds' reasons
# The deep faults (a zombie's late commit request, a survivor of a lost rack
# holding an abandoned branch) take long rule sequences: search harder than
# the profile's 100 examples, which costs seconds here.
EXAMPLES_MIN = 300
SEED_ENV = "ROLLCALL_STATEFUL_SEED"
# One seed per session, so that a failure can be replayed from it.
SEED = int(os.environ.get(SEED_ENV) or random.SystemRandom().randrange(2**32))


def _import_every_project_module() -> None:
    """Make the seed replay the same search alone as in the whole suite.

    Hypothesis draws some values from the constants in the project's modules
    imported so far (not test files), so a seed found in a full run, where
    other tests had imported the drivers, searched differently when this
    file ran alone (seed 2155524081 failed in CI and passed on replay).
    Importing every module first makes that pool the same in both.
    """
    for pkg in ("rollcall", "sim", "real"):
        module = importlib.import_module(pkg)
        for info in pkgutil.walk_packages(module.__path__, prefix=f"{pkg}."):
            if not info.name.endswith(".__main__"):
                importlib.import_module(info.name)


_import_every_project_module()

picks = st.integers(0, 10_000)


class Rendezvous(RuleBasedStateMachine):
    world: World

    @initialize(n=st.integers(2, N_MAX), min_workers=st.integers(1, 3),
                room=st.integers(0, 2), latency=st.sampled_from([0.0, 0.01, 0.2]),
                strategy=st.sampled_from(["elastic", "checkpoint-restart"]),
                batched=st.booleans(), bulk=st.booleans(), spec=st.none(),
                phi=st.booleans(), stragglers=st.booleans(), durable=st.booleans(),
                max_restarts=st.sampled_from([None, None, 0, 1, 3]))
    def start(self, n: int, min_workers: int, room: int, latency: float, strategy: str,
              batched: bool, bulk: bool, spec: ShardSpec | None, phi: bool = False,
              stragglers: bool = False, durable: bool = False,
              max_restarts: int | None = None) -> None:
        """``room``: how many fewer members fit than the workers that start;
        ``phi``: the keeper's detector is phi accrual (nominal silence TIMEOUT_S);
        ``stragglers``: the keeper evicts stragglers (the ``slow`` rule makes them);
        ``durable``: the keeper's record lives in a store, and the keeper may
        die and be replaced by a standby (``fail_keeper``); ``max_restarts``:
        checkpoint-restart's restart budget (then the job gives up)."""
        max_workers = max(min(min_workers, n), n - room)
        self.world = World(n, min_workers=min(min_workers, n), max_workers=max_workers,
                           heartbeat_s=HEARTBEAT_S, timeout_s=TIMEOUT_S, last_call_s=0.1,
                           latency_s=latency, strategy=strategy, sharding=spec,
                           batched=batched, bulk=bulk, phi=phi, stragglers=stragglers,
                           durable=durable, max_restarts=max_restarts)
        self.keeper_gens = [0]
        self.life_gens: dict[tuple[int, int], int] = {}
        self.failed_gen: int | None = None  # the generation the job gave up in

    # --- time and network faults ----------------------------------------------

    @rule(dt=st.floats(0.01, 2.0))
    def advance(self, dt: float) -> None:
        self.world.advance(dt)

    @precondition(lambda self: self.world.flights)
    @rule(i=picks)
    def deliver_out_of_order(self, i: int) -> None:
        flights = self.world.flights
        flight = flights.pop(i % len(flights))
        heapq.heapify(flights)
        self.world.deliver(flight)

    @staticmethod
    def _copyable(f: Flight) -> bool:
        """Whether the network may lose or copy ``f``: not a commit request
        (the worker's connection to the launcher is reliable), and not a
        ``JoinBatch``, which no wire carries: it is the simulator's
        in-process delivery of simultaneous joins, exactly once (the real
        target sends each ``Join`` over its connection; those are copied)."""
        return not isinstance(f.msg, (Ask, JoinBatch))

    def _lossy(self, i: int) -> Flight | None:
        """A flight the network may lose or duplicate."""
        pool = [f for f in self.world.flights if self._copyable(f)]
        return pool[i % len(pool)] if pool else None

    @precondition(lambda self: self.world.flights)
    @rule(i=picks)
    def lose(self, i: int) -> None:
        f = self._lossy(i)
        if f is not None:
            self.world.flights.remove(f)
            heapq.heapify(self.world.flights)

    @precondition(lambda self: self.world.flights)
    @rule(i=picks, extra=st.floats(0.0, 3.0))
    def duplicate(self, i: int, extra: float) -> None:
        w = self.world
        f = self._lossy(i)
        if f is not None:
            heapq.heappush(w.flights, Flight(f.at + extra, next(w._seq), f.dst, f.msg, f.lives))

    @precondition(lambda self: self.world.sent)
    @rule(i=picks)
    def replay(self, i: int) -> None:
        """A copy of a message sent a while ago (one of the last 32) arrives now."""
        w = self.world
        pool = [f for f in w.sent if self._copyable(f)]
        if pool:
            f = pool[i % len(pool)]
            w.deliver(Flight(w.now, next(w._seq), f.dst, f.msg, f.lives))

    @precondition(lambda self: self.world.flights)
    @rule(i=picks, extra=st.floats(0.0, 3.0))
    def delay(self, i: int, extra: float) -> None:
        flights = self.world.flights
        f = flights[i % len(flights)]
        f.at += extra
        heapq.heapify(flights)

    # --- process faults -------------------------------------------------------

    def _pick(self, i: int, pool: list[Proc]) -> Proc | None:
        return pool[i % len(pool)] if pool else None

    def _procs(self, status: str | None = None) -> list[Proc]:
        procs = self.world.processes()
        if status is None:
            return [p for p in procs if p.running]
        return [p for p in procs if p.status == status and p.alive]

    @rule(i=picks, noticed=st.booleans(), node_lost=st.booleans())
    def crash(self, i: int, noticed: bool, node_lost: bool) -> None:
        w = self.world
        p = self._pick(i, [p for p in w.processes() if p.alive])
        if p is None:
            return
        w.crash(p)
        if node_lost:  # its machine is gone too, and every process on it
            for q in w.procs[p.worker]:
                if q.alive:
                    w.crash(q)
            w.nodes_lost.add(p.worker)
            if w.keeper_up:  # else the supervisor reports it to the next keeper
                w.keeper.node_down(w.now, p.worker)
        if noticed and w.keeper_up:  # the host saw the process exit
            w._apply_keeper(w.keeper.exited(w.now, p.worker, p.agent.incarnation))

    @rule(i=picks, factor=st.sampled_from([1.0, 4.0]), steps=st.integers(0, 3))
    def slow(self, i: int, factor: float, steps: int) -> None:
        """A running process computes ``factor`` times slower (1: at speed
        again), and the job trains ``steps`` steps: a straggler, evicted by
        the policy, benched, readmitted (``heal`` ends every slowdown)."""
        p = self._pick(i, self._procs())
        if p is not None:
            p.slow = factor
        for _ in range(steps):
            self.train(None)
            self.world.advance(0.05 + 2 * self.world.latency_s)

    @rule(i=picks)
    def pause(self, i: int) -> None:
        p = self._pick(i, self._procs())
        if p is not None:
            self.world.pause(p)

    @rule(i=picks)
    def resume(self, i: int) -> None:
        p = self._pick(i, self._procs(PAUSED))
        if p is not None:
            self.world.resume(p)

    def _restart(self, i: int, status: str) -> None:
        """Start worker ``w`` again, as the life the keeper hands out."""
        w = self.world
        ids = sorted(x for x, ps in w.procs.items() if ps[-1].status == status)
        if not ids or not w.keeper_up:  # a life is the keeper's to hand out
            return
        x = ids[i % len(ids)]
        w.nodes_lost.discard(x)
        inc = w.keeper.node_up(w.now, x)
        assert inc > w.latest(x).agent.incarnation, (x, inc)
        w.spawn(x, inc)

    @rule(i=picks)
    def restart(self, i: int) -> None:
        """A crashed worker's process (or its repaired machine) starts again."""
        self._restart(i, CRASHED)

    @rule(i=picks)
    def restart_paused(self, i: int) -> None:
        """A paused worker's id starts again while the paused life is still
        alive: when that one wakes, it is a zombie, an older incarnation."""
        self._restart(i, PAUSED)

    @rule(i=picks)
    def leave(self, i: int) -> None:
        p = self._pick(i, self._procs())
        if p is not None:
            self.world.leave(p)

    @precondition(lambda self: len(self.world.procs) < N_IDS)
    @rule(k=st.integers(1, 2))
    def add_workers(self, k: int) -> None:
        """Brand-new workers ask to join (beyond max_workers they wait as standbys)."""
        w = self.world
        first = max(w.procs) + 1
        w._batch_join(w.spawn_many(range(first, min(first + k, N_IDS))))

    # once the keeper has failed the job the drivers end the run (JobFailed):
    # no standby takes over a job that gave up
    @precondition(lambda self: self.world.keeper.config.durable and self.world.keeper_up
                  and self.world.failed is None)
    @rule(outage=st.floats(0.05, 3.0))
    def fail_keeper(self, outage: float) -> None:
        """The keeper dies; a standby rebuilds it from the store's record
        ``outage`` seconds later and holds a roll call."""
        self.world.fail_keeper(outage)

    # --- training -------------------------------------------------------------

    @rule(i=picks)
    def contribute(self, i: int) -> None:
        """Any running process offers its gradient, stale, zombie or not."""
        p = self._pick(i, self._procs())
        if p is not None:
            self.world.contribute(p)

    @rule(skip=st.none() | picks)
    def train(self, skip: int | None) -> None:
        """The running members of the exchange recover and offer (all, or all
        but one: its offer, later or never, decides whether the step completes)."""
        w = self.world
        ex = w.exchange
        if ex is None:
            return
        procs = [p for p in self._procs() if p.worker in ex.members]
        if skip is not None and procs:
            procs.pop(skip % len(procs))
        for p in procs:
            if p.enter is not None and not p.ready:
                w.recover(p)
            w.contribute(p)

    @rule(i=picks, fault=st.sampled_from(["crash", "pause", "step_failed", "leave"]),
          dt=st.floats(0.0, 0.3))
    def fault_mid_step(self, i: int, fault: str, dt: float) -> None:
        """A step completes and, while its commit requests are on their way,
        a member fails: some ask before the round opens, some after."""
        self.train(None)
        w = self.world
        members = [p for p in self._procs() if w.exchange and p.worker in w.exchange.members]
        p = self._pick(i, members)
        if p is not None:
            if fault == "crash":
                w.crash(p)
                if w.keeper_up:
                    w._apply_keeper(w.keeper.exited(w.now, p.worker, p.agent.incarnation))
            else:
                getattr(w, fault)(p)
        w.advance(dt)

    @rule(i=picks)
    def zombie_mid_step(self, i: int) -> None:
        """A participant freezes just after its offer; the step completes
        without it, its id starts again, and it wakes once the new life has
        reached the keeper: the commit request it still owes is a zombie's."""
        w = self.world
        ex = w.exchange
        procs = [p for p in self._procs() if ex and p.worker in ex.members]
        p = self._pick(i, procs)
        if p is None or w.latest(p.worker) is not p or not w.keeper_up:
            return
        for q in procs:
            if q.enter is not None and not q.ready:
                w.recover(q)
        if w.contribute(p) != "accepted":
            return
        w.pause(p)
        for q in procs:
            w.contribute(q)
        w.advance(3 * w.latency_s + 0.01)  # the others' commit requests are answered
        if not w.keeper_up:
            return
        w.spawn(p.worker, w.keeper.node_up(w.now, p.worker))
        w.advance(1.5 * w.latency_s)  # its join arrives, the round it opens is not answered yet
        if p.status == PAUSED:  # a checkpoint-restart tears every process of the id down
            w.resume(p)

    @precondition(lambda self: self.world.keeper_up)
    @rule(i=picks)
    def rack_loss(self, i: int) -> None:
        """Every running process dies and its host sees it; each id starts again
        as a fresh life, and they form a generation. Paused processes survive
        (if none is, running process ``i`` freezes first), holding what they
        held: once they wake, an abandoned branch or a state behind the
        checkpoint, which the keeper must not resume."""
        w = self.world
        if not self._procs(PAUSED) and self._procs():
            w.pause(self._pick(i, self._procs()))
        for p in self._procs():
            w.crash(p)
            w._apply_keeper(w.keeper.exited(w.now, p.worker, p.agent.incarnation))
        for x in sorted(w.procs):
            if w.latest(x).status == CRASHED:
                w.nodes_lost.discard(x)
                w.spawn(x, w.keeper.node_up(w.now, x))
        w.advance(2 * TIMEOUT_S)  # the detector evicts the frozen ones

    @rule(i=picks)
    def recover(self, i: int) -> None:
        """A member finishes the copies and loads its generation asked for."""
        p = self._pick(i, [p for p in self._procs() if p.enter is not None and not p.ready])
        if p is not None:
            self.world.recover(p)

    @rule(i=picks)
    def checkpoint(self, i: int) -> None:
        p = self._pick(i, self._procs())
        if p is not None:
            self.world.checkpoint(p)

    @rule(i=picks)
    def step_failed(self, i: int) -> None:
        p = self._pick(i, [p for p in self._procs() if p.agent.may_step(p.agent.generation)])
        if p is not None:
            self.world.step_failed(p)

    # --- liveness -------------------------------------------------------------

    @precondition(lambda self: len({p.worker for p in self.world.processes() if p.alive})
                  >= self.world.keeper.config.min_workers and self.world.failed is None)
    @rule()
    def heal(self) -> None:
        """Faults stop: within a bounded time the live workers form a
        generation (as many as fit; the rest wait as standbys) and commit a step."""
        w = self.world
        for p in self._procs(PAUSED):
            w.resume(p)
        for p in w.processes():
            p.slow = 1.0
        deadline = w.now + HEAL_LIMIT_S
        before = len(w.accepted)
        while w.now < deadline:
            w.advance(HEARTBEAT_S)
            if len(w.running_ids()) < w.keeper.config.min_workers:
                return  # a woken worker learned it was an older life and stopped
            if w.failed is not None:
                return  # a loss found while healing spent the restart budget (invariant)
            for p in self._procs():
                ex, a = w.exchange, p.agent
                if a.may_step(a.generation) and (ex is None or ex.generation != a.generation):
                    w.step_failed(p)  # its collective's peers have all moved on or died
            if w.settled():
                if any(gen == w.keeper.generation for _, _, gen, _ in w.accepted[before:]):
                    return
                w.train_members()
        k = w.keeper
        procs = {p.life: (p.status, p.agent.phase.value, p.agent.generation, p.ready)
                 for p in w.processes()}
        raise AssertionError(
            f"no generation of the live workers {sorted(w.running_ids())} committed within "
            f"{HEAL_LIMIT_S}s: keeper gen {k.generation} members {k.members} "
            f"round {k.round}, processes {procs}")

    # --- safety ---------------------------------------------------------------

    @invariant()
    def decisions_match_the_facts(self) -> None:
        assert not self.world.violations, self.world.violations

    @invariant()
    def generations_only_go_up(self) -> None:
        k = self.world.keeper
        assert k.generation >= self.keeper_gens[-1]
        self.keeper_gens.append(k.generation)
        for p in self.world.processes():
            a = p.agent
            assert a.generation >= self.life_gens.get(p.life, 0)
            self.life_gens[p.life] = a.generation
            assert a.generation <= k.generation

    @invariant()
    def only_admitted_lives_act(self) -> None:
        w = self.world
        for p in w.processes():
            a = p.agent
            if p.alive and a.may_step(a.generation):
                assert w.views[a.generation].admits(*p.life), (p.life, w.views[a.generation])

    @invariant()
    def one_active_life_per_id_and_generation(self) -> None:
        """No two lives of one id are members (active or blocked) of one
        generation: a zombie never shares a generation with its successor."""
        seen: dict[tuple[int, int], int] = {}
        for p in self.world.processes():
            a = p.agent
            if p.alive and a.phase in (Phase.ACTIVE, Phase.BLOCKED):
                other = seen.setdefault((p.worker, a.generation), a.incarnation)
                assert other == a.incarnation, (p.worker, a.generation, other, a.incarnation)

    @invariant()
    def no_stale_contribution_counted(self) -> None:
        w = self.world
        for worker, life, gen, _step in w.accepted:
            assert w.views[gen].admits(worker, life)
        if w.accepted:
            assert w.accepted[-1][2] <= w.keeper.generation

    def _failures_outran_recovery(self) -> bool:
        """The keeper's rate verdict (:mod:`rollcall.core.progress`), read
        against the history: it names the window, and the keeper's current
        term opened at least that many recovery rounds (a loss's round, not
        the start's, a growth's, a restart's or a takeover's)."""
        w = self.world
        if not w.failed.startswith(f"{NOT_EXPECTED}: over the last {RECOVERY_WINDOW} "
                                   "recoveries"):
            return False
        losses = 0
        for r in w.records:
            if r["f"] == "takeover":
                losses = 0  # each term measures the rate anew
            elif r["f"] == "round" and r["type"] == "invoke":
                losses += r.get("reason") not in NOT_A_LOSS
        return losses >= RECOVERY_WINDOW

    @invariant()
    def restarts_stay_within_the_budget(self) -> None:
        """``max_restarts``: at most that many restarts, and once the job has
        given up, no generation after the one it gave up in."""
        w = self.world
        if w.max_restarts is not None:
            assert w.keeper.restarts <= w.max_restarts, (w.keeper.restarts, w.max_restarts)
            # the store holds the budget spent before any teardown is ordered,
            # so no successor orders more, however many keepers die
            assert w.restarts <= w.max_restarts, (w.restarts, w.max_restarts)
        if w.failed is not None:  # a spent budget, or failures faster than recovery
            spent = w.max_restarts is not None and w.failed.startswith(
                f"max_restarts={w.max_restarts} reached")
            assert spent or self._failures_outran_recovery(), w.failed
            if self.failed_gen is None:
                self.failed_gen = w.keeper.generation
            assert w.keeper.generation == self.failed_gen, (w.keeper.generation, self.failed_gen)

    @invariant()
    def members_fit_and_asked(self) -> None:
        w, k = self.world, self.world.keeper
        assert len(k.members) <= k.config.max_workers, k.members
        asked = {x for x, _ in w.joined}
        assert set(k.members) <= asked, (k.members, asked)

    @invariant()
    def checkpoint_on_the_lineage(self) -> None:
        w, ck = self.world, self.world.keeper.checkpoint
        assert ck is None or (ck in w.durable and ck in w.lineage), (ck, w.lineage)

    def teardown(self) -> None:
        """The history's own checkers accept the model's records."""
        if not hasattr(self, "world"):
            return
        report = check(self.world.records, DATA)
        assert report.valid, report.violations


class ShardedRendezvous(Rendezvous):
    """The same machine with sharded state: the keeper places shards and
    plans their recovery at every generation."""

    @initialize(n=st.integers(2, N_MAX), min_workers=st.integers(1, 3),
                room=st.integers(0, 2), latency=st.sampled_from([0.0, 0.01, 0.2]),
                strategy=st.sampled_from(["elastic", "checkpoint-restart"]),
                batched=st.booleans(), bulk=st.booleans(),
                spec=st.builds(ShardSpec, n_shards=st.integers(1, 6),
                               replicas=st.integers(1, 3),
                               rack_size=st.sampled_from([None, 2]),
                               shard_bytes=st.just(100)),
                phi=st.booleans(), stragglers=st.booleans(), durable=st.booleans(),
                max_restarts=st.sampled_from([None, None, 0, 1, 3]))
    def start(self, n: int, min_workers: int, room: int, latency: float, strategy: str,
              batched: bool, bulk: bool, spec: ShardSpec | None, phi: bool = False,
              stragglers: bool = False, durable: bool = False,
              max_restarts: int | None = None) -> None:
        super().start(n, min_workers, room, latency, strategy, batched, bulk, spec, phi,
                      stragglers, durable, max_restarts)


def _replay_line(nodeid: str) -> str:
    profile = os.environ.get("HYPOTHESIS_PROFILE", "dev")
    return (f"{SEED_ENV}={SEED} HYPOTHESIS_PROFILE={profile} PYTHONPATH=$PWD "
            f"{shlex.quote(sys.executable)} -m pytest -q -p no:cacheprovider {shlex.quote(nodeid)}")


@pytest.mark.slow  # the thorough profile runs it for minutes
@pytest.mark.timeout(900)
@pytest.mark.parametrize("machine", [Rendezvous, ShardedRendezvous], ids=["replicated", "sharded"])
def test_rendezvous(machine: type[Rendezvous], request: pytest.FixtureRequest) -> None:
    """Run the machine from the session's seed; a failure names it and how to replay."""
    try:
        budget = settings(deadline=None, print_blob=True,
                          max_examples=max(EXAMPLES_MIN, settings.default.max_examples))
        run_state_machine_as_test(seed(SEED)(machine), settings=budget)
    except BaseException as exc:
        exc.add_note(f"seed {SEED}; replay: {_replay_line(request.node.nodeid)}")
        raise


def test_keeper_never_sends_to_nobody() -> None:
    """A smoke check that the harness delivers keeper traffic at all."""
    w = World(3, min_workers=2)
    w.advance(1.0)
    assert w.keeper.generation == 1 and tuple(w.keeper.members) == (0, 1, 2)
    assert KEEPER == -1


# --- gaps in the core this model found, fixed: their examples ------------------------


def test_a_relaunch_names_a_life_node_up_handed_out() -> None:
    """The example hypothesis found (a gap, fixed in Keeper._fail_generation):
    a paused worker's id is started again (node_up hands out life 1 of
    worker 0); its Join ends the old life, the restart tears every member
    down (the new process too), and the Relaunch must order life 2 of worker
    0, not life 1, which the model has started already."""
    m = ShardedRendezvous()
    m.start(n=2, min_workers=1, room=0, latency=0.0, strategy="checkpoint-restart",
            batched=False, bulk=False,
            spec=ShardSpec(n_shards=1, replicas=1, rack_size=None, shard_bytes=100))
    m.pause(i=0)
    m.restart_paused(i=0)
    m.heal()
    assert not m.world.violations, m.world.violations


def test_a_repaired_members_life_that_dies_in_the_restart_is_torn_down() -> None:
    """The example hypothesis found (seed 380662767; a gap, fixed in
    Keeper._restart_again): worker 0's node is lost, the restart relaunches
    worker 2 alone, and the repaired node's new life 1 of worker 0 joins the
    restart round. A rack loss freezes that life; evicted, its loss restarts
    the group again, which kept it as a running life instead of tearing it
    down, and the next restart relaunched worker 0 as life 1 again."""
    m = ShardedRendezvous()
    m.start(n=3, min_workers=3, room=0, latency=0.0, strategy="checkpoint-restart",
            batched=False, bulk=False,
            spec=ShardSpec(n_shards=1, replicas=1, rack_size=None, shard_bytes=100))
    m.heal()
    m.crash(i=0, node_lost=True, noticed=False)
    m.fault_mid_step(dt=0.0, fault="leave", i=0)
    for _ in range(7):
        m.advance(dt=1.0)
    for _ in range(3):
        m.rack_loss(i=0)
    w = m.world
    assert not w.violations, w.violations
    assert [p.agent.incarnation for p in w.procs[0]] == [0, 1, 2, 3]


def test_checker_reads_a_zombies_late_enter_as_going_back() -> None:
    """The example hypothesis found (a gap, fixed: enter records name the
    life, and the checker orders each life's enters): worker 1 is paused before it hears
    generation 1 (which admits its life 0) and started again as life 1,
    which enters generation 2; on waking, life 0 enters generation 1, then
    learns it is an older life and stops. Each life went forward."""
    m = Rendezvous()
    m.start(n=2, min_workers=1, room=0, latency=0.0, strategy="elastic", batched=False,
            bulk=False, spec=None)
    m.crash(i=0, node_lost=False, noticed=False)
    m.pause(i=0)
    m.restart_paused(i=0)
    m.advance(dt=1.0)
    m.heal()
    w = m.world
    assert not w.violations, w.violations
    assert w.entered == {(1, 1): [2], (1, 0): [1]}, w.entered
    report = check(w.records, DATA)
    assert report.valid, report.violations


# A gap the model found, fixed in Keeper._join_batch: a JoinBatch without
# incarnations from lives a restart tore down is refused, as each Join is.
def test_a_stale_batch_does_what_its_joins_would_do() -> None:
    def restarting() -> Keeper:
        k = Keeper(KeeperConfig(min_workers=1, max_workers=2, last_call_s=0.1,
                                detector=TimeoutDetector(0.25, 1.0),
                                strategy="checkpoint-restart"))
        k.receive(0.0, JoinBatch((0, 1), None))
        k.handle_timer(0.2)
        out = k.receive(0.3, Leave(0, 0))  # the restart orders life 1 of worker 1
        assert [o.lives() for o in out if isinstance(o, Relaunch)] == [{1: 1}]
        return k

    batch, joins = restarting(), restarting()
    got = batch.receive(0.4, JoinBatch((0, 1), None)) + batch.handle_timer(0.6)
    want = joins.receive_many(0.4, [Join(0, 0, None), Join(1, 0, None)]) + joins.handle_timer(0.6)
    assert (batch.generation, got) == (joins.generation, want)


# A gap the model found, fixed in Keeper._join: a late copy of a Join, older
# than the answer its life already gave this round, claims nothing.
def test_a_late_join_copy_names_a_source_that_moved_on() -> None:
    m = Rendezvous()
    m.start(n=2, min_workers=1, room=0, latency=0.01, strategy="elastic", batched=False,
            bulk=False, spec=None)
    w = m.world
    m.advance(dt=0.5)  # generation 1: workers 0 and 1 start at the origin
    p0, p1 = w.latest(0), w.latest(1)
    w.step_failed(p0)  # round 2: both answer from generation 1, holding the origin
    answers: list[Flight] = []
    while not answers:
        m.advance(dt=0.001)
        answers = [f for f in w.flights if isinstance(f.msg, Join) and f.msg.worker == 0]
    late = Flight(w.now, next(w._seq), KEEPER, answers[0].msg)  # the network keeps a copy
    m.advance(dt=0.3)  # generation 2 forms at the origin
    m.train(skip=None)
    m.advance(dt=0.05)  # step 0 commits
    assert (w.keeper.generation, p0.state, p1.state) == (2, Cursor(1, 8), Cursor(1, 8))
    w.step_failed(p0)  # round 3: worker 0 answers holding step 1, worker 1 is paused
    w.pause(p1)
    m.advance(dt=0.05)
    w.deliver(late)  # worker 0's answer to round 2 arrives again
    w.crash(p1)  # worker 1 is killed and its host sees it: the round closes at once
    w._apply_keeper(w.keeper.exited(w.now, 1, 0))
    assert w.keeper.generation == 3 and w.keeper.source == 0
    assert w.keeper.cursor == p0.state, (w.keeper.cursor, p0.state)


def test_a_zombies_batched_answer_claims_its_own_life() -> None:
    """The example hypothesis found (seed 205840734; a gap, fixed in
    Keeper._batch_life): worker 0 is paused, worker 1's step fails and a
    roll call opens, and worker 0's id is started again as life 1, which
    joins holding nothing. The paused life 0 wakes and answers the roll
    call holding step 1; its answer travels in a lives-less batch that
    arrives after life 1's Join. The batch stands for the lives generation
    1 admitted, so life 0's answer is refused: before the fix it was read
    as life 1's, and generation 2 admitted life 1 as current (not stale)
    at step 1 though it holds no state."""
    m = ShardedRendezvous()
    m.start(n=2, min_workers=1, room=0, latency=0.2, strategy="elastic", batched=True,
            bulk=False, spec=ShardSpec(n_shards=1, replicas=2, rack_size=None, shard_bytes=100))
    m.heal()
    m.pause(i=0)
    m.step_failed(i=0)
    m.advance(dt=0.25)
    m.restart_paused(i=0)
    m.heal()
    w = m.world
    assert not w.violations, w.violations
    assert w.latest(0).agent.incarnation == 1 and w.keeper.incarnation_of(0) == 1
    report = check(w.records, DATA)
    assert report.valid, report.violations


@pytest.mark.parametrize("batched", [False, True], ids=["joins", "batch"])
def test_a_late_join_from_before_a_generation_its_life_entered_claims_nothing(batched: bool) -> None:
    """The example hypothesis found (seed 415734542, each way; a gap, fixed
    in Keeper._join with Keeper._stamp, and for a JoinBatch, which now carries
    its joins' generation, in Keeper._join_batch): worker 0's answer to round 2 (holding
    step 1) is delayed 2 s; its retry forms generation 2, which commits
    steps 1 and 2. Round 3 opens (worker 1's process dies; worker 0 is
    paused) and the delayed answer arrives: before the fix the keeper took
    it as worker 0's claim and formed generation 3 at step 1 with worker 0
    as the source, which holds step 3. Its heartbeats were stamped with
    generation 2, so a Join stamped with generation 1 is a late copy."""
    m = Rendezvous()
    m.start(n=2, min_workers=1, room=0, latency=0.01, strategy="elastic", batched=batched,
            bulk=False, spec=None)
    m.heal()
    m.step_failed(i=0)
    m.advance(dt=0.015625)
    m.advance(dt=0.01171875)
    m.delay(extra=2.0, i=0)  # worker 0's answer to round 2
    m.heal()
    m.heal()
    m.rack_loss(i=0)
    w = m.world
    assert not w.violations, w.violations
    m.heal()
    assert not w.violations, w.violations
    report = check(w.records, DATA)
    assert report.valid, report.violations


def test_a_late_join_from_a_life_evicted_since_claims_nothing() -> None:
    """Seed 1035 (CI's profile; a gap, fixed in Keeper._join): worker 1,
    alone, is evicted (frozen by a rack loss), readmitted in generation 3 at
    step 2 and commits step 2; frozen again, it is evicted, which opens
    round 4. A copy of its old Join (stamped with generation 2, claiming
    step 2) then arrives. The keeper no longer tracked the life, so it took
    the copy for a rejoin and formed generation 4 at step 2 with worker 1 as
    the source, which holds step 3. The life stamped generation 3 since: the
    copy claims nothing."""
    m = Rendezvous()
    m.start(n=2, min_workers=1, room=0, latency=0.2, strategy="elastic", batched=False,
            bulk=False, spec=None)
    for name, kw in [("leave", dict(i=0)), ("heal", {}), ("heal", {}), ("rack_loss", dict(i=0)),
                     ("heal", {}), ("rack_loss", dict(i=0))]:
        getattr(m, name)(**kw)
    w = m.world
    late = [f for f in w.sent if m._copyable(f) and isinstance(f.msg, Join)
            and f.msg.worker == 1 and f.msg.generation == 2]
    assert late, "the scenario sends the Join the case replays"
    w.deliver(Flight(w.now, next(w._seq), late[0].dst, late[0].msg, late[0].lives))
    assert not w.violations, w.violations
    assert 4 not in w.views, "no generation formed from the late copy"
    m.heal()
    m.teardown()
    assert not w.violations, w.violations


def test_a_lives_less_answer_from_before_a_life_was_born_claims_nothing() -> None:
    """The example hypothesis found (a gap, fixed by Keeper._born_after):
    worker 1's life 1 answers a roll call as a lives-less batch claiming
    generation 3's state; the network holds it back a second, meanwhile the
    worker's life 2 joins fresh (no state) once generation 4 had formed. The
    late batch names the life the keeper knows, life 2, which never entered
    generation 3: it must claim nothing, or life 2 is made the source of
    state it does not hold."""
    m = Rendezvous()
    m.start(n=4, min_workers=1, room=1, latency=0.2, strategy="elastic", batched=True,
            bulk=False, spec=None)
    for name, kw in [("leave", dict(i=0)), ("delay", dict(extra=0.0, i=0)),
                     ("advance", dict(dt=0.01)), ("pause", dict(i=20)),
                     ("rack_loss", dict(i=0)), ("crash", dict(i=1, node_lost=False, noticed=True)),
                     ("deliver_out_of_order", dict(i=7379)), ("lose", dict(i=0)),
                     ("add_workers", dict(k=1)),
                     ("crash", dict(i=511, node_lost=False, noticed=True)),
                     ("delay", dict(extra=1.0, i=23)), ("advance", dict(dt=0.01)),
                     ("add_workers", dict(k=1)), ("add_workers", dict(k=1)),
                     ("add_workers", dict(k=1)), ("rack_loss", dict(i=7))]:
        getattr(m, name)(**kw)
        assert not m.world.violations, (name, m.world.violations)
    m.teardown()
    assert not m.world.violations, m.world.violations


def test_a_member_lost_while_the_group_restarts_is_not_left_waiting_as_a_standby() -> None:
    """Seed 3 of the thorough run: a repaired member's new life joins the
    restart round and dies there; the restart starts over. Its id must be
    torn down and relaunched, not kept as a standby: kept, it counted as
    joined for the id's next life, and a later restart admitted that life
    (life 3 of worker 2) before it had asked to join."""
    m = ShardedRendezvous()
    m.start(n=3, min_workers=3, room=0, latency=0.0, strategy="checkpoint-restart",
            batched=False, bulk=False,
            spec=ShardSpec(n_shards=1, replicas=1, rack_size=None, shard_bytes=100))
    m.heal()
    m.step_failed(i=0)
    m.crash(i=0, node_lost=False, noticed=False)
    m.crash(i=0, node_lost=True, noticed=False)
    m.crash(i=0, node_lost=True, noticed=False)
    m.deliver_out_of_order(i=0)
    m.delay(extra=1.0, i=0)
    m.restart(i=1)
    m.slow(factor=1.0, i=0, steps=1)
    m.contribute(i=0)
    m.rack_loss(i=0)
    m.rack_loss(i=0)
    assert not m.world.violations, m.world.violations
    m.heal()
    assert not m.world.violations, m.world.violations


def test_a_life_evicted_and_heard_again_keeps_the_generations_it_entered() -> None:
    """Seed 1592536163: worker 0 freezes in generation 1 and is evicted; an
    old copy of its first Join re-admits the same life into generation 2,
    whose Membership is lost. Woken, it answers the next roll call with a
    Join claiming generation 1, which it did enter. The keeper had dated the
    life's birth to its re-admission and dropped each such Join as a late
    copy, so the round waited on it for ever while it beat."""
    m = ShardedRendezvous()
    m.start(n=2, min_workers=2, room=0, latency=0.2, strategy="elastic",
            batched=False, bulk=False,
            spec=ShardSpec(n_shards=1, replicas=1, rack_size=None, shard_bytes=100))
    m.rack_loss(i=0)
    m.leave(i=0)
    m.duplicate(extra=0.0, i=0)
    m.replay(i=0)
    m.add_workers(k=1)
    m.lose(i=5)
    m.heal()
    assert not m.world.violations, m.world.violations


def test_a_successor_keeper_inherits_the_restarts_a_repeated_restart_spent() -> None:
    """Seed 1893975111: a zombie's failed step restarts the group twice
    within one restart round (``restart_failure: repeat``), then the keeper
    dies. The store held the budget of the generation's formation only, so
    the successor ordered two restarts more than ``max_restarts``; each
    restart now writes the budget it spends before the teardown."""
    m = ShardedRendezvous()
    m.start(n=2, min_workers=1, room=0, latency=0.0, strategy="checkpoint-restart",
            batched=False, bulk=False,
            spec=ShardSpec(n_shards=1, replicas=1, rack_size=None, shard_bytes=100),
            durable=True, max_restarts=3)
    m.rack_loss(i=0)
    m.leave(i=0)
    m.zombie_mid_step(i=0)
    m.fail_keeper(outage=1.0)
    m.crash(i=0, node_lost=False, noticed=False)
    m.add_workers(k=1)
    m.heal()
    m.zombie_mid_step(i=0)
    m.restarts_stay_within_the_budget()
    assert not m.world.violations, m.world.violations


def test_a_first_batch_after_a_takeover_claims_first_lives() -> None:
    """Seed 3498787808: worker 0 pauses and its id starts again as life 1
    before any generation; the keeper dies and its successor hears of
    life 1 in the takeover report. The first joins of both ids, a batch
    without lives, then arrive: the keeper admitted them as the latest
    lives it knew, life 1 of worker 0 among them, which had not asked to
    join. A batch stamped with generation 0 claims first lives."""
    m = Rendezvous()
    m.start(n=2, min_workers=1, room=0, latency=0.2, strategy="elastic", batched=True,
            bulk=False, spec=None, durable=True)
    m.pause(i=0)
    m.restart_paused(i=0)
    m.fail_keeper(outage=0.125)
    m.heal()
    assert not m.world.violations, m.world.violations


def test_a_late_first_batch_after_a_takeover_speaks_for_no_newer_life() -> None:
    """Seed 1717171717: worker 1 pauses and its id starts again as life 1
    before any generation, then the keeper dies; life 1's Join and Leave
    are lost with it, and its successor hears of life 1 only in the
    takeover report. Worker 2 opens generation 1 alone; the job's first
    batch of joins, delayed, arrives after it. The keeper admitted worker 1
    from that batch as a newcomer without asking which life it was: life 1,
    which never asked to join. A batch of first joins speaks for first
    lives only; worker 1's is refused as stale."""
    m = Rendezvous()
    m.start(n=3, min_workers=1, room=0, latency=0.2, strategy="elastic", batched=True,
            bulk=False, spec=None, stragglers=True, durable=True)
    m.crash(i=0, node_lost=False, noticed=False)
    m.pause(i=0)
    m.restart_paused(i=0)
    m.fail_keeper(outage=0.5)
    m.leave(i=0)
    m.delay(extra=1.0, i=0)
    m.heal()
    assert not m.world.violations, m.world.violations


def test_rack_losses_faster_than_recovery_end_the_job_as_not_expected() -> None:
    """Every rack loss cuts the roll calls of the one before short (its
    crashes, then the eviction of the process it froze): after the keeper's
    window of recoveries, none completed, the job gives up as not expected
    to finish, with no budget set, and decides nothing after."""
    m = ShardedRendezvous()
    m.start(n=3, room=2, min_workers=1, batched=False, durable=True, latency=0.01,
            spec=ShardSpec(n_shards=1, replicas=3, rack_size=None, shard_bytes=100),
            bulk=False, max_restarts=None, strategy="elastic", stragglers=True, phi=True)
    w = m.world
    losses = 0
    while w.failed is None:
        m.rack_loss(i=0)
        losses += 1
        assert losses <= RECOVERY_WINDOW + 2, "the job outlived the keeper's window"
        m.restarts_stay_within_the_budget()
        assert not w.violations, w.violations
    assert w.failed.startswith(NOT_EXPECTED) and m._failures_outran_recovery(), w.failed
    generation = w.keeper.generation
    m.rack_loss(i=0)  # nothing is decided after the verdict
    m.restarts_stay_within_the_budget()
    assert w.keeper.generation == generation
