"""The scenario schema: one YAML file describes a whole experiment.

A scenario names a cluster, a workload, a failure model and a recovery
strategy; the ``sim`` and ``real`` targets both run from the same validated
object, so every check lives here and no driver re-interprets raw YAML.

Errors matter as much as the schema: a person edits these files by hand, so
every problem is reported as ONE line naming the file, the dotted field and
the line in the file (``bad.yaml: workload.micro_batch (line 9): must divide
workload.global_batch=64, got 7``). Pydantic does the checking; the loader
maps its errors back onto YAML nodes found with ``yaml.compose``.

The modules, in the order they build on each other: ``base`` (bounds, field
types, :class:`ScenarioError`), ``faults`` (a scheduled fault, one model per
action), ``sections``, ``scale`` (other ways to say a size), ``yaml_text``
(bounded YAML), ``model`` (:class:`Scenario`) and ``loader`` (the entry
points). Import from here.
"""

from rollcall.scenario.base import (
    MAX_ALIAS_NODES, MAX_EXTRA_JOINS, MAX_NESTING, MAX_SCENARIO_BYTES, MAX_WORKER_IDS,
    ScenarioError,
)
from rollcall.scenario.faults import (
    FAULT_KEYS, FAULT_MODELS, LINK_ACTIONS, MAX_LATENCY_S, DelayFault, Fault, FaultAction, FaultBase,
    FaultTrigger, IsolateKeeperFault, JoinFault, KillEtcdFault, KillFault, KillKeeperFault,
    KillRackFault, LateHeartbeatsFault, LoseHostFault, LossFault, PartitionFault,
    PartitionKeeperFault, PauseFault, SlowFault,
)
from rollcall.scenario.loader import NotARegularFile, load_scenario, parse_scenario, read_regular
from rollcall.scenario.model import Scenario
from rollcall.scenario.scale import NODE_DAYS_S, SCALE_HELPERS
from rollcall.scenario.sections import (
    Cluster, Detector, Failures, KeeperSection, Network, Rendezvous, RepairPipeline, SlowFactor,
    State, Strategy, Workload,
)
from rollcall.scenario.yaml_text import ScenarioDumper

__all__ = [
    "Cluster", "DelayFault", "Detector", "FAULT_KEYS", "FAULT_MODELS", "Failures", "Fault", "FaultAction",
    "FaultBase", "FaultTrigger", "IsolateKeeperFault", "JoinFault", "KeeperSection",
    "KillEtcdFault", "KillFault", "KillKeeperFault", "KillRackFault", "LINK_ACTIONS",
    "LateHeartbeatsFault", "LoseHostFault", "LossFault", "MAX_ALIAS_NODES", "MAX_EXTRA_JOINS",
    "MAX_LATENCY_S", "MAX_NESTING", "MAX_SCENARIO_BYTES", "MAX_WORKER_IDS", "NODE_DAYS_S",
    "Network", "NotARegularFile", "PartitionFault", "PartitionKeeperFault", "PauseFault",
    "Rendezvous", "RepairPipeline", "SCALE_HELPERS", "Scenario", "ScenarioDumper",
    "ScenarioError", "SlowFactor", "SlowFault", "State", "Strategy", "Workload",
    "load_scenario", "parse_scenario", "read_regular",
]
