"""The sim's side of the keeper: its inputs in, its outputs carried out.

Every input reaches the core :class:`rollcall.core.Keeper` here (messages,
exit notices, the liveness report, its timer), after the commit votes that
reached it first, and whatever it decides is turned into simulated effects:
records written (and the scripted faults they make due), the generation
formed, roll calls and member lists broadcast a latency later, single
sends to agents, a restart's teardown and relaunch, the job given up. The
keeper is woken at its own timer (``Keeper.get_timer``), nothing else.
While no keeper serves (:mod:`sim.failover`) every input is lost.
"""

from __future__ import annotations

from time import perf_counter as _perf
from typing import Any, Callable, Optional, Protocol

from rollcall.core import (
    Broadcast, Deposed, Due, FaultPlan, Formed, IdRuns, JobFailed, Membership, Persist,
    Record, Relaunch, RestartJob, RollCall, Send,
)

from sim.host import Host, KeeperOutage
from sim.state import ids_of_flags

__all__ = ["Job", "KeeperInbox", "KeeperPort", "PortHost"]


class KeeperInbox(Protocol):
    """What the agents, the machines and the silences tell the keeper, and its wake-up."""

    def receive_at(self, messages: list) -> None:
        """``messages`` reach the keeper now (a scheduled delivery)."""

    def exited(self, w: int, incarnation: int) -> None:
        """The host of killed node ``w`` reports its process's exit (now)."""

    def rearm(self, now: float) -> None:
        """Wake the keeper at its own timer, which a call may have moved."""


class Job(Protocol):
    """What the keeper's outputs do to the job (the simulation's)."""

    def formed(self, now: float, out: Formed) -> None:
        """A generation was decided: the members enter it."""

    def roll_call(self, now: float, to: IdRuns, call: RollCall) -> None:
        """A roll call reaches the members ``to`` (its agents hear it next)."""

    def restart(self, now: float, teardown: IdRuns) -> None:
        """Checkpoint-restart: the processes of ``teardown`` are torn down."""

    def finish(self, now: float, completed: bool, reason: str) -> None:
        """The run ends."""


class Store(KeeperOutage, Protocol):
    """The keeper's store, and whether a keeper serves (:class:`sim.failover.KeeperFailover`)."""

    def persist(self, now: float, out: Persist) -> list: ...


class Sends(Protocol):
    """The agents' inbox (:class:`sim.agents.Agents`)."""

    def send(self, now: float, w: int, message: Any) -> None: ...

    def hold_for_singles(self, message: Any, to: IdRuns) -> None:
        """The single agents of ``to`` (paused processes) get ``message`` when they hear again."""

    def receive(self, now: float, message: Any, to: IdRuns) -> list:
        """``message`` reaches the batch's agents of ``to``: what they send."""


class Relauncher(Protocol):
    """Who starts the processes a relaunch names (:class:`sim.machines.Machines`)."""

    def relaunch(self, now: float, order: Relaunch) -> None: ...


class Carrier(Protocol):
    """Who carries out a fault (:class:`sim.nemesis.Nemesis`)."""

    def carry_out(self, now: float, due: Due) -> None: ...


class LateBeats(Protocol):
    """Whose beats are held back (:class:`sim.silence.Silences`)."""

    @property
    def late_beats(self) -> tuple[int, ...]: ...


class PortHost(Host, Protocol):
    """What the keeper's side needs of the simulation."""

    @property
    def plan(self) -> FaultPlan: ...

    @property
    def failover(self) -> Store: ...

    @property
    def agents(self) -> Sends: ...

    @property
    def machines(self) -> Relauncher: ...

    @property
    def nemesis(self) -> Carrier: ...

    @property
    def silences(self) -> LateBeats: ...


class KeeperPort:
    """One run's inputs to the keeper and the effects of its outputs."""

    def __init__(self, host: PortHost, job: Job) -> None:
        self._host = host
        self._job = job
        self._alarms: set[float] = set()  # the instants a keeper wake is set for
        self.wall_s = 0.0  # wall time spent inside the core's Keeper (profiling aid)

    # --- inputs -----------------------------------------------------------------------

    def call(self, now: float, call: Callable[..., list], *args: Any) -> None:
        """One input to the keeper at ``now``: ``call(now, *args)``, after the
        votes that reached it first, its outputs carried out. While no
        keeper serves (:mod:`sim.failover`) the input is lost."""
        host = self._host
        if host.finished or host.failover.down:
            return
        if host.voting:
            host.cast_votes(now)  # the votes that reached the keeper first
        host.count("keeper_calls")
        t = _perf()
        out = call(now, *args)
        self.wall_s += _perf() - t
        self.apply(now, out)

    def receive(self, now: float, messages: list) -> None:
        """``messages`` reach the keeper at ``now``."""
        self.call(now, self._host.keeper.receive_many, messages)

    def receive_at(self, messages: list) -> None:
        """``messages`` reach the keeper now (a scheduled delivery)."""
        self.receive(self._host.env.now, messages)

    def exited(self, w: int, incarnation: int) -> None:
        """The host of killed node ``w`` reports its process's exit.

        A physical fact, as on real (the launcher's pidfd): the host sees its
        child exit and tells the keeper in one message, so the notice arrives
        ``detector.exit_notice_s`` after the kill (by default one
        ``network.latency_s``; a calibrated run sets what the real host took,
        mostly the killed process's teardown). Whether it evicts the life
        (``exited``) is the keeper's decision.
        """
        host = self._host
        self.call(host.env.now, host.keeper.exited, w, incarnation)

    def vouch(self, now: float) -> None:
        """Tell the keeper which of the workers it tracks beat on time: all
        but the silent few (down, paused, or with beats held back), named
        instead of the 10^4 live ones (Keeper.observe_beating_except)."""
        host = self._host
        nodes = host.nodes
        silent = ids_of_flags(~(nodes.proc & ~nodes.paused))
        late = host.silences.late_beats
        if late:  # live, but their beats are late
            silent = silent | late
        host.keeper.observe_beating_except(now, silent)

    # --- the keeper's timer -------------------------------------------------------------

    def rearm(self, now: float) -> None:
        """Wake the keeper at its own timer (Keeper.get_timer: a round's
        deadline, a silent worker's expiry, the lease, giving up), after any
        call that may have moved it; a wake already set for that instant serves."""
        host = self._host
        if host.finished or host.failover.down:
            return
        t = host.keeper.get_timer()
        if t is not None:
            t = max(t, now)
            if t not in self._alarms:
                self._alarms.add(t)
                host.at(t, self.tick, t)

    def tick(self, now: float, votes: bool = False) -> None:
        """The keeper's timer fired (or, with ``votes``, a vote reaches it)."""
        host = self._host
        self._alarms.discard(now)
        if host.finished or host.failover.down:
            return
        keeper = host.keeper
        due = keeper.get_timer()
        if not votes and (due is None or due > now):
            return  # the timer moved since this wake was set: nothing is due
        host.cast_votes(now)
        host.count("keeper_calls")
        t = _perf()
        self.vouch(now)
        # the statement may answer what woke it (a new life's first expiry,
        # while it beats on time): then the keeper's timer has nothing due
        due = keeper.get_timer()
        out = keeper.handle_timer(now) if due is not None and due <= now else []
        self.wall_s += _perf() - t
        self.apply(now, out)

    # --- outputs ----------------------------------------------------------------------

    def apply(self, now: float, outputs: list) -> None:
        """Turn the keeper's outputs into simulated effects. A ``Persist``
        (always last: the keeper holds back what follows it) is answered
        first, as the keeper process does before it reads anything else: an
        effect that feeds the keeper (a restart casts the votes on their
        way) finds it ready; what it held back is carried out after the rest."""
        host, job = self._host, self._job
        held: Optional[list] = None
        if outputs and isinstance(outputs[-1], Persist):
            held = host.failover.persist(now, outputs[-1])
            outputs = outputs[:-1]
        due: list[Due] = []
        for out in outputs:
            if isinstance(out, Record):
                due += self._recorded(out.record)
            elif isinstance(out, Formed):
                job.formed(now, out)
            elif isinstance(out, Broadcast):
                msg = out.message
                if isinstance(msg, RollCall):
                    host.at(now + host.lat, self._roll_call, out.to, msg)
                elif isinstance(msg, Membership):
                    host.at(now + host.lat, self._members_told, out.to, msg)
            elif isinstance(out, Send):
                host.agents.send(now, out.to, out.message)
            elif isinstance(out, RestartJob):
                job.restart(now, out.teardown)
            elif isinstance(out, Relaunch):
                host.machines.relaunch(now, out)  # the processes the keeper names
            elif isinstance(out, JobFailed):
                job.finish(now, False, f"job failed: {out.reason}")
            elif isinstance(out, Deposed):
                pass  # its lease lapsed: sim.failover stops it at the lease's end
            else:
                assert not isinstance(out, Persist), "a Persist is the keeper's last output"
        if held is not None:
            self.apply(now, held)
        if due:  # once the keeper's outputs of this instant are carried out
            host.at(now, self._scripted, due)
        self.rearm(now)

    def _roll_call(self, to: IdRuns, call: RollCall) -> None:
        """A roll call reaches the members it was sent to (now): the job
        gives up its step, then their agents answer."""
        host = self._host
        if host.finished:
            return
        now, to = host.env.now, IdRuns.of(to)
        host.agents.hold_for_singles(call, to)  # paused processes: they hear it later
        self._job.roll_call(now, to, call)
        msgs = host.agents.receive(now, call, to)
        if msgs:  # the members with a state first, then those without
            msgs.sort(key=lambda m: m.cursor is None)
            host.at(now + host.lat, self.receive_at, msgs)

    def _members_told(self, to: IdRuns, m: Membership) -> None:
        """A generation's member list reaches the agents it was sent to (now)."""
        host = self._host
        now, to = host.env.now, IdRuns.of(to)
        host.agents.hold_for_singles(m, to)  # paused processes: they hear it later
        msgs = host.agents.receive(now, m, to)
        if msgs:
            host.at(now + host.lat, self.receive_at, msgs)

    def _recorded(self, r: dict) -> list[Due]:
        """A keeper record is written and counted: the faults it makes due."""
        host = self._host
        host.write(r)
        due = host.plan.due_by_record(r)
        f = r["f"]
        if f == "evict":
            host.count("evictions")
            if r.get("reason") == "timeout":
                host.count("detections")
        elif f == "round" and r["type"] == "invoke":
            host.count("rounds")
        return due

    def _scripted(self, due: list[Due]) -> None:
        """Carry out scripted faults the keeper's records made due."""
        host = self._host
        for fault in due:
            if host.finished:
                return
            host.nemesis.carry_out(host.env.now, fault)

