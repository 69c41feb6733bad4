"""The keeper's outputs, carried out on the real target.

Whatever the keeper decides comes back to the launcher as outputs (frames
to workers, history records, a generation formed, a job restart and its
relaunch, a failed job) and as commit verdicts; :class:`Outputs` carries
them out and keeps what the launcher knows of the job from them: the latest
generation and its members, when training started, what was committed.
It is the keeper's :class:`real.keeper_port.Sink` for a keeper in the
launcher's process, and its :class:`real.keeper_port.RemoteSink` for a
keeper in processes of its own (:class:`real.keeper_link.RemoteKeeper`).
It reaches the launcher only through :class:`OutputsHost`.
"""

from __future__ import annotations

import signal
from typing import Any, Optional, Protocol

from rollcall.core import (
    EMPTY, Broadcast, CommitVerdict, Completion, FaultPlan, Formed, IdRuns, JobFailed, Record,
    Relaunch, RestartJob, Send, StepDue,
)

from real.fault_timing import FaultTiming
from real.keeper_port import CommitAsk
from real.lives import Lives
from real.processes import Processes
from real.service import Service

__all__ = ["Outputs", "OutputsHost"]


class Injector(Protocol):
    """The fault injector (:class:`real.nemesis.Nemesis`)."""

    def inject(self, due: Any) -> None: ...

    def forget_dead(self) -> None: ...


class OutputsHost(Protocol):
    """What carrying out the keeper's outputs needs of the launcher."""

    @property
    def keeper(self) -> Any:
        """The keeper's port (:class:`real.keeper_port.LocalKeeper` or a remote one)."""

    @property
    def service(self) -> Service: ...

    @property
    def processes(self) -> Processes: ...

    @property
    def lives(self) -> Lives: ...

    @property
    def faults(self) -> FaultPlan: ...

    @property
    def fault_timing(self) -> FaultTiming: ...

    @property
    def nemesis(self) -> Injector: ...

    @property
    def completion(self) -> Completion: ...

    @property
    def result(self) -> Optional[str]: ...

    def now(self) -> float: ...

    def write(self, record: dict) -> None: ...

    def finish(self, result: str, reason: str) -> None: ...


class Outputs:
    """The keeper's outputs and commit verdicts of one real run, carried out."""

    def __init__(self, host: OutputsHost) -> None:
        self._host = host
        self.generation = 0
        self.members: IdRuns = EMPTY
        # (when, generation, members) of every generation formed
        self.formed: list[tuple[float, int, tuple[int, ...]]] = []
        self.train_start: Optional[float] = None  # the first generation's instant
        self.committed = 0  # highest committed cursor step
        self.committed_cursor = [0, 0]
        self.survivor_restarts = 0  # live processes a job restart tore down

    def effects(self, outputs: list) -> None:
        host = self._host
        for out in outputs:
            if isinstance(out, Send):
                host.service.route(out.to, out.message)
            elif isinstance(out, Broadcast):
                for w in out.to:
                    host.service.route(w, out.message)
            elif isinstance(out, Record):
                host.write(out.record)
                host.fault_timing.record(out.record)
            elif isinstance(out, Formed):
                self.formed_generation(out.generation, out.members)
            elif isinstance(out, RestartJob):
                self.restart_job(out)
            elif isinstance(out, Relaunch):
                # exactly the lives the keeper names, as one batch that joins
                # together once every one has imported torch
                host.lives.start_batch(list(out.lives().items()))
            elif isinstance(out, JobFailed):
                host.finish("failed", f"job failed: {out.reason}")

    def life_given(self, worker: int, life: int) -> None:
        """The keeper handed out the life a repaired node's process starts as."""
        self._host.lives.life_given(worker, life)

    def formed_generation(self, generation: int, members: IdRuns) -> None:
        """The keeper decided ``generation`` with ``members``; the first starts training time."""
        self.generation, self.members = generation, members
        t = self._host.now()
        self.formed.append((t, generation, tuple(members)))
        if self.train_start is None:
            self.train_start = t
            for p in self._host.processes:
                if p.alive and p.activated:
                    self._host.faults.node_up(p.worker, 0.0)

    def restart_job(self, out: RestartJob) -> None:
        """Checkpoint-restart: SIGKILL the process of every worker the keeper
        tears down (the members; torchrun's behaviour). Standbys keep waiting."""
        processes = self._host.processes
        doomed = [p for p in processes if p.alive and p.worker in out.teardown]
        for p in doomed:
            if p.fault is None:
                self.survivor_restarts += 1
            p.fault = "restart"
            processes.signal(p, signal.SIGKILL)
        for p in doomed:
            processes.reap(p)
        self._host.nemesis.forget_dead()

    def commit_answered(self, ask: CommitAsk, verdict: CommitVerdict, held: bool = False) -> None:
        """The vote's answer: the history's record, the scripted faults of a
        step every member holds, and the member's ack. With direct links
        (``ask.conn`` None) the keeper sent the ack, or ``held`` it at a gate
        until the faults are in: it is released here."""
        host = self._host
        now, conn, w, gen, step, record = (host.now(), ask.conn, ask.worker, ask.gen, ask.step,
                                           ask.record)
        if verdict.complete:
            host.completion.job_complete(now)
        ok = verdict.ok and host.result is None
        if ok and verdict.first:
            r = dict(record)
            r["t"] = round(now, 9)
            host.write(r)
            if record["last"] + 1 >= self.committed:
                self.committed = record["last"] + 1
                self.committed_cursor = [self.committed, record["stop"]]
        timing = host.fault_timing
        due = timing.answered(gen, step, w, len(self.members), self.committed) if ok else StepDue()
        after = timing.before_answer(due)  # the rest go after the answer
        if conn is None:
            if due:
                host.keeper.gate(host.faults.next_gate())
            if held:  # the rest once the keeper sent the ack and hears no worker
                host.keeper.release(w, ask.incarnation, gen, step, bool(after))
                timing.hold(after)
                return
        else:
            host.service.send(conn, ("ack", gen, step, ok))
        for d in after:
            host.nemesis.inject(d)

    def gate_released(self, frozen: bool = True) -> None:
        """Direct links: the ack held at a gate went and the keeper hears no
        worker (``frozen``; not when its link was lost): the faults that go
        after it go in, then it hears them again."""
        self._host.fault_timing.released()
        if frozen and self._host.keeper.up:
            self._host.keeper.resume()
