"""The sans-IO core: every decision rollcall makes, and nothing else.

Pure Python, standard library only (``tests/test_purity.py`` enforces it):
no clock, socket, thread, file or global random state. Each piece is handed
``now`` and inputs and returns outputs; the drivers (``sim/``, ``real/``)
turn outputs into effects and report physical facts as inputs. Drivers use
only the names below; the submodules' other names are internals.

- :mod:`~rollcall.core.keeper`: the record-keeper (membership, generations,
  resume point, restarts and relaunches, the commit vote, shard recovery).
- :mod:`~rollcall.core.agent`: a worker's side of the protocol.
- :mod:`~rollcall.core.agents`: many agents at once, grouped by identical
  state (a simulator's bulk nodes), shown equivalent to single agents.
- :mod:`~rollcall.core.detector`: the failure-detector policy.
- :mod:`~rollcall.core.stragglers`: the straggler policy (evict a slow member
  only when the job is faster without it).
- :mod:`~rollcall.core.reshard`: data order, virtual shards, batch policy.
- :mod:`~rollcall.core.placement`, :mod:`~rollcall.core.sharding`: sharded state.
- :mod:`~rollcall.core.job`: checkpoint policy and completion rule.
- :mod:`~rollcall.core.joins`: lives started together join together.
- :mod:`~rollcall.core.completion`: when a job that has all its steps is over.
- :mod:`~rollcall.core.progress`: when a job is not expected to finish
  (failures faster than it recovers, or no progress over many recoveries).
- :mod:`~rollcall.core.failures`: random lifetimes and choices, by (seed, name, k).
- :mod:`~rollcall.core.faults`: the fault plan, which scripted or random fault
  is due when (by training time or by committed step).
- :mod:`~rollcall.core.step_faults`: the instant a fault scripted ``at_step``
  lands, on both targets (every member answered for the step).
- :mod:`~rollcall.core.repairs`: a failed node's repair or retirement, and
  when spares are pulled from a cold pool.
- :mod:`~rollcall.core.history`, :mod:`~rollcall.core.checkers`: the record
  format both targets write and the invariant checkers that read it.
- :mod:`~rollcall.core.accounting`: where a run's time went (productive,
  checkpoint, lost, recovery, stall), read from its history.
"""

from __future__ import annotations

from rollcall.core.accounting import TimeAccount, time_account
from rollcall.core.agent import (
    Abort, Action, Agent, AgentState, Enter, Log, Phase, SendToKeeper, Stop,
)
from rollcall.core.agents import AgentBatch, GroupAction, LifeSource
from rollcall.core.codec import (
    TO_KEEPER_TYPES, TO_WORKER_TYPES, WIRE_MESSAGE_TYPES, CodecError, check_cursor, check_flag,
    check_id_set, check_list,
    check_nat, check_text, message_from_data, message_to_data,
)
from rollcall.core.checkers import CheckReport, DataSpec, check, summarize_report
from rollcall.core.detector import Detector, PhiDetector, TimeoutDetector, make_detector
from rollcall.core.completion import FINAL_GRACE_S, Completion, Final
from rollcall.core.failures import Draws, FailureModel, SlowdownModel
from rollcall.core.faults import Due, FaultPlan, ScheduledFault
from rollcall.core.history import (
    DRIVER, JOB, KEEPER, NEMESIS, FailureTally, commit, expand_deltas, members_delta,
    members_field, rec,
)
from rollcall.core.idset import EMPTY, IdRuns
from rollcall.core.job import JobPolicy
from rollcall.core.joins import JoinBatches
from rollcall.core.keeper import (
    LEASE_MARGIN, RENEW_SHARE, Broadcast, CommitVerdict, Deposed, Formed, JobFailed, Keeper,
    KeeperConfig, Output, Persist, Record, Relaunch, RestartJob, Send, last_renewal,
)
from rollcall.core.record import KeeperRecord, record_from_data, record_to_data
from rollcall.core.lives import Lives
from rollcall.core.messages import (
    Checkpointed, Heartbeat, Join, JoinBatch, Leave, Membership, Refused, RollCall,
    StepFailed, ToKeeper, ToWorker,
)
from rollcall.core.placement import Copy, RecoveryPlan, Reload
from rollcall.core.progress import FAILED_ATTEMPTS_LIMIT, NOT_EXPECTED, RECOVERY_WINDOW
from rollcall.core.repairs import Blame, Pull, Repair, RepairPolicy, RepairShop, Retire, Warm
from rollcall.core.reshard import (
    describe_assignment, lr_scale, plan_step, rank_range, sample_ids, step_batch, stripes,
)
from rollcall.core.sharding import ShardSpec, split_bytes
from rollcall.core.step_faults import BEFORE_THE_ANSWER, StepAnswers, StepDue, StepFaults
from rollcall.core.stragglers import StragglerPolicy
from rollcall.core.types import Cursor, WorkerId, from_ranges

__all__ = [
    "Abort", "Action", "Agent", "AgentBatch", "AgentState", "BEFORE_THE_ANSWER", "Blame", "Broadcast", "CheckReport",
    "Checkpointed", "CodecError", "CommitVerdict", "Completion", "Copy", "Cursor", "DRIVER", "DataSpec", "Deposed",
    "Draws", "Due", "EMPTY", "Enter", "FAILED_ATTEMPTS_LIMIT", "FINAL_GRACE_S", "FailureModel", "FailureTally", "FaultPlan",
    "Final", "Formed", "GroupAction",
    "Heartbeat", "IdRuns", "JOB", "JobFailed", "JobPolicy", "Join", "JoinBatch", "JoinBatches", "KEEPER",
    "Keeper", "KeeperConfig", "KeeperRecord", "LEASE_MARGIN", "Leave", "LifeSource", "Lives", "Log", "Membership", "NEMESIS",
    "NOT_EXPECTED",
    "Output", "Persist", "Phase", "Pull", "RECOVERY_WINDOW", "RENEW_SHARE", "Record", "RecoveryPlan", "Refused", "Relaunch", "Reload",
    "Repair", "RepairPolicy", "RepairShop", "RestartJob", "Retire",
    "RollCall", "ScheduledFault", "Send", "SendToKeeper", "ShardSpec", "SlowdownModel", "StepAnswers", "StepDue", "StepFailed", "StepFaults", "Stop",
    "StragglerPolicy",
    "TO_KEEPER_TYPES", "TimeAccount",
    "TO_WORKER_TYPES", "Detector", "PhiDetector", "TimeoutDetector", "ToKeeper", "ToWorker",
    "WIRE_MESSAGE_TYPES", "Warm",
    "WorkerId", "check", "check_cursor", "check_flag", "check_id_set", "check_list", "check_nat",
    "check_text", "commit",
    "describe_assignment", "expand_deltas", "from_ranges", "last_renewal", "lr_scale",
    "make_detector",
    "members_delta", "members_field",
    "message_from_data", "message_to_data", "plan_step", "rank_range", "rec", "record_from_data",
    "record_to_data", "sample_ids",
    "split_bytes", "step_batch", "stripes", "summarize_report", "time_account",
]
