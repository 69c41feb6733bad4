"""The record-keeper: the one place a generation's member list is decided.

Sans-IO (after h11 and aioquic): messages and ``now`` go in, outputs come
out, and ``get_timer()`` says when the driver must call ``handle_timer``.
The keeper reads no clock and sends nothing itself.

Agreement. Every change to the record is a compare-and-set against the
stamps the request carries: a join from an older incarnation, a heartbeat
or step report stamped with a superseded generation, a message from an
evicted worker are refused and answered with the current generation. A
generation is decided once, here, so every worker that enters generation
``g`` receives the same ordered member list.

Liveness. The keeper notes on its own clock when each worker's heartbeat
counter last advanced and asks the detector policy for a verdict; it never
compares a worker's clock with its own.

Rounds. A roll call for generation ``g+1`` opens when a member is declared
dead, leaves, reports a failed step, or a newcomer asks to join while there
is room. Members of ``g`` that are still alive are *expected*: the round
waits for each of them until it answers or the detector declares it dead,
so a slow worker is evicted by the detector's timeout, never by the round.
A round made only of old members closes as soon as they have all answered;
one with newcomers holds a last-call window for more of them.

Sharded state (``KeeperConfig.sharding``, see :mod:`rollcall.core.sharding`).
When a generation forms the keeper also decides where the state shards
live and how they are recovered; :class:`Formed`, :class:`Membership` and
the agent's ``Enter`` carry the answer in three fields, all left at their
defaults (None, None, False) when the state is replicated:

* ``placement``: for each shard ``s`` (index into the tuple), the workers
  that hold a replica of it in this generation, owner first, then the
  buddies. Every holder is a member. A holder absent from it drops the
  replica once the recovery below is done.
* ``recovery``: a :class:`rollcall.core.placement.RecoveryPlan` (or None for a
  fresh placement: the first generation, a checkpoint-restart). Execute it
  before the first step: every ``Copy(shard, src, dst)`` sends ``src``'s
  replica of ``shard`` at ``cursor`` to ``dst``; every ``Reload(shard,
  dst)`` makes ``dst`` load ``shard`` from the checkpoint at ``cursor``.
  Members that are not stale may take part too (as sources, or as new
  buddies); ``recovery.placement`` equals ``placement``.
* ``fallback``: a shard was lost (all its holders died or hold no state at
  the resume point): the generation resumes from the last checkpoint
  (``cursor`` is the checkpoint's, or the origin when none was taken),
  ``source`` is None, every member is stale and ``recovery`` lists only
  reloads (every holder reloads every shard it holds). Without fallback,
  ``source`` names the member whose cursor won and whose replicated part of
  the state (for ZeRO-1: the parameters) stale members copy, as with
  replicated state; the sharded part moves by ``recovery`` only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Mapping, Optional, Sequence, Union

from rollcall.core.detector import Detector
from rollcall.core.history import KEEPER, members_delta, rec
from rollcall.core.idset import EMPTY, IdRuns
from rollcall.core.job import JobPolicy
from rollcall.core.lives import LifeTable, Lives
from rollcall.core.liveness import Liveness
from rollcall.core.messages import (
    Checkpointed, Heartbeat, Join, JoinBatch, Leave, Membership, Refused, RollCall,
    StepFailed, ToKeeper, ToWorker,
)
from rollcall.core.placement import Placement, RecoveryPlan
from rollcall.core.progress import NOT_EXPECTED, ProgressWatch
from rollcall.core.record import KeeperRecord
from rollcall.core.sharding import ShardSpec, decide
from rollcall.core.stragglers import (
    Lagging, StragglerPolicy, StragglerWatch, eviction_gain, median_with,
)
from rollcall.core.types import Cursor, WorkerId, runs_of_sorted

ELASTIC = "elastic"
CHECKPOINT_RESTART = "checkpoint-restart"
# A relaunch record lists each life that differs from the common one for up
# to this many workers; beyond, listing them (every node repaired so far, on
# every restart of a 10^4-node run) would cost the sim more than the restart.
RELAUNCH_LISTED_MAX = 1024


@dataclass(frozen=True)
class KeeperConfig:
    min_workers: int
    max_workers: int
    last_call_s: float
    detector: Detector
    join_timeout_s: Optional[float] = None
    strategy: str = ELASTIC
    # How long a restart round waits for a relaunched worker that never
    # joins (its host may be dead too); None: as long as join_timeout_s.
    relaunch_timeout_s: Optional[float] = None
    # Sharded state: place shards and decide their recovery at every
    # generation (None: replicated state, nothing to decide).
    sharding: Optional[ShardSpec] = None
    # When a commit completes the job (None: never, for protocol tests).
    policy: Optional[JobPolicy] = None
    # strategy.stragglers: evict (None: keep every straggler). Elastic only:
    # a checkpoint-restart job restarts whole, it has no member to take out.
    stragglers: Optional[StragglerPolicy] = None
    # Checkpoint-restart: what a node lost while the job restarts costs.
    # ``repeat``: the relaunched group fails once the loss is detected, and
    # the restart starts over (torchrun: the new group's rendezvous or first
    # collective fails); ``replace``: the restart goes on without the node,
    # a spare takes its place (a scheduler that patches a restart in flight).
    restart_failure: str = "repeat"
    # Checkpoint-restart: the job gives up instead of restarting a
    # (max_restarts + 1)-th time, as torchrun's --max-restarts; every restart
    # counts, one that starts over after a loss in the restarting group too.
    # None: never (a job whose MTBF is below its restart time then runs on).
    max_restarts: Optional[int] = None
    # The job gives up when no step beyond the furthest committed one has
    # committed over this many consecutive recoveries, and when failures come
    # faster than it recovers (rollcall.core.progress). None: only the latter.
    max_recoveries_without_progress: Optional[int] = None
    # The last instant a scripted worker can come (a scripted join, the end
    # of a fault that cut live processes off); None: any time (a fault whose
    # end is not known in advance). With join_timeout_s None a round below
    # min_workers waits for arrivals, and gives up (not expected to finish)
    # once none can come.
    arrivals_end_s: Optional[float] = None
    # The fleet brings nodes back (repairs, a spare pool, idle nodes): then
    # arrivals end only once it holds fewer than min_workers nodes that are,
    # or may yet come, in service (:meth:`Keeper.fleet_capacity`, the repair
    # shop's count; retirements lower it). False: no node comes back.
    fleet_returns: bool = False
    # The job gives up (not expected to finish) if it is not done by this
    # instant: far past any run that ends on its own (rollcall.config.horizon_s).
    give_up_at_s: Optional[float] = None
    # The record lives in a store (etcd): every generation decided is
    # written (:class:`Persist`) before any worker hears of it, and a keeper
    # the store refuses is deposed. False: the record lives in this object.
    durable: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.min_workers <= self.max_workers:
            raise ValueError("need 1 <= min_workers <= max_workers")
        if self.max_restarts is not None and self.max_restarts < 0:
            raise ValueError("max_restarts must be >= 0 (or None)")
        if self.max_recoveries_without_progress is not None \
                and self.max_recoveries_without_progress < 1:
            raise ValueError("max_recoveries_without_progress must be >= 1 (or None)")
        if self.relaunch_timeout_s is not None and self.relaunch_timeout_s < 0:
            raise ValueError("relaunch_timeout_s must be >= 0 (or None)")
        if self.strategy not in (ELASTIC, CHECKPOINT_RESTART):
            raise ValueError(f"unknown strategy {self.strategy!r}")
        if self.restart_failure not in ("repeat", "replace"):
            raise ValueError(f"unknown restart_failure {self.restart_failure!r}")


# Where a keeper ends its lease, as a share of the TTL counted from when the
# renewal was sent: before the store's end (clock drift, the renewal's trip),
# so it has stopped deciding before a standby can win. Both drivers pass it
# to :meth:`Keeper.hold`: the keeper process after each renewal, the sim's
# failover at a partition_keeper cut (its last renewal).
LEASE_MARGIN = 0.9
# How often a keeper renews its lease, as a share of the TTL: from when it
# took over, every quarter TTL (three renewals may fail before the margin).
RENEW_SHARE = 0.25


def last_renewal(took_over_at: float, now: float, ttl_s: float) -> float:
    """When the last renewal at or before ``now`` was sent, for a keeper
    that took over at ``took_over_at`` and renews every ``RENEW_SHARE`` of
    ``ttl_s`` from then, none of them late: the exact bulk form of the
    keeper process's renewals, for a driver that does not send them."""
    assert now >= took_over_at and ttl_s > 0, (took_over_at, now, ttl_s)
    period_s = RENEW_SHARE * ttl_s
    return took_over_at + math.floor((now - took_over_at) / period_s) * period_s


# --- outputs -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Send:
    to: WorkerId
    message: ToWorker


@dataclass(frozen=True, slots=True)
class Broadcast:
    to: Sequence[WorkerId]  # an IdRuns: sorted, a few runs at any scale
    message: ToWorker


@dataclass(frozen=True, slots=True)
class Record:
    record: dict


@dataclass(frozen=True, slots=True)
class Formed:
    """A generation closed. ``stale`` members must copy state from ``source``.

    ``placement``, ``recovery``, ``fallback``: sharded state only (see the
    module docstring).
    """

    generation: int
    members: IdRuns  # the ordered member list (a read-only sequence of ids)
    cursor: Cursor
    source: Optional[WorkerId]
    stale: IdRuns
    reason: str
    placement: Optional[tuple[tuple[WorkerId, ...], ...]] = None
    recovery: Optional[RecoveryPlan] = None
    fallback: bool = False


@dataclass(frozen=True, slots=True)
class RestartJob:
    """Checkpoint-restart: tear down the process of every worker in ``teardown``.

    Those are the members of ``generation``; standbys keep waiting. A
    :class:`Relaunch` follows at once: starting the new processes takes
    what it takes (on the sim, the scenario's ``restart_s``).
    """

    generation: int
    reason: str
    teardown: IdRuns = EMPTY


@dataclass(frozen=True, slots=True)
class Relaunch:
    """Start a process for each worker of ``workers`` as the life paired in
    ``incarnations`` (a :class:`Lives`): the members of the torn-down
    generation whose node is not down now. The keeper expects each in the
    restart round until it joins or ``relaunch_timeout_s`` passes. A
    simulator answers with one ``JoinBatch(workers, None, incarnations)``.
    Starting exactly these makes a repeated order harmless: the same life is
    not started twice.
    """

    generation: int
    workers: IdRuns
    incarnations: Lives

    def lives(self) -> dict[WorkerId, int]:
        """Worker -> incarnation to start."""
        return dict(zip(self.workers, self.incarnations))


@dataclass(frozen=True, slots=True)
class CommitVerdict:
    """The commit vote's answer to one member's request to commit a step.

    ``ok``: the step counts and the worker applies it. ``first``: no member
    had committed it before (the driver writes the history's record once).
    ``complete``: with this step the job has all its steps (JobPolicy).
    ``reason`` says why a refused step was refused.
    """

    ok: bool
    reason: str
    first: bool = False
    complete: bool = False


# every answer the vote gives, made once (the sim votes once per run of steps)
_REFUSED = {r: CommitVerdict(False, r) for r in
            ("job-failed", "stale-generation", "stale-incarnation", "round-open", "deposed")}
_DONE = CommitVerdict(True, "ok")
_FIRST = CommitVerdict(True, "ok", first=True)
_FIRST_COMPLETE = CommitVerdict(True, "ok", first=True, complete=True)


@dataclass(frozen=True, slots=True)
class JobFailed:
    reason: str


@dataclass(frozen=True, slots=True)
class Persist:
    """Write ``record`` to the store as generation ``generation`` of term
    ``term``, if the store still holds this keeper's lease and generation
    ``generation - 1`` as its latest (a compare-and-set), then answer with
    :meth:`Keeper.persisted`. The keeper holds back what follows (the
    generation's announcement) until that answer: a generation no worker
    has heard of can be lost with its keeper, one they act on cannot.

    ``again``: a restart writes the store's latest generation again (the
    compare-and-set: ``generation`` is the latest, the lease still this
    keeper's), with the restart budget spent, and holds back the teardown
    until that answer."""

    generation: int
    term: int
    record: KeeperRecord
    again: bool = False


@dataclass(frozen=True, slots=True)
class Deposed:
    """This keeper lost its term (the lease lapsed, or the store refused a
    write): it decides nothing more, and the driver stops it."""

    reason: str


Output = Union[Send, Broadcast, Record, Formed, RestartJob, Relaunch, JobFailed, Persist, Deposed]


@dataclass
class Round:
    """An open roll call.

    Worker sets are :class:`IdRuns`: a round answered by 10^4 survivors is a
    few runs, and adding or dropping a batch costs its runs, not its ids.
    """

    generation: int
    reason: str
    opened_at: float
    previous: IdRuns
    # who joined, by the cursor of the state they hold (None: no state)
    by_cursor: dict[Optional[Cursor], IdRuns] = field(default_factory=dict)
    joined: IdRuns = EMPTY
    expected: IdRuns = EMPTY
    # the generation whose lineage an individually joining worker's state is of
    state_gen: dict[WorkerId, int] = field(default_factory=dict)
    last_call_at: Optional[float] = None
    starved_since: Optional[float] = None
    expect_until: Optional[float] = None  # relaunched lives: not heartbeating yet
    lost_at: Optional[float] = None  # restart_failure repeat: a lost node's detection

    def add(self, workers: IdRuns, cursor: Optional[Cursor]) -> None:
        """Record that ``workers`` joined holding state at ``cursor``."""
        if not self.joined.isdisjoint(workers):  # a worker may join twice
            for c, ws in list(self.by_cursor.items()):
                if c != cursor:
                    self._set_group(c, ws - workers)
        self.by_cursor[cursor] = self.by_cursor.get(cursor, EMPTY) | workers
        self.joined = self.joined | workers
        self.expected = self.expected - workers

    def drop(self, worker: WorkerId) -> None:
        if worker in self.joined:
            self.joined = self.joined - (worker,)
            for c, ws in list(self.by_cursor.items()):
                if worker in ws:
                    self._set_group(c, ws - (worker,))
        if worker in self.expected:
            self.expected = self.expected - (worker,)
        self.state_gen.pop(worker, None)

    def _set_group(self, cursor: Optional[Cursor], ws: IdRuns) -> None:
        if ws:
            self.by_cursor[cursor] = ws
        else:
            self.by_cursor.pop(cursor, None)


class Keeper:
    """The record-keeper's state machine.

    Cost model: a generation (or a restart) costs the changes it brings, not
    the job size. Worker sets are id runs (:mod:`rollcall.core.idset`), the
    liveness record keeps one shared instant for the bulk
    (:mod:`rollcall.core.liveness`), incarnations are stored sparsely
    (:mod:`rollcall.core.lives`), and the member list every worker receives is
    the same immutable :class:`IdRuns`, never a copied tuple.
    """

    def __init__(self, config: KeeperConfig, liveness: Optional[Liveness] = None) -> None:
        self._config = config
        self._generation = 0
        self._members: IdRuns = EMPTY
        self._recorded_members: Optional[IdRuns] = None  # the last generation record's list
        self._cursor = Cursor()
        self._source: Optional[WorkerId] = None
        self._stale: IdRuns = EMPTY
        self._member_lives: Lives = LifeTable().snapshot(EMPTY)  # paired with members
        self._checkpoint: Optional[Cursor] = None
        self._round: Optional[Round] = None
        self._failed: Optional[str] = None
        self._restarts = 0  # RestartJobs ordered (checkpoint-restart), for max_restarts
        # the recoveries and the furthest step: whether the job can still finish
        self._progress = ProgressWatch(config.max_recoveries_without_progress)
        # the latest life of each worker; lives a restart ordered that have not
        # joined yet are ``awaiting_relaunch`` (their admitted life is the one before)
        self._life_table = LifeTable()
        self._awaiting_relaunch: IdRuns = EMPTY
        self._standby: dict[Optional[Cursor], IdRuns] = {}
        self._standby_gen: dict[WorkerId, int] = {}
        self._resumes: list[tuple[int, int]] = []  # (generation, resume step)
        self._counter: dict[WorkerId, int] = {}  # heartbeat counters; absent: -1
        # an adaptive detector's: each life's recent heartbeat intervals (phi's cadence)
        self._intervals: dict[WorkerId, list[float]] = {}
        self._arrived: dict[WorkerId, float] = {}  # the last beat it heard alone, of those
        # worker -> (life, the latest generation that life stamped on a message):
        # a Join stamped with an older one is a late copy (it entered a newer since)
        self._stamped: dict[WorkerId, tuple[int, int]] = {}
        self._stamped_at: dict[int, set[WorkerId]] = {}  # the same, by generation stamped
        # worker -> (life, the generation current when that life's first Join
        # arrived): a life enters only generations formed after it was heard,
        # so a claim to hold an older one's state is an older life's message
        self._born: dict[WorkerId, tuple[int, int]] = {}
        # the lives watched, and when each last advanced (a test may hand in its own)
        self._liveness = Liveness() if liveness is None else liveness
        self._out: list[Output] = []
        # sharded state: the current generation's placement and recovery
        self._placement: Optional[Placement] = None
        self._recovery: Optional[RecoveryPlan] = None
        self._fallback = False
        self._steps_lost = 0  # committed steps the latest fallback threw away
        # workers not to relaunch: node down (until node_up), or left the job
        self._down: IdRuns = EMPTY
        # worker -> its life that left the job: over for good (a late copy of
        # one of its Joins is refused) until a newer life joins
        self._left: dict[WorkerId, int] = {}
        self._relaunched: IdRuns = EMPTY  # ordered lives a Relaunch started
        self._promised: dict[WorkerId, int] = {}  # node_up: a life handed out, until it joins
        self._committed: Optional[int] = None  # the current generation's last committed step
        self._completed = False
        # stragglers (rollcall.core.stragglers): the current generation's watch;
        # evicted ones benched until a holdout ends (worker -> its end), with
        # the Join each sent meanwhile; how often each was evicted so far
        self._watch: Optional[StragglerWatch] = None
        self._benched: dict[WorkerId, float] = {}
        self._bench_join: dict[WorkerId, tuple[Optional[Cursor], int]] = {}
        self._slow_evictions: dict[WorkerId, int] = {}
        self._kept_slow: set[WorkerId] = set()  # lagging but kept (recorded once a generation)
        self._commit_at: Optional[float] = None  # watched: the latest first commit, and
        self._step_s: Optional[float] = None     # the step time it measured
        # a durable record (KeeperConfig.durable): the term this keeper decides
        # in (0: the only keeper of the run), the end of its lease on its own
        # clock (None: no lease), why it was deposed, and the outputs held back
        # until the store answers the Persist of generation ``_awaiting``
        self._term = 0
        self._lease_until: Optional[float] = None
        self._deposed: Optional[str] = None
        # restored from a record and not yet taken over: it knows the
        # generation but not which of its steps committed, so it votes on none
        self._restoring = False
        self._awaiting: Optional[int] = None
        self._held: list[Output] = []
        # the record the store holds (durable): a restart writes it again with
        # the budget spent, so that a successor does not order more
        self._stored: Optional[KeeperRecord] = None
        # fleet_returns: the nodes that are or may come in service, as last
        # reported, and since when fewer than min_workers (None: enough)
        self._capacity: Optional[int] = None
        self._short_since: Optional[float] = None

    # --- driver API -----------------------------------------------------------

    def receive(self, now: float, message: ToKeeper) -> list[Output]:
        """Handle one message that arrived at ``now``."""
        if self._live(now):
            self._dispatch(now, message)
        return self._flush()

    def receive_many(self, now: float, messages: Iterable[ToKeeper]) -> list[Output]:
        """Handle messages that arrived at the same instant, in one call."""
        if self._live(now):
            for message in messages:
                self._dispatch(now, message)
        return self._flush()

    def observe_alive(self, now: float, workers: Iterable[WorkerId]) -> None:
        """Mark the heartbeats of ``workers`` as advanced at ``now``.

        A batch form of :class:`Heartbeat` for simulators, which do not
        simulate every beat of every healthy node: the effect on the detector
        is the one each worker's next beat would have had.
        """
        self._ready()
        self._liveness.advance(now, IdRuns.of(workers))

    def observe_alive_except(self, now: float, silent: Iterable[WorkerId]) -> None:
        """:meth:`observe_alive` for every tracked worker but ``silent``.

        What a simulator knows cheaply: the few nodes that stopped beating,
        not the 10^4 that did not. Costs the silent ones, not the job.
        """
        self._ready()
        self._liveness.advance_except(now, IdRuns.of(silent))

    def observe_beating_except(self, now: float, silent: Iterable[WorkerId]) -> None:
        """Every tracked worker but ``silent`` beats on time from ``now`` on,
        until :meth:`observe_silent` names it or a later call leaves it out
        (then it was last seen at that call's ``now``); a silent one whose
        heartbeat comes beats on time again. The exact
        bulk form of healthy heartbeats for a simulator, which sends none:
        :meth:`get_timer` names only the silent workers' expiries, as it
        would with every beat delivered. Costs the silent ones, not the job."""
        self._ready()
        self._liveness.beat_on_time_except(now, IdRuns.of(silent))

    def observe_silent(self, last: float, workers: Iterable[WorkerId]) -> None:
        """``workers`` beat last at ``last`` (their last heartbeat's arrival)
        and are silent since: a simulator's report of a worker that stopped,
        or whose beats are held back. The detector decides from there: an
        adaptive one with each worker's own window, as if it had heard every
        beat the bulk form stood for (:meth:`observe_beating_except`)."""
        self._ready()
        ws = IdRuns.of(workers)
        vouched = [w for w in self._intervals if w in ws and self._liveness.beats_on_time(w)]
        self._liveness.silent_since(last, ws)
        det = self._config.detector
        for w in vouched:
            self._heard_on_time(w, last)
            extra = det.extra_s(self._intervals[w])
            if extra:
                self._liveness.set(last, w, extra)

    def exited(self, now: float, worker: WorkerId, incarnation: int) -> list[Output]:
        """The worker's process is known to be gone (its host saw it exit)."""
        self._exit(now, worker, incarnation)
        return self._flush()

    def _exit(self, now: float, worker: WorkerId, incarnation: int) -> None:
        if self._live(now) and self.incarnation_of(worker) == incarnation \
                and worker in self._liveness:
            self._declare_dead(now, worker, "exited")

    def node_down(self, now: float, worker: WorkerId) -> None:
        """The machine of ``worker`` is gone until :meth:`node_up`: no restart
        relaunches it, whichever report of its loss (a silence, an exit, a
        failed step) arrives first. Liveness is unchanged: the detector (or
        :meth:`exited`) still decides when its process is dead."""
        self._ready()
        was_down = worker in self._down
        self._down = self._down | (worker,)
        r = self._round
        if not was_down and self._repeats(r) and worker in self._members:
            # a node of the restarting group is gone: the group fails once the
            # loss is detected (its silence), whether or not its life started
            assert r is not None
            at = now + self._config.detector.silence_s()
            r.lost_at = at if r.lost_at is None else min(r.lost_at, at)

    def fleet_capacity(self, now: float, nodes: int) -> None:
        """The fleet holds ``nodes`` nodes that are in service or may yet come
        (up, in repair, pulled or left in the spare pool): the repair shop's
        count, reported whenever a loss, retirement or join changes it. Once
        fewer than ``min_workers``, a starved round stops waiting on the
        fleet (:attr:`KeeperConfig.fleet_returns`) a detection window and a
        last call later: the timer moves, nothing is decided now."""
        self._ready()
        assert nodes >= 0, nodes
        self._capacity = nodes
        if nodes >= self._config.min_workers:
            self._short_since = None
        elif self._short_since is None:
            self._short_since = now

    def node_up(self, now: float, worker: WorkerId) -> int:
        """The machine of ``worker`` is back (repaired): relaunchable again.

        Returns the incarnation its new process starts as: the life a restart
        ordered for it and never started, or else the one after the latest.
        """
        self._ready()
        if worker in self._down:
            self._down = self._down - (worker,)
        life = self._life_table.get(worker)
        unstarted = worker in self._awaiting_relaunch and worker not in self._relaunched
        life = max(life if unstarted else life + 1, self._promised.get(worker, -1) + 1)
        assert life > self._promised.get(worker, -1), "never the same life twice"
        self._promised[worker] = life
        return life

    def commit(self, now: float, worker: WorkerId, incarnation: int, generation: int,
               step: int, last: Optional[int] = None) -> CommitVerdict:
        """The commit vote: may ``worker`` apply steps ``step..last`` of ``generation``?

        Only a current member, in the life the generation admitted, stamped
        with the current generation. While a roll call is open nothing new
        commits (the members are abandoning the step), but a step another
        member already committed still may: it is the lineage's state, and a
        survivor left a step behind would hold replicas nobody can use.

        ``last`` (default ``step``) votes a run of steps at once: none of the
        rule's conditions depends on the step, so the answer is the one each
        step would get in turn (a simulator that steps a whole job at once
        votes a run of steps in O(1)). A run is either all new (it starts
        right after the last committed step) or all committed already.
        """
        last = step if last is None else last
        assert last >= step, (step, last)
        if not self._live(now):
            return _REFUSED["deposed"]
        if self._failed is not None:
            return _REFUSED["job-failed"]
        if self._restoring:
            return _REFUSED["round-open"]  # its roll call comes at take_over
        if generation != self._generation or worker not in self._members:
            return _REFUSED["stale-generation"]
        if self.incarnation_of(worker) != incarnation:
            return _REFUSED["stale-incarnation"]
        done_to = self._committed
        done = done_to is not None and last <= done_to
        if self._round is not None and not done:
            return _REFUSED["round-open"]
        if done:
            return _DONE
        nxt = self._cursor.step if done_to is None else done_to + 1
        assert step == nxt, ("a vote skips or overlaps committed steps", step, last, done_to)
        self._committed = last
        self._progress.committed(now, last)
        if self._watch is not None:  # the step time, on the keeper's clock
            if self._commit_at is not None:
                self._step_s = (now - self._commit_at) / (last - step + 1)
            self._commit_at = now
        policy = self._config.policy
        complete = policy is not None and policy.complete(last + 1)
        self._completed = self._completed or complete
        return _FIRST_COMPLETE if complete else _FIRST

    def report_compute(self, now: float, worker: WorkerId, incarnation: int, generation: int,
                       step: int, compute_s: float, load: int) -> list[Output]:
        """A member's compute for ``step``: ``load`` micro-batches in
        ``compute_s`` (a real member's, with its commit request). Once every
        member reported the step, the straggler policy judges it."""
        assert compute_s >= 0 and load >= 0, (compute_s, load)
        watch = self._watch
        if self._live(now) and watch is not None and self._watching(generation) and worker in self._members \
                and self.incarnation_of(worker) == incarnation:
            due = watch.report(step, worker, compute_s, load)
            if due:
                self._consider(now, due, watch.slow)
        return self._flush()

    def report_steps(self, now: float, generation: int, first: int, last: int,
                     typical_s: float, slow: Mapping[WorkerId, float]) -> list[Output]:
        """Steps ``first..last`` of ``generation``: every member computed each
        of its micro-batches in ``typical_s``, but the members of ``slow``, in
        the time given (a simulator's report for the whole job, costing its
        slow members). The straggler policy judges the steps, over the
        members with micro-batches, as :meth:`report_compute`'s reports: a
        rank past the step's micro-batches computes nothing, slow or not."""
        watch = self._watch
        if self._live(now) and watch is not None and self._watching(generation) and first > watch.judged:
            members = self._members
            working = min(watch.policy.shards(len(members)), len(members))  # ranks 0..working-1
            mine = {w: s for w, s in slow.items() if w in members and members.index(w) < working}
            typical = median_with(list(mine.values()), typical_s, working - len(mine))
            due = watch.judge(first, last, typical, mine)
            if due:
                self._consider(now, due, watch.slow)
        return self._flush()

    def next_round_deadline(self) -> Optional[float]:
        """The keeper's own next deadline, without detector expiries: the open
        round's (last call, join timeout, the relaunch, the relaunch
        timeout) or a benched straggler's holdout. What a simulator that
        does not simulate healthy heartbeats must wake for."""
        if self._failed is not None or self._deposed is not None:
            return None
        times = [min(self._benched.values())] if self._benched else []
        r = self._round
        if r is None:
            return times[0] if times else None
        times += [t for t in (r.last_call_at, r.lost_at) if t is not None]
        if r.starved_since is not None and self._config.join_timeout_s is not None:
            times.append(r.starved_since + self._config.join_timeout_s)
        nobody = self._nobody_comes_at(r)
        if nobody is not None:
            times.append(nobody)
        if r.expect_until is not None and r.expected:
            times.append(r.expect_until)
        return min(times) if times else None

    def get_timer(self) -> Optional[float]:
        """The next instant at which :meth:`handle_timer` has work to do."""
        if self._failed is not None or self._deposed is not None or self._awaiting is not None:
            return None
        # the earliest of four (a driver asks after every call: no list is built)
        first = self._lease_until
        limit = self._config.give_up_at_s
        if limit is not None and not self._completed and (first is None or limit < first):
            first = limit
        oldest = self._liveness.earliest()
        if oldest is not None:
            expiry = self._config.detector.expiry(oldest)
            if first is None or expiry < first:
                first = expiry
        deadline = self.next_round_deadline()
        if deadline is not None and (first is None or deadline < first):
            first = deadline
        return first

    def handle_timer(self, now: float) -> list[Output]:
        if not self._live(now) or self._failed is not None:
            return self._flush()
        limit = self._config.give_up_at_s
        if limit is not None and now >= limit and not self._completed:
            self._fail(now, f"{NOT_EXPECTED}: not done by t={limit:.6g} s (1,000 times its "
                       f"failure-free work, with room for restarts and repairs; "
                       f"rollcall.config.horizon_s)")
            return self._flush()
        dead: list[WorkerId] = []
        expiry = self._config.detector.expiry
        oldest = self._liveness.earliest()
        if oldest is not None and expiry(oldest) <= now:
            dead = self._liveness.expired(lambda t: expiry(t) <= now)
        assert dead == sorted(dead), "verdicts in id order (the history is deterministic)"
        for worker in dead:
            # a restart an earlier verdict of this tick caused tore the
            # others' lives down already: theirs are over, not lost again
            if worker in self._liveness:
                self._declare_dead(now, worker, "timeout")
        if self._benched:
            self._unbench(now)
        r = self._round
        if r is not None and r.lost_at is not None and now >= r.lost_at:
            self._restart_again(now, r)
            r = self._round
        if r is not None and r.expect_until is not None and now >= r.expect_until and r.expected:
            assert isinstance(r.expected, IdRuns), "an id set: evictions in id order"
            for worker in r.expected:
                self._out.append(Record(rec(now, "info", "evict", KEEPER, worker=worker,
                                            incarnation=None, reason="never-relaunched")))
            r.expected = EMPTY
        self._maybe_close(now)
        return self._flush()

    def is_member(self, worker: WorkerId, generation: int) -> bool:
        return generation == self._generation and worker in self._members

    def incarnation_of(self, worker: WorkerId) -> int:
        """The life of ``worker`` last admitted (0 for a worker never seen)."""
        life = self._life_table.get(worker)
        waiting = self._awaiting_relaunch  # empty but during a restart: no lookup then
        return life - 1 if waiting.mask and worker in waiting else life

    # --- a durable record: leases, persistence, failover -------------------------

    def hold(self, now: float, until: float) -> None:
        """The store renewed this keeper's lease until ``until`` on the keeper's
        clock (the driver counts the TTL from when it *sent* the renewal, less
        a margin for clock drift, so this end comes before the store's). From
        ``until`` on the keeper decides nothing: a standby may hold the next
        term by then."""
        self._ready()
        assert self._config.durable, "a lease guards a durable record"
        assert self._lease_until is None or until >= self._lease_until, "a lease never shrinks"
        self._lease_until = until

    def persisted(self, now: float, generation: int, ok: bool) -> list[Output]:
        """The store's answer to :class:`Persist` of ``generation``: written
        (the outputs held back follow), or refused (this keeper is deposed,
        and the generation was never decided: nothing held back is done)."""
        if self._awaiting != generation:
            raise RuntimeError(f"no Persist of generation {generation} awaits an answer")
        self._awaiting = None
        held, self._held = self._held, []
        if not ok:
            self._depose(now, "store-refused")
            self._out.append(Record(rec(now, "fail", "generation", KEEPER, gen=generation,
                                        term=self._term, reason="store-refused")))
            return self._flush()
        self._out = held + self._out
        return self._flush()

    def durable_record(self, reason: str) -> KeeperRecord:
        """The record of the current generation a successor rebuilds from."""
        p = self._placement
        return KeeperRecord(
            self._generation, self._term, reason, self._members, self._cursor, self._source,
            self._stale, self._checkpoint, tuple(self._resumes),
            LifeTable.from_data(**_table_fields(self._life_table)), self._awaiting_relaunch,
            self._down, tuple(sorted(self._left.items())), tuple(sorted(self._promised.items())),
            None if p is None else p.shards, self._recovery, self._fallback, self._restarts,
            self._progress.furthest, self._progress.since_progress)

    @classmethod
    def restored(cls, config: KeeperConfig, record: Optional[KeeperRecord],
                 term: int) -> "Keeper":
        """A keeper of ``term`` that holds ``record`` (the last generation the
        store holds; None: none was decided yet): call :meth:`take_over`."""
        if term <= (0 if record is None else record.term):
            raise ValueError(f"term {term} must be newer than the record's")
        k = cls(config)
        k._term = term
        k._restoring = True
        if record is None:
            return k
        k._generation, k._members, k._cursor = record.generation, record.members, record.cursor
        k._source, k._stale, k._checkpoint = record.source, record.stale, record.checkpoint
        k._resumes = list(record.resumes)
        k._life_table = LifeTable.from_data(**_table_fields(record.lives))
        k._awaiting_relaunch, k._down = record.awaiting_relaunch, record.down
        k._member_lives = k._life_table.snapshot(record.members)
        k._left, k._promised = dict(record.left), dict(record.promised)
        if record.placement is not None:
            k._placement = Placement(record.placement)
        k._recovery, k._fallback = record.recovery, record.fallback
        k._stored = record
        # the job's restart budget survives a failover as far as the store
        # holds it: a restart ordered after the record's generation is not in it
        k._restarts = record.restarts
        # and so does the count of recoveries without progress (the progress rule)
        k._progress = ProgressWatch(config.max_recoveries_without_progress,
                                    record.furthest_step, record.recoveries_without_progress)
        return k

    def take_over(self, now: float, started: Mapping[WorkerId, int],
                  down: Iterable[WorkerId] = (),
                  exited: Iterable[tuple[WorkerId, int]] = (),
                  capacity: Optional[int] = None) -> list[Output]:
        """Begin this term from the supervisor's report of the physical world,
        the same on every target: ``started`` (below), the nodes ``down``
        (lost and not repaired: :meth:`node_down`), the lives ``exited``
        whose process its host saw exit (:meth:`exited`) and the fleet's
        ``capacity`` (:meth:`fleet_capacity`; None: not counted). A crashed
        machine reports nothing and a restart's teardown is no exit: the
        detector decides those lives, as it would have under the old keeper.
        """
        for worker in down:
            self.node_down(now, worker)
        if capacity is not None:
            self.fleet_capacity(now, capacity)
        self._begin_term(now, started)
        for worker, life in exited:  # one answer: an exit's restart may write the store
            self._exit(now, worker, life)
        return self._flush()

    def _begin_term(self, now: float, started: Mapping[WorkerId, int]) -> None:
        """The members of the record are expected at a roll call (a full
        detector window from ``now`` to answer), which decides the next
        generation from the state the survivors hold.

        ``started``: the latest life of each worker id the supervisor has
        started a process for (a physical fact it reports on reconnecting).
        A predecessor may have handed out lives after its last record (a
        relaunch, a repaired node): such a life is the latest of its id here
        too, so the older ones are over (their messages are refused) and no
        life is ever started twice, whichever keeper orders it."""
        assert self._term > 0 and self._round is None, "restored first (Keeper.restored)"
        self._restoring = False
        if not self._live(now):
            return  # its lease lapsed before it began
        moved = []
        for w, life in sorted(started.items()):
            if life > self.incarnation_of(w):
                self._life_table.set(w, max(life, self._life_table.get(w)))
                moved.append(w)
                if self._promised.get(w, life + 1) <= life:
                    del self._promised[w]
        if moved:
            self._awaiting_relaunch = self._awaiting_relaunch - IdRuns.of(moved)
        self._out.append(Record(rec(now, "info", "takeover", KEEPER, gen=self._generation,
                                    term=self._term)))
        if self._generation == 0:
            return  # no record yet: the first round opens on the first Join
        # the members whose recorded life still runs answer the roll call
        self._liveness.track(now, self._members - self._awaiting_relaunch - IdRuns.of(moved))
        self._open(now, "failover")

    def _ready(self) -> None:
        """Inputs wait for the store's answer to a Persist (local misuse raises)."""
        if self._awaiting is not None:
            raise RuntimeError(f"answer the Persist of generation {self._awaiting} "
                               "(Keeper.persisted) before anything else")

    def _live(self, now: float) -> bool:
        """Whether this keeper may still decide at ``now`` (its lease holds)."""
        self._ready()
        if self._deposed is None and self._lease_until is not None and now >= self._lease_until:
            self._depose(now, "lease-lapsed")
        return self._deposed is None

    def _depose(self, now: float, reason: str) -> None:
        self._deposed = reason
        self._round = None
        self._out.append(Record(rec(now, "info", "deposed", KEEPER, gen=self._generation,
                                    term=self._term, reason=reason)))
        self._out.append(Deposed(reason))

    # --- read-only state (drivers and tests read these; only the keeper writes) ---

    @property
    def config(self) -> KeeperConfig:
        """The configuration the keeper decides by."""
        return self._config

    @property
    def term(self) -> int:
        """The term this keeper decides in (0: the run's only keeper)."""
        return self._term

    @property
    def generation(self) -> int:
        """The current generation (0 before the first is formed)."""
        return self._generation

    @property
    def members(self) -> IdRuns:
        """The current generation's members."""
        return self._members

    @property
    def member_lives(self) -> Lives:
        """The members' lives, paired with :attr:`members`."""
        return self._member_lives

    @property
    def cursor(self) -> Cursor:
        """Where the current generation resumed."""
        return self._cursor

    @property
    def source(self) -> Optional[WorkerId]:
        """The member the current generation's stale ones copy the state from."""
        return self._source

    @property
    def stale(self) -> IdRuns:
        """Members that do not hold the state yet."""
        return self._stale

    @property
    def checkpoint(self) -> Optional[Cursor]:
        """The latest checkpoint written."""
        return self._checkpoint

    @property
    def round(self) -> Optional[Round]:
        """The roll call in progress, if any."""
        return self._round

    @property
    def failed(self) -> Optional[str]:
        """Why the job was given up (None while it goes on)."""
        return self._failed

    @property
    def completed(self) -> bool:
        """Whether every step has committed."""
        return self._completed

    @property
    def restarts(self) -> int:
        """RestartJobs ordered so far (checkpoint-restart)."""
        return self._restarts

    @property
    def resumes(self) -> Sequence[tuple[int, int]]:
        """(generation, resume step) of each generation formed."""
        return self._resumes

    @property
    def placement(self) -> Optional[Placement]:
        """The current generation's shard placement (sharded state)."""
        return self._placement

    @property
    def benched(self) -> Mapping[WorkerId, float]:
        """Evicted stragglers and when each one's holdout ends."""
        return self._benched

    @property
    def lease_until(self) -> Optional[float]:
        """When this keeper's lease ends on its clock (None: no lease held):
        the driver waits on the store no later than this."""
        return self._lease_until

    @property
    def standby(self) -> IdRuns:
        """Joiners held for the next round (beyond ``max_workers``)."""
        out = EMPTY
        for ws in self._standby.values():
            out = out | ws
        return out

    # --- message handling -----------------------------------------------------

    def _dispatch(self, now: float, message: ToKeeper) -> None:
        if self._failed is not None:
            return
        if not isinstance(message, JoinBatch) and not self._incarnation_ok(
                now, message.worker, message.incarnation):
            return
        if isinstance(message, Heartbeat):
            self._heartbeat(now, message)
        elif isinstance(message, Join):
            self._join(now, message)
        elif isinstance(message, JoinBatch):
            self._join_batch(now, message)
        elif isinstance(message, StepFailed):
            self._step_failed(now, message)
        elif isinstance(message, Leave):
            if message.worker in self._liveness:
                self._down = self._down | (message.worker,)  # gone for good: no relaunch
                self._left[message.worker] = message.incarnation
                self._declare_dead(now, message.worker, "left")
        elif isinstance(message, Checkpointed):
            self._checkpointed(now, message)
        else:  # pragma: no cover - typing guards this
            raise TypeError(f"unknown message {message!r}")

    def _incarnation_ok(self, now: float, worker: WorkerId, incarnation: int) -> bool:
        left = self._left.get(worker, -1)  # a life that left: all it sends is a late copy
        if incarnation > left and incarnation >= self._life_table.get(worker):
            return True
        self._refuse(now, worker, incarnation, "message", "stale-incarnation")
        return False

    def _heartbeat(self, now: float, hb: Heartbeat) -> None:
        w = hb.worker
        if w not in self._liveness or hb.incarnation != self.incarnation_of(w):
            self._refuse(now, w, hb.incarnation, "heartbeat", "not-member")
            return
        if hb.counter > self._counter.get(w, -1):
            self._counter[w] = hb.counter
            self._beat(now, w)
        self._stamp(w, hb.incarnation, hb.generation)
        # Heal lost messages: a member behind the record learns the answer
        # again, an expected member that missed the roll call hears it again.
        r = self._round
        if r is not None and w in r.expected:
            self._out.append(Send(w, RollCall(r.generation, r.reason, self._term)))
        elif hb.generation < self._generation and w in self._members:
            self._out.append(Send(w, self._membership()))

    def _beat(self, now: float, w: WorkerId) -> None:
        """A heartbeat advanced: on the keeper's clock, and for an adaptive
        detector one more interval of the worker's cadence (its tolerance)."""
        det = self._config.detector
        if not det.adaptive:
            self._liveness.beat(now, w)
            return
        gaps = self._intervals.setdefault(w, [])
        if self._liveness.beats_on_time(w):  # vouched for since its last beat heard alone
            self._heard_on_time(w, now)
        else:
            seen = self._liveness.at(w)
            assert seen is not None and now >= seen, (w, seen, now)
            gaps.append(now - seen)
        del gaps[:-det.window]
        self._arrived[w] = now
        self._liveness.beat(now, w, det.extra_s(gaps))

    def _heard_on_time(self, w: WorkerId, until: float) -> None:
        """An adaptive detector's window: ``w`` beat on time from its last
        beat heard alone until a beat that arrived at ``until`` (the bulk
        form stood for those beats): their intervals, as if each was heard."""
        det = self._config.detector
        gaps, since = self._intervals.get(w), self._arrived.get(w)
        if gaps is None or since is None or until <= since:
            return  # nothing heard alone yet: the window's prior is on time already
        gaps += det.on_time(until - since)
        del gaps[:-det.window]
        self._arrived[w] = until

    def _join(self, now: float, join: Join) -> None:
        w, inc = join.worker, join.incarnation
        tracked = w in self._liveness
        known = self.incarnation_of(w)
        if not tracked and inc == known and self._stamped_newer(w, inc, join.generation):
            # a late copy of a Join from a life evicted since it stamped a newer
            # generation: it claims a state the life has moved past (it
            # committed steps since), and is no sign of life
            return
        if tracked and inc > known:
            # A new life of a worker we still track: its old life is over.
            self._declare_dead(now, w, "restarted")
            tracked = False
            if inc < self._life_table.get(w):
                # ... and the checkpoint-restart that ended it tore this life
                # down too (it ordered a newer one): this Join claims nothing
                self._refuse(now, w, inc, "join", "stale-incarnation")
                return
        new_life = not tracked or inc > known
        self._life_table.set(w, inc)
        if w in self._left:
            assert inc > self._left[w], "a life that left is refused (_incarnation_ok)"
            del self._left[w]
        if self._promised.get(w, inc + 1) <= inc:
            del self._promised[w]  # kept: a life node_up handed out that has not joined
        if w in self._awaiting_relaunch:
            self._awaiting_relaunch = self._awaiting_relaunch - (w,)
        if new_life:
            self._counter.pop(w, None)
            self._intervals.pop(w, None)
            self._arrived.pop(w, None)
            if self._born.get(w, (-1, 0))[0] != inc:
                # a life evicted and heard again keeps the birth it had: it
                # may hold (and answer with) a generation it entered before
                self._born[w] = (inc, self._generation)
        self._liveness.set(now, w)
        one = IdRuns.span(w, w)
        r = self._round
        # a late copy of a Join this life sent before it stamped a newer
        # generation on a message (a newer Join this round, a heartbeat from a
        # generation it entered since) claims nothing: its state has moved on
        late = r is not None and not new_life and (self._stamped_newer(w, inc, join.generation)
                                                   or self._born_after(w, inc, join.generation))
        self._stamp(w, inc, join.generation)
        if w in self._benched and not new_life:
            self._bench_join[w] = (join.cursor, join.generation)  # waits out its holdout
            return
        if r is not None:
            if not late:
                self._admit(now, w, join.cursor, join.generation)
                self._maybe_close(now)
            return
        if w in self._members and not new_life:
            if join.generation < self._generation:
                self._out.append(Send(w, self._membership()))  # a late duplicate
            else:
                self._fail_generation(now, "rejoin")  # a member wants a new round
                if self._round is not None:
                    self._round.add(one, join.cursor)
                    self._maybe_close(now)
            return
        self._admit(now, w, join.cursor, join.generation)

    def _admit(self, now: float, w: WorkerId, cursor: Optional[Cursor], generation: int) -> None:
        """A Join that claims what it says (state at ``cursor``, of the lineage
        of ``generation``): it enters the open round, or waits as a standby
        and opens a round if there is room (the caller closes what is due)."""
        one = IdRuns.span(w, w)
        r = self._round
        if r is not None:
            r.add(one, cursor)
            r.state_gen[w] = generation
            return
        self._standby_add(one, cursor)
        self._standby_gen[w] = generation
        if self._completed:
            return  # the job has every step: it grows no more
        if self._generation == 0 or len(self._members) < self._config.max_workers:
            self._open(now, "start" if self._generation == 0 else "growth")

    def _late_in(self, ws: IdRuns, claimed: Callable[[WorkerId], int], generation: int) -> IdRuns:
        """The lives of ``ws`` that stamped a message with a generation newer than
        ``generation``: a join stamped with it is a late copy for them. Costs
        the lives stamped individually (a real heartbeat, a Join) with a newer
        generation, found by generation (``_stamped_at``), not ``ws``, nor
        every life ever stamped (``_stamped_newer``'s test, for a set)."""
        late = []
        for g, stamped in self._stamped_at.items():
            if g > generation:
                late += [w for w in stamped if w in ws and claimed(w) == self._stamped[w][0]]
        return IdRuns.of(late)

    def _born_after(self, w: WorkerId, life: int, generation: int) -> bool:
        """Whether life ``life`` of ``w`` was first heard once ``generation`` had
        formed (so it never entered it): a Join of it claiming that
        generation's state is a late copy of an older life's (a lives-less
        batch names the latest life it knows)."""
        born = self._born.get(w)
        return born is not None and born[0] == life and 0 < generation <= born[1]

    def _stamped_newer(self, w: WorkerId, life: int, generation: int) -> bool:
        """Whether life ``life`` of ``w`` stamped a generation newer than ``generation``."""
        have = self._stamped.get(w)
        return have is not None and have[0] == life and have[1] > generation

    def _stamp(self, w: WorkerId, life: int, generation: int) -> None:
        """Life ``life`` of ``w`` sent a message stamped with ``generation``."""
        have = self._stamped.get(w)
        if have is None or have[0] != life or have[1] < generation:
            if have is not None:
                old = self._stamped_at[have[1]]
                old.discard(w)
                if not old:
                    del self._stamped_at[have[1]]
            self._stamped[w] = (life, generation)
            self._stamped_at.setdefault(generation, set()).add(w)

    def _join_batch(self, now: float, batch: JoinBatch) -> None:
        r = self._round
        workers = IdRuns.of(batch.workers)
        claimed: Callable[[WorkerId], int]
        if batch.incarnations is None:
            # stamped generation 0, its agents entered none: first lives (a
            # takeover's report may name a newer life of the id, which this
            # batch is not); else lives a Membership admitted
            claimed = _first_life if batch.generation == 0 else self._batch_life
            if r is None and batch.cursor is None and workers:
                # the job's first arrival: the first joiner opens the round
                w = workers.first()
                if self._incarnation_ok(now, w, claimed(w)):
                    self._join(now, Join(w, claimed(w), None))
                workers, r = workers.tail(1), self._round
            # a lives-less batch stands for the lives the keeper knows: for a
            # worker a restart moved on, the torn-down one, or one whose life
            # left, which each Join would have refused (the slow path does)
            gone = IdRuns.of(self._left) if self._left else EMPTY
            eligible = self._at_first_life(workers) \
                if r is not None and batch.generation == 0 else workers
            fast = (eligible & r.expected) - self._awaiting_relaunch - gone \
                if r is not None else EMPTY
            if r is not None and batch.cursor is None:
                # Workers never seen (or back from repair, untracked) joining
                # without state: what ``_join`` does to each, done to all at
                # once (admission by id order is the same: ``Keeper._close``).
                new = eligible - fast - self._liveness.tracked - self._members \
                    - self._awaiting_relaunch - gone
                if new:
                    self._forget_beats(new)
                    fast = fast | new
        else:
            lives = batch.incarnations
            if not isinstance(lives, Lives):
                lives = dict(zip(batch.workers, lives)).__getitem__  # type: ignore[assignment]
                claimed = lives  # type: ignore[assignment]
            else:
                claimed = lives.of  # type: ignore[assignment]
            fast = self._new_lives(workers, batch.incarnations, claimed) \
                if r is not None else EMPTY
        if fast and self._stamped and batch.generation < self._generation:
            fast = fast - self._late_in(fast, claimed, batch.generation)  # as _join would
        if fast:
            self._liveness.track(now, fast)
            r.add(fast, batch.cursor)
        slow = workers - fast
        assert isinstance(slow, IdRuns), "an id set: joins admitted in id order"
        for w in slow:
            inc = claimed(w)
            if self._incarnation_ok(now, w, inc):
                self._join(now, Join(w, inc, batch.cursor, batch.generation))
        self._maybe_close(now)

    def _at_first_life(self, workers: IdRuns) -> IdRuns:
        """Those of ``workers`` whose latest known life is their first: a
        batch of first joins speaks for no other (an id a takeover's report
        named at a newer life goes the slow way, and is refused as stale)."""
        return self._life_table.snapshot(workers).having(workers, 0)

    def _batch_life(self, w: WorkerId) -> int:
        """The life a lives-less batch claims for ``w``: a member answers as
        the life its generation admitted, any other id as the life last
        admitted. Read from the membership, not the latest life: a newer life
        of a member may join while the old one's answer is on its way (the
        old one paused, then woke), and that answer is the old life's."""
        life = self._member_lives.of(w)
        return self.incarnation_of(w) if life is None else life

    def _new_lives(self, workers: IdRuns, lives: object,
                   claimed: Callable[[WorkerId], int]) -> IdRuns:
        """The workers of a relaunch batch that can be admitted wholesale:
        lives newer than any the keeper knows, whose old life is not tracked
        (a life a restart ordered counts as newer)."""
        ws = workers - self._liveness.tracked
        if not ws:
            return EMPTY
        if isinstance(lives, Lives) and ws.issubset(self._awaiting_relaunch) \
                and self._life_table.snapshot(ws).same_as(lives.restricted(ws)):
            fresh = ws  # exactly the lives a RestartJob ordered
        else:
            awaiting, table = self._awaiting_relaunch, self._life_table
            fresh = IdRuns.of(w for w in ws if claimed(w) > table.get(w) - (w in awaiting))
            for w in fresh:
                table.set(w, claimed(w))
        self._awaiting_relaunch = self._awaiting_relaunch - fresh
        for w in [w for w in self._left if w in fresh]:  # newer lives of workers that left
            del self._left[w]
        self._forget_beats(fresh)
        return fresh

    def _step_failed(self, now: float, msg: StepFailed) -> None:
        if msg.generation != self._generation or msg.worker not in self._members:
            self._refuse(now, msg.worker, msg.incarnation, "step-failed", "stale-generation")
            return
        if self._round is None:
            self._fail_generation(now, "step-failed")

    def _checkpointed(self, now: float, msg: Checkpointed) -> None:
        if msg.generation != self._generation or msg.worker not in self._members:
            self._refuse(now, msg.worker, msg.incarnation, "checkpoint", "stale-generation")
            return
        # The current generation resumed at or after the last checkpoint, so
        # a checkpoint it reports is of the current lineage and supersedes it.
        if self._checkpoint is None or msg.cursor.step >= self._checkpoint.step:
            self._checkpoint = msg.cursor

    # --- stragglers (rollcall.core.stragglers) -----------------------------------

    def _watching(self, generation: int) -> bool:
        """Whether reports of ``generation`` are judged: the current one, while
        it trains (no roll call open, not failed)."""
        return generation == self._generation and self._round is None and self._failed is None

    def _watch_generation(self) -> None:
        """A generation formed: its members' lag is counted from its first step."""
        policy = self._config.stragglers
        self._kept_slow.clear()
        self._commit_at = self._step_s = None
        self._watch = None if policy is None or self._config.strategy != ELASTIC \
            else StragglerWatch(policy, self._generation, len(self._members))

    def _consider(self, now: float, due: list[Lagging], slow: Mapping[WorkerId, float]) -> None:
        """Members lagged for the policy's steps (slowest first): evict the
        slowest ``j`` of them for the ``j`` that saves most, if any saves;
        keep (and say why, once a generation) the others."""
        best: Optional[tuple[float, int, float, float]] = None
        why = "min-workers"
        for j in range(1, len(due) + 1):
            out = due[:j]
            others = {w: pb for w, pb in slow.items() if w not in {x.worker for x in out}}
            net, reason, with_s, without_s = self._eviction_net(out, others)
            if net is None:
                break  # fewer would be left than min_workers
            why = reason
            if net > 0 and (best is None or net > best[0]):
                best = (net, j, with_s, without_s)
        chosen = due[:best[1]] if best is not None else []
        for lag in due[len(chosen):]:
            if lag.worker not in self._kept_slow:
                self._kept_slow.add(lag.worker)
                self._out.append(Record(rec(now, "info", "straggler", KEEPER, worker=lag.worker,
                                            gen=self._generation, lag=round(lag.lag, 3),
                                            decision="keep", reason=why)))
        if best is not None:
            self._evict_stragglers(now, chosen, best[2], best[3])

    def _eviction_net(self, out: list[Lagging], others: Mapping[WorkerId, float],
                      ) -> tuple[Optional[float], str, float, float]:
        """What evicting ``out`` saves over the steps left, less what it costs
        (None: below ``min_workers``), why, and one step's compute with them
        and without them."""
        cfg = self._config
        policy = cfg.stragglers
        assert policy is not None
        members = self._members
        if len(members) - len(out) < cfg.min_workers:
            return None, "min-workers", 0.0, 0.0
        with_s, without_s = eviction_gain(policy, members, out, others)
        done = self._cursor.step if self._committed is None else self._committed + 1
        left = cfg.policy.steps - done if cfg.policy is not None else float("inf")
        step_s = self._step_s if self._step_s is not None else with_s
        # the eviction abandons a step, the readmission another and waits its last call
        cost_s = 2 * step_s + cfg.last_call_s
        net = (with_s - without_s) * left - cost_s if left > 0 else -cost_s
        return net, "faster-without" if net > 0 else "not-faster-without", with_s, without_s

    def _evict_stragglers(self, now: float, out: list[Lagging], with_s: float,
                          without_s: float) -> None:
        """Take live stragglers out: bench each for its holdout, tell it (it
        rejoins, and waits), and hold one roll call without them."""
        policy = self._config.stragglers
        assert policy is not None and self._round is None and out
        for lag in sorted(out, key=lambda x: x.worker):
            w = lag.worker
            times = self._slow_evictions[w] = self._slow_evictions.get(w, 0) + 1
            hold_s = policy.holdout_for(times)
            self._benched[w] = now + hold_s
            life = self.incarnation_of(w)
            self._out.append(Record(rec(now, "info", "evict", KEEPER, worker=w, incarnation=life,
                                        reason="straggler", lag=round(lag.lag, 3),
                                        step_s=round(with_s, 9), without_s=round(without_s, 9),
                                        holdout_s=hold_s)))
            self._refuse(now, w, life, "step", "straggler")
        self._fail_generation(now, "straggler")

    def _unbench(self, now: float) -> None:
        """Holdouts that ended: the straggler is a newcomer again (its Join, if
        it sent one meanwhile, enters the open round or opens a growth one)."""
        for w in sorted(w for w, t in self._benched.items() if t <= now):
            del self._benched[w]
            held = self._bench_join.pop(w, None)
            if held is not None:  # else its Join, when it comes, takes the usual path
                self._admit(now, w, *held)

    # --- decisions ------------------------------------------------------------

    def _standby_add(self, ws: IdRuns, cursor: Optional[Cursor]) -> None:
        self._standby_drop(ws)
        self._standby[cursor] = self._standby.get(cursor, EMPTY) | ws

    def _standby_drop(self, ws: IdRuns) -> None:
        for c, group in list(self._standby.items()):
            rest = group - ws
            if not rest:
                del self._standby[c]
            elif rest is not group:
                self._standby[c] = rest

    def _forget_beats(self, ws: IdRuns) -> None:
        """The heartbeat counters and intervals of ``ws``'s lives are over."""
        for beats in (self._counter, self._intervals, self._arrived):
            if beats:
                for w in [w for w in beats if w in ws]:
                    del beats[w]

    def _declare_dead(self, now: float, worker: WorkerId, reason: str) -> None:
        self._liveness.drop(worker)
        self._counter.pop(worker, None)
        self._intervals.pop(worker, None)
        self._arrived.pop(worker, None)
        self._standby_drop(IdRuns.span(worker, worker))
        self._standby_gen.pop(worker, None)
        if self._benched:
            self._benched.pop(worker, None)
            self._bench_join.pop(worker, None)
        self._out.append(Record(rec(now, "info", "evict", KEEPER, worker=worker,
                                    incarnation=self.incarnation_of(worker), reason=reason)))
        r = self._round
        if r is not None and self._repeats(r) and worker in self._members:
            self._restart_again(now, r, dead=worker)  # a life of the restarting group is gone
        elif r is not None and r.reason == "failover" and worker in self._members \
                and self._config.strategy == CHECKPOINT_RESTART:
            # a new keeper's roll call lost a member of a checkpoint-restart
            # group (its restart may have been in flight when the keeper
            # died): the group restarts, as it would under the old keeper
            self._set_aside(r, self._members)  # every member's life is torn down
            self._fail_generation(now, "leave" if reason == "left" else "failure")
        elif r is not None:
            r.drop(worker)
            self._maybe_close(now)
        elif worker in self._members:
            self._fail_generation(now, "leave" if reason == "left" else "failure")

    def _set_aside(self, r: Round, over: IdRuns) -> None:
        """Close the open round without a generation: who joined it waits as a
        standby again, but the lives of ``over`` (torn down, or dead)."""
        for cursor, ws in r.by_cursor.items():
            waiting = ws - over
            if waiting:
                self._standby_add(waiting, cursor)
                # the few that claimed a generation's state, not every waiting id
                for w, g in r.state_gen.items():
                    if w in waiting:
                        self._standby_gen[w] = g
        self._round = None

    def _fail_generation(self, now: float, reason: str) -> None:
        """A member of the current generation is gone or the step failed."""
        if self._failed is not None or self._completed:
            return  # the job gave up (an earlier verdict of this tick) or has every step
        if self._config.strategy == CHECKPOINT_RESTART:
            # Every current life is over: the members whose node is still up
            # are relaunched, each as its next life (the only one accepted now).
            self._restart(now, reason, self._members)
        elif not self._hopeless(now):
            self._open(now, reason)

    def _hopeless(self, now: float) -> bool:
        """A recovery begins: the job gives up instead if it is not expected
        to finish (:mod:`rollcall.core.progress`)."""
        reason = self._progress.recovery(now)
        if reason is not None:
            self._fail(now, reason)
        return reason is not None

    def _restart(self, now: float, reason: str, teardown: IdRuns, keep: IdRuns = EMPTY) -> None:
        """Tear down the lives of ``teardown`` (members) and open the restart
        round that relaunches every member whose node is up (but ``keep``:
        lives already running that wait in the round)."""
        members = self._members
        assert teardown.issubset(members), "a restart tears down members"
        if self._failed is not None or self._completed:  # gave up, or done: nothing to restart
            return
        limit = self._config.max_restarts
        if limit is not None and self._restarts >= limit:
            # the cause is not in the reason: a kill reads "failure" or
            # "step-failed" by which report came first (rollcall.app.decisions)
            self._fail(now, f"max_restarts={limit} reached ({self._restarts} restarts)")
            return
        if self._hopeless(now):
            return
        self._restarts += 1
        self._life_table.bump(teardown)
        # never the same life twice: a life node_up handed out that has not
        # joined yet (few: the entries are dropped as the lives join) is
        # not named again
        for w, promised in self._promised.items():
            if w in teardown and self._life_table.get(w) <= promised:
                self._life_table.set(w, promised + 1)
        self._awaiting_relaunch = self._awaiting_relaunch | teardown
        self._liveness.drop_many(teardown)
        self._forget_beats(teardown)
        self._out.append(Record(rec(now, "info", "restart", KEEPER,
                                    gen=self._generation, reason=reason)))
        self._store_budget()
        self._out.append(RestartJob(self._generation, reason, teardown))
        self._relaunched = self._relaunched - members
        self._open(now, "restart", expect=False, relaunch=members - self._down - keep)

    def _store_budget(self) -> None:
        """A durable record: write the current generation's record again with
        the restarts and recoveries spent, before the teardown is ordered:
        kept only in this keeper, they would go with it if it died before the
        restart round closed, and a successor would order restarts past
        ``max_restarts``."""
        if not self._config.durable:
            return
        assert self._stored is not None and self._stored.generation == self._generation, \
            "a restart tears down a generation the store holds"
        self._stored = replace(self._stored, restarts=self._restarts,
                               furthest_step=self._progress.furthest,
                               recoveries_without_progress=self._progress.since_progress)
        self._out.append(Persist(self._generation, self._term, self._stored, again=True))

    def _repeats(self, r: Optional[Round]) -> bool:
        """Whether a loss in the group fails the open round: a restart's, under
        ``restart_failure: repeat``."""
        return r is not None and r.reason == "restart" and \
            self._config.restart_failure == "repeat" and self._config.strategy == CHECKPOINT_RESTART

    def _restart_again(self, now: float, r: Round, dead: Optional[WorkerId] = None) -> None:
        """``restart_failure: repeat``: a node of the group was lost while it
        restarted, so the relaunched group fails (torchrun: its rendezvous
        or first collective errors) and the restart starts over. The lives
        it started (and a repaired member's life still starting) are torn
        down and relaunched as their next ones; the lives not started yet
        are relaunched as ordered; the other lives that joined the round
        (spares, a repaired member's new life) wait for the next one, but
        the ``dead`` one whose loss this is: kept as a standby, it counted as
        joined for its id's next life, which never asked (the stateful
        test, seed 3); kept as running, its id was relaunched later as the
        life that had died (seed 380662767). It is torn down with the
        started ones."""
        members = self._members
        # the lives running: the relaunched ones, and those node_up handed out
        # (a repaired node's) that have not joined yet
        promised = IdRuns.of(sorted(self._promised)) if self._promised else EMPTY
        started = (self._relaunched | promised) & members
        over = started if dead is None else started | (dead,)
        self._set_aside(r, over)  # a dead life never waits as a standby
        # the dead life is over too, whether it was started by the relaunch
        # or joined the round otherwise (a repaired member's new life): torn
        # down, it is relaunched as its next life, never kept as running
        self._restart(now, "restart-failure", over, keep=r.joined - over)

    def _relaunch(self, now: float, r: Round) -> None:
        """The relaunch a restart orders with its teardown: the lives of the
        torn-down members whose node is up (one known to be down is not
        relaunched, and the round does not expect it)."""
        r.expected = r.expected - self._down
        workers = r.expected
        # a node repaired meanwhile was handed the life ordered for it
        # (node_up): its process starts it; the relaunch must not start it again
        handed = [w for w, life in self._promised.items()
                  if w in workers and life >= self._life_table.get(w)]
        if handed:
            workers = workers - IdRuns.of(sorted(handed))
        assert r.joined.isdisjoint(workers), "a joiner is no longer expected (Round.add)"
        if workers:
            self._relaunched = self._relaunched | workers
            lives = self._life_table.snapshot(workers)
            self._out.append(Record(self._relaunch_record(now, r.generation - 1, lives)))
            self._out.append(Relaunch(r.generation - 1, workers, lives))

    def _relaunch_record(self, now: float, gen: int, lives: Lives) -> dict:
        """The history's account of a Relaunch (rollcall.core.history): the
        members of ``gen`` it leaves out (a few runs, where the relaunched
        set would repeat the member list's) and the lives it starts."""
        workers = lives.members
        assert gen == self._generation and workers.issubset(self._members), "relaunch of members"
        common, others = lives.common_and_others(RELAUNCH_LISTED_MAX)
        return rec(now, "info", "relaunch", KEEPER, gen=gen,
                   not_relaunched=(self._members - workers).runs(), incarnation=common,
                   others=None if others is None else [[w, life] for w, life in others])

    def _open(self, now: float, reason: str, expect: bool = True,
              relaunch: IdRuns = EMPTY) -> None:
        # After a restart nobody carries over: every joiner is a new life.
        previous = self._members if expect else EMPTY
        r = Round(self._generation + 1, reason, now, previous)
        if expect:
            r.expected = self._liveness.tracked & previous
            if self._benched:  # an evicted straggler is not asked back
                r.expected = r.expected - IdRuns.of(sorted(self._benched))
        else:
            r.expected = relaunch
            cfg = self._config
            timeout = cfg.relaunch_timeout_s if cfg.relaunch_timeout_s is not None \
                else cfg.join_timeout_s
            r.expect_until = now + timeout if timeout is not None else None
        for cursor, ws in self._standby.items():
            r.add(ws, cursor)
        r.state_gen.update(self._standby_gen)
        self._standby.clear()
        self._standby_gen.clear()
        self._round = r
        self._out.append(Record(rec(now, "invoke", "round", KEEPER, gen=r.generation, reason=reason)))
        if not expect:
            self._relaunch(now, r)
        elif r.expected:
            self._out.append(Broadcast(r.expected, RollCall(r.generation, reason, self._term)))
        self._maybe_close(now)

    def _maybe_close(self, now: float) -> None:
        r = self._round
        if r is None or self._failed is not None:
            return
        cfg = self._config
        if len(r.joined) + len(r.expected) < cfg.min_workers:
            if r.starved_since is None:
                r.starved_since = now
            r.last_call_at = None
            timeout = cfg.join_timeout_s
            if timeout is not None and now >= r.starved_since + timeout:
                self._give_up(now, r)
            elif (nobody := self._nobody_comes_at(r)) is not None and now >= nobody:
                left = self._capacity
                fleet = (f"only {left} node{'' if left == 1 else 's'} in service or to come, "
                         f"the rest lost for good; no" if cfg.fleet_returns else
                         "no repairs, spare pool, idle nodes or")
                self._fail(now, f"{NOT_EXPECTED}: below min_workers={cfg.min_workers} with "
                           f"{len(r.joined) + len(r.expected)} since t={r.starved_since:.6g} s "
                           f"and nothing can bring a worker ({fleet} scripted arrivals "
                           f"after t={cfg.arrivals_end_s:.6g} s)", r.generation)
            return
        r.starved_since = None
        if r.expected or len(r.joined) < cfg.min_workers:
            return
        newcomers = not r.joined.issubset(r.previous)
        if len(r.joined) >= cfg.max_workers or not newcomers:
            self._close(now, r)
            return
        if r.last_call_at is None:
            r.last_call_at = now + cfg.last_call_s
        if now >= r.last_call_at:
            self._close(now, r)

    def _nobody_comes_at(self, r: Round) -> Optional[float]:
        """When a starved round with no join timeout stops waiting: a detection
        window and a last call after the last possible arrival (a fenced life
        still running rejoins within it); None while one may still come."""
        cfg = self._config
        if (cfg.join_timeout_s is not None or cfg.arrivals_end_s is None or self._benched
                or r.starved_since is None):
            return None
        end = max(r.starved_since, cfg.arrivals_end_s)
        if cfg.fleet_returns:
            if self._short_since is None:
                return None  # a repair, a pull or an idle node may still come
            end = max(end, self._short_since)
        grace = 2 * cfg.detector.silence_s() + cfg.last_call_s
        return end + grace

    def _give_up(self, now: float, r: Round) -> None:
        self._fail(now, f"below min_workers={self._config.min_workers} for join_timeout_s",
                   r.generation)

    def _fail(self, now: float, reason: str, gen: Optional[int] = None) -> None:
        """The job gives up: nothing is decided after this."""
        assert self._failed is None, self._failed
        self._failed = reason
        self._out.append(Record(rec(now, "fail", "round", KEEPER,
                                    gen=self._generation if gen is None else gen, reason=reason)))
        self._out.append(JobFailed(reason))

    def _close(self, now: float, r: Round) -> None:
        old = r.joined & r.previous
        room = self._config.max_workers - len(old)
        new = r.joined - r.previous
        admitted, overflow = new.head(room), new.tail(room)
        for claimed, ws in r.by_cursor.items():  # the overflow waits as standbys
            over = ws & overflow
            if over:
                self._standby_add(over, claimed)
                if claimed is not None:  # a lineage only matters with state
                    for w in over:
                        self._standby_gen[w] = r.state_gen.get(w, r.generation - 1)
        members = old | admitted
        cursor, source = self._resume_point(r, old, admitted, overflow=bool(overflow))
        if source is None:
            stale = members if cursor != Cursor() else EMPTY
        else:
            current = (r.by_cursor[cursor] & r.previous) - (source,)
            stale = members - current - (source,)
        if self._config.sharding is not None:
            cursor, source, stale = self._shards(now, r, members, cursor, source, stale)
        self._generation = r.generation
        self._resumes.append((r.generation, cursor.step))
        self._members = members
        self._member_lives = self._life_table.snapshot(members)
        self._cursor = cursor
        self._source = source
        self._stale = stale
        self._round = None
        self._committed = None
        self._watch_generation()
        if self._config.durable:  # written before anyone hears of it
            self._stored = self.durable_record(r.reason)
            self._out.append(Persist(self._generation, self._term, self._stored))
        terms = {"term": self._term} if self._term else {}
        self._out.append(Record(rec(
            now, "ok", "generation", KEEPER, gen=self._generation,
            **members_delta("members", members, self._recorded_members),
            cursor=cursor.to_json(), source=source, reason=r.reason, stale=len(stale), **terms)))
        self._recorded_members = members  # the list the history holds now
        if self._config.sharding is None:
            self._out.append(Formed(self._generation, members, cursor, source, stale, r.reason))
        else:
            self._out.append(Record(self._recovery_record(now)))
            self._out.append(Formed(self._generation, members, cursor, source, stale, r.reason,
                                    self._placement.shards, self._recovery, self._fallback))
        self._out.append(Broadcast(members, self._membership()))

    def _shards(self, now: float, r: Round, members: tuple[WorkerId, ...], cursor: Cursor,
                source: Optional[WorkerId], stale: tuple[WorkerId, ...],
                ) -> tuple[Cursor, Optional[WorkerId], tuple[WorkerId, ...]]:
        """Place or replan the state shards; on a lost shard, resume from the checkpoint.

        A holder counts only if it holds the state at the resume cursor: a
        member that answered without state (still copying) or behind holds
        nothing the others could use. Checkpoint-restart reloads everything
        anyway, so it only places the shards anew.
        """
        spec = self._config.sharding
        assert spec is not None
        holding = (r.by_cursor.get(cursor, EMPTY) & r.previous) if source is not None else EMPTY
        # a member whose state predates the previous generation never ran that
        # generation's recovery: it holds none of the shards placed on it then
        before = r.generation - 1
        behind = [w for w, g in r.state_gen.items() if g < before]
        if behind and holding:
            holding = holding - behind
        fresh = self._config.strategy == CHECKPOINT_RESTART and source is None
        prev = self._recovery
        # no step committed since the last generation formed: its copies may be unfinished
        in_flight = [(c.shard, c.dst) for c in prev.copies] if prev is not None and \
            cursor == self._cursor else []
        d = decide(spec, self._placement, members, holding, fresh, in_flight)
        self._steps_lost = 0
        if d.fallback:
            back = self._checkpoint or Cursor()
            self._steps_lost = cursor.step - back.step
            cursor, source, stale = back, None, members
        self._placement, self._recovery, self._fallback = d.placement, d.recovery, d.fallback
        return cursor, source, stale

    def _recovery_record(self, now: float) -> dict:
        """The history's account of this generation's shard recovery (rollcall.core.history)."""
        spec = self._config.sharding
        plan = self._recovery
        if plan is None:
            return rec(now, "info", "recovery", KEEPER, gen=self._generation, initial=True,
                       fallback=False, lost=[], copies=0, reloads=0, bytes_moved=0,
                       bytes_reloaded=0, steps_lost=0)
        return rec(now, "info", "recovery", KEEPER, gen=self._generation, initial=False,
                   fallback=self._fallback, lost=runs_of_sorted(plan.lost),
                   copies=len(plan.copies), reloads=len(plan.reloads),
                   bytes_moved=plan.bytes_moved(spec.shard_bytes),
                   bytes_reloaded=plan.bytes_reloaded(spec.shard_bytes),
                   steps_lost=self._steps_lost)

    def _resume_point(self, r: Round, old: IdRuns, new: IdRuns,
                      overflow: bool = False) -> tuple[Cursor, Optional[WorkerId]]:
        """The most advanced state among the members wins; ties go to an old
        member, then to the lowest id. With no state at all, the checkpoint."""
        admitted = old | new if overflow else r.joined
        held = sorted((c for c, ws in r.by_cursor.items()
                       if c is not None and not ws.isdisjoint(admitted)), reverse=True)
        fallback = self._checkpoint or Cursor()
        for best in held:
            if best < fallback:
                break
            holders = r.by_cursor[best]
            for group in (old, new):
                candidates = holders & group
                assert isinstance(candidates, IdRuns), "in id order: the first match is the lowest"
                for w in candidates.ascending():  # mostly the first: derive no runs
                    if self._on_lineage(best, r.state_gen.get(w)):
                        return best, w
        return fallback, None

    def _on_lineage(self, cursor: Cursor, state_gen: Optional[int]) -> bool:
        """Is a state of generation ``state_gen`` at ``cursor`` still on the
        lineage? Not if a later generation resumed behind it: that branch was
        abandoned, and resuming it would fork the training history."""
        if state_gen is None:  # answered a roll call of the latest generation
            return True
        for gen, step in reversed(self._resumes):
            if gen <= state_gen:
                break
            if step < cursor.step:
                return False
        return True

    def _membership(self) -> Membership:
        if self._placement is None:
            return Membership(self._generation, self._members, self._member_lives, self._cursor,
                              self._source, self._stale, term=self._term)
        return Membership(self._generation, self._members, self._member_lives, self._cursor,
                          self._source, self._stale, self._placement.shards, self._recovery,
                          self._fallback, self._term)

    def _refuse(self, now: float, worker: WorkerId, incarnation: int, what: str,
                reason: str) -> None:
        self._out.append(Record(rec(now, "info", "refuse", KEEPER, worker=worker,
                                    incarnation=incarnation, what=what, reason=reason)))
        self._out.append(Send(worker, Refused(worker, incarnation, self._generation, reason,
                                              self._term)))

    def _flush(self) -> list[Output]:
        """The outputs so far, up to the first :class:`Persist`: what follows
        it is held back until :meth:`persisted` answers."""
        out, self._out = self._out, []
        if self._config.durable:
            for i, o in enumerate(out):
                if isinstance(o, Persist):
                    assert self._awaiting is None and not self._held, "one Persist at a time"
                    self._awaiting = o.generation
                    out, self._held = out[:i + 1], out[i + 1:]
                    break
        return out


def _first_life(worker: WorkerId) -> int:
    """The life a lives-less batch of first joins claims: 0."""
    return 0


def _table_fields(table: LifeTable) -> dict:
    """A life table's fields, as :meth:`LifeTable.from_data` takes them (a
    copy that shares nothing with ``table``)."""
    data = table.to_data()
    return {"own": data["own"], "cohort": IdRuns(data["cohort"]), "base": data["base"],
            "delta": data["delta"]}
