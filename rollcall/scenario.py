"""The scenario schema: one YAML file describes a whole experiment.

A scenario names a cluster, a workload, a failure model and a recovery
strategy; the ``sim`` and ``real`` targets both run from the same validated
object, so every check lives here and no driver re-interprets raw YAML.

Errors matter as much as the schema: a person edits these files by hand, so
every problem is reported as ONE line naming the file, the dotted field and
the line in the file (``bad.yaml: workload.micro_batch (line 9): must divide
workload.global_batch=64, got 7``). Pydantic does the checking; this module
maps its errors back onto YAML nodes found with ``yaml.compose``.

Pure: no clocks, no randomness, no I/O beyond reading the file it is given.
"""

from __future__ import annotations

import math
import os
import re
import stat
from fractions import Fraction
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Sequence, Union, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StringConstraints,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

__all__ = [
    "Cluster",
    "Detector",
    "Failures",
    "Fault",
    "Network",
    "Rendezvous",
    "Scenario",
    "ScenarioError",
    "State",
    "Strategy",
    "Workload",
    "MAX_ALIAS_NODES",
    "MAX_EXTRA_JOINS",
    "MAX_NESTING",
    "MAX_SCENARIO_BYTES",
    "MAX_WORKER_IDS",
    "NODE_DAYS_S",
    "SCALE_HELPERS",
    "load_scenario",
    "parse_scenario",
]

# --------------------------------------------------------------------------
# Bounds: input a person cannot mean, refused before it costs memory or time.

#: A scenario file is at most this many bytes (a scenario is a few KiB; a
#: 100k-id kill list is well under it). Bounds memory before YAML sees a byte.
MAX_SCENARIO_BYTES = 1 << 20
#: Mappings and lists nest at most this deep (a scenario needs 5 levels), so
#: the recursive composer, the duplicate-key walk and pydantic never recurse far.
MAX_NESTING = 50
#: Aliases may add at most this many nodes to what the file itself holds: an
#: anchor reused a few times is fine, a billion-laughs bomb is refused.
MAX_ALIAS_NODES = 100_000
#: A schedule's joins add at most ``rendezvous.max_workers`` plus this many
#: newcomers (enough to replace every member many times over).
MAX_EXTRA_JOINS = 1_000
#: Worker ids (workers + spares + joins) in one scenario, at most.
MAX_WORKER_IDS = 1_000_000


# --------------------------------------------------------------------------
# Field types. Strict: a quoted "4" is a typo, not an integer; YAML's `yes`
# must not become 1. Floats accept integers (3600 is a fine number of seconds).

PosInt = Annotated[int, Strict(), Field(ge=1)]
NonNegInt = Annotated[int, Strict(), Field(ge=0)]
PosFloat = Annotated[float, Strict(), Field(gt=0)]
NonNegFloat = Annotated[float, Strict(), Field(ge=0)]
Text = Annotated[str, Strict()]
Name = Annotated[str, StringConstraints(strict=True, pattern=r"^[A-Za-z0-9_.-]+$")]
SomeText = Annotated[str, StringConstraints(strict=True, min_length=1, max_length=4096)]

WorkerTargets = Union[int, tuple[int, ...], Literal["random"]]


class _Problem(ValueError):
    """A cross-field problem that knows which field (relative path) is at fault.

    Pydantic wraps ValueErrors raised by validators and keeps the instance in
    the error's context, so the formatter can point at the exact field
    instead of at the whole section.
    """

    def __init__(self, where: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.where = where


class _Section(BaseModel):
    """Base of every scenario model: unknown keys are errors, values immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# --------------------------------------------------------------------------
# Sections


Probability = Annotated[float, Strict(), Field(ge=0.0, le=1.0)]


class RepairPipeline(_Section):
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
            raise _Problem(("retire_window_s",), "needs retire_after (failures in the window)")
        return self


class Cluster(_Section):
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
            raise _Problem(("repair",), "give repair_s (a fixed time) or repair (a pipeline), "
                                        "not both")
        if self.select_s and self.warm_standbys is None:
            raise _Problem(("select_s",), "is the host selection of an idle node made a warm "
                                          "standby: it needs warm_standbys")
        return self

    @model_validator(mode="after")
    def _nccl_needs_cuda(self) -> "Cluster":
        # NCCL moves GPU memory only: a CPU tensor in an NCCL collective is an
        # error at the first step, so say it before anything starts
        if self.backend == "nccl" and self.device != "cuda":
            raise _Problem(("backend",), f"nccl needs cluster.device: cuda (NCCL runs on GPUs "
                                         f"only), got device: {self.device}; use gloo on cpu")
        return self


class Workload(_Section):
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
            raise _Problem(
                ("micro_batch",),
                f"must divide workload.global_batch={self.global_batch}, got {self.micro_batch}",
            )
        if self.dataset_samples < self.global_batch:
            # an epoch shorter than one step: every batch would wrap the data
            raise _Problem(
                ("dataset_samples",),
                f"must be >= workload.global_batch={self.global_batch} (one batch), "
                f"got {self.dataset_samples}",
            )
        return self


def _worker_id(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PydanticCustomError(
            "rollcall_worker_id", "expected a worker id (integer >= 0), got {got}", {"got": _show(value)}
        )
    if value < 0:
        raise PydanticCustomError(
            "rollcall_worker_id", "worker ids are >= 0, got {got}", {"got": _show(value)}
        )
    return value


# the failure domains, each with the cluster key of its size (workers per domain)
_DOMAINS = {"rack": "rack_size", "host": "workers_per_host"}
_TRIGGERS = ("at_s", "at_step", "at_roll_call")
_ACTIONS = ("kill", "kill_rack", "lose_host", "partition", "isolate_keeper", "delay", "loss",
            "pause", "slow", "late_heartbeats", "join", "kill_keeper", "kill_etcd",
            "partition_keeper")
#: the faults of a host's links (hosts mode, real target: nftables rules in
#: real.netns, or for ``delay`` the host agent's relay of its workers' keeper link)
LINK_ACTIONS = ("partition", "isolate_keeper", "delay", "loss")
# the actions that last for_s
_TIMED = ("pause", "partition", "isolate_keeper", "delay", "loss", "slow", "late_heartbeats",
          "partition_keeper")
# the faults' own parameter: action -> key (required with it, allowed only with it)
_LINK_KEYS = {"delay": "latency_s", "loss": "rate", "slow": "factor", "late_heartbeats": "delay_s"}
_PARAM_WHAT = {"latency_s": "extra one-way seconds (> 0)",
               "rate": "the fraction of packets dropped, 0 <= rate < 1",
               "factor": "how many times slower the worker computes (> 1)",
               "delay_s": "seconds late each heartbeat reaches the keeper (> 0)"}
#: the most extra one-way latency a ``delay`` fault may add, on both targets: the
#: real host agent's relay holds what it delays (``real/wire.py`` refuses more), and
#: a scenario must mean the same on the sim, so it is refused before either runs
MAX_LATENCY_S = 3600.0


class Fault(_Section):
    """One scheduled fault: exactly one trigger and exactly one action.

    Triggers: ``at_s`` (simulated/elapsed seconds), ``at_step`` (when the
    job reaches that committed step) or ``at_roll_call`` (a generation >= 1:
    when the keeper opens the roll call that forms it, a protocol event,
    so the fault lands during that roll call on both targets; it never
    fires if the job ends first). Actions: ``kill`` (ids, or "random"),
    ``kill_rack`` (a rack index, or "random": every live worker of that rack
    at once, a correlated failure; needs ``cluster.rack_size``), ``lose_host``
    (a host index, or "random": the machine dies, every process on it at
    once, no exit reported; needs ``cluster.workers_per_host``),
    ``partition`` (a list of host indices cut off from everyone else, the
    keeper staying with the rest, for ``for_s`` seconds; on real, hosts
    mode, nftables rules), ``isolate_keeper`` (a host index: the host loses the
    keeper but not its peers for ``for_s`` seconds, heartbeats stop while
    collectives still work, the gray failure; on real, nftables rules),
    ``delay`` (a host index or "random", with ``latency_s``: the
    host's link gets that much extra one-way latency for ``for_s``
    seconds; on real, the host agent's relay of the keeper link holds it
    back, gloo is not delayed), ``loss`` (a host index or
    "random", with ``rate``, 0 <= rate < 1: the host's link drops that
    fraction of packets for ``for_s`` seconds; every transport is TCP, so
    a drop is a retransmission, a delay, never a lost message: see
    :mod:`sim.network`; on real, nftables rules), ``pause``
    (one id or "random", for ``for_s`` seconds), ``slow`` (one id or
    "random", with ``factor`` > 1: the worker computes ``factor`` times
    slower for ``for_s`` seconds, a straggler; its heartbeats stay on time),
    ``late_heartbeats`` (one id or "random", with ``delay_s``: the worker's
    heartbeats reach the keeper ``delay_s`` late, in order, for ``for_s``
    seconds; its work and its other messages are on time), ``join`` (count
    of newcomers, which take the next unused ids), ``kill_keeper``
    ("active": the active record-keeper dies, a standby takes over; needs
    ``keeper.store: etcd`` and ``keeper.standbys >= 1``), ``kill_etcd`` (the
    index of one member of the keeper's etcd cluster, which dies: with two
    of three left the job must not notice; needs ``keeper.store: etcd``),
    ``partition_keeper`` ("active", for ``for_s`` seconds: the active keeper
    is cut off from etcd, not from its workers; it cannot renew its lease,
    stops deciding when the lease ends on its own clock, and a standby takes
    over; needs what ``kill_keeper`` needs).
    """

    at_s: NonNegFloat | None = None
    at_step: NonNegInt | None = None
    at_roll_call: PosInt | None = None
    kill: WorkerTargets | None = None
    kill_rack: Union[int, Literal["random"], None] = None
    lose_host: Union[int, Literal["random"], None] = None
    partition: tuple[NonNegInt, ...] | None = None
    isolate_keeper: NonNegInt | None = None
    delay: Union[int, Literal["random"], None] = None
    latency_s: PosFloat | None = None
    loss: Union[int, Literal["random"], None] = None
    rate: NonNegFloat | None = None
    pause: Union[int, Literal["random"], None] = None
    slow: Union[int, Literal["random"], None] = None
    factor: PosFloat | None = None
    late_heartbeats: Union[int, Literal["random"], None] = None
    delay_s: PosFloat | None = None
    for_s: PosFloat | None = None
    join: PosInt | None = None
    kill_keeper: Literal["active"] | None = None
    kill_etcd: NonNegInt | None = None
    partition_keeper: Literal["active"] | None = None

    @field_validator("kill", mode="before")
    @classmethod
    def _check_kill(cls, value: Any) -> Any:
        if value is None or value == "random":
            return value
        if isinstance(value, (list, tuple)):
            if not value:
                raise PydanticCustomError("rollcall_worker_ids", "expected at least one worker id, got []")
            ids = tuple(_worker_id(v) for v in value)
            if len(set(ids)) != len(ids):
                raise PydanticCustomError(
                    "rollcall_worker_ids", "lists a worker twice, got {got}", {"got": list(ids)}
                )
            return ids
        if isinstance(value, int) and not isinstance(value, bool):
            return _worker_id(value)
        raise PydanticCustomError(
            "rollcall_worker_ids",
            "expected a worker id, a list of worker ids, or 'random', got {got}",
            {"got": _show(value)},
        )

    @field_validator("kill_rack", "lose_host", "delay", "loss", mode="before")
    @classmethod
    def _check_domain(cls, value: Any, info: Any) -> Any:
        what = "rack" if info.field_name == "kill_rack" else "host"
        if value is None or value == "random":
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            if value < 0:
                raise PydanticCustomError(
                    "rollcall_domain", "{what} indices are >= 0, got {got}",
                    {"what": what, "got": _show(value)},
                )
            return value
        raise PydanticCustomError(
            "rollcall_domain", "expected a {what} index (integer >= 0) or 'random', got {got}",
            {"what": what, "got": _show(value)},
        )

    @field_validator("pause", "slow", "late_heartbeats", mode="before")
    @classmethod
    def _check_pause(cls, value: Any) -> Any:
        if value is None or value == "random":
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return _worker_id(value)
        raise PydanticCustomError(
            "rollcall_worker_id", "expected a worker id or 'random', got {got}", {"got": _show(value)}
        )

    @model_validator(mode="after")
    def _one_trigger_one_action(self) -> "Fault":
        triggers = [k for k in _TRIGGERS if getattr(self, k) is not None]
        if not triggers:
            raise _Problem((), "a fault needs exactly one trigger: at_s, at_step or at_roll_call")
        if len(triggers) > 1:
            raise _Problem((triggers[1],), f"a fault has exactly one trigger, got both "
                                           f"{' and '.join(triggers)}")
        actions = [k for k in _ACTIONS if getattr(self, k) is not None]
        if not actions:
            raise _Problem((), f"a fault needs exactly one action: {', '.join(_ACTIONS[:-1])}"
                               f" or {_ACTIONS[-1]}")
        if len(actions) > 1:
            raise _Problem(
                (actions[1],), f"a fault has exactly one action, got {' and '.join(actions)}"
            )
        timed = actions[0] in _TIMED
        if timed and self.for_s is None:
            raise _Problem(("for_s",), f"required with {actions[0]}: seconds it lasts (> 0)")
        if not timed and self.for_s is not None:
            raise _Problem(("for_s",), f"only allowed with {', '.join(_TIMED)}, not with "
                                       f"{actions[0]}")
        if self.partition is not None and (not self.partition
                                           or len(set(self.partition)) != len(self.partition)):
            raise _Problem(("partition",), "lists each host once, at least one")
        self._check_link_keys(actions[0])
        return self

    def _check_link_keys(self, action: str) -> None:
        """``delay`` takes ``latency_s``, ``loss`` ``rate`` (0 <= rate < 1: a link
        that drops every packet is a partition), ``slow`` ``factor`` and
        ``late_heartbeats`` ``delay_s``, each with its own action only."""
        for act, key in _LINK_KEYS.items():
            value = getattr(self, key)
            if action == act and value is None:
                raise _Problem((key,), f"required with {act}: {_PARAM_WHAT[key]}")
            if action != act and value is not None:
                raise _Problem((key,), f"only allowed with {act}, not with {action}")
        for key in ("latency_s", "delay_s"):
            value = getattr(self, key)
            if value is not None and not value <= MAX_LATENCY_S:
                raise _Problem((key,), f"must be <= {_num(MAX_LATENCY_S)} (the real target holds "
                                       f"what it delays), got {_num(value)}")
        if self.factor is not None and not 1 < self.factor <= 1000:
            raise _Problem(("factor",), f"must be > 1 and <= 1000 (times slower), got "
                                        f"{_num(self.factor)}")
        if self.rate is not None and not self.rate < 1:
            raise _Problem(("rate",), f"must be < 1 (a link that drops every packet is a "
                                      f"partition: use partition), got {_num(self.rate)}")

    @model_serializer(mode="wrap")
    def _drop_unset(self, handler: Any) -> dict[str, Any]:
        # A fault uses two or three of its six keys; the rest would be noise.
        return {k: v for k, v in handler(self).items() if v is not None}

    @property
    def trigger(self) -> Literal["at_s", "at_step", "at_roll_call"]:
        if self.at_s is not None:
            return "at_s"
        return "at_step" if self.at_step is not None else "at_roll_call"

    @property
    def when(self) -> float | int:
        """The trigger's value: seconds for ``at_s``, a step for ``at_step``, a
        generation for ``at_roll_call``."""
        value = getattr(self, self.trigger)
        assert value is not None
        return value

    @property
    def action(self) -> Literal["kill", "kill_rack", "lose_host", "partition", "isolate_keeper",
                                "delay", "loss", "pause", "slow", "late_heartbeats", "join",
                                "kill_keeper", "kill_etcd", "partition_keeper"]:
        if self.kill is not None:
            return "kill"
        if self.kill_keeper is not None:
            return "kill_keeper"
        if self.partition_keeper is not None:
            return "partition_keeper"
        if self.kill_etcd is not None:
            return "kill_etcd"
        if self.kill_rack is not None:
            return "kill_rack"
        if self.lose_host is not None:
            return "lose_host"
        if self.partition is not None:
            return "partition"
        if self.isolate_keeper is not None:
            return "isolate_keeper"
        if self.delay is not None:
            return "delay"
        if self.loss is not None:
            return "loss"
        if self.slow is not None:
            return "slow"
        if self.late_heartbeats is not None:
            return "late_heartbeats"
        return "pause" if self.pause is not None else "join"

    @property
    def targets(self) -> tuple[int, ...] | Literal["random"]:
        """Worker ids hit by a kill, pause, slow or late_heartbeats (``"random"``
        stays a string); () for join.

        For ``kill_rack`` the rack index or ``"random"`` is :attr:`rack`; the
        workers it hits are those of the rack alive when it fires
        (:meth:`Scenario.rack_workers` lists the rack's ids), so ``targets``
        is ``()`` there, as for a join.
        """
        value = next((v for v in (self.kill, self.pause, self.slow, self.late_heartbeats)
                      if v is not None), None)
        if value is None:
            return ()
        if value == "random":
            return "random"
        return value if isinstance(value, tuple) else (value,)  # type: ignore[return-value]

    @property
    def rack(self) -> int | Literal["random"] | None:
        """The rack a ``kill_rack`` takes down (an index or ``"random"``); None otherwise."""
        return self.kill_rack

    @property
    def host(self) -> int | Literal["random"] | None:
        """The host a ``lose_host`` takes down (an index or ``"random"``); None otherwise."""
        return self.lose_host

    @property
    def link(self) -> int | Literal["random"] | None:
        """The host whose link a ``delay`` or ``loss`` degrades (an index or
        ``"random"``); None otherwise."""
        return self.delay if self.delay is not None else self.loss

    @property
    def domain(self) -> tuple[str, int | Literal["random"]] | None:
        """``("rack", index)`` for a ``kill_rack``, ``("host", index)`` for a
        ``lose_host`` (the failure domain it takes down whole); None otherwise."""
        if self.kill_rack is not None:
            return ("rack", self.kill_rack)
        return None if self.lose_host is None else ("host", self.lose_host)

    @property
    def count(self) -> int:
        """How many workers the fault affects (newcomers for a join; racks, 1, for kill_rack)."""
        if self.join is not None:
            return self.join
        if self.kill_rack is not None or self.lose_host is not None:
            return 1
        if self.kill_keeper is not None or self.kill_etcd is not None or \
                self.partition_keeper is not None:
            return 0  # no worker
        if self.partition is not None:
            return len(self.partition)
        if self.isolate_keeper is not None or self.link is not None:
            return 1
        # (slow and late_heartbeats: one worker, as pause)
        targets = self.targets
        return 1 if targets == "random" else len(targets)


class SlowFactor(_Section):
    """A distribution of slowdown factors: ``1 + (median - 1) * exp(spread * z)``,
    ``z`` standard logistic (the slowness beyond 1 is log-logistic; capped at 1000)."""

    median: float
    spread: NonNegFloat = 0.5

    @model_validator(mode="after")
    def _above_one(self) -> "SlowFactor":
        if not 1 < self.median <= 1000:
            raise _Problem(("median",), f"must be > 1 and <= 1000 (times slower), got "
                                        f"{_num(self.median)}")
        return self


class Failures(_Section):
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
        if isinstance(self.slow_factor, float) and not 1 < self.slow_factor <= 1000:
            raise _Problem(("slow_factor",), f"must be > 1 and <= 1000 (times slower), got "
                                             f"{_num(self.slow_factor)}")
        return self


class Detector(_Section):
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
            raise _Problem(
                ("timeout_s",),
                f"must be > detector.heartbeat_s={_num(self.heartbeat_s)}, got {_num(self.timeout_s)}",
            )
        return self


class Rendezvous(_Section):
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
            raise _Problem(
                ("min_workers",),
                f"must be <= rendezvous.max_workers={self.max_workers}, got {self.min_workers}",
            )
        return self


class Network(_Section):
    """Sim cost model of the wire."""

    latency_s: NonNegFloat = 0.0005
    bandwidth_Bps: PosFloat = 1.25e9


class State(_Section):
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


class Strategy(_Section):
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


class KeeperSection(_Section):
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
            raise _Problem(("worker_links",), "needs keeper.store: etcd (the workers find "
                                              "the keeper there)")
        if self.store == "memory":
            for key in ("standbys", "etcd_endpoints", "etcd_user", "etcd_password_file",
                        "mtbf_s", "failover_s"):
                if getattr(self, key) not in (None, 0):
                    raise _Problem((key,), "needs keeper.store: etcd (a keeper whose record "
                                           "lives in memory has no successor)")
        if self.mtbf_s is not None and self.standbys < 1:
            raise _Problem(("mtbf_s",), "needs keeper.standbys >= 1 (without a standby a "
                                        "keeper failure ends the job)")
        for key in ("etcd_user", "etcd_password_file"):
            if getattr(self, key) is not None and self.etcd_endpoints is None:
                raise _Problem((key,), "needs keeper.etcd_endpoints (the run's own etcd "
                                       "authenticates with the run's secret)")
        if self.etcd_user is not None and self.etcd_password_file is None:
            raise _Problem(("etcd_user",), "needs keeper.etcd_password_file (the user's password)")
        if self.etcd_endpoints is not None:
            for url in self.etcd_endpoints:
                if not url.startswith(("http://127.", "http://localhost:", "http://[::1]:")):
                    raise _Problem(("etcd_endpoints",), f"loopback http URLs only (the run "
                                                        f"reaches no other address), got {url!r}")
        return self

    @property
    def takeover_s(self) -> float:
        """The sim's time from a keeper's death to its successor's roll call."""
        return self.lease_ttl_s if self.failover_s is None else self.failover_s


class Scenario(_Section):
    """A whole experiment. Build it with :func:`load_scenario`/:func:`parse_scenario`."""

    name: Name
    description: Text = ""
    seed: NonNegInt = 0
    target: Literal["sim", "real"] = "sim"
    cluster: Cluster = Field(default_factory=Cluster)
    workload: Workload = Field(default_factory=Workload)
    failures: Failures = Field(default_factory=Failures)
    detector: Detector = Field(default_factory=Detector)
    rendezvous: Rendezvous = Field(default_factory=Rendezvous)
    network: Network = Field(default_factory=Network)
    strategy: Strategy = Field(default_factory=Strategy)
    state: State = Field(default_factory=State)
    keeper: KeeperSection = Field(default_factory=KeeperSection)

    @model_validator(mode="before")
    @classmethod
    def _rendezvous_defaults(cls, data: Any) -> Any:
        # The size bounds default from the cluster, which a field default
        # cannot see; fill them into the raw mapping before validation.
        # The scale helpers (cluster.gpus, fractions, per-worker batch, rates
        # per 1,000 node-days) become canonical keys first: they need the
        # worker count too, and the defaults must see the resolved one.
        if not isinstance(data, dict):
            return data
        data = _resolve_scale(data)
        cluster = data.get("cluster")
        workers = cluster.workers if isinstance(cluster, Cluster) else (
            cluster.get("workers", Cluster().workers) if isinstance(cluster, dict)
            else Cluster().workers if cluster is None else None
        )
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            return data  # cluster.workers itself will be reported
        rdv = data.get("rendezvous", {})
        if rdv is None:
            rdv = {}
        if not isinstance(rdv, dict):
            return data
        rdv = dict(rdv)
        rdv.setdefault("max_workers", workers)
        top = rdv["max_workers"]
        if isinstance(top, int) and not isinstance(top, bool) and top >= 1:
            rdv.setdefault("min_workers", min(2, top))
        return {**data, "rendezvous": rdv}

    @field_validator("name")
    @classmethod
    def _name_stays_in_runs(cls, value: str) -> str:
        # the name is a directory under runs/: "." and ".." would leave it
        if value in (".", ".."):
            raise PydanticCustomError(
                "rollcall_name", "must not be '.' or '..' (the run directory runs/<name>/ "
                "would leave runs/), got {got}", {"got": _show(value)})
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "Scenario":
        c, r = self.cluster, self.rendezvous
        self._check_sizes()
        self._check_hosts()
        if self.target == "real" and self.failures.age == "computing":
            raise _Problem(("failures", "age"), "computing is sim only (a real node ages whether "
                                                "the job computes or not); use always")
        if r.max_workers < c.workers:
            raise _Problem(
                ("rendezvous", "max_workers"),
                f"must be >= cluster.workers={c.workers}, got {r.max_workers}",
            )
        if r.min_workers > c.workers + c.spares:
            raise _Problem(
                ("rendezvous", "min_workers"),
                f"must be <= cluster.workers + cluster.spares = {c.workers + c.spares}"
                f" (else the job can never start), got {r.min_workers}",
            )
        limit = self.worker_id_limit
        joined = self.pool_first_id - c.workers - c.spares
        self._check_keeper_faults()
        for i, fault in enumerate(self.failures.schedule):
            if fault.action in ("kill_keeper", "kill_etcd", "partition_keeper"):
                continue
            if fault.domain is not None:
                self._check_domain(i, *fault.domain, fault.action)
                continue
            if fault.partition is not None:
                for host in fault.partition:
                    self._check_domain(i, "host", host, "partition")
                continue
            if fault.isolate_keeper is not None:
                self._check_domain(i, "host", fault.isolate_keeper, "isolate_keeper")
                continue
            if fault.link is not None:
                self._check_domain(i, "host", fault.link, fault.action)
                continue
            targets = fault.targets
            if targets == "random":
                continue
            unknown = [w for w in targets if w >= limit]
            if unknown:
                raise _Problem(
                    ("failures", "schedule", i, fault.action),
                    f"worker {unknown[0]} does not exist (ids are 0..{limit - 1}:"
                    f" {_count(c.workers, 'worker')} + {_count(c.spares, 'spare')}"
                    f" + {joined} joined + {c.spare_pool} in the pool)",
                )
        return self

    def _check_keeper_faults(self) -> None:
        """A keeper or etcd fault needs the keeper it hits: an etcd store,
        and for ``kill_keeper`` a standby to take over."""
        k = self.keeper
        if (k.worker_links == "direct" and k.etcd_endpoints is not None
                and self.cluster.workers_per_host is not None):
            raise _Problem(("keeper", "worker_links"),
                           "direct with keeper.etcd_endpoints cannot have hosts "
                           "(cluster.workers_per_host): a host's namespace does not reach "
                           "your cluster on this machine's loopback")
        for i, fault in enumerate(self.failures.schedule):
            action = fault.action
            if k.worker_links == "direct" and action in LINK_ACTIONS:
                raise _Problem(("failures", "schedule", i, action),
                               "not built with keeper.worker_links: direct yet (the "
                               "workers' links go to the keeper's host, not the launcher's)")
            if action not in ("kill_keeper", "kill_etcd", "partition_keeper"):
                continue
            if k.store != "etcd":
                raise _Problem(("failures", "schedule", i, action),
                               "needs keeper.store: etcd (the keeper's record in etcd)")
            if action in ("kill_keeper", "partition_keeper") and k.standbys < 1:
                raise _Problem(("failures", "schedule", i, action),
                               "needs keeper.standbys >= 1 (a standby to take over)")
            if action == "kill_etcd" and k.etcd_endpoints is not None:
                raise _Problem(("failures", "schedule", i, action),
                               "only on the etcd cluster the run starts itself "
                               "(keeper.etcd_endpoints is the user's)")
            if action == "kill_etcd" and fault.kill_etcd > 2:
                raise _Problem(("failures", "schedule", i, action),
                               f"the run's etcd cluster has members 0..2, got {fault.kill_etcd}")

    def _check_sizes(self) -> None:
        """Refuse sizes no target can run: the keeper tracks every worker id."""
        c, r = self.cluster, self.rendezvous
        joins = [(i, f.join) for i, f in enumerate(self.failures.schedule) if f.join is not None]
        joined = sum(n for _, n in joins)
        if joins and joined > r.max_workers + MAX_EXTRA_JOINS:
            i = joins[-1][0]
            raise _Problem(
                ("failures", "schedule", i, "join"),
                f"the schedule joins {joined} newcomers in all, more than rendezvous.max_workers"
                f"={r.max_workers} + {MAX_EXTRA_JOINS} (no job holds that many; the rest would"
                f" only idle)",
            )
        total = c.workers + c.spares + joined + c.spare_pool
        if total > MAX_WORKER_IDS:
            raise _Problem(
                ("cluster", "workers"),
                f"workers + spares + joins + spare_pool = {total} worker ids, more than"
                f" {MAX_WORKER_IDS}",
            )

    def warnings(self) -> list[tuple[str, str]]:
        """(dotted field, message) for what is valid but will not do what it says.

        A warning, not an error: in a sweep over ``workload.steps`` one
        point's fault may well lie beyond its end.
        """
        out: list[tuple[str, str]] = []
        steps = self.workload.steps
        for i, fault in enumerate(self.failures.schedule):
            if fault.at_step is not None and fault.at_step >= steps:
                out.append((
                    f"failures.schedule.{i}.at_step",
                    f"the job ends at step workload.steps={steps}, so this fault at step "
                    f"{fault.at_step} never fires",
                ))
        return out

    def _check_hosts(self) -> None:
        """Hosts hold whole groups of ids: the initial workers fill whole
        hosts, and racks whole hosts."""
        c = self.cluster
        k = c.workers_per_host
        if k is None:
            return
        if c.workers % k:
            raise _Problem(("cluster", "workers_per_host"),
                           f"cluster.workers={c.workers} does not fill hosts of {k}: the "
                           f"initial workers fill whole hosts")
        if c.rack_size is not None and c.rack_size % k:
            raise _Problem(("cluster", "rack_size"),
                           f"must be a multiple of cluster.workers_per_host={k} (racks group "
                           f"whole hosts), got {c.rack_size}")

    def _check_domain(self, i: int, domain: str, index: int | str, key: str) -> None:
        """A fault naming a rack or a host: the cluster has them, and that one exists."""
        where = ("failures", "schedule", i, key)
        field = _DOMAINS[domain]
        size = getattr(self.cluster, field)
        if size is None:
            raise _Problem(where, f"needs cluster.{field} (workers per {domain}), which is not set")
        n = self.n_domains(domain)
        if index != "random" and not 0 <= int(index) < n:
            raise _Problem(
                where,
                f"{domain} {index} does not exist ({domain}s are 0..{n - 1}: worker ids"
                f" 0..{self.worker_id_limit - 1} in {domain}s of cluster.{field}={size})",
            )

    # -- derived values ------------------------------------------------------

    def n_domains(self, domain: str) -> int:
        """Racks or hosts (``domain``) that can ever hold a worker (0 without their size)."""
        size = getattr(self.cluster, _DOMAINS[domain])
        return 0 if size is None else -(-self.worker_id_limit // size)

    def domain_of(self, domain: str, worker: int) -> int | None:
        """The rack or host of worker id ``worker`` (None without their size)."""
        size = getattr(self.cluster, _DOMAINS[domain])
        return None if size is None else worker // size

    def domain_workers(self, domain: str, index: int) -> tuple[int, ...]:
        """Every worker id that can ever live in rack or host ``index`` (alive or not)."""
        size = getattr(self.cluster, _DOMAINS[domain])
        if size is None:
            return ()
        return tuple(range(index * size, min((index + 1) * size, self.worker_id_limit)))

    @property
    def n_hosts(self) -> int:
        return self.n_domains("host")

    def host_of(self, worker: int) -> int | None:
        return self.domain_of("host", worker)

    def host_workers(self, host: int) -> tuple[int, ...]:
        return self.domain_workers("host", host)

    @property
    def n_racks(self) -> int:
        return self.n_domains("rack")

    def rack_of(self, worker: int) -> int | None:
        return self.domain_of("rack", worker)

    def rack_workers(self, rack: int) -> tuple[int, ...]:
        return self.domain_workers("rack", rack)

    @property
    def state_shards(self) -> int:
        """Number of state shards under ``sharding: sharded`` (default ``cluster.workers``)."""
        return self.state.shards if self.state.shards is not None else self.cluster.workers

    @property
    def shards_per_step(self) -> int:
        """Virtual shards (micro-batches) in one global batch."""
        return self.workload.global_batch // self.workload.micro_batch

    @property
    def ideal_step_s(self) -> float:
        """Step time with all initial workers healthy: shards spread evenly, then one allreduce."""
        measured = self.workload.step_s_by_workers.get(self.cluster.workers)
        if measured is not None:
            return measured
        per_worker = math.ceil(self.shards_per_step / self.cluster.workers)
        return per_worker * self.workload.micro_batch_s + self.workload.allreduce_s

    def exchange_s(self, workers: int) -> float:
        """Sim time of one step's gradient exchange among ``workers``.

        ``fast``: ``workload.allreduce_s`` (float32 gradients). ``exact``
        (see ``real/reduce.py``) sums int32 fixed-point values, the same
        bytes, under a scale guessed from the shared momentum, so with
        replicated state it costs the same exchange (the scalar MAX that
        fixes the scale on the first step, or after a gradient spike, is
        left out: rare). With ``state.sharding: sharded`` the momentum is
        sliced and every step first takes a scalar MAX of the owners'
        maxima: latency-bound, a tree of ``2 * ceil(log2(workers))`` hops
        of ``network.latency_s``. The per-micro-batch encoding is compute,
        not priced here (``benchmarks/exact_overhead.py`` measures it).
        """
        if self.strategy.reduction == "fast" or self.state.sharding != "sharded":
            return self.workload.allreduce_s
        hops = 2 * math.ceil(math.log2(workers)) if workers > 1 else 0
        return self.workload.allreduce_s + hops * self.network.latency_s

    @property
    def worker_id_limit(self) -> int:
        """One past the largest worker id that can ever exist (workers + spares
        + joins + the cold pool, whose ids come last)."""
        return self.pool_first_id + self.cluster.spare_pool

    @property
    def pool_first_id(self) -> int:
        """The id of the first spare pulled from the cold pool (after every join)."""
        joins = sum(f.join for f in self.failures.schedule if f.join is not None)
        return self.cluster.workers + self.cluster.spares + joins

    # -- output --------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The fully resolved scenario as plain JSON-able data (lists, not tuples)."""
        return self.model_dump(mode="json")

    def to_yaml(self) -> str:
        """The fully resolved scenario as YAML; ``parse_scenario`` gives back an equal object."""
        # allow_unicode=False: characters such as U+0085 would otherwise be written
        # raw and read back as line breaks; escaped, every string round-trips.
        # _Dumper quotes strings that _Loader would read as numbers ("0E0").
        return yaml.dump(self.to_dict(), Dumper=_Dumper, sort_keys=False, allow_unicode=False)


# --------------------------------------------------------------------------
# Scale helpers: other ways to say a size, resolved into the canonical keys
#
# A person sizing a job thinks in GPUs, in "at least 90% of the nodes", in a
# per-GPU batch and in failures per 1,000 node-days (how Meta's Llama-3
# report gives them). Each helper is an alternative spelling of one
# canonical key, resolved in the raw mapping before validation and then
# dropped: the resolved scenario (``validate``, a run's scenario.yaml, the
# sweep's staleness hash) holds the canonical keys only, so a run made from
# ``cluster.gpus: 64`` and one from ``cluster.workers: 8`` are the same run.

#: helper key -> the canonical key it is an alternative to, per section. An
#: override (``--set``, ``--gpus``, a sweep's grid) of either one replaces
#: the other (see :func:`_drop_alternative`); within one layer both may not
#: be given (``cluster.gpus`` and ``cluster.workers`` may, when they agree).
SCALE_HELPERS: dict[str, dict[str, str]] = {
    "cluster": {"gpus": "workers"},
    "workload": {"per_worker_batch": "global_batch"},
    "failures": {"per_1000_node_days": "worker_mtbf_s"},
}
#: seconds in 1,000 days: ``worker_mtbf_s = NODE_DAYS_S / per_1000_node_days``
NODE_DAYS_S = 1000 * 86_400
_PERCENT = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*%\s*$")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _pos_int(value: Any, where: tuple[str | int, ...], what: str) -> int:
    if not _is_int(value) or value < 1:
        raise _Problem(where, f"expected {what} (an integer >= 1), got {_show(value)}")
    return value


def _resolve_scale(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with every scale helper turned into its canonical key (a new mapping).

    Sections that are not mappings are left for validation to report.
    """
    out = dict(data)
    sections = {k: dict(out[k]) for k in SCALE_HELPERS if isinstance(out.get(k), dict)}
    if "cluster" in sections:
        _resolve_gpus(sections["cluster"])
    if "failures" in sections:
        _resolve_rate(sections["failures"])
    out.update(sections)
    cluster = out.get("cluster", {})
    workers = cluster.workers if isinstance(cluster, Cluster) else (
        cluster.get("workers", Cluster().workers) if isinstance(cluster, dict)
        else Cluster().workers if cluster is None else None)
    if not _is_int(workers) or workers < 1:
        # cluster.workers itself is reported; what depends on it cannot be checked
        for section, key in (("workload", "per_worker_batch"), ("rendezvous", "min_workers"),
                             ("rendezvous", "max_workers")):
            node = out.get(section)
            if isinstance(node, dict) and key in node and (
                    key == "per_worker_batch" or not _is_int(node[key])):
                out[section] = {k: v for k, v in node.items() if k != key}
        return out
    if "workload" in sections:
        _resolve_batch(sections["workload"], workers)
    if isinstance(out.get("rendezvous"), dict):
        out["rendezvous"] = _resolve_fractions(dict(out["rendezvous"]), workers)
    return out


def _resolve_gpus(cluster: dict[str, Any]) -> None:
    """``cluster.gpus`` -> ``cluster.workers`` (gpus / gpus_per_worker, a whole number)."""
    if cluster.get("gpus") is None:
        cluster.pop("gpus", None)
        return
    gpus = _pos_int(cluster.pop("gpus"), ("cluster", "gpus"), "a GPU count")
    per = cluster.get("gpus_per_worker", Cluster().gpus_per_worker)
    if not _is_int(per) or per < 1:
        return  # cluster.gpus_per_worker itself is reported
    if gpus % per:
        raise _Problem(("cluster", "gpus"), f"must be a multiple of cluster.gpus_per_worker={per} "
                       f"(whole workers), got {gpus}")
    workers = cluster.get("workers")
    if workers is not None and workers != gpus // per:
        raise _Problem(("cluster", "gpus"), f"{gpus} GPUs are {gpus // per} workers of "
                       f"{per} GPUs, but cluster.workers={_show(workers)}; give one of the two")
    cluster["workers"] = gpus // per


def _resolve_rate(failures: dict[str, Any]) -> None:
    """``failures.per_1000_node_days`` -> ``failures.worker_mtbf_s`` (1,000 days / rate)."""
    if failures.get("per_1000_node_days") is None:
        failures.pop("per_1000_node_days", None)
        return
    rate = failures.pop("per_1000_node_days")
    where = ("failures", "per_1000_node_days")
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate < math.inf:
        raise _Problem(where, f"expected a failure rate (a finite number > 0), got {_show(rate)}")
    if failures.get("worker_mtbf_s") is not None:
        raise _Problem(where, "give either failures.per_1000_node_days or failures.worker_mtbf_s, "
                       "not both (one is the other: worker_mtbf_s = 86,400,000 s / rate)")
    failures["worker_mtbf_s"] = NODE_DAYS_S / rate


def _resolve_batch(workload: dict[str, Any], workers: int) -> None:
    """``workload.per_worker_batch`` -> ``workload.global_batch`` (per worker x workers)."""
    if workload.get("per_worker_batch") is None:
        workload.pop("per_worker_batch", None)
        return
    where = ("workload", "per_worker_batch")
    per = _pos_int(workload.pop("per_worker_batch"), where, "samples per worker per step")
    if workload.get("global_batch") is not None:
        raise _Problem(where, "give either workload.per_worker_batch or workload.global_batch, "
                       "not both (global_batch = per_worker_batch x cluster.workers)")
    workload["global_batch"] = per * workers


def _resolve_fractions(rdv: dict[str, Any], workers: int) -> dict[str, Any]:
    """Fractions of ``cluster.workers`` in ``min_workers``/``max_workers`` -> counts.

    One rule: an integer is a count; a float in (0, 1] or a percentage
    string in (0%, 100%] is a fraction of the initial workers (torchrun's
    ``--nnodes MIN:MAX`` spelt relative to the job). Rounded inwards, so the
    bound written always holds: ``min_workers`` up (90% of 10.5 workers
    means 10, never fewer than 90%), ``max_workers`` down (never more than
    the share written). Exact arithmetic: ``0.9`` is 9/10, not 0.900...02.
    """
    for key, up in (("min_workers", True), ("max_workers", False)):
        value = rdv.get(key)
        if value is None or _is_int(value):
            continue
        where = ("rendezvous", key)
        share = _fraction(value, where)
        count = math.ceil(share * workers) if up else math.floor(share * workers)
        said = f"{_show(value)} of cluster.workers={workers} is {count} (rounded {'up' if up else 'down'})"
        if count < 1:
            raise _Problem(where, f"{said}: must be >= 1 worker")
        if not up and count < workers:
            raise _Problem(where, f"{said}: must be >= cluster.workers={workers} (a fraction of "
                           "max_workers can only be 1.0 or '100%'; give a count to let the job grow)")
        rdv[key] = count
    return rdv


def _fraction(value: Any, where: tuple[str | int, ...]) -> Fraction:
    """The exact share a float in (0, 1] or a 'P%' string says; a _Problem otherwise."""
    expected = ("expected a worker count (an integer >= 1), a fraction of cluster.workers in "
                f"(0, 1] or a percentage such as '90%', got {_show(value)}")
    if isinstance(value, float):
        share = Fraction(repr(value)) if math.isfinite(value) else Fraction(-1)
    elif isinstance(value, str) and _PERCENT.match(value):
        share = Fraction(_PERCENT.match(value).group(1)) / 100  # type: ignore[union-attr]
    else:
        raise _Problem(where, expected)
    if not 0 < share <= 1:
        raise _Problem(where, f"{expected} (a fraction is at most 1; write an integer for a count)")
    return share


def _drop_alternative(raw: dict[str, Any], parts: tuple[str, ...]) -> None:
    """After an override of ``parts``, forget the key it is an alternative to.

    ``--set cluster.gpus=64`` (or ``--gpus 64``, or a sweep's grid) on a file
    that says ``cluster.workers: 4`` means 64 GPUs: the later word wins, as
    for any override, instead of a conflict between two layers.
    """
    if len(parts) != 2 or parts[0] not in SCALE_HELPERS:
        return
    section, key = parts
    pairs = SCALE_HELPERS[section]
    other = pairs.get(key) or next((h for h, c in pairs.items() if c == key), None)
    node = raw.get(section)
    if other is not None and isinstance(node, dict):
        node.pop(other, None)


# --------------------------------------------------------------------------
# Errors


class ScenarioError(Exception):
    """A scenario that cannot be used; ``str()`` is one line for a person.

    Format: ``<file>: <dotted.field> (line N): <what was wrong>``. The line is
    omitted when it cannot be located; a value that came from the command
    line says so instead (``(from --set)``). ``problems`` holds every problem
    found (one line each); ``str()`` shows the first.
    """

    def __init__(
        self,
        source: str,
        field: str | None,
        message: str,
        *,
        line: int | None = None,
        origin: str | None = None,
        problems: Sequence[str] = (),
    ) -> None:
        self.source = source
        self.field = field
        self.message = " ".join(message.split())
        self.line = line
        self.origin = origin
        text = self._format()
        self.problems: tuple[str, ...] = tuple(problems) or (text,)
        super().__init__(text)

    def _format(self) -> str:
        where = ""
        if self.line is not None:
            where = f" (line {self.line})"
        elif self.origin is not None:
            where = f" (from {self.origin})"
        if self.field:
            return f"{self.source}: {self.field}{where}: {self.message}"
        return f"{self.source}{where}: {self.message}"

    def __str__(self) -> str:
        return self._format()


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _num(value: float | int) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _show(value: Any) -> str:
    """A value as a person wrote it in YAML, kept short."""
    if value is True or value is False:
        return "true" if value else "false"
    if value is None:
        return "null"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _dotted(path: Sequence[str | int]) -> str:
    return ".".join(str(p) for p in path)


def _model_at(path: Sequence[str | int]) -> type[BaseModel] | None:
    """The model class that validates the mapping at ``path`` (for 'expected keys')."""
    model: Any = Scenario
    for part in path:
        if isinstance(model, type) and issubclass(model, BaseModel):
            field = model.model_fields.get(str(part))
            if field is None:
                return None
            model = field.annotation
        elif get_origin(model) is tuple and isinstance(part, int):
            model = get_args(model)[0]
        else:
            return None
        # unwrap Optional[...]
        optional = get_origin(model) in (Union, UnionType)  # X | None, Optional[X]
        args = [a for a in get_args(model) if a is not type(None)] if optional else None
        if args is not None and len(args) == 1:
            model = args[0]
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _message(err: dict[str, Any]) -> tuple[tuple[str | int, ...], str]:
    """Turn one pydantic error into (path, one-line message in our words)."""
    loc, text = _message_at(err)
    if loc and loc[-1] == "[key]":  # a mapping's key, not its value, is wrong
        return loc[:-1], f"the key {text}"
    return loc, text


def _message_at(err: dict[str, Any]) -> tuple[tuple[str | int, ...], str]:
    loc = tuple(err["loc"])
    kind = err["type"]
    ctx = err.get("ctx") or {}
    got = _show(err.get("input"))
    if kind == "value_error" and isinstance(ctx.get("error"), _Problem):
        problem = ctx["error"]
        return loc + problem.where, str(problem)
    if kind == "value_error":
        return loc, str(ctx.get("error", err["msg"]))
    if kind.startswith("rollcall_"):  # raised by our own validators, already worded
        return loc, str(err["msg"])
    if kind == "missing":
        return loc, "required key is missing"
    if kind == "extra_forbidden":
        model = _model_at(loc[:-1])
        helpers = list(SCALE_HELPERS.get(str(loc[0]), {})) if model and len(loc) == 2 else []
        keys = ", ".join(list(model.model_fields) + helpers) if model else "?"
        return loc, f"unknown key (expected one of: {keys})"
    simple = {
        "int_type": "expected an integer",
        "int_parsing": "expected an integer",
        "int_from_float": "expected an integer",
        "float_type": "expected a number",
        "float_parsing": "expected a number",
        "finite_number": "expected a finite number",
        "string_type": "expected a string",
        "model_type": "expected a mapping",
        "model_attributes_type": "expected a mapping",
        "dict_type": "expected a mapping",
        "tuple_type": "expected a list",
        "list_type": "expected a list",
    }
    if kind in simple:
        return loc, f"{simple[kind]}, got {got}"
    if kind == "literal_error":
        return loc, f"expected {ctx.get('expected')}, got {got}"
    bounds = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
    if kind in bounds:
        limit = next(iter(ctx.values()))
        return loc, f"must be {bounds[kind]} {_num(limit)}, got {got}"
    if kind == "string_pattern_mismatch":
        return loc, f"may contain only letters, digits, '_', '.' and '-', got {got}"
    return loc, f"{err['msg']}, got {got}"


# --------------------------------------------------------------------------
# YAML reading


class _Loader(yaml.SafeLoader):
    """SafeLoader with bounds, that also reads exponent floats without a sign or dot.

    Exponent floats (``1e9``, ``1.25e9``): YAML 1.1 (PyYAML) reads those as
    strings, which would turn a perfectly ordinary bandwidth into a type error.

    Bounds: ``compose_node`` counts its depth (PyYAML's composer recurses, so
    10,000 nested brackets would end in a RecursionError) and refuses an
    alias to an anchor still being composed (a cycle, which every later walk
    would follow forever). The alias-expansion budget is checked on the
    finished node graph by :func:`_check_bounds`.
    """

    source = "<string>"
    _depth = 0
    _open_anchors: frozenset[str] = frozenset()

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            if event.anchor in self._open_anchors:
                raise ScenarioError(
                    self.source, "yaml",
                    f"alias *{event.anchor} refers to the structure that contains it (a cycle)",
                    line=event.start_mark.line + 1,
                )
            return super().compose_node(parent, index)
        event = self.peek_event()
        if self._depth >= MAX_NESTING:
            raise ScenarioError(
                self.source, "yaml", f"nested deeper than {MAX_NESTING} levels",
                line=event.start_mark.line + 1,
            )
        anchor = getattr(event, "anchor", None)
        before = self._open_anchors
        self._depth += 1
        if anchor is not None:
            self._open_anchors = before | {anchor}
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1
            self._open_anchors = before


_EXP_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    _EXP_FLOAT,
    list("-+0123456789."),
)


class _Dumper(yaml.SafeDumper):
    """SafeDumper that knows _Loader's extra float form, so it quotes such strings."""


_Dumper.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    _EXP_FLOAT,
    list("-+0123456789."),
)


def _compose(text: str, source: str) -> tuple[yaml.Node | None, Any]:
    """Parse ``text`` once into both the node tree (for line numbers) and data."""
    if len(text) > MAX_SCENARIO_BYTES or len(text.encode("utf-8")) > MAX_SCENARIO_BYTES:
        raise ScenarioError(source, None, f"larger than {MAX_SCENARIO_BYTES} bytes (1 MiB), the limit "
                            "for a scenario file")
    loader = _Loader(text)
    loader.source = source
    try:
        node = loader.get_single_node()
        if node is not None:
            _check_bounds(node, source)
            _reject_duplicate_keys(node, (), source, set())
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        message = exc.problem or exc.context or "invalid YAML"
        if exc.context and exc.problem:
            # e.g. an unclosed bracket: the problem shows up later than its cause
            started = exc.context_mark
            at = f" started at line {started.line + 1}" if started and started is not mark else ""
            message = f"{exc.problem} ({exc.context}{at})"
        raise ScenarioError(
            source, "yaml syntax", message, line=mark.line + 1 if mark else None
        ) from None
    except yaml.YAMLError as exc:
        raise ScenarioError(source, "yaml syntax", str(exc)) from None
    finally:
        loader.dispose()
    return node, data


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_bounds(root: yaml.Node, source: str) -> None:
    """Refuse a node graph whose aliases expand too far or nest too deep.

    Aliases make the node tree a DAG (the composer hands back the anchored
    node itself), so the file is small while its expansion (what pydantic,
    ``repr`` and every walk would see) can be exponential. Sizes and heights
    are memoised per node, so this costs one visit per distinct node.
    """
    memo: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded nodes, height)

    def walk(node: yaml.Node, depth: int) -> tuple[int, int]:
        # ``depth`` nodes lie above this one; checked before descending, so
        # this recursion is as shallow as the limit
        known = memo.get(id(node))
        if depth >= MAX_NESTING or (known is not None and depth + known[1] > MAX_NESTING):
            raise ScenarioError(source, "yaml", f"aliases nest the data deeper than {MAX_NESTING} "
                                "levels", line=node.start_mark.line + 1)
        if known is None:
            size, height = 1, 1
            for child in _children(node):
                child_size, child_height = walk(child, depth + 1)
                size += child_size
                height = max(height, child_height + 1)
            known = memo[id(node)] = (size, height)
        return known

    expanded, _ = walk(root, 0)
    added = expanded - len(memo)
    assert added >= 0
    if added > MAX_ALIAS_NODES:
        raise ScenarioError(source, "yaml", f"aliases expand the file by {added} nodes (at most "
                            f"{MAX_ALIAS_NODES}): an alias bomb?", line=root.start_mark.line + 1)


def _reject_duplicate_keys(node: yaml.Node, path: tuple[str | int, ...], source: str,
                           seen_nodes: set[int]) -> None:
    # PyYAML silently keeps the last of two equal keys; that hides edits. An
    # aliased node is checked once (``seen_nodes``), not once per alias.
    if id(node) in seen_nodes:
        return
    seen_nodes.add(id(node))
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                if key.value in seen:
                    raise ScenarioError(
                        source,
                        _dotted(path + (key.value,)),
                        f"duplicate key (first at line {seen[key.value]})",
                        line=key.start_mark.line + 1,
                    )
                seen[key.value] = key.start_mark.line + 1
                _reject_duplicate_keys(value, path + (key.value,), source, seen_nodes)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _reject_duplicate_keys(item, path + (i,), source, seen_nodes)


def _line_of(root: yaml.Node | None, path: Sequence[str | int]) -> int | None:
    """1-based line of the deepest node along ``path`` that exists in the file."""
    if root is None:
        return None
    node: yaml.Node = root
    line = root.start_mark.line + 1
    for part in path:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                    node, line = value, key.start_mark.line + 1
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line


# --------------------------------------------------------------------------
# Overrides


def _parse_override(item: str, source: str) -> tuple[tuple[str, ...], Any]:
    key, sep, text = item.partition("=")
    key = key.strip()
    parts = tuple(key.split("."))
    if not sep or not key or any(not p for p in parts):
        raise ScenarioError(source, f"--set {item!r}", "expected dotted.key=value")
    try:
        value = _load_bounded(text, source) if text.strip() else None
    except yaml.YAMLError as exc:
        detail = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise ScenarioError(source, key, f"value {text!r} is not valid YAML: {detail}", origin="--set") from None
    return parts, value


def _load_bounded(text: str, source: str) -> Any:
    """``yaml.load`` of a ``--set`` value under the same bounds as a file."""
    loader = _Loader(text)
    loader.source = source
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_bounds(node, source)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _apply_override(raw: dict[str, Any], parts: tuple[str, ...], value: Any, source: str) -> None:
    node: Any = raw
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        where = ".".join(parts[: depth + 1])
        if isinstance(node, dict):
            if last:
                node[part] = value
            else:
                if node.get(part) is None:
                    node[part] = {}
                node = node[part]
        elif isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ScenarioError(
                    source, ".".join(parts),
                    f"{where}: no such list index (the list has {len(node)} items)", origin="--set",
                )
            if last:
                node[int(part)] = value
            else:
                node = node[int(part)]
        else:
            raise ScenarioError(
                source, ".".join(parts),
                f"cannot set inside {'.'.join(parts[:depth])}: it is {_show(node)}, not a mapping",
                origin="--set",
            )


# --------------------------------------------------------------------------
# Entry points


def parse_scenario(
    text: str,
    source: str = "<string>",
    overrides: Sequence[str] = (),
    *,
    seed: int | None = None,
    target: str | None = None,
    strategy: str | None = None,
) -> Scenario:
    """Validate a scenario given as YAML text; raise :class:`ScenarioError` on any problem.

    ``overrides`` are ``dotted.key=value`` strings (value parsed as YAML),
    applied to the raw mapping before validation; then ``seed``, ``target``
    and ``strategy`` (CLI flags) override ``seed``, ``target`` and
    ``strategy.kind``.
    """
    root, raw = _compose(text, source)
    if raw is None:
        raise ScenarioError(
            source, "top level", "the file is empty; expected a mapping of scenario keys (at least 'name')",
            line=1,
        )
    if not isinstance(raw, dict):
        raise ScenarioError(
            source, "top level",
            f"expected a mapping of scenario keys, got a {type(raw).__name__} ({_show(raw)})",
            line=root.start_mark.line + 1 if root is not None else None,
        )
    origins: dict[tuple[str, ...], str] = {}
    if isinstance(overrides, str):  # a lone string is one override, not characters
        overrides = (overrides,)
    for item in overrides:
        parts, value = _parse_override(item, source)
        _apply_override(raw, parts, value, source)
        _drop_alternative(raw, parts)
        origins[parts] = "--set"
    if seed is not None:
        raw["seed"] = seed
        origins[("seed",)] = "--seed"
    if target is not None:
        raw["target"] = target
        origins[("target",)] = "--target"
    if strategy is not None:
        section = raw.get("strategy")
        if section is None:
            raw["strategy"] = section = {}
        if isinstance(section, dict):
            section["kind"] = strategy
            origins[("strategy", "kind")] = "--strategy"
    try:
        return Scenario.model_validate(raw)
    except ValidationError as exc:
        raise _to_scenario_error(exc, source, root, origins) from None


def load_scenario(
    path: str | Path,
    overrides: Sequence[str] = (),
    *,
    seed: int | None = None,
    target: str | None = None,
    strategy: str | None = None,
) -> Scenario:
    """Read and validate a scenario file (see :func:`parse_scenario`)."""
    source = str(path)
    try:
        text = _read_bounded(Path(path), source).decode("utf-8")
    except FileNotFoundError:
        raise ScenarioError(source, None, "no such file") from None
    except UnicodeDecodeError as exc:
        raise ScenarioError(source, None, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise ScenarioError(source, None, f"cannot read: {exc.strerror or exc}") from None
    return parse_scenario(text, source, overrides, seed=seed, target=target, strategy=strategy)


class NotARegularFile(ValueError):
    """:func:`read_regular` found no regular file of at most the limit:
    ``kind`` is ``directory``, ``special`` (a device, pipe or socket) or ``large``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def read_regular(path: str | Path, limit: int) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes, else
    :class:`NotARegularFile` (``OSError`` where it cannot be opened).

    Opened non-blocking (a FIFO would block ``open`` until a writer came) and
    checked with ``fstat`` before any read: a device (``/dev/zero``), a pipe
    or a socket is refused, and at most the limit plus one byte is read, so
    a file that grows while read cannot exhaust memory either.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise NotARegularFile("directory", "is a directory")
        if not stat.S_ISREG(mode):
            raise NotARegularFile("special", "not a regular file (a device, pipe or socket)")
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        raise NotARegularFile("large", f"larger than {limit} bytes")
    return data


def _read_bounded(path: Path, source: str) -> bytes:
    """At most ``MAX_SCENARIO_BYTES`` bytes of a regular file, or a ScenarioError."""
    try:
        return read_regular(path, MAX_SCENARIO_BYTES)
    except NotARegularFile as exc:
        if exc.kind == "large":
            raise ScenarioError(source, None, f"larger than {MAX_SCENARIO_BYTES} bytes (1 MiB), "
                                "the limit for a scenario file") from None
        raise ScenarioError(source, None, f"{exc}{',' if exc.kind == 'directory' else ';'}"
                            " expected a scenario file") from None


def _to_scenario_error(
    exc: ValidationError,
    source: str,
    root: yaml.Node | None,
    origins: dict[tuple[str, ...], str],
) -> ScenarioError:
    located: list[tuple[tuple[str | int, ...], str, int | None, str | None]] = []
    for err in exc.errors():
        path, message = _message(err)
        spath = tuple(str(p) for p in path)
        # a value set on the command line is not at any line of the file:
        # the error is in it if one path is a prefix of the other
        origin = next(
            (o for p, o in reversed(origins.items()) if p[: len(spath)] == spath[: len(p)]), None
        ) if spath else None
        line = None if origin else _line_of(root, path)
        located.append((path, message, line, origin))
    lines = [
        str(ScenarioError(source, _dotted(p) or "top level", m, line=ln, origin=o))
        for p, m, ln, o in located
    ]
    path, message, line, origin = located[0]
    return ScenarioError(
        source, _dotted(path) or "top level", message, line=line, origin=origin, problems=lines
    )
