"""The messages of the rendezvous protocol, as plain frozen values.

Every message a worker sends is stamped with its ``incarnation`` (one process
life of that worker id) and, where it refers to training, the ``generation``
it believes in. The record-keeper compares those stamps with its record and
refuses anything stale: generations and incarnations are fencing tokens.

Every message the keeper sends carries its ``term``: 0 for the one keeper of
a run whose record lives in memory, and with a durable record (etcd) the
term the active keeper won its leadership in. A worker drops a message from
a term older than the newest it has seen, so a deposed keeper's late
decisions are refused by every worker (:class:`rollcall.core.agent.Agent`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

from rollcall.core.lives import Lives
from rollcall.core.placement import RecoveryPlan
from rollcall.core.types import Cursor, WorkerId

# --- worker -> record-keeper -------------------------------------------------


@dataclass(frozen=True, slots=True)
class Join:
    """Ask to be a member of the next generation.

    ``cursor`` is the training position of the state this worker holds, or
    None when it holds none (a newcomer, a restarted process). ``generation``
    is the last one it was a member of: a member asking from the current
    generation wants out of it, while an older stamp marks a late duplicate.
    """

    worker: WorkerId
    incarnation: int
    cursor: Optional[Cursor]
    generation: int = 0


@dataclass(frozen=True, slots=True)
class JoinBatch:
    """Many current lives answering a roll call with the same ``cursor``.

    Exactly what each of their :class:`Join` messages would do, in one
    message: a simulator feeds simultaneous arrivals to the keeper in one
    call. Without ``incarnations`` the workers are first lives (life 0 of
    each, stamped ``generation`` 0: the job's first arrivals) or the lives
    the keeper admitted (members answering a roll call); with them, new
    lives (a job relaunched after a restart), paired with ``workers`` in
    order.

    At scale ``workers`` is an :class:`rollcall.core.idset.IdRuns` (for a roll
    call: "every member of the generation but these few", a few runs) and
    ``incarnations`` a :class:`rollcall.core.lives.Lives` (for a relaunch: the
    keeper's own ``RestartJob.incarnations`` restricted to the relaunched),
    so the message and its handling cost runs, not workers.
    """

    workers: Sequence[WorkerId]
    cursor: Optional[Cursor]
    incarnations: Optional[Sequence[int]] = None
    # the generation every one of these joins is stamped with (Join.generation):
    # a batch that answers an older round than its lives have since entered
    # is a late copy for them, as each Join would be
    generation: int = 0


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A liveness counter; only its advance matters, never a timestamp."""

    worker: WorkerId
    incarnation: int
    generation: int
    counter: int


@dataclass(frozen=True, slots=True)
class Leave:
    worker: WorkerId
    incarnation: int


@dataclass(frozen=True, slots=True)
class StepFailed:
    """A collective of ``generation`` failed here: a peer may be gone."""

    worker: WorkerId
    incarnation: int
    generation: int
    step: int


@dataclass(frozen=True, slots=True)
class Checkpointed:
    """A checkpoint of ``cursor`` is durable; newcomers-only rounds resume it."""

    worker: WorkerId
    incarnation: int
    generation: int
    cursor: Cursor


ToKeeper = Union[Join, JoinBatch, Heartbeat, Leave, StepFailed, Checkpointed]

# --- record-keeper -> worker -------------------------------------------------


@dataclass(frozen=True, slots=True)
class RollCall:
    """Round ``generation`` is open: members of the previous one must answer.

    Whatever the ``reason`` (``failure``, ``step-failed``, ``growth``,
    ``leave``, ``rejoin``), the member abandons the step in flight and joins:
    members stop at different step boundaries, so finishing "the" step first
    could leave one waiting in an exchange the others never enter.
    """

    generation: int
    reason: str
    term: int = 0


@dataclass(frozen=True, slots=True)
class Membership:
    """Generation ``generation`` is closed: the one answer for it.

    ``cursor`` is where training resumes; ``source`` the member whose state
    everyone else copies, or None to load the checkpoint at ``cursor`` (or to
    initialise fresh when ``cursor`` is the origin). ``stale`` lists the
    members whose state must be replaced before the first step.
    ``incarnations`` pairs with ``members``: a later life of a worker id must
    not mistake an answer meant for an earlier one for its own.

    Sharded state only (defaults otherwise; exact meaning in
    :mod:`rollcall.core.keeper`): ``placement`` holds, per shard, its holders
    (owner first); ``recovery`` the copies and reloads to do before the first
    step; ``fallback`` says a shard was lost and the generation resumes from
    the checkpoint at ``cursor``.
    """

    generation: int
    members: Sequence[WorkerId]  # from the keeper: an IdRuns (sorted ids)
    incarnations: Sequence[int]  # from the keeper: a Lives, paired with members
    cursor: Cursor
    source: Optional[WorkerId]
    stale: Sequence[WorkerId] = ()
    placement: Optional[tuple[tuple[WorkerId, ...], ...]] = None
    recovery: Optional[RecoveryPlan] = None
    fallback: bool = False
    term: int = 0

    def admits(self, worker: WorkerId, incarnation: int) -> bool:
        incs = self.incarnations
        if isinstance(incs, Lives) and incs.members is self.members:
            return incs.of(worker) == incarnation  # by id: no rank lookup
        try:
            rank = self.members.index(worker)
        except ValueError:
            return False
        return self.incarnations[rank] == incarnation


@dataclass(frozen=True, slots=True)
class Refused:
    """A stale or unknown stamp was refused; ``generation`` is the current one.

    ``reason`` is ``not-member`` (you were evicted: rejoin as a newcomer),
    ``stale-incarnation`` (an older life of this worker: stop) or
    ``stale-generation`` (drop what you were doing).
    """

    worker: WorkerId
    incarnation: int
    generation: int
    reason: str
    term: int = 0


ToWorker = Union[RollCall, Membership, Refused]
