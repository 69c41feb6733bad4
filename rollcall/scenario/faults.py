"""Scheduled faults: one model per action, picked by the action's key.

A fault of ``failures.schedule`` is a mapping with exactly one trigger and
exactly one action key. The action key picks the model (a pydantic union
with a discriminator), so each model holds only the keys its action takes,
and code that reads a fault reads one of fourteen small types.

Triggers: ``at_s`` (simulated/elapsed seconds), ``at_step`` (when the job
reaches that committed step) or ``at_roll_call`` (a generation >= 1: when
the keeper opens the roll call that forms it, a protocol event, so the
fault lands during that roll call on both targets; it never fires if the
job ends first). The actions are the classes below, each documented where
it is declared.

Before the union picks a model, :func:`_one_trigger_one_action` checks the
mapping's shape (one trigger, one action, ``for_s`` and the action's own
key where they belong), so a person reads the same one-line errors
whatever the action.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, Union, get_args

from pydantic import BeforeValidator, Discriminator, Tag, model_serializer, model_validator
from pydantic_core import PydanticCustomError

from rollcall.scenario.base import (
    MAX_WORKER_IDS, NonNegFloat, NonNegInt, PosFloat, PosInt, Problem, Section, check_slowdown, num,
    show,
)

FaultTrigger = Literal["at_s", "at_step", "at_roll_call"]
FaultAction = Literal["kill", "kill_rack", "lose_host", "partition", "isolate_keeper", "delay",
                      "loss", "pause", "slow", "late_heartbeats", "join", "kill_keeper",
                      "kill_etcd", "partition_keeper"]
TRIGGERS: tuple[str, ...] = get_args(FaultTrigger)
ACTIONS: tuple[str, ...] = get_args(FaultAction)
#: the faults of a host's links (hosts mode, real target: nftables rules in
#: real.netns, or for ``delay`` the host agent's relay of its workers' keeper link)
LINK_ACTIONS = ("partition", "isolate_keeper", "delay", "loss")
#: the actions that last ``for_s``
TIMED = ("pause", "partition", "isolate_keeper", "delay", "loss", "slow", "late_heartbeats",
         "partition_keeper")
#: an action's own parameter: action -> key (required with it, allowed only with it)
PARAMETER_KEYS = {"delay": "latency_s", "loss": "rate", "slow": "factor",
                  "late_heartbeats": "delay_s"}
_PARAMETER_WHAT = {"latency_s": "extra one-way seconds (> 0)",
                   "rate": "the fraction of packets dropped, 0 <= rate < 1",
                   "factor": "how many times slower the worker computes (> 1)",
                   "delay_s": "seconds late each heartbeat reaches the keeper (> 0)"}
#: every key a fault may hold, in the one order a fault is written out
FAULT_KEYS = ("at_s", "at_step", "at_roll_call", "kill", "kill_rack", "lose_host", "partition",
              "isolate_keeper", "delay", "latency_s", "loss", "rate", "pause", "slow", "factor",
              "late_heartbeats", "delay_s", "for_s", "join", "kill_keeper", "kill_etcd",
              "partition_keeper")
#: the most extra one-way latency a ``delay`` fault may add, on both targets: the
#: real host agent's relay holds what it delays (``real/wire.py`` refuses more), and
#: a scenario must mean the same on the sim, so it is refused before either runs
MAX_LATENCY_S = 3600.0


# --------------------------------------------------------------------------
# What a fault names: worker ids, a rack or host index, or "random"


def _worker_id(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PydanticCustomError("rollcall_worker_ids", "expected a worker id (integer), got {got}",
                                  {"got": show(value)})
    if not 0 <= value < MAX_WORKER_IDS:
        raise PydanticCustomError(
            "rollcall_worker_ids", "worker ids are 0..{top}, got {got}",
            {"top": MAX_WORKER_IDS - 1, "got": show(value)},
        )
    return value


def _workers(value: Any) -> Any:
    """A worker id, a list of distinct ones, or ``"random"``."""
    if value == "random":
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
        {"got": show(value)},
    )


def _one_worker(value: Any) -> Any:
    if value == "random":
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return _worker_id(value)
    raise PydanticCustomError(
        "rollcall_worker_id", "expected a worker id or 'random', got {got}", {"got": show(value)}
    )


def _domain_index(what: str) -> BeforeValidator:
    def check(value: Any) -> Any:
        if value == "random":
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            if value < 0:
                raise PydanticCustomError(
                    "rollcall_domain", "{what} indices are >= 0, got {got}",
                    {"what": what, "got": show(value)},
                )
            return value
        raise PydanticCustomError(
            "rollcall_domain", "expected a {what} index (integer >= 0) or 'random', got {got}",
            {"what": what, "got": show(value)},
        )
    return BeforeValidator(check)


WorkerTargets = Annotated[Union[int, tuple[int, ...], Literal["random"]], BeforeValidator(_workers)]
OneWorker = Annotated[Union[int, Literal["random"]], BeforeValidator(_one_worker)]
RackIndex = Annotated[Union[int, Literal["random"]], _domain_index("rack")]
HostIndex = Annotated[Union[int, Literal["random"]], _domain_index("host")]
Targets = Union[tuple[int, ...], Literal["random"]]


# --------------------------------------------------------------------------
# The models


class FaultBase(Section):
    """What every fault has: its trigger, and what it hits in common terms."""

    ACTION: ClassVar[str]
    at_s: NonNegFloat | None = None
    at_step: NonNegInt | None = None
    at_roll_call: PosInt | None = None

    @model_serializer(mode="wrap")
    def _written_out(self, handler: Any) -> dict[str, Any]:
        # the keys that are set, in the one order of FAULT_KEYS
        out = handler(self)
        return {key: out[key] for key in FAULT_KEYS if out.get(key) is not None}

    @property
    def trigger(self) -> FaultTrigger:
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
    def action(self) -> FaultAction:
        return self.ACTION  # type: ignore[return-value]

    @property
    def targets(self) -> Targets:
        """Worker ids hit by a kill, pause, slow or late_heartbeats (``"random"``
        stays a string); () for every other action (a rack's or a host's
        workers are those alive when it fires: :meth:`Scenario.domain_workers`)."""
        return ()

    @property
    def subject(self) -> Any:
        """What the fault hits, as its action's key says it: worker targets,
        a rack or host index, hosts, a count of newcomers, an etcd member."""
        return getattr(self, self.ACTION)

    @property
    def parameters(self) -> dict[str, float]:
        """The action's numbers by key: ``for_s`` and its own parameter, where it has them."""
        return {key: getattr(self, key) for key in ("for_s", *PARAMETER_KEYS.values())
                if key in type(self).model_fields}

    @property
    def domain(self) -> tuple[str, int | Literal["random"]] | None:
        """``("rack", index)`` for a ``kill_rack``, ``("host", index)`` for a
        ``lose_host`` (the failure domain it takes down whole); None otherwise."""
        return None

    @property
    def rack(self) -> int | Literal["random"] | None:
        """The rack a ``kill_rack`` takes down (an index or ``"random"``); None otherwise."""
        domain = self.domain
        return domain[1] if domain is not None and domain[0] == "rack" else None

    @property
    def host(self) -> int | Literal["random"] | None:
        """The host a ``lose_host`` takes down (an index or ``"random"``); None otherwise."""
        domain = self.domain
        return domain[1] if domain is not None and domain[0] == "host" else None

    @property
    def hosts(self) -> tuple[int, ...]:
        """The hosts a ``partition`` or an ``isolate_keeper`` cuts off; () otherwise."""
        return ()

    @property
    def link(self) -> int | Literal["random"] | None:
        """The host whose link a ``delay`` or ``loss`` degrades (an index or
        ``"random"``); None otherwise."""
        return None

    @property
    def newcomers(self) -> int:
        """How many new workers a ``join`` brings (0 for every other action)."""
        return 0

    @property
    def count(self) -> int:
        """How many workers the fault affects: newcomers for a join; 1 for a
        whole rack or host or a host's link; the hosts a partition cuts off;
        its targets for a worker fault; 0 for a fault of the keeper or etcd."""
        if self.newcomers:
            return self.newcomers
        if self.domain is not None or self.link is not None:
            return 1
        if self.hosts:
            return len(self.hosts)
        targets = self.targets
        return 1 if targets == "random" else len(targets)


class _WorkerFault(FaultBase):
    """A fault whose action names worker ids, one or a list, or ``"random"``."""

    @property
    def targets(self) -> Targets:
        value = getattr(self, self.ACTION)
        return value if value == "random" or isinstance(value, tuple) else (value,)

    @property
    def subject(self) -> Targets:
        return self.targets


class KillFault(_WorkerFault):
    """``kill``: ids, or "random": each process dies, its host reports the exit."""

    ACTION = "kill"
    kill: WorkerTargets


class KillRackFault(FaultBase):
    """``kill_rack``: a rack index, or "random": every live worker of that
    rack at once, a correlated failure; needs ``cluster.rack_size``."""

    ACTION = "kill_rack"
    kill_rack: RackIndex

    @property
    def domain(self) -> tuple[str, int | Literal["random"]]:
        return ("rack", self.kill_rack)


class LoseHostFault(FaultBase):
    """``lose_host``: a host index, or "random": the machine dies, every
    process on it at once, no exit reported; needs ``cluster.workers_per_host``."""

    ACTION = "lose_host"
    lose_host: HostIndex

    @property
    def domain(self) -> tuple[str, int | Literal["random"]]:
        return ("host", self.lose_host)


class PartitionFault(FaultBase):
    """``partition``: a list of host indices cut off from everyone else, the
    keeper staying with the rest, for ``for_s`` seconds (on real, hosts
    mode, nftables rules)."""

    ACTION = "partition"
    partition: tuple[NonNegInt, ...]
    for_s: PosFloat

    @model_validator(mode="after")
    def _each_host_once(self) -> "PartitionFault":
        if not self.partition or len(set(self.partition)) != len(self.partition):
            raise Problem(("partition",), "lists each host once, at least one")
        return self

    @property
    def hosts(self) -> tuple[int, ...]:
        return self.partition


class IsolateKeeperFault(FaultBase):
    """``isolate_keeper``: a host index: the host loses the keeper but not
    its peers for ``for_s`` seconds, heartbeats stop while collectives still
    work, the gray failure (on real, nftables rules)."""

    ACTION = "isolate_keeper"
    isolate_keeper: NonNegInt
    for_s: PosFloat

    @property
    def hosts(self) -> tuple[int, ...]:
        return (self.isolate_keeper,)


class DelayFault(FaultBase):
    """``delay``: a host index or "random", with ``latency_s``: the host's
    link gets that much extra one-way latency for ``for_s`` seconds (on
    real, the host agent's relay of the keeper link holds it back; gloo is
    not delayed)."""

    ACTION = "delay"
    delay: HostIndex
    latency_s: PosFloat
    for_s: PosFloat

    @model_validator(mode="after")
    def _relay_holds_it(self) -> "DelayFault":
        _at_most_max_latency("latency_s", self.latency_s)
        return self

    @property
    def link(self) -> int | Literal["random"]:
        return self.delay


class LossFault(FaultBase):
    """``loss``: a host index or "random", with ``rate``, 0 <= rate < 1: the
    host's link drops that fraction of packets for ``for_s`` seconds. Every
    transport is TCP, so a drop is a retransmission, a delay, never a lost
    message (:mod:`sim.network`; on real, nftables rules)."""

    ACTION = "loss"
    loss: HostIndex
    rate: NonNegFloat
    for_s: PosFloat

    @model_validator(mode="after")
    def _not_a_partition(self) -> "LossFault":
        if not self.rate < 1:
            raise Problem(("rate",), f"must be < 1 (a link that drops every packet is a "
                                     f"partition: use partition), got {num(self.rate)}")
        return self

    @property
    def link(self) -> int | Literal["random"]:
        return self.loss


class PauseFault(_WorkerFault):
    """``pause``: one id or "random", for ``for_s`` seconds (SIGSTOP, SIGCONT)."""

    ACTION = "pause"
    pause: OneWorker
    for_s: PosFloat


class SlowFault(_WorkerFault):
    """``slow``: one id or "random", with ``factor`` > 1: the worker computes
    ``factor`` times slower for ``for_s`` seconds, a straggler; its
    heartbeats stay on time."""

    ACTION = "slow"
    slow: OneWorker
    factor: PosFloat
    for_s: PosFloat

    @model_validator(mode="after")
    def _slower(self) -> "SlowFault":
        check_slowdown("factor", self.factor)
        return self


class LateHeartbeatsFault(_WorkerFault):
    """``late_heartbeats``: one id or "random", with ``delay_s``: the
    worker's heartbeats reach the keeper ``delay_s`` late, in order, for
    ``for_s`` seconds; its work and its other messages are on time."""

    ACTION = "late_heartbeats"
    late_heartbeats: OneWorker
    delay_s: PosFloat
    for_s: PosFloat

    @model_validator(mode="after")
    def _relay_holds_it(self) -> "LateHeartbeatsFault":
        _at_most_max_latency("delay_s", self.delay_s)
        return self


class JoinFault(FaultBase):
    """``join``: a count of newcomers, which take the next unused ids."""

    ACTION = "join"
    join: PosInt

    @property
    def newcomers(self) -> int:
        return self.join


class KillKeeperFault(FaultBase):
    """``kill_keeper: active``: the active record-keeper dies, a standby
    takes over; needs ``keeper.store: etcd`` and ``keeper.standbys >= 1``."""

    ACTION = "kill_keeper"
    kill_keeper: Literal["active"]

    @property
    def subject(self) -> tuple[int, ...]:
        return ()  # no worker


class KillEtcdFault(FaultBase):
    """``kill_etcd``: the index of one member of the keeper's etcd cluster,
    which dies: with two of three left the job must not notice; needs
    ``keeper.store: etcd``."""

    ACTION = "kill_etcd"
    kill_etcd: NonNegInt


class PartitionKeeperFault(FaultBase):
    """``partition_keeper: active``, for ``for_s`` seconds: the active keeper
    is cut off from etcd, not from its workers; it cannot renew its lease,
    stops deciding when the lease ends on its own clock, and a standby takes
    over; needs what ``kill_keeper`` needs."""

    ACTION = "partition_keeper"
    for_s: PosFloat
    partition_keeper: Literal["active"]



FAULT_MODELS: dict[str, type[FaultBase]] = {model.ACTION: model for model in (
    KillFault, KillRackFault, LoseHostFault, PartitionFault, IsolateKeeperFault, DelayFault,
    LossFault, PauseFault, SlowFault, LateHeartbeatsFault, JoinFault, KillKeeperFault,
    KillEtcdFault, PartitionKeeperFault)}
assert tuple(FAULT_MODELS) == ACTIONS


def _at_most_max_latency(key: str, value: float) -> None:
    if not value <= MAX_LATENCY_S:
        raise Problem((key,), f"must be <= {num(MAX_LATENCY_S)} (the real target holds "
                              f"what it delays), got {num(value)}")


# --------------------------------------------------------------------------
# The union: its shape checked first, then the action's key picks the model


def _one_trigger_one_action(value: Any) -> Any:
    """The mapping with its unset (null) keys dropped, once its shape is right:
    no unknown key, one trigger, one action, and ``for_s`` and the action's
    own parameter exactly where they belong."""
    if isinstance(value, FaultBase):
        return value
    if not isinstance(value, dict):
        raise PydanticCustomError("rollcall_mapping", "expected a mapping, got {got}",
                                  {"got": show(value)})
    unknown = [key for key in value if key not in FAULT_KEYS]
    if unknown:
        raise Problem((unknown[0],), f"unknown key (expected one of: {', '.join(FAULT_KEYS)})")
    given = {key: item for key, item in value.items() if item is not None}
    triggers = [key for key in TRIGGERS if key in given]
    if not triggers:
        raise Problem((), "a fault needs exactly one trigger: at_s, at_step or at_roll_call")
    if len(triggers) > 1:
        raise Problem((triggers[1],), f"a fault has exactly one trigger, got both "
                                      f"{' and '.join(triggers)}")
    actions = [key for key in ACTIONS if key in given]
    if not actions:
        raise Problem((), f"a fault needs exactly one action: {', '.join(ACTIONS[:-1])}"
                          f" or {ACTIONS[-1]}")
    if len(actions) > 1:
        raise Problem((actions[1],), f"a fault has exactly one action, got {' and '.join(actions)}")
    _check_parameter_keys(actions[0], given)
    return given


def _check_parameter_keys(action: str, given: dict[str, Any]) -> None:
    """``for_s`` with a timed action only; ``delay`` takes ``latency_s``,
    ``loss`` ``rate``, ``slow`` ``factor`` and ``late_heartbeats`` ``delay_s``,
    each with its own action only."""
    timed = action in TIMED
    if timed and "for_s" not in given:
        raise Problem(("for_s",), f"required with {action}: seconds it lasts (> 0)")
    if not timed and "for_s" in given:
        raise Problem(("for_s",), f"only allowed with {', '.join(TIMED)}, not with {action}")
    for owner, key in PARAMETER_KEYS.items():
        if action == owner and key not in given:
            raise Problem((key,), f"required with {owner}: {_PARAMETER_WHAT[key]}")
        if action != owner and key in given:
            raise Problem((key,), f"only allowed with {owner}, not with {action}")


def _model_tag(value: Any) -> str | None:
    """The union member for ``value``: its one action key (checked before)."""
    if isinstance(value, FaultBase):
        return type(value).__name__
    if isinstance(value, dict):
        action = next((key for key in ACTIONS if key in value), None)
        return None if action is None else FAULT_MODELS[action].__name__
    return None


#: the tags the union puts in an error's location (a model's name, never a key)
FAULT_TAGS: dict[str, type[FaultBase]] = {model.__name__: model for model in FAULT_MODELS.values()}

Fault = Annotated[
    Union[
        Annotated[KillFault, Tag("KillFault")],
        Annotated[KillRackFault, Tag("KillRackFault")],
        Annotated[LoseHostFault, Tag("LoseHostFault")],
        Annotated[PartitionFault, Tag("PartitionFault")],
        Annotated[IsolateKeeperFault, Tag("IsolateKeeperFault")],
        Annotated[DelayFault, Tag("DelayFault")],
        Annotated[LossFault, Tag("LossFault")],
        Annotated[PauseFault, Tag("PauseFault")],
        Annotated[SlowFault, Tag("SlowFault")],
        Annotated[LateHeartbeatsFault, Tag("LateHeartbeatsFault")],
        Annotated[JoinFault, Tag("JoinFault")],
        Annotated[KillKeeperFault, Tag("KillKeeperFault")],
        Annotated[KillEtcdFault, Tag("KillEtcdFault")],
        Annotated[PartitionKeeperFault, Tag("PartitionKeeperFault")],
    ],
    Discriminator(_model_tag),
    BeforeValidator(_one_trigger_one_action),
]
"""A scheduled fault: one of the models above, picked by its action's key."""
