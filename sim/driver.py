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

The job itself (segments of steps, stalls, checkpoints, the end) is
:mod:`sim.job`'s; where the time went is read from the history by the core
(:func:`rollcall.core.time_account`), as on the real target.
"""

from __future__ import annotations

import dataclasses
import time as _time
from pathlib import Path
from time import perf_counter as _perf
from typing import Any, Callable, Optional

import simpy

from rollcall.config import data_spec, draws, horizon_s, keeper_config, repair_shop, scheduled_faults
from rollcall.core import DRIVER, FailureTally, FaultPlan, IdRuns, Keeper, check, rec
from rollcall.interrupts import StopRequest
from rollcall.results import write_summary
from rollcall.scenario import Scenario

from sim.agents import Agents
from sim.failover import KeeperFailover
from sim.gray import GrayFaults
from sim.job import Job
from sim.keeper_port import KeeperPort
from sim.ledger import Ledger
from sim.machines import Machines
from sim.nemesis import Nemesis
from sim.network import NetFaults
from sim.silence import Silences
from sim.state import Nodes, Recorder, Tally
from sim.stepping import SimulationStuck, Stepper, few_collections
from sim.summary import RunFacts, run_summary
from sim.votes import Votes
from sim.world import DONE

__all__ = ["run", "Simulation", "SimulationStuck"]  # SimulationStuck: sim.stepping's

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
        self.draws = draws(sc)  # node lifetimes and random targets, as on real
        # which fault is due when: the core's plan, as on real (under
        # failures.age: computing, sim.aging times the crashes)
        self.plan = FaultPlan(scheduled_faults(sc), self.draws,
                              crashes=sc.failures.age != "computing")
        self.shop = repair_shop(sc, self.draws)  # repairs, retirements, the cold pool
        self.W = sc.cluster.workers
        self.n_nodes = sc.worker_id_limit
        n = self.n_nodes
        self.nodes = Nodes.zeros(n)  # the physical world, per node
        # hardware lives and the repair shop's answers (sim.machines); under
        # failures.age: computing (AIReSim's assumption) only members age, while computing
        self.machines = Machines(self, sc.failures.age == "computing", sc.cluster.launch_s,
                                 sc.strategy.restart_s, self._wake_faults)
        # --- random streams ------------------------------------------------
        self.seed = sc.seed
        self.tally = Tally(self.W)  # where the simulated time went, and counters
        self.failures = FailureTally()
        self.recorder = Recorder(Path(out_dir) if out_dir is not None else None, flush_every)
        self.records = self.recorder.records  # the history, kept for the checkers
        w = sc.workload
        # the per-sample ledger (True), the compact one (False), or by size
        # (the data order of an epoch is a permutation of the whole dataset)
        if ledger is None:
            ledger = (w.steps * w.global_batch <= LEDGER_SAMPLES
                      and w.dataset_samples <= LEDGER_SAMPLES)
        self.ledger = Ledger(self.write, sc.seed, w, "samples" if ledger else "compact", self.lat)
        self.votes = Votes(self)  # the computed steps' commit votes (sim.votes)
        self.job = Job(self, config, self.plan, self.ledger, self.votes)  # the job (sim.job)
        # every process's core agent (sim.agents)
        self.agents = Agents(self, sc.detector.heartbeat_s, self.ledger.kind == "samples")
        self.silences = Silences(self)  # lost, paused, cut off, late (sim.silence)
        self.port = KeeperPort(self, self.job)  # the keeper's inputs and outputs (sim.keeper_port)
        self.check_s = 0.0
        # the event loop: to the end, or ended early (sim.stepping)
        self.stepper = Stepper(self.env, self.job.done, self.n_nodes, self.job.describe,
                               lambda now, reason: self.job.finish(now, False, reason))
        self.failover = KeeperFailover(self)  # the keeper's deaths and takeovers (sim.failover)
        self.net = NetFaults(self)  # per-host links: delay, loss (sim.network)
        self.gray = GrayFaults(self)  # slow workers, late heartbeats (sim.gray)
        self.nemesis = Nemesis(self)  # carries out each fault the plan hands out (sim.nemesis)

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

    # ------------------------------------------------------------------ the job, as the parts read it

    @property
    def finished(self) -> bool:
        """Whether the run is over: nothing more is carried out."""
        return self.job.state == DONE

    @property
    def voting(self) -> bool:
        """Whether commit votes are on their way to the keeper."""
        return bool(self.votes.runs)

    def cast_votes(self, t: float, everything: bool = False) -> None:
        """Cast the commit votes that reached the keeper by ``t`` (:meth:`sim.votes.Votes.cast`)."""
        self.votes.cast(t, everything)

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

    def _horizon(self) -> None:
        self.job.finish(self.env.now, False, "horizon: simulated time limit reached")

    # ------------------------------------------------------------------ run

    def run(self, max_wall_s: Optional[float] = None,
            stop: Optional[StopRequest] = None) -> dict:
        """Simulate to the end, or until ``max_wall_s`` seconds of wall clock have passed,
        or until ``stop.reason()`` returns one (an interrupt: ``result`` "interrupted")."""
        assert max_wall_s is None or max_wall_s > 0, max_wall_s
        with few_collections():
            return self._run(max_wall_s, stop)

    def _run(self, max_wall_s: Optional[float],
             stop: Optional[StopRequest]) -> dict:
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
        self.job.start()
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
        return run_summary(self.sc, self.records, self.report, self.tally, RunFacts(
            completed=self.job.completed, interrupted=self.stepper.interrupted,
            end_reason=self.job.end_reason, failures=self.failures.count, wall_s=self.wall_s,
            keeper_failovers=self.failover.count, events=self.events,
            keeper_wall_s=self.port.wall_s, check_wall_s=self.check_s))


def run(scenario: Scenario, out_dir: str | Path, ledger: Optional[bool] = None,
        max_wall_s: Optional[float] = None,
        stop: Optional[StopRequest] = None) -> dict:
    """Simulate ``scenario`` (its seed, its strategy); write history.jsonl and summary.json.

    ``ledger``: True writes the per-sample ledger whatever the run's size,
    False the compact form; by default the per-sample one up to
    ``LEDGER_SAMPLES`` samples (and dataset ids), the compact one beyond.
    ``max_wall_s``: end the run (not completed, ``end_reason`` "wall limit:
    ...", history and summary written) once that much wall clock has passed.
    ``stop``: the caller's record of signals (:class:`rollcall.interrupts.Stop`,
    or anything with its ``reason()``), polled during the run; once it gives
    a reason (the CLI's "interrupted by SIGINT") the run ends the same way,
    with ``result`` "interrupted" and that reason as ``end_reason``.
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
