"""The launcher's way to its record-keeper: in this process, or another one.

The launcher (supervisor, fault injector, the workers' relay) reports
physical facts and carries the workers' protocol messages to the keeper, and
does what the keeper's outputs say. Where the keeper runs is this module's
business only:

- :class:`LocalKeeper` (``keeper.store: memory``): the core
  :class:`rollcall.core.keeper.Keeper` lives in the launcher; every call is
  answered at once.
- :class:`real.keeper_link.RemoteKeeper` (``keeper.store: etcd``): the active
  keeper is a process of its own (``real.keeper_proc``) that a standby
  replaces; calls travel over an authenticated connection and are answered
  when its frames come back, or not at all while no keeper serves.

Either way the answers come back through three callbacks, a :class:`Sink`
(:class:`real.outputs.Outputs`, which carries them out; a remote keeper
reaches it through the launcher), so there is one code path:
``effects(outputs)``, ``commit_answered(ask, verdict)`` and
``life_given(worker, life)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Protocol

from rollcall.core import CommitVerdict, IdRuns, Keeper, Refused
from rollcall.interrupts import Stop
from rollcall.scenario import Scenario

from real.netns import Network


def link_for(worker: int, message: Any, of_life: Mapping[tuple[int, int], Any],
             newest: Mapping[int, Any]) -> Optional[Any]:
    """The link a keeper message for ``worker`` goes on: a ``Refused`` to the
    life it names (a newer life of the id must not take it for its own),
    anything else to the id's newest life; None when that life has none.
    The launcher's relay and the keeper process's direct links route alike."""
    link = None
    if isinstance(message, Refused):
        link = of_life.get((worker, message.incarnation))
    return newest.get(worker) if link is None else link


@dataclass(frozen=True)
class CommitAsk:
    """One member's request to commit ``step`` of ``gen`` (its connection
    gets the answer), with the compute it reports for the straggler policy."""

    conn: Any  # None: a direct link's commit, answered by the keeper itself
    worker: int
    incarnation: int
    gen: int
    step: int
    record: dict
    compute_s: float
    load: int


class Sink(Protocol):
    """What is done with the keeper's answers (:class:`real.outputs.Outputs`)."""

    def effects(self, outputs: list) -> None: ...

    def commit_answered(self, ask: CommitAsk, verdict: CommitVerdict,
                        held: bool = False) -> None:
        """``held``: a keeper in its own processes holds the ack at a fault's gate."""

    def life_given(self, worker: int, life: int) -> None: ...


class RemoteSink(Sink, Protocol):
    """What is done with the answers of a keeper in its own processes
    (:class:`real.keeper_link.RemoteKeeper`): a :class:`Sink`'s, and the two
    facts only such a keeper reports apart."""

    def formed_generation(self, generation: int, members: IdRuns) -> None:
        """It formed ``generation`` (its ``Formed`` output, sent as a frame)."""

    def gate_released(self, frozen: bool = True) -> None:
        """Direct links: the ack held at a gate went (``frozen``: the keeper hears no worker)."""


class Supervisor(Protocol):
    """What a keeper in its own processes (:class:`real.keeper_link.RemoteKeeper`)
    needs of the launcher beside a :class:`Sink`: the run's identity and
    secret, where it writes, the hosts' network, the history, and the
    physical facts a new keeper takes over with."""

    @property
    def sc(self) -> Scenario: ...

    @property
    def run_id(self) -> str: ...

    @property
    def secret(self) -> bytes: ...

    @property
    def out(self) -> Path:
        """The run directory."""

    @property
    def real_dir(self) -> Path: ...

    @property
    def secret_path(self) -> Path: ...

    @property
    def t0(self) -> float:
        """The run's start on this machine's monotonic clock."""

    @property
    def network(self) -> Optional[Network]:
        """The hosts' network namespaces, where the run has them."""

    @property
    def result(self) -> Optional[str]:
        """How the run ended, once it did (None while it runs)."""

    @property
    def stop(self) -> Stop:
        """The signal that ends the run, once one came."""

    def now(self) -> float: ...

    def finish(self, result: str, reason: str) -> None:
        """End the run with ``result`` (``error``: the launcher could not go on) and why."""

    def write(self, record: dict) -> None: ...

    def write_reject(self, reason: str) -> None: ...

    def tell_workers(self, frame: tuple) -> None: ...

    def physical_report(self) -> tuple[list, list, list, int]: ...

    def next_gate(self) -> int:
        """The committed count whose last ack waits for a fault (0: none)."""


class LocalKeeper:
    """The keeper in the launcher's own process: every answer at once."""

    up = True  # it is never down: it dies with the launcher

    def __init__(self, keeper: Keeper, sink: Sink) -> None:
        self.keeper = keeper
        self.sink = sink

    def receive(self, now: float, messages: list) -> None:
        self.sink.effects(self.keeper.receive_many(now, messages))

    def exited(self, now: float, worker: int, incarnation: int) -> None:
        self.sink.effects(self.keeper.exited(now, worker, incarnation))

    def node_down(self, now: float, worker: int) -> None:
        self.keeper.node_down(now, worker)

    def fleet_capacity(self, now: float, nodes: int) -> None:
        self.keeper.fleet_capacity(now, nodes)

    def node_up(self, now: float, worker: int) -> None:
        self.sink.life_given(worker, self.keeper.node_up(now, worker))

    def commit(self, now: float, ask: CommitAsk) -> None:
        verdict = self.keeper.commit(now, ask.worker, ask.incarnation, ask.gen, ask.step)
        self.sink.commit_answered(ask, verdict)
        self.sink.effects(self.keeper.report_compute(now, ask.worker, ask.incarnation, ask.gen,
                                                     ask.step, ask.compute_s, ask.load))

    def batch(self, lives: list[tuple[int, int]], until: float) -> None:
        """Direct links only: the launcher holds a batch's Joins itself."""

    def gate(self, step: int) -> None:
        """Direct links only: the launcher answers every commit itself."""

    def release(self, worker: int, life: int, gen: int, step: int, freeze: bool) -> None:
        """Direct links only."""

    def resume(self) -> None:
        """Direct links only."""

    def get_timer(self) -> Optional[float]:
        return self.keeper.get_timer()

    def handle_timer(self, now: float) -> None:
        kt = self.keeper.get_timer()
        if kt is not None and now >= kt:
            self.sink.effects(self.keeper.handle_timer(now))

    def close(self) -> None:
        pass

    def kill_now(self) -> None:
        pass  # no process of its own
