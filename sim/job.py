"""The job of one sim run: where it stands, its steps, votes and checkpoints.

The job is the simulated training loop between the keeper's decisions. It
runs a generation's steps in contiguous segments (cut at checkpoints, at
``at_step`` faults and where a price changes), stalls while a member is
silent, writes checkpoints once their step passed the vote, and gives the
step in flight up when a roll call or a restart comes. The keeper's outputs
reach it through :class:`sim.keeper_port.Job` (generations, roll calls,
member lists, restarts, relaunches, the end); it reaches the rest of the
run only through :class:`JobHost`.

Where the time went is read from the history the job writes (its commits'
spans, checkpoint writes, roll calls and faults) by the core's
:func:`rollcall.core.time_account`, the real target's definition too.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Protocol

import simpy

from rollcall.config import job_policy
from rollcall.core import (
    DRIVER, EMPTY, JOB, Completion, Cursor, FaultPlan, Final, Formed,
    IdRuns, KeeperConfig, RollCall, rec,
)
from rollcall.scenario import Scenario

from sim.agents import Agents
from sim.fault_timing import SimStepFaults
from sim.gray import GrayFaults
from sim.host import KeeperOutage
from sim.keeper_port import KeeperPort
from sim.ledger import Ledger
from sim.machines import Machines
from sim.nemesis import Nemesis
from sim.network import NetFaults
from sim.sharded import entry_cost_s
from sim.silence import Silences
from sim.state import Nodes, Tally, flags_of_ids
from sim.stepping import Stepper
from sim.steps import EPS, StepPlans, StepRun
from sim.votes import Votes
from sim.world import CKPT, DONE, IDLE, RUN, SYNC, WAIT

__all__ = ["Job", "JobHost"]



class JobHost(Protocol):
    """What the job needs of the rest of the run."""

    @property
    def sc(self) -> Scenario: ...

    @property
    def env(self) -> simpy.Environment: ...

    @property
    def lat(self) -> float:
        """One message between the keeper and a worker on a sound link, seconds."""

    @property
    def nodes(self) -> Nodes: ...

    @property
    def tally(self) -> Tally:
        """Where the simulated time went, and counters."""

    def at(self, t: float, fn: Callable[..., Any], *args: Any) -> None: ...

    def write(self, record: dict) -> None: ...

    def alive(self, w: int) -> bool: ...

    @property
    def agents(self) -> Agents: ...

    @property
    def silences(self) -> Silences: ...

    @property
    def net(self) -> NetFaults: ...

    @property
    def gray(self) -> GrayFaults: ...

    @property
    def port(self) -> KeeperPort: ...

    @property
    def failover(self) -> KeeperOutage:
        """Whether a keeper serves: while none does, nobody can commit."""

    @property
    def machines(self) -> Machines: ...

    @property
    def nemesis(self) -> Nemesis: ...

    @property
    def stepper(self) -> Stepper: ...


class Job:
    """The simulated training job of one run."""

    def __init__(self, host: JobHost, config: KeeperConfig, plan: FaultPlan,
                 ledger: Ledger, votes: Votes) -> None:
        sc = host.sc
        self._host = host
        self._sharding = config.sharding
        # strategy.stragglers: evict: the members' compute goes with each vote,
        # and while one is slow each step's vote is cast as it arrives
        self._watch_compute = config.stragglers is not None and config.strategy == "elastic"
        self._policy = job_policy(sc)
        self._plans = StepPlans(sc)  # each member count's batch, step time and shards
        self._step_faults = SimStepFaults(plan)  # at_step faults: when they land here
        self.ledger = ledger
        self.votes = votes  # the computed steps' commit votes (sim.votes)
        self.done = host.env.event()  # triggered when the run ends
        self.completed = False
        self.end_reason = ""
        self.state = IDLE
        self.gen = 0
        self.members: IdRuns = EMPTY
        self.cursor = Cursor()     # what the members computed
        self.committed = Cursor()  # what the keeper committed (the trainers applied)
        self.completion = Completion()  # the vote's verdict and the members' final reports
        self.batch = sc.workload.global_batch
        self._step_s = 0.0
        self._seg_t0 = 0.0
        self._seg_c0 = Cursor()
        self._seg_stop = 0
        self._checkpoint_t0 = 0.0  # the checkpoint write's start
        self._due: Optional[float] = None
        self._stalled = False
        self._stall_remaining = 0.0
        self._carry = 0.0
        self._carry_since: Optional[float] = None  # when the carried partial step began
        self._stale: IdRuns = EMPTY  # members copying / loading the state
        self._answered = 0  # the latest round the members answered
        self._process: Optional[simpy.Process] = None
        self._waiting = False
        self._wait_until: Optional[float] = None

    def start(self) -> None:
        """Start the job's process: it meets the job's deadlines."""
        self._process = self._host.env.process(self._loop())

    def describe(self) -> str:
        """Where the job stands, for a stuck run's message."""
        return f"job state {self.state}, committed {self.committed.step} steps"

    # ------------------------------------------------------------------ the job's process

    def _loop(self):
        while self.state != DONE:
            due = self._due
            self._wait_until = due
            self._waiting = True
            try:
                if due is None:
                    yield self._host.env.event()
                else:
                    yield self._host.env.timeout(max(0.0, due - self._host.env.now))
            except simpy.Interrupt:
                continue
            finally:
                self._waiting = False
            if self._due == due and due is not None:
                self._due = None
                self._on_due(self._host.env.now)
                self._run_ahead()

    def _run_ahead(self) -> None:
        """Meet the job's next deadlines here while no other event comes first.

        Between failures a job only runs segments and writes checkpoints. When
        nothing else is scheduled up to the next deadline, meeting it inline
        instead of through a simpy timeout writes the same history (every
        instant used is explicit; the env's clock lags until the next yield)
        with a third of the events.
        """
        env = self._host.env
        met = 0
        while (self._due is not None and self.state in (RUN, CKPT) and not self._stalled
               and not self._host.agents.any_single and self._step_faults.none_pending() and self._due < env.peek()):
            met += 1
            stepper = self._host.stepper
            if met % 64 == 0 and stepper.halt is None:
                stepper.check()  # an early end waits for a yield
            if stepper.halt is not None:
                break
            due, self._due = self._due, None
            stepper.ahead_t = due
            self._on_due(due)

    def _set_due(self, t: Optional[float]) -> None:
        self._due = t
        # A later (or no) deadline needs no wake-up: the stale timeout fires,
        # finds the deadline changed and waits again.
        if (t is not None and self._waiting and self._process is not None
                and (self._wait_until is None or t < self._wait_until)
                and self._host.env.active_process is not self._process):
            self._waiting = False
            self._process.interrupt()

    def _clock(self, now: float) -> None:
        """Tell the compute clock (``failures.age: computing``) whether the job computes."""
        if self._host.machines.aging is not None:
            self._host.machines.aging.clock(now, self.state in (RUN, CKPT) and not self._stalled)

    def _start_segment(self, now: float) -> None:
        self.state = RUN
        self._seg_t0 = now - self._carry
        carried_from = self._carry_since  # the true start of a step carried in
        self._carry = 0.0
        self._carry_since = None
        self._seg_c0 = self.cursor
        stop = self._policy.next_boundary(self.cursor.step)
        fault = self._step_faults.next_stop(self.cursor.step)
        if fault is not None:
            stop = min(stop, fault)
        if self._host.net.touched or self._host.gray.touched:  # a link or member degraded once: reprice
            base_s = self._host.gray.step_s(self._plans.step_s(len(self.members)))  # slow members stretch it
            stop, self._step_s, self._seg_t0 = self._host.net.segment(now, stop, base_s, self._step_s,
                                                                      self._seg_t0)
        self._seg_stop = stop
        # the first step's record starts when it did: before a stall that held
        # it up, or before a new price rescaled the part of it done
        started = carried_from if (carried_from is not None
                                   and abs(carried_from - self._seg_t0) > EPS) else None
        c = self.cursor
        run = StepRun(self.gen, c.step, c.sample, self.batch, self._seg_t0, self._step_s,
                      stop - c.step, self.members, started=started)
        self.votes.runs.append(run)
        self._set_due(self._seg_t0 + (stop - self._seg_c0.step) * self._step_s)
        if self._watch_compute:  # a slowdown's start or end starts a new segment
            run.compute = self._host.gray.compute(self._plans.step_s(len(self.members)))
            self.votes.watch()
        self._clock(now)

    def restart_segment(self, now: float) -> None:
        """A price changed (a link or a member's speed): a running segment is
        closed where it stands and started again at the new price (the
        partial step carried over)."""
        if self.state == RUN and not self._stalled:
            self._close_segment(now, None, abandon=False)
            self._start_segment(now)

    def _close_segment(self, now: float, k: Optional[int], abandon: bool) -> None:
        """Close the running segment: its steps finished by ``now`` are
        computed (their votes decide whether they count), the rest is
        abandoned (``abandon``) or carried into the next segment."""
        t0, c0, s = self._seg_t0, self._seg_c0, self._step_s
        if k is None:
            k = min(self._seg_stop - c0.step, int((now - t0) / s + EPS))
        run = self.votes.runs[-1]
        assert not run.closed and run.first == c0.step and run.voted <= k, (run, k)
        run.n = k
        if k == 0:
            self.votes.runs.pop()
        self.cursor = Cursor(c0.step + k, c0.sample + k * self.batch)
        partial = max(0.0, now - (t0 + k * s))
        if not abandon:
            self._carry = partial
            first = run.started if k == 0 and run.started is not None else t0 + k * s
            self._carry_since = first if partial > 0 else None

    # ------------------------------------------------------------------ commit votes

    def passed(self, t: float, cursor: Cursor, complete: bool) -> None:
        """Steps up to ``cursor`` passed the vote at ``t``: the trainers hold
        that state; ``complete``: the keeper says the job is done."""
        self.committed = cursor
        if complete:
            self.completion.job_complete(t)
            if self.state == WAIT:  # a vote later than the check
                self._host.at(t, self._final_vote)

    def _abandon(self, now: float) -> None:
        """The step in flight (or sync / checkpoint write) is given up."""
        if self.state == RUN:
            if self._stalled:
                self._carry = 0.0
                self._carry_since = None
            else:
                self._close_segment(now, None, abandon=True)
        self._stalled = False
        self.state = IDLE
        self._set_due(None)
        self._clock(now)

    def stall(self, now: float) -> None:
        if self.state not in (SYNC, RUN, CKPT) or self._stalled:
            return
        if self.state == RUN:
            self._close_segment(now, None, abandon=False)
        else:
            self._stall_remaining = max(0.0, (self._due or now) - now)
        self._stalled = True
        self._set_due(None)
        self._clock(now)

    def step_end(self, now: float) -> float:
        """When the step in flight at ``now`` is done (``now`` itself when no
        step is running): a member that then waits for a commit answer that
        cannot come hangs the job's next exchange from there on."""
        if self.state != RUN or self._stalled:
            return now
        t0, s = self._seg_t0, self._step_s
        steps = max(1, math.ceil((now - t0) / s - EPS))
        end = t0 + steps * s
        return max(now, end if self._due is None else min(end, self._due))

    def unstall(self, now: float) -> None:
        """Every member is heard again; while no keeper serves the members
        still wait (for the standby's roll call), as each real member waits
        for its commit's answer."""
        if not self._stalled or self._host.failover.down:
            return
        self._stalled = False
        if self.state == RUN:
            self._start_segment(now)
        else:
            self._set_due(now + self._stall_remaining)

    def formed(self, now: float, f: Formed) -> None:
        """The keeper closed a generation: the members enter it after the latency."""
        if self.state == DONE:
            return
        if self.state in (SYNC, RUN, CKPT, WAIT):
            self._abandon(now)  # cannot happen without a roll call; be safe
        self.votes.cast(now, everything=True)  # a new generation: the old one's votes fail
        self.ledger.flush()
        self.state = IDLE
        self._stalled = False
        self._clock(now)
        self._carry = 0.0
        self._carry_since = None
        self.cursor = self.committed = f.cursor
        self.gen = f.generation
        self.members = IdRuns.of(f.members)
        self.votes.new_generation(self.members)
        n = len(f.members)
        self._host.nodes.member_flags = flags_of_ids(f.members, len(self._host.nodes.proc))
        self._host.nodes.is_member = self._host.nodes.member_flags.copy()
        self._host.tally.min_members = min(self._host.tally.min_members, n)
        self.batch, self._step_s, assignment = self._plans.of(f.members)
        self._host.write(rec(now, "info", "assign", JOB, gen=f.generation, batch=self.batch,
                        step_s=round(self._step_s, 9), **assignment))
        cost = entry_cost_s(f, self._host.sc, self._sharding, self._host.lat)
        self._stale = IdRuns.of(f.stale)
        self._host.silences.recount()
        self._host.at(now + self._host.lat, self._enter, f.generation, cost)

    def _enter(self, gen: int, cost: float) -> None:
        if gen != self.gen or self.state != IDLE or self._answered > gen:
            return  # superseded, or the members already answered the next roll call
        now = self._host.env.now
        self.state = SYNC
        silent = self._host.silences.recount()
        self._stall_remaining = cost
        if silent or self._host.failover.down:  # a Membership the dead keeper sent
            self._stalled = True
            self._set_due(None)
        else:
            self._set_due(now + cost)

    def _on_due(self, now: float) -> None:
        st = self.state
        if st == CKPT:
            self.votes.cast(now)  # the checkpoint is written once its step passed
        if st == SYNC:
            self._start_segment(now)
        elif st == RUN:
            self._close_segment(now, self._seg_stop - self._seg_c0.step, abandon=False)
            self.state = IDLE  # between segments; _after_step picks what comes next
            self._after_step(now)
        elif st == CKPT:
            self._checkpoint_done(now)
        self._clock(now)

    def _after_step(self, now: float) -> None:
        """A segment ended at a boundary: checkpoint, finish, answer or continue."""
        step = self.cursor.step
        if self._policy.complete(step):
            # the keeper decides: its verdict on the last step's vote
            self.state = WAIT
            self._host.at(now + self._host.lat, self._final_vote)
            return
        # out of the plan before the next segment is cut
        acting, landing = self._step_faults.computed(step)
        if self._policy.checkpoint_due(step):
            self.state = CKPT
            self._checkpoint_t0 = now
            self._set_due(now + self._host.sc.strategy.checkpoint_write_s)
        else:
            self._start_segment(now)
        if acting:
            self._host.nemesis.step_faults(now, acting)
        if landing:  # when the step's vote reaches the keeper
            self._host.at(now + self._host.lat, self._host.nemesis.step_faults_now, landing)

    def _final_vote(self) -> None:
        if self.state != WAIT:
            return  # a roll call came first: the step is redone
        now = self._host.env.now
        self.votes.cast(now)
        if not self.completion.complete:
            return
        # each member with a process reports its end at once (no transit is modelled)
        reporting = [m for m in self.members if self._host.nodes.proc[m]]
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
                self._set_due(max(now, last.vote_at(last.n, self._host.lat)))
                return
            self.state = WAIT
            self._set_due(None)
            return
        self._host.tally.counts["checkpoints"] += 1
        self._host.write(rec(now, "ok", "checkpoint", JOB, gen=self.gen,
                             cursor=self.cursor.to_json(), t0=self._checkpoint_t0))
        self.votes.report_checkpoint(now, self.gen, self.cursor)
        self._start_segment(now)

    def roll_call(self, now: float, to: IdRuns, call: RollCall) -> None:
        """A roll call reaches the members ``to`` (its agents hear it next)."""
        if call.generation == self.gen + 1:
            # Whatever the reason, a member abandons the step in flight (or the
            # state copy, or the checkpoint write) and joins (rollcall.core.messages.RollCall).
            self.votes.cast(now)  # the round is open: no vote still on its way can pass
            self._answered = self.gen + 1
            synced = self.state in (RUN, CKPT, WAIT)  # the stale members finished the copy / load
            self._abandon(now)
            self.votes.cast(now, everything=True)
            # the fact the agents are told: their trainers hold the committed
            # state (a stale member, before its copy or load is done, none)
            holders = to if synced or not self._stale else to - self._stale
            self._host.agents.step_committed(now, self.committed, holders)

    def restart(self, now: float, teardown: IdRuns) -> None:
        """Checkpoint-restart: the job's step is given up and the process of
        every worker in ``teardown`` torn down (:meth:`sim.machines.Machines.tear_down`);
        the keeper's :class:`Relaunch` that follows says which nodes get a
        fresh process (a stopped process is killed by the teardown too, and
        its node relaunched)."""
        self._host.tally.counts["restarts"] += 1
        if self.state in (SYNC, RUN, CKPT, WAIT):
            self._abandon(now)
        self.votes.cast(now, everything=True)
        self._stalled = False
        self._host.machines.tear_down(teardown)
        self.state = IDLE
        self._set_due(None)
        self._clock(now)

    def finish(self, now: float, completed: bool, reason: str) -> None:
        if self.state == DONE:
            return
        if self.state == RUN and not self._stalled:
            self._close_segment(now, None, abandon=True)
        if completed:
            assert not self.votes.runs, "the keeper completed the job with votes outstanding"
        else:
            self.votes.lose_outstanding()  # votes nobody will answer: the steps are lost
        self._host.tally.end_s = self._host.tally.end_s or now
        self.ledger.flush()
        self.state = DONE
        self._clock(now)
        self.completed = completed
        self.end_reason = reason
        self._host.write(rec(now, "info", "end", DRIVER, completed=completed,
                        cursor=self.completion.end_cursor(self.committed.to_json()),
                        reason=reason))
        if not self.done.triggered:
            self.done.succeed()
