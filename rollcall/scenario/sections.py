"""The scenario's sections: cluster, workload, failures, detector,
rendezvous, network, strategy, state and keeper, each a pydantic model that
checks its own keys (the checks that span sections are :class:`Scenario`'s).
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field, Strict, model_validator

from rollcall.scenario.base import (
    NonNegFloat, NonNegInt, PosFloat, PosInt, Problem, Section, SomeText, Text, check_slowdown,
    num,
)
from rollcall.scenario.faults import Fault


Probability = Annotated[float, Strict(), Field(ge=0.0, le=1.0)]


class RepairPipeline(Section):
    """AIReSim's repair pipeline (:mod:`rollcall.core.repairs`): a failure is
    diagnosed with probability ``diagnosis_p`` (else the node is back after
    ``reboot_s``, its fault still there); automated repair (exponential, mean
    ``auto_s``), escalated with probability ``manual_p`` to a manual one
    (exponential, mean ``manual_s``, after it); the repair did not fix the
    node with probability ``auto_fail_p`` / ``manual_fail_p`` (a bad node
    stays bad). A diagnosis blames the wrong node with probability
    ``wrong_blame_p`` (AIReSim's ``diagnosis_uncertainty``): a live member
    drawn at random is sent through the pipeline instead, and the culprit is
    back after ``reboot_s`` with its fault. A node failing ``retire_after``
    times within ``retire_window_s`` (unset: ever) is retired instead of
    repaired."""

    auto_s: PosFloat = 7200.0
    manual_s: PosFloat = 172800.0
    manual_p: Probability = 0.8
    auto_fail_p: Probability = 0.4
    manual_fail_p: Probability = 0.2
    diagnosis_p: Probability = 1.0
    wrong_blame_p: Probability = 0.0
    reboot_s: PosFloat = 600.0
    retire_after: PosInt | None = None
    retire_window_s: PosFloat | None = None

    @model_validator(mode="after")
    def _window_needs_count(self) -> "RepairPipeline":
        if self.retire_window_s is not None and self.retire_after is None:
            raise Problem(("retire_window_s",), "needs retire_after (failures in the window)")
        return self


class Cluster(Section):
    """Machines: initial members, idle spares that can join, repair time.

    A failed node is back after ``repair_s``, or after a ``repair``
    pipeline (:class:`RepairPipeline`), or never (neither set). A cold
    ``spare_pool`` of that many nodes is drawn on once fewer than
    ``workers`` nodes are in service or on their way: one at a time,
    ``preempt_s`` each (the wait for the work they are taken from), until
    ``workers + spares`` are; a pulled node joins as a newcomer.

    ``warm_standbys``: AIReSim's warm standbys. At most ``workers +
    warm_standbys`` nodes in service hold a worker process (the members and
    the standbys that joined and wait); the spares beyond are idle in the
    working pool, without one. When a node with a process fails, the idle
    node that waited longest is made a standby: its host selection takes
    ``select_s``, then its process starts (``launch_s``) and joins. A
    node back from repair takes a free place at once, or waits idle. Unset
    (the default): every node in service runs a process, every spare is a
    warm standby. The repair shop decides (``rollcall.core.repairs``).

    ``launch_s``: the time a fresh process started outside a restart (a
    pulled spare's, a repaired node's new life) takes to ask to join: its
    start-up (interpreter, framework, connections). The sim charges it; on
    real it is what the machine takes (``rollcall calibrate`` measures it).
    A scripted ``join`` brings a worker that is ready (the real target keeps
    a warm process for it), and a restart's relaunch is in
    ``strategy.restart_s``.

    ``rack_size`` names failure domains: worker id ``w`` lives in rack
    ``w // rack_size`` (spares and joined workers too, by their ids); None
    means no domains. Sharded state spreads a shard's replicas over racks,
    and ``kill_rack`` faults take a whole rack down at once.

    ``workers_per_host`` puts workers on machines: host ``h`` holds worker
    ids ``h*k .. h*k+k-1`` (the initial workers fill whole hosts; spares and
    newcomers, whose ids come after, get hosts of their own), and a
    ``lose_host`` fault takes one down: every process on it dies at once and
    nothing reports an exit. Unset: every worker is its own machine. Racks
    group whole hosts (``rack_size`` a multiple of ``workers_per_host``).

    ``device`` and ``backend`` say where the real target's workers compute
    and what carries their collectives: ``cpu`` with ``gloo`` (the
    default), ``cuda`` with ``gloo`` (workers share the GPUs, gloo stages
    CUDA tensors through host memory) or ``cuda`` with ``nccl`` (one GPU per
    worker process). The file alone decides only that ``nccl`` needs
    ``cuda``; whether this machine has CUDA and a GPU per worker is checked
    when a real run starts (``real.device.device_problem``), since a
    scenario is often validated on a machine without GPUs. The sim target
    ignores both: its step costs come from ``workload``.
    """

    workers: PosInt = 4
    gpus_per_worker: PosInt = 1
    spares: NonNegInt = 0
    repair_s: PosFloat | None = None
    repair: RepairPipeline | None = None
    spare_pool: NonNegInt = 0
    preempt_s: NonNegFloat = 1200.0
    launch_s: NonNegFloat = 0.0
    warm_standbys: NonNegInt | None = None
    select_s: NonNegFloat = 0.0
    rack_size: PosInt | None = None
    workers_per_host: PosInt | None = None
    device: Literal["cpu", "cuda"] = "cpu"
    backend: Literal["gloo", "nccl"] = "gloo"

    @model_validator(mode="after")
    def _one_repair(self) -> "Cluster":
        if self.repair_s is not None and self.repair is not None:
            raise Problem(("repair",), "give repair_s (a fixed time) or repair (a pipeline), "
                                        "not both")
        if self.select_s and self.warm_standbys is None:
            raise Problem(("select_s",), "is the host selection of an idle node made a warm "
                                          "standby: it needs warm_standbys")
        return self

    @model_validator(mode="after")
    def _nccl_needs_cuda(self) -> "Cluster":
        # NCCL moves GPU memory only: a CPU tensor in an NCCL collective is an
        # error at the first step, so say it before anything starts
        if self.backend == "nccl" and self.device != "cuda":
            raise Problem(("backend",), f"nccl needs cluster.device: cuda (NCCL runs on GPUs "
                                         f"only), got device: {self.device}; use gloo on cpu")
        return self


class Workload(Section):
    """What the job must do, and the sim cost model of one step."""

    steps: PosInt = 200
    global_batch: PosInt = 64
    micro_batch: PosInt = 8
    dataset_samples: PosInt = 4096
    micro_batch_s: PosFloat = 0.02
    allreduce_s: NonNegFloat = 0.005
    # Measured whole-step seconds by member count (``rollcall calibrate``):
    # where a count is listed the sim takes it instead of the micro-batch
    # model, e.g. CPU workers that share cores, where fewer can be faster.
    step_s_by_workers: dict[Annotated[int, Field(ge=1)], PosFloat] = Field(default_factory=dict)
    # Extra seconds before the job's first step completes: process groups set
    # up, lazy initialisation of the first forward/backward (measured by
    # ``rollcall calibrate``; 0 for a warm cluster).
    warmup_s: NonNegFloat = 0.0
    model_params: PosInt = 1_000_000
    bytes_per_param: PosFloat = 12.0
    lr: PosFloat = 0.05

    @model_validator(mode="after")
    def _micro_batch_divides(self) -> "Workload":
        # Virtual shards are fixed micro-batches: the global batch must be a
        # whole number of them, whatever the worker count.
        if self.global_batch % self.micro_batch:
            raise Problem(
                ("micro_batch",),
                f"must divide workload.global_batch={self.global_batch}, got {self.micro_batch}",
            )
        if self.dataset_samples < self.global_batch:
            # an epoch shorter than one step: every batch would wrap the data
            raise Problem(
                ("dataset_samples",),
                f"must be >= workload.global_batch={self.global_batch} (one batch), "
                f"got {self.dataset_samples}",
            )
        return self



class SlowFactor(Section):
    """A distribution of slowdown factors: ``1 + (median - 1) * exp(spread * z)``,
    ``z`` standard logistic (the slowness beyond 1 is log-logistic; capped at 1000)."""

    median: float
    spread: NonNegFloat = 0.5

    @model_validator(mode="after")
    def _above_one(self) -> "SlowFactor":
        check_slowdown("median", self.median)
        return self


class Failures(Section):
    """Random failures (per-worker MTBF) plus a deterministic schedule.

    Random slowdowns (``slow_mtbf_s``): each worker is slowed now and then,
    a gray failure (``slow`` faults drawn from the seed: see
    :class:`rollcall.core.failures.SlowdownModel`), ``slow_factor`` times (a
    number, or ``{median, spread}``) for ``slow_for_s`` seconds.

    ``worker_mtbf_s`` is a good node's; ``bad_fraction`` of the nodes (by id,
    from the seed) are bad and fail ``bad_multiplier`` times as often
    (AIReSim's lemons). ``lognormal`` lifetimes: ``lognormal_sigma`` is the
    log's standard deviation, the mean stays ``worker_mtbf_s``.

    ``age``: ``always``, a node ages (and fails) whenever it is up, member,
    spare or idle, the job running or not; ``computing``, only a member
    ages, and only while the job computes steps (not while it detects,
    restarts, loads or copies state): AIReSim's assumption, for reproducing
    it (sim only).
    """

    worker_mtbf_s: PosFloat | None = None
    distribution: Literal["exponential", "weibull", "lognormal"] = "exponential"
    weibull_shape: PosFloat = 0.7
    lognormal_sigma: PosFloat = 1.0
    bad_fraction: Annotated[float, Strict(), Field(ge=0.0, le=1.0)] = 0.0
    bad_multiplier: Annotated[float, Strict(), Field(ge=1.0, le=1000.0)] = 5.0
    age: Literal["always", "computing"] = "always"
    slow_mtbf_s: PosFloat | None = None
    slow_factor: Union[float, SlowFactor] = 2.0
    slow_for_s: PosFloat = 60.0
    schedule: tuple[Fault, ...] = ()

    @model_validator(mode="after")
    def _slow_factor_above_one(self) -> "Failures":
        if isinstance(self.slow_factor, float):
            check_slowdown("slow_factor", self.slow_factor)
        return self


class Detector(Section):
    """Failure-detector policy knobs, and how soon a killed process's exit
    reaches the keeper on the sim (``exit_notice_s``; None: one
    ``network.latency_s``, the host's message; the real target's is whatever
    its host takes, measured by ``rollcall calibrate``).

    ``kind: timeout``: dead after ``timeout_s`` without a beat. ``kind: phi``:
    phi accrual (:class:`rollcall.core.detector.PhiDetector`): dead once the
    suspicion reaches ``phi_threshold``, a silence of ``phi_threshold * ln 10``
    of the worker's own observed mean intervals (8: 18.4; ``timeout_s`` is
    not used)."""

    kind: Literal["timeout", "phi"] = "timeout"
    heartbeat_s: PosFloat = 0.5
    timeout_s: PosFloat = 3.0
    phi_threshold: PosFloat = 8.0
    exit_notice_s: NonNegFloat | None = None

    @property
    def silence_s(self) -> float:
        """The longest silence tolerated at the nominal cadence (the core's rule)."""
        from rollcall.core.detector import make_detector

        return make_detector(self.kind, self.heartbeat_s, self.timeout_s,
                             self.phi_threshold).silence_s()

    @model_validator(mode="after")
    def _timeout_above_heartbeat(self) -> "Detector":
        # A timeout no longer than one heartbeat period suspects healthy workers.
        if self.timeout_s <= self.heartbeat_s:
            raise Problem(
                ("timeout_s",),
                f"must be > detector.heartbeat_s={num(self.heartbeat_s)}, got {num(self.timeout_s)}",
            )
        return self


class Rendezvous(Section):
    """Membership rounds: size bounds, last-call window, how long to wait.

    In a scenario, ``max_workers`` defaults to ``cluster.workers`` and
    ``min_workers`` to ``min(2, max_workers)`` (filled in by :class:`Scenario`).
    """

    min_workers: PosInt = 2
    max_workers: PosInt = 4
    last_call_s: NonNegFloat = 0.5
    join_timeout_s: PosFloat | None = 600.0

    @model_validator(mode="after")
    def _min_le_max(self) -> "Rendezvous":
        if self.min_workers > self.max_workers:
            raise Problem(
                ("min_workers",),
                f"must be <= rendezvous.max_workers={self.max_workers}, got {self.min_workers}",
            )
        return self


class Network(Section):
    """Sim cost model of the wire."""

    latency_s: NonNegFloat = 0.0005
    bandwidth_Bps: PosFloat = 1.25e9


class State(Section):
    """How the training state (parameters + optimizer state) is held.

    ``replicated``: every worker holds all of it (plain data parallel), so a
    survivor can always hand it on. ``sharded``: the state is cut into
    ``shards`` pieces (default ``cluster.workers``), each held by ``replicas``
    distinct workers (the owner plus ``replicas - 1`` buddies, spread over
    racks when ``cluster.rack_size`` is set); a shard whose holders all die
    forces a fallback to the last checkpoint. See :mod:`rollcall.core.placement`.
    """

    sharding: Literal["replicated", "sharded"] = "replicated"
    replicas: PosInt = 2
    shards: PosInt | None = None


class Strategy(Section):
    """Recovery strategy and batch policy (``lr_scaling`` applies to shrink).

    ``stragglers``: ``keep`` waits for a slow member; ``evict`` takes one out
    once its compute per micro-batch has exceeded ``straggler_factor`` times
    the median for ``straggler_steps`` consecutive steps and the job is
    faster without it, and readmits it after ``straggler_holdout_s``
    (doubling each time it is evicted again); see
    :mod:`rollcall.core.stragglers`. Elastic only: a checkpoint-restart job
    keeps its stragglers.

    ``max_recoveries_without_progress``: the job gives up (not completed,
    "not expected to finish") once no step beyond the furthest one committed
    has committed over this many consecutive recoveries; it also gives up
    when failures come faster than it recovers (:mod:`rollcall.core.progress`).
    ``null``: only the latter.
    """

    kind: Literal["elastic", "checkpoint-restart"] = "elastic"
    checkpoint_interval_steps: PosInt = 50
    checkpoint_write_s: NonNegFloat = 1.0
    checkpoint_read_s: NonNegFloat = 2.0
    restart_s: NonNegFloat = 30.0
    batch: Literal["constant", "shrink"] = "constant"
    lr_scaling: Literal["none", "linear"] = "none"
    reduction: Literal["fast", "exact"] = "fast"
    restart_failure: Literal["repeat", "replace"] = "repeat"
    max_restarts: NonNegInt | None = None
    max_recoveries_without_progress: PosInt | None = 100
    stragglers: Literal["keep", "evict"] = "keep"
    straggler_factor: Annotated[float, Strict(), Field(gt=1.0, le=1000.0)] = 2.0
    straggler_steps: PosInt = 5
    straggler_holdout_s: PosFloat = 30.0


class KeeperSection(Section):
    """The record-keeper: where its record lives and what replaces it.

    ``store: memory``: the record lives in the one keeper (the launcher on
    real), a single point of failure as in torchrun's c10d store.
    ``store: etcd``: each decided generation is written to etcd (v3) with a
    compare-and-set before any worker hears of it; the active keeper holds a
    lease of ``lease_ttl_s`` (etcd grants whole seconds, rounded up: a
    standby can win only after that; the keeper stops deciding before the
    time asked) and ``standbys`` keepers wait to take over from the last
    record (:mod:`rollcall.core.record`). ``etcd_endpoints``: an
    etcd cluster of the user's (client URLs); unset, the real launcher
    starts a 3-member cluster on loopback for the run. A cluster of the
    user's with auth on takes ``etcd_user`` (default root) and the path of a
    file holding its password, ``etcd_password_file`` (read when the run
    starts, never copied into the run's files); the run keeps its keys under
    ``/rollcall/<run id>/`` and deletes them when it ends.

    ``worker_links`` (etcd only): how the workers reach the keeper. ``launcher``:
    through the launcher (each host's agent here), which finds the active
    keeper in etcd and tells its workers after a failover. ``direct``: each
    worker finds the active keeper in etcd itself (it watches the leadership
    key) and links to it; the launcher hears what it needs from the keeper.
    Link faults (``partition``, ``isolate_keeper``, ``delay``, ``loss``) are
    not built for direct links yet.

    The sim models the failover: the keeper fails at random with mean
    ``mtbf_s`` (None: only ``kill_keeper`` faults), and a standby takes over
    ``failover_s`` later (default ``lease_ttl_s``: the lease must lapse
    first; ``rollcall calibrate`` measures the real one).
    """

    store: Literal["memory", "etcd"] = "memory"
    standbys: NonNegInt = 0
    etcd_endpoints: tuple[Text, ...] | None = None
    etcd_user: SomeText | None = None
    etcd_password_file: SomeText | None = None
    lease_ttl_s: Annotated[float, Strict(), Field(ge=1.0, le=600.0)] = 2.0
    mtbf_s: PosFloat | None = None
    failover_s: PosFloat | None = None
    worker_links: Literal["launcher", "direct"] = "launcher"

    @model_validator(mode="after")
    def _etcd_only(self) -> "KeeperSection":
        if self.store == "memory" and self.worker_links != "launcher":
            raise Problem(("worker_links",), "needs keeper.store: etcd (the workers find "
                                              "the keeper there)")
        if self.store == "memory":
            for key in ("standbys", "etcd_endpoints", "etcd_user", "etcd_password_file",
                        "mtbf_s", "failover_s"):
                if getattr(self, key) not in (None, 0):
                    raise Problem((key,), "needs keeper.store: etcd (a keeper whose record "
                                           "lives in memory has no successor)")
        if self.mtbf_s is not None and self.standbys < 1:
            raise Problem(("mtbf_s",), "needs keeper.standbys >= 1 (without a standby a "
                                        "keeper failure ends the job)")
        for key in ("etcd_user", "etcd_password_file"):
            if getattr(self, key) is not None and self.etcd_endpoints is None:
                raise Problem((key,), "needs keeper.etcd_endpoints (the run's own etcd "
                                       "authenticates with the run's secret)")
        if self.etcd_user is not None and self.etcd_password_file is None:
            raise Problem(("etcd_user",), "needs keeper.etcd_password_file (the user's password)")
        if self.etcd_endpoints is not None:
            for url in self.etcd_endpoints:
                if not url.startswith(("http://127.", "http://localhost:", "http://[::1]:")):
                    raise Problem(("etcd_endpoints",), f"loopback http URLs only (the run "
                                                        f"reaches no other address), got {url!r}")
        return self

    @property
    def takeover_s(self) -> float:
        """The sim's time from a keeper's death to its successor's roll call."""
        return self.lease_ttl_s if self.failover_s is None else self.failover_s


