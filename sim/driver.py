"""The simpy driver of the shared core: ``run(scenario, out_dir) -> summary``.

What is simulated, and where the core decides
---------------------------------------------
* **Nodes** live in flat numpy arrays (hardware up, process running, paused,
  incarnation, heartbeat phase, member of the current generation). Failures
  are per node: a node's k-th hardware life is draw k of the stream
  ``node/<i>`` (:class:`rollcall.core.Draws`, the real target's too), so the
  failure trace depends only on the seed, never on the strategy. Which
  fault is due when (scripted, crash, random slowdown) is the core's
  :class:`rollcall.core.FaultPlan`, the real launcher's too: the driver
  tells it which nodes came up and went down. A failed node comes back
  after ``repair_s`` as a new incarnation and joins.
* **The record-keeper** is the core's :class:`rollcall.core.keeper.Keeper`. Every
  membership decision (who is in generation g, where it resumes, who is
  stale, when the whole job restarts, when it gives up) is its output; the
  driver only turns outputs into simulated effects after the network latency
  (``network.latency_s``; a ``delay`` or ``loss`` fault degrades one host's
  link: :mod:`sim.network` prices the heartbeats, the exchange and single
  messages through it).
* **Failure detection** is not simulated beat by beat: the keeper is told
  in the core's exact bulk form. At every tick it hears that every tracked
  node but the silent ones beats on time (``observe_beating_except(now,
  silent)``: those never expire). When a node goes silent (crash, pause,
  beats held back) the driver tells it when the node's last beat arrived
  (``observe_silent``, at ``detector.last_arrival``). The keeper is woken
  at its own timer, ``Keeper.get_timer`` (:meth:`sim.keeper_port.KeeperPort.rearm` after
  every call that may move it): a silent node's expiry, a round's
  deadlines, the lease, giving up; ``handle_timer(now)`` gives the
  verdicts. The keeper hears commit votes when they arrive (each input
  first casts those that reached it, and a node's loss or the keeper's
  cut from etcd casts them too).
* **Exits.** A scripted ``kill`` (or ``kill_rack``) kills the node's
  process and its host sees it exit, as the real launcher does through a
  pidfd: the driver reports ``Keeper.exited`` ``detector.exit_notice_s``
  later (default: one ``network.latency_s``, the host's message to the
  keeper), and the keeper evicts the life (``exited``) before its detector
  would. A random lifetime's end is
  the machine's (``crash``): nobody is left to report, the detector decides.
* **Agents.** Every process runs the core's worker side: the bulk as one
  :class:`rollcall.core.AgentBatch` (N agents held as groups of identical
  state, shown equal to N single :class:`Agent`s by
  ``tests/test_agent_batch.py``), with heartbeats not simulated (liveness is
  reported to the keeper in bulk, above). Roll calls, memberships and the
  keeper's single sends reach the batch after the latency, and what its
  agents answer goes to the keeper: the first joins and a relaunch's new
  lives as one ``JoinBatch`` each, a roll call's answers as one per group
  (the members holding the committed state with their cursor, the stale
  ones still copying or loading with none). The driver only reports facts
  to them: the trainers hold the committed state (``step_committed``), a
  process started (``start``), died or was torn down (``discard``). A
  newcomer's agent (repair, scripted join) starts singly (its ``Join``)
  and joins the batch. Small runs (``ledger == "samples"``) also write the
  agents' per-worker records (``enter``, ``abort``, ``fenced``).
* **Paused workers** are silent for ``for_s``. While a member is silent the
  all-or-nothing gradient exchange cannot complete, so the job stalls. A
  paused node's agent is taken out of the batch (in its exact state);
  messages sent to it are held until it resumes, then handed to it, and it
  goes back into the batch. If it resumes before the detector fires,
  training continues where it stopped. If it was evicted, its agent's first
  heartbeat is refused by the keeper (``not-member``), the agent is fenced
  and rejoins as a newcomer, which opens a growth round.
* **Steps** are simulated at job level in ranges: a generation's step time is
  ``max micro-batches per member * micro_batch_s + exchange_s`` (the
  reduction's exchange, ``Scenario.exchange_s``: exact mode costs more) with the
  shard split and the batch of :mod:`rollcall.core.reshard` (``step_batch``,
  ``rank_range``). A contiguous run of steps inside a generation (closed at
  checkpoints, interruptions, scripted ``at_step`` faults and growth roll
  calls) counts only through the keeper's commit vote (``Keeper.commit``,
  the rule the real launcher applies): each step's vote reaches the keeper
  one latency after the step ends, and the driver casts it before the first
  keeper call that comes later (:mod:`sim.steps`), so a step whose vote
  arrives after a roll call opened is refused and lost, as on real. The
  steps that passed are one ``commit`` record stamped with the member whose
  vote passed them (the lowest live one); the job is complete when the
  keeper says so of the last step's vote. The run's ledger follows: one
  ``contribute`` record per member and step with the dataset ids of its
  shards, as the real worker writes it, up to ``LEDGER_SAMPLES`` samples
  (or always with ``ledger=True``, ``rollcall run --ledger``), else one
  compact record per run that the checker expands.
* **Strategies.** ``elastic``: survivors roll call, reshard, newcomers copy
  the state, striped over the members that hold it (``model_params *
  bytes_per_param / bandwidth_Bps + latency_s`` while they outnumber the
  newcomers, :func:`sim.sharded.replicated_copy_time`), then continue. ``checkpoint-restart``: the
  keeper's ``RestartJob`` tears every member process down and its
  ``Relaunch`` names a new incarnation for each member whose node is up;
  each process starts ``restart_s`` later (unless its node fails first)
  and joins (one ``JoinBatch`` of new lives), the keeper resumes from the checkpoint
  it was told of (``Checkpointed``), the job pays ``checkpoint_read_s`` and
  redoes the lost steps. The keeper waits for an expected relaunched worker
  ``restart_s`` plus the detector's silence (``KeeperConfig.relaunch_timeout_s``). Both
  strategies write a checkpoint every ``checkpoint_interval_steps``
  (``checkpoint_write_s``); a checkpoint is durable only if no member failed
  while it was written.
* **Sharded state** (``state.sharding: sharded``): the keeper places the
  shards and, at every generation, either lists the peer copies that
  restore the dead workers' replicas or falls back on the checkpoint (a
  shard lost: ``Formed.fallback``). The driver prices what it is told
  (:mod:`sim.sharded`): copies take the busiest link's bytes over
  ``bandwidth_Bps``; a fallback is a checkpoint resume like any other
  (``checkpoint_read_s``, steps since the checkpoint redone). Replicated
  state (the default) takes none of these paths.
* **Rack failures** (``kill_rack``): every node of the rack whose hardware
  is up goes down at once (one ``fault`` record, ``kind: kill_rack``).
* **Spares** are idle nodes that join at the start: the keeper holds joiners
  beyond ``max_workers`` as standbys and admits them in the next round, so a
  failure is replaced at the roll call (or the restart) that follows it.
  Standbys fail like any node.

Time accounting: every simulated second from 0 to the end belongs to exactly
one of productive (steps finally committed), lost (steps rolled back or
abandoned mid-flight), stall (a silent member blocks the exchange until it
resumes or is evicted), recovery (rounds, restarts, state copy, checkpoint
load) and checkpoint (writes).
"""

from __future__ import annotations

import dataclasses
import time as _time
from pathlib import Path
from time import perf_counter as _perf
from typing import Any, Callable, Optional

import simpy

from rollcall.config import (
    data_spec, draws, horizon_s, job_policy, keeper_config, repair_shop, scheduled_faults,
)
from rollcall.core import (
    DRIVER, EMPTY, JOB, Checkpointed, Completion, Cursor, FailureTally, FaultPlan,
    Final, Formed, IdRuns, Keeper, Membership, Relaunch, RollCall, check, rec,
)
from rollcall.results import write_summary
from rollcall.scenario import Scenario

from sim.agents import Agents
from sim.failover import KeeperFailover
from sim.fault_timing import StepFaults
from sim.gray import GrayFaults
from sim.keeper_port import KeeperPort
from sim.machines import Machines
from sim.nemesis import Nemesis
from sim.network import NetFaults
from sim.sharded import entry_cost_s
from sim.silence import Silences
from sim.ledger import Ledger
from sim.state import Nodes, Recorder, Tally, flags_of_ids
from sim.stepping import SimulationStuck, Stepper, few_collections
from sim.steps import EPS, StepPlans, StepRun
from sim.summary import RunFacts, run_summary
from sim.votes import Votes
from sim.world import CKPT, DONE, IDLE, RUN, SYNC, WAIT

__all__ = ["run", "Simulation", "SimulationStuck"]  # SimulationStuck: sim.stepping's

# Where the job's time goes while it is in a state (running steps: see
# Simulation._close_segment; WAIT: the last step's vote was refused and a roll
# call comes, so the wait is lost work).
_SPENT_ON = {CKPT: "checkpoint", IDLE: "recovery", SYNC: "recovery", WAIT: "lost"}


# a run writes the per-sample ledger by default up to this many samples
# (steps x global batch, and the dataset an epoch's permutation spans)
LEDGER_SAMPLES = 1_000_000
# the records FailureTally reads (the rest pass it by)
_TALLIED = frozenset(("fault", "evict"))
class Simulation:
    """One run of one scenario with one seed. Use :func:`run`."""

    def __init__(self, scenario: Scenario, out_dir: Optional[Path] = None,
                 flush_every: int = 4096, relaunch_timeout_s: Optional[float] = None,
                 ledger: Optional[bool] = None) -> None:
        sc = scenario
        self.sc = sc
        self.env = simpy.Environment()
        self.lat = float(sc.network.latency_s)
        notice = sc.detector.exit_notice_s  # a killed process's exit, heard by the keeper
        self.exit_notice_s = self.lat if notice is None else float(notice)
        config = keeper_config(sc)
        if relaunch_timeout_s is not None:  # regression tests of older keeper settings
            config = dataclasses.replace(config, relaunch_timeout_s=relaunch_timeout_s)
        self.detector = config.detector
        self.keeper = Keeper(config)
        self.keeper.observe_beating_except(0.0, ())  # the workers it will track beat on time
        self.policy = job_policy(sc)
        self.draws = draws(sc)  # node lifetimes and random targets, as on real
        # which fault is due when: the core's plan, as on real (under
        # failures.age: computing, sim.aging times the crashes)
        self.plan = FaultPlan(scheduled_faults(sc), self.draws,
                              crashes=sc.failures.age != "computing")
        self.step_faults = StepFaults(self.plan)  # at_step faults: when they come due here
        self.shop = repair_shop(sc, self.draws)  # repairs, retirements, the cold pool
        self.W = sc.cluster.workers
        self.n_nodes = sc.worker_id_limit
        n = self.n_nodes
        self.nodes = Nodes.zeros(n)  # the physical world, per node
        # hardware lives and the repair shop's answers (sim.machines); under
        # failures.age: computing (AIReSim's assumption) only members age, while computing
        self.machines = Machines(self, sc.failures.age == "computing", sc.cluster.launch_s,
                                 sc.strategy.restart_s, self._wake_faults)
        self.plans = StepPlans(sc)  # each member count's batch, step time and shards
        # --- random streams ------------------------------------------------
        self.seed = sc.seed
        self._init_job(ledger)
        # every process's core agent (sim.agents)
        self.agents = Agents(self, sc.detector.heartbeat_s, self.ledger.kind == "samples")
        self.silences = Silences(self)  # lost, paused, cut off, late (sim.silence)
        self.tally = Tally(self.W)  # where the simulated time went, and counters
        self.failures = FailureTally()
        self.completed = False
        self.end_reason = ""
        self.recorder = Recorder(Path(out_dir) if out_dir is not None else None, flush_every)
        self.records = self.recorder.records  # the history, kept for the checkers
        self.port = KeeperPort(self, self)  # the keeper's inputs and outputs (sim.keeper_port)
        self.check_s = 0.0
        self.done = self.env.event()
        # the event loop: to the end, or ended early (sim.stepping)
        self.stepper = Stepper(self.env, self.done, self.n_nodes, self._describe,
                               lambda now, reason: self.finish(now, False, reason))
        self._job_proc: Optional[simpy.Process] = None
        self._job_waiting = False
        self._job_wait: Optional[float] = None
        self.failover = KeeperFailover(self)  # the keeper's deaths and takeovers (sim.failover)
        self.net = NetFaults(self)  # per-host links: delay, loss (sim.network)
        self.gray = GrayFaults(self)  # slow workers, late heartbeats (sim.gray)
        self.nemesis = Nemesis(self)  # carries out each fault the plan hands out (sim.nemesis)
        # strategy.stragglers: evict: the members' compute goes with each vote,
        # and while one is slow each step's vote is cast as it arrives
        self.watch_compute = config.stragglers is not None and config.strategy == "elastic"

    def _init_job(self, ledger: Optional[bool]) -> None:
        """The job's state: where it stands, its running segment, its votes."""
        sc, w = self.sc, self.sc.workload
        self.state = IDLE
        self.gen = 0
        self.members: IdRuns = EMPTY
        self.cursor = Cursor()     # what the members computed
        self.committed = Cursor()  # what the keeper committed (the trainers applied)
        self.completion = Completion()  # the vote's verdict and the members' final reports
        # the per-sample ledger (True), the compact one (False), or by size
        # (the data order of an epoch is a permutation of the whole dataset)
        if ledger is None:
            ledger = (w.steps * w.global_batch <= LEDGER_SAMPLES
                      and w.dataset_samples <= LEDGER_SAMPLES)
        self.ledger = Ledger(self.write, sc.seed, w, "samples" if ledger else "compact", self.lat)
        self.votes = Votes(self)  # the computed steps' commit votes (sim.votes)
        self.step_s = 0.0
        self.batch = w.global_batch
        self.seg_t0 = 0.0
        self.seg_c0 = Cursor()
        self.seg_stop = 0
        self.due: Optional[float] = None
        self.stalled = False
        self.stall_remaining = 0.0
        self.carry = 0.0
        self.carry_head_s = 0.0  # the carried partial step's head_s (see StepRun)
        self.stale: IdRuns = EMPTY  # members copying / loading the state
        self.answered = 0  # the latest round the members answered

    # ------------------------------------------------------------------ plumbing

    def count(self, name: str) -> None:
        """One more of ``name`` (a kill, a join, ...) for the summary."""
        self.tally.counts[name] += 1

    def write(self, record: dict) -> None:
        self.recorder.write(record)
        if record["f"] in _TALLIED:
            self.failures.feed(record)  # the summary's failures, read from the records

    def at(self, t: float, fn: Callable[..., None], *args: Any) -> None:
        ev = self.env.timeout(max(0.0, t - self.env.now))
        ev.callbacks.append(lambda _ev: fn(*args))

    def one_way_s(self, w: int) -> float:
        """One way between the keeper and worker ``w``: its host's link (:mod:`sim.network`)."""
        return self.net.one_way_s(w) if self.net.links.degraded else self.lat

    def alive(self, w: int) -> bool:
        return bool(self.nodes.proc[w] and not self.nodes.paused[w])

    def _wake_faults(self) -> None:
        """A node came up: the fault plan may have something due sooner."""
        self.nemesis.wake()

    @property
    def finished(self) -> bool:
        """Whether the run is over: nothing more is carried out."""
        return self.state == DONE

    @property
    def voting(self) -> bool:
        """Whether commit votes are on their way to the keeper."""
        return bool(self.votes.runs)

    # ------------------------------------------------------------------ nodes

    def launch(self, now: float, w: int, incarnation: int) -> list:
        """Start a worker process on node ``w`` as ``incarnation``; return
        what its agent sends first (a Join), the agent joining the batch."""
        self.nodes.started(w, incarnation)
        self.nodes.proc[w] = True
        self.nodes.paused[w] = False
        self.nodes.started_at[w] = now
        self.silences.launched(w)
        return self.agents.launch(now, w, incarnation)

    # ------------------------------------------------------------------ job process

    def _job_process(self):
        while self.state != DONE:
            due = self.due
            self._job_wait = due
            self._job_waiting = True
            try:
                if due is None:
                    yield self.env.event()
                else:
                    yield self.env.timeout(max(0.0, due - self.env.now))
            except simpy.Interrupt:
                continue
            finally:
                self._job_waiting = False
            if self.due == due and due is not None:
                self.due = None
                self._on_due(self.env.now)
                self._run_ahead()

    def _run_ahead(self) -> None:
        """Meet the job's next deadlines here while no other event comes first.

        Between failures a job only runs segments and writes checkpoints. When
        nothing else is scheduled up to the next deadline, meeting it inline
        instead of through a simpy timeout writes the same history (every
        instant used is explicit; the env's clock lags until the next yield)
        with a third of the events.
        """
        env = self.env
        met = 0
        while (self.due is not None and self.state in (RUN, CKPT) and not self.stalled
               and not self.agents.any_single and self.step_faults.none_pending() and self.due < env.peek()):
            met += 1
            stepper = self.stepper
            if met % 64 == 0 and stepper.halt is None:
                stepper.check()  # an early end waits for a yield
            if stepper.halt is not None:
                break
            due, self.due = self.due, None
            stepper.ahead_t = due
            self._on_due(due)

    def _set_due(self, t: Optional[float]) -> None:
        self.due = t
        # A later (or no) deadline needs no wake-up: the stale timeout fires,
        # finds the deadline changed and waits again.
        if (t is not None and self._job_waiting and self._job_proc is not None
                and (self._job_wait is None or t < self._job_wait)
                and self.env.active_process is not self._job_proc):
            self._job_waiting = False
            self._job_proc.interrupt()

    def _acct(self, now: float) -> None:
        """Attribute [mark, now) to the category of the current job state.

        Running time is attributed by :meth:`_close_segment` (committed steps
        are productive until a rollback, a step abandoned mid-flight is lost).
        """
        self.tally.spend(now, "stall" if self.stalled else _SPENT_ON.get(self.state))

    def _clock(self, now: float) -> None:
        """Tell the compute clock (``failures.age: computing``) whether the job computes."""
        if self.machines.aging is not None:
            self.machines.aging.clock(now, self.state in (RUN, CKPT) and not self.stalled)

    def _start_segment(self, now: float) -> None:
        self._acct(now)
        self.state = RUN
        self.seg_t0 = now - self.carry
        head_s = self.carry_head_s
        self.carry = self.carry_head_s = 0.0
        self.seg_c0 = self.cursor
        stop = self.policy.next_boundary(self.cursor.step)
        fault = self.step_faults.next_stop(self.cursor.step)
        if fault is not None:
            stop = min(stop, fault)
        if self.net.touched or self.gray.touched:  # a link or member degraded once: reprice
            t0 = self.seg_t0
            base_s = self.gray.step_s(self.plans.step_s(len(self.members)))  # slow members stretch it
            stop, self.step_s, self.seg_t0 = self.net.segment(now, stop, base_s, self.step_s, t0)
            head_s += self.seg_t0 - t0  # the step in flight is charged what it cost
        self.seg_stop = stop
        c = self.cursor
        run = StepRun(self.gen, c.step, c.sample, self.batch, self.seg_t0, self.step_s,
                      stop - c.step, self.members, head_s=head_s)
        self.votes.runs.append(run)
        self._set_due(self.seg_t0 + (stop - self.seg_c0.step) * self.step_s)
        if self.watch_compute:  # a slowdown's start or end starts a new segment
            run.compute = self.gray.compute(self.plans.step_s(len(self.members)))
            self.votes.watch()
        self._clock(now)

    def restart_segment(self, now: float) -> None:
        """A price changed (a link or a member's speed): a running segment is
        closed where it stands and started again at the new price (the
        partial step carried over)."""
        if self.state == RUN and not self.stalled:
            self._close_segment(now, None, abandon=False)
            self._start_segment(now)

    def _close_segment(self, now: float, k: Optional[int], abandon: bool) -> None:
        """Close the running segment: its steps finished by ``now`` are
        computed (their votes decide whether they count), the rest is
        abandoned (``abandon``) or carried into the next segment."""
        t0, c0, s = self.seg_t0, self.seg_c0, self.step_s
        if k is None:
            k = min(self.seg_stop - c0.step, int((now - t0) / s + EPS))
        run = self.votes.runs[-1]
        assert not run.closed and run.first == c0.step and run.voted <= k, (run, k)
        run.n = k
        head_s = 0.0  # the partial step's, when it is the run's first
        if k == 0:
            self.votes.runs.pop()
            head_s = run.head_s
        self.cursor = Cursor(c0.step + k, c0.sample + k * self.batch)
        partial = max(0.0, now - (t0 + k * s))
        if abandon:
            self.tally.lose(partial + head_s)
        else:
            self.carry, self.carry_head_s = partial, head_s
        self.tally.spend(now, None)

    # ------------------------------------------------------------------ commit votes

    def cast_votes(self, t: float, everything: bool = False) -> None:
        """Cast the commit votes that reached the keeper by ``t`` (:meth:`sim.votes.Votes.cast`)."""
        self.votes.cast(t, everything)

    def passed(self, t: float, cursor: Cursor, complete: bool) -> None:
        """Steps up to ``cursor`` passed the vote at ``t``: the trainers hold
        that state; ``complete``: the keeper says the job is done."""
        self.committed = cursor
        if complete:
            self.completion.job_complete(t)
            if self.state == WAIT:  # a vote later than the check
                self.at(t, self._final_vote)

    def _abandon(self, now: float) -> None:
        """The step in flight (or sync / checkpoint write) is given up."""
        if self.state == RUN:
            if self.stalled:
                self._acct(now)
                self.tally.lose(self.carry + self.carry_head_s)
                self.carry = self.carry_head_s = 0.0
            else:
                self._close_segment(now, None, abandon=True)
        else:
            self._acct(now)
        self.stalled = False
        self.state = IDLE
        self._set_due(None)
        self._clock(now)

    def stall(self, now: float) -> None:
        if self.state not in (SYNC, RUN, CKPT) or self.stalled:
            return
        if self.state == RUN:
            self._close_segment(now, None, abandon=False)
        else:
            self._acct(now)
            self.stall_remaining = max(0.0, (self.due or now) - now)
        self.stalled = True
        self._set_due(None)
        self._clock(now)

    def unstall(self, now: float) -> None:
        if not self.stalled:
            return
        self._acct(now)
        self.stalled = False
        if self.state == RUN:
            self._start_segment(now)
        else:
            self._set_due(now + self.stall_remaining)

    def formed(self, now: float, f: Formed) -> None:
        """The keeper closed a generation: the members enter it after the latency."""
        if self.state == DONE:
            return
        if self.state in (SYNC, RUN, CKPT, WAIT):
            self._abandon(now)  # cannot happen without a roll call; be safe
        self.cast_votes(now, everything=True)  # a new generation: the old one's votes fail
        self.ledger.flush()
        self._acct(now)
        self.state = IDLE
        self.stalled = False
        self._clock(now)
        self.carry = self.carry_head_s = 0.0
        if f.cursor < self.committed:
            self.tally.rollback(f.cursor.step)
        self.cursor = self.committed = f.cursor
        self.gen = f.generation
        self.members = IdRuns.of(f.members)
        self.votes.new_generation(self.members)
        n = len(f.members)
        self.nodes.member_flags = flags_of_ids(f.members, len(self.nodes.proc))
        self.nodes.is_member = self.nodes.member_flags.copy()
        self.tally.min_members = min(self.tally.min_members, n)
        self.batch, self.step_s, assignment = self.plans.of(f.members)
        self.write(rec(now, "info", "assign", JOB, gen=f.generation, batch=self.batch,
                        step_s=round(self.step_s, 9), **assignment))
        cost = entry_cost_s(f, self.sc, self.keeper.config.sharding, self.lat)
        self.stale = IdRuns.of(f.stale)
        self.silences.recount()
        self.at(now + self.lat, self._enter, f.generation, cost)

    def membership(self, to: IdRuns, m: Membership) -> None:
        """A generation's member list reaches the agents it was sent to."""
        now = self.env.now
        to = IdRuns.of(to)
        self.agents.hold_for_singles(m, to)  # paused processes: they hear it later
        msgs = self.agents.receive(now, m, to)
        if msgs:
            self.at(now + self.lat, self.port.receive_at, msgs)

    def _enter(self, gen: int, cost: float) -> None:
        if gen != self.gen or self.state != IDLE or self.answered > gen:
            return  # superseded, or the members already answered the next roll call
        now = self.env.now
        self._acct(now)
        self.state = SYNC
        silent = self.silences.recount()
        self.stall_remaining = cost
        if silent:
            self.stalled = True
            self._set_due(None)
        else:
            self._set_due(now + cost)

    def _on_due(self, now: float) -> None:
        st = self.state
        if st == CKPT:
            self.cast_votes(now)  # the checkpoint is written once its step passed
        if st == SYNC:
            self._start_segment(now)
        elif st == RUN:
            self._close_segment(now, self.seg_stop - self.seg_c0.step, abandon=False)
            self.state = IDLE  # between segments; _after_step picks what comes next
            self._after_step(now)
        elif st == CKPT:
            self._checkpoint_done(now)
        self._clock(now)

    def _after_step(self, now: float) -> None:
        """A segment ended at a boundary: checkpoint, finish, answer or continue."""
        step = self.cursor.step
        if self.policy.complete(step):
            # the keeper decides: its verdict on the last step's vote
            self.state = WAIT
            self.at(now + self.lat, self._final_vote)
            return
        due = self.step_faults.due(step)  # out of the plan before the next segment is cut
        if self.policy.checkpoint_due(step):
            self._acct(now)
            self.state = CKPT
            self._set_due(now + self.sc.strategy.checkpoint_write_s)
        else:
            self._start_segment(now)
        schedule = self.sc.failures.schedule
        for fault in due:
            self.nemesis.scripted(now, schedule[fault.index])

    def _final_vote(self) -> None:
        if self.state != WAIT:
            return  # a roll call came first: the step is redone
        now = self.env.now
        self.cast_votes(now)
        if not self.completion.complete:
            return
        # each member with a process reports its end at once (no transit is modelled)
        reporting = [m for m in self.members if self.nodes.proc[m]]
        report = Final(self.committed.to_json(), None)
        for m in reporting:
            self.completion.final(m, report)
        if self.completion.done(now, reporting):
            self.finish(now, True, "steps reached")

    def _checkpoint_done(self, now: float) -> None:
        if self.committed != self.cursor:
            # the checkpoint is of the step being voted on: written once it passed
            runs = self.votes.runs
            last = runs[-1] if runs else None
            if last is not None and not last.refused:
                assert last.closed and last.voted < last.n, last
                self._set_due(max(now, last.vote_at(last.n, self.lat)))
                return
            self._acct(now)  # refused: the state is not the lineage's, a roll call comes
            self.state = WAIT
            self._set_due(None)
            return
        self._acct(now)
        self.tally.counts["checkpoints"] += 1
        self.write(rec(now, "ok", "checkpoint", JOB, gen=self.gen, cursor=self.cursor.to_json()))
        reporter = self.votes.voter()  # the lowest live member
        if self.alive(reporter):
            msg = Checkpointed(reporter, self.nodes.life_of(reporter), self.gen, self.cursor)
            t = now + self.lat
            if t < self.env.peek() and not self.agents.any_single:
                self.port.receive(t, [msg])  # nothing else happens first: deliver it now
            else:
                self.at(t, self.port.receive_at, [msg])
        self._start_segment(now)

    def roll_call(self, to: IdRuns, call: RollCall) -> None:
        """A roll call reaches the members it was sent to."""
        now = self.env.now
        if self.state == DONE:
            return
        to = IdRuns.of(to)
        self.agents.hold_for_singles(call, to)  # paused processes: they hear it later
        if call.generation == self.gen + 1:
            # Whatever the reason, a member abandons the step in flight (or the
            # state copy, or the checkpoint write) and joins (rollcall.core.messages.RollCall).
            self.cast_votes(now)  # the round is open: no vote still on its way can pass
            self.answered = self.gen + 1
            synced = self.state in (RUN, CKPT, WAIT)  # the stale members finished the copy / load
            self._abandon(now)
            self.cast_votes(now, everything=True)
            # the fact the agents are told: their trainers hold the committed
            # state (a stale member, before its copy or load is done, none)
            holders = to if synced or not self.stale else to - self.stale
            self.agents.step_committed(now, self.committed, holders)
        msgs = self.agents.receive(now, call, to)
        if msgs:  # the members with a state first, then those without
            msgs.sort(key=lambda m: m.cursor is None)
            self.at(now + self.lat, self.port.receive_at, msgs)

    def restart(self, now: float, teardown: IdRuns) -> None:
        """Checkpoint-restart: the job's step is given up and the process of
        every worker in ``teardown`` torn down (:meth:`sim.machines.Machines.tear_down`);
        the keeper's :class:`Relaunch` that follows says which nodes get a
        fresh process (a stopped process is killed by the teardown too, and
        its node relaunched)."""
        self.tally.counts["restarts"] += 1
        if self.state in (SYNC, RUN, CKPT, WAIT):
            self._abandon(now)
        self.cast_votes(now, everything=True)
        self._acct(now)
        self.stalled = False
        self.machines.tear_down(teardown)
        self.state = IDLE
        self._set_due(None)
        self._clock(now)

    def relaunch(self, now: float, order: Relaunch) -> None:
        """The keeper relaunched the nodes it names (:meth:`sim.machines.Machines.relaunch`)."""
        self.machines.relaunch(now, order)

    def finish(self, now: float, completed: bool, reason: str) -> None:
        if self.state == DONE:
            return
        if self.state == RUN and not self.stalled:
            self._close_segment(now, None, abandon=True)
        if completed:
            assert not self.votes.runs, "the keeper completed the job with votes outstanding"
            self.tally.spend(now, None)  # the job's time ended with its last step (elapsed_s)
            self.tally.end_s = self.tally.end_s or self.tally.elapsed_s
        else:
            self._acct(now)
            if self.state == RUN:
                self.tally.lose(self.carry + self.carry_head_s)
            for run in self.votes.runs:  # votes nobody will answer: the steps are lost
                self.tally.lose((run.n - run.voted) * run.step_s + run.unvoted_head_s())
                run.voted = run.n
                self.ledger.run_closed(run)
            self.votes.runs.clear()
            self.tally.end_s = self.tally.end_s or now
        self.ledger.flush()
        self.state = DONE
        self._clock(now)
        self.completed = completed
        self.end_reason = reason
        self.write(rec(now, "info", "end", DRIVER, completed=completed,
                        cursor=self.completion.end_cursor(self.committed.to_json()),
                        reason=reason))
        if not self.done.triggered:
            self.done.succeed()

    def _horizon(self) -> None:
        self.finish(self.env.now, False, "horizon: simulated time limit reached")

    # ------------------------------------------------------------------ run

    def run(self, max_wall_s: Optional[float] = None,
            stop: Optional[Callable[[], Optional[str]]] = None) -> dict:
        """Simulate to the end, or until ``max_wall_s`` seconds of wall clock have passed,
        or until ``stop()`` returns a reason (an interrupt: ``result`` "interrupted")."""
        assert max_wall_s is None or max_wall_s > 0, max_wall_s
        with few_collections():
            return self._run(max_wall_s, stop)

    def _describe(self) -> str:
        """Where the job stands, for a stuck run's message."""
        return f"job state {self.state}, committed {self.committed.step} steps"

    def _run(self, max_wall_s: Optional[float],
             stop: Optional[Callable[[], Optional[str]]]) -> dict:
        wall0 = _time.perf_counter()
        sc = self.sc
        env = self.env
        n0 = self.W + sc.cluster.spares
        for w in range(n0):
            self.machines.arrive(0.0, w)
        running = self.shop.initial  # the others wait idle (warm_standbys)
        self.nodes.proc[:running] = True
        self.write(rec(0.0, "info", "start", DRIVER, scenario=sc.name, seed=self.seed,
                        strategy=sc.strategy.kind, workers=self.W, spares=sc.cluster.spares))
        # every agent's first message, Join(w, 0, None): one batch
        msgs = self.agents.start(0.0, IdRuns.span(0, running - 1), 0)
        self.at(self.lat, self.port.receive_at, msgs)
        self._job_proc = env.process(self._job_process())
        aging = self.machines.aging
        if aging is not None:
            aging.proc = env.process(aging.process())
        self.nemesis.proc = env.process(self.nemesis.process())
        if self.failover.mtbf_s is not None:
            env.process(self.failover.process())
        # the keeper gives up a job not done by horizon_s (its own timer); the
        # sim's own bound, twice that, ends a run no keeper serves any more
        self.port.rearm(0.0)
        self.at(2 * horizon_s(sc), self._horizon)
        try:
            self.stepper.run(wall0, max_wall_s, stop)
        finally:
            self.recorder.close()  # a crash too keeps every record written before it
        self.events = next(env._eid)  # events scheduled so far (simpy's own counter)
        # validity comes from the core's checkers over the history: the very
        # records just written, not a parse of them (JSON keeps every value
        # exactly; tests/test_sim_determinism.py checks a re-read agrees)
        t = _perf()
        self.report = check(self.records, data_spec(sc))
        self.check_s = _perf() - t
        self.wall_s = _time.perf_counter() - wall0
        return self.summary()

    def summary(self) -> dict:
        """The run's summary (``summary.json``): :func:`sim.summary.run_summary` of its facts."""
        return run_summary(self.sc, self.report, self.tally, RunFacts(
            completed=self.completed, interrupted=self.stepper.interrupted,
            end_reason=self.end_reason, failures=self.failures.count, wall_s=self.wall_s,
            keeper_failovers=self.failover.count, events=self.events,
            keeper_wall_s=self.port.wall_s, check_wall_s=self.check_s))


def run(scenario: Scenario, out_dir: str | Path, ledger: Optional[bool] = None,
        max_wall_s: Optional[float] = None,
        stop: Optional[Callable[[], Optional[str]]] = None) -> dict:
    """Simulate ``scenario`` (its seed, its strategy); write history.jsonl and summary.json.

    ``ledger``: True writes the per-sample ledger whatever the run's size,
    False the compact form; by default the per-sample one up to
    ``LEDGER_SAMPLES`` samples (and dataset ids), the compact one beyond.
    ``max_wall_s``: end the run (not completed, ``end_reason`` "wall limit:
    ...", history and summary written) once that much wall clock has passed.
    ``stop``: polled during the run; once it returns a reason (the CLI's
    "interrupted by SIGINT") the run ends the same way, with ``result``
    "interrupted" and that reason as ``end_reason``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    hist = out / "history.jsonl"
    if hist.exists():
        hist.unlink()  # a rerun into the same directory starts a fresh history
    sim = Simulation(scenario, out, ledger=ledger)
    summary = sim.run(max_wall_s, stop)
    write_summary(out, summary)
    return summary
