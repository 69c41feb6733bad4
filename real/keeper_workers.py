"""The keeper process's side of direct worker links (``keeper.worker_links: direct``).

Each worker finds the active keeper in etcd itself and links to the address
its leadership key names (:mod:`real.worker`). That is the keeper process's
own listener (:mod:`real.keeper_proc`): a link whose first frame is a
worker's ``hello`` (the HMAC of this link's challenge under the run's
secret) comes here; the launcher's ``sup_hello`` goes to the supervisor link.

This module moves bytes and holds what the launcher's relay used to hold; it
decides nothing:

- the keeper's ``Send``/``Broadcast`` go to each worker's newest link (a
  ``Refused`` to the life it names), as :meth:`Launcher.route` does;
- a commit request is the keeper's vote; its ack goes back on the link, and
  the launcher hears it (``committed``: the history's record, the scripted
  faults of a step). At a *gate* (a step some scripted fault waits for, named
  by the launcher) the last member's ack is held until the launcher has put
  the fault in (``release``), as the launcher did when it relayed;
- the Joins of a batch of lives started together (named by the launcher)
  are handed to the keeper as one arrival in id order, once every one still
  alive has sent its Join or the batch's time is up (the core's
  :class:`rollcall.core.JoinBatches`, the launcher's rule too);
- until the launcher's report has been taken over (:meth:`serve`), nothing a
  worker sends reaches the keeper: a commit is refused, a message dropped.
  Once it serves, each link is told the term (``("keeper", term)``) and the
  worker's agent asks again what went unanswered.
"""

from __future__ import annotations

import selectors
import socket
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from rollcall.core import Join, JoinBatches, Keeper, StepAnswers

from real import wire
from real.keeper_port import link_for

MAX_BACKLOG = 8 << 20  # bytes queued for a worker that does not read: its link is dropped


@dataclass
class WorkerLink:
    sock: socket.socket
    worker: int
    life: int
    out: bytearray = field(default_factory=bytearray)


class WorkerLinks:
    def __init__(self, sel: selectors.BaseSelector, to_launcher: Callable[..., None],
                 emit: Callable[[list], None], now: Callable[[], float]) -> None:
        self.sel = sel
        self.now = now
        self.to_launcher = to_launcher
        self.emit = emit
        self.links: dict[socket.socket, WorkerLink] = {}
        self.newest: dict[int, WorkerLink] = {}
        self.of_life: dict[tuple[int, int], WorkerLink] = {}
        self.keeper: Optional[Keeper] = None  # set once the keeper serves
        self.members = 0  # the current generation's size (its last member's ack may be held)
        self.answers = StepAnswers()  # which members were answered ok, per step
        self.gate = 0  # the next step a scripted fault waits for (0: none)
        self.held: dict[tuple[int, int, int, int], WorkerLink] = {}
        self.joins = JoinBatches()
        # after a released gate whose other faults are still to come: the
        # workers' frames wait here, in order, until the launcher says resume
        self.frozen: Optional[list[tuple[WorkerLink, tuple]]] = None

    # --- links ---------------------------------------------------------------------------

    def adopt(self, sock: socket.socket, reader: wire.FrameReader, worker: int, life: int) -> None:
        """A link whose ``hello`` checked out: it is this life's."""
        link = WorkerLink(sock, worker, life)
        self.links[sock] = link
        self.of_life[(worker, life)] = link
        cur = self.newest.get(worker)
        if cur is None or cur.life <= life:
            self.newest[worker] = link
        reader.kinds = wire.WORKER_TO_KEEPER
        reader.authenticated()
        self.sel.modify(sock, selectors.EVENT_READ, ("worker", reader))
        if self.keeper is not None:
            self.send(link, ("keeper", self.keeper.term))

    def serve(self, keeper: Keeper) -> None:
        """The keeper took over: every link linked so far hears its term."""
        self.keeper = keeper
        for link in list(self.links.values()):
            self.send(link, ("keeper", keeper.term))

    def drop(self, sock: socket.socket) -> None:
        link = self.links.pop(sock, None)
        wire.close_watched(self.sel, sock)
        if link is None:
            return
        if self.of_life.get((link.worker, link.life)) is link:
            del self.of_life[(link.worker, link.life)]
        if self.newest.get(link.worker) is link:
            del self.newest[link.worker]

    def send(self, link: WorkerLink, frame: tuple) -> None:
        """Queue one frame and send what the socket takes now; a worker that
        stops reading (stopped, cut off) must not stall the keeper."""
        if link.sock not in self.links:
            return
        link.out += wire.encode(frame)
        self.flush(link)

    def flush(self, link: WorkerLink) -> None:
        if wire.send_some(link.sock, link.out, MAX_BACKLOG) is not None:
            self.drop(link.sock)
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if link.out else 0)
        self.sel.modify(link.sock, events, self.sel.get_key(link.sock).data)

    def event(self, sock: socket.socket, reader: wire.FrameReader, mask: int) -> None:
        link = self.links.get(sock)
        if link is None:
            return
        if mask & selectors.EVENT_WRITE:
            self.flush(link)
        if not mask & selectors.EVENT_READ or sock not in self.links:
            return
        data = wire.recv_some(sock)
        if data is None:
            return
        if not data:
            self.drop(sock)
            return
        self.feed(sock, reader, data)

    def feed(self, sock: socket.socket, reader: wire.FrameReader, data: bytes) -> None:
        link = self.links[sock]
        try:
            wire.feed_frames(reader, data, lambda f: self.frame(link, f),
                             lambda: sock in self.links)
        except wire.WireError:
            self.drop(sock)  # a bad peer: dropped (the run goes on)

    # --- what the keeper says ----------------------------------------------------------------

    def route(self, worker: int, message: Any) -> None:
        link = link_for(worker, message, self.of_life, self.newest)
        if link is not None:
            self.send(link, ("msg", message))

    # --- what a worker says ------------------------------------------------------------------

    def frame(self, link: WorkerLink, frame: tuple) -> None:
        kind, k = frame[0], self.keeper
        if kind == "hello":
            raise wire.WireError("a second hello")
        if self.frozen is not None:
            self.frozen.append((link, frame))
            return
        if kind == "msg":
            if k is not None and not self.hold_join(link, frame[1]):
                self.emit(k.receive_many(self.now(), [frame[1]]))
        elif kind == "commit":
            _, w, life, gen, step, record, compute_s, load = frame
            if (w, life) != (link.worker, link.life):
                raise wire.WireError(f"a commit of {w}.{life} on the link of "
                                     f"{link.worker}.{link.life}")
            self.commit(link, gen, step, record, compute_s, load)

    def commit(self, link: WorkerLink, gen: int, step: int, record: dict,
               compute_s: float, load: int) -> None:
        k, w, life = self.keeper, link.worker, link.life
        if k is None:
            self.send(link, ("ack", gen, step, False))
            return
        now = self.now()
        v = k.commit(now, w, life, gen, step)
        held = False
        if v.ok:
            if self.answers.answered(gen, step, w, self.members):
                held = self.gate > 0 and record["last"] + 1 >= self.gate
        self.to_launcher("committed", w, life, gen, step, v.ok, v.first, v.complete, v.reason,
                         record, held)
        if held:
            self.held[(w, life, gen, step)] = link
        else:
            self.send(link, ("ack", gen, step, v.ok))
        self.emit(k.report_compute(now, w, life, gen, step, compute_s, load))

    def release(self, w: int, life: int, gen: int, step: int, freeze: bool) -> None:
        """The launcher put in the faults of a gate that go before the last
        ack: the ack goes. ``freeze``: faults that go after it are still to
        come (a keeper killed once every member holds the step): nothing a
        worker sends is heard until :meth:`resume`, as no step past the gate
        could reach the keeper while the launcher relayed."""
        link = self.held.pop((w, life, gen, step), None)
        if link is not None:
            self.send(link, ("ack", gen, step, True))
        if freeze:
            self.frozen = []
            self.to_launcher("released", w, life, gen, step)

    def resume(self) -> None:
        frozen, self.frozen = self.frozen or [], None
        for link, frame in frozen:
            if link.sock in self.links:
                self.frame(link, frame)

    def formed(self, members: int) -> None:
        self.members = members
        self.answers.forget()

    # --- batches of Joins --------------------------------------------------------------------

    def batch(self, lives: list[tuple[int, int]], until: float) -> None:
        self.joins.open([(int(w), int(life)) for w, life in lives], until)

    def hold_join(self, link: WorkerLink, message: Any) -> bool:
        if not isinstance(message, Join):
            return False
        if not self.joins.hold(self.now(), (link.worker, link.life), message):
            return False
        self.release_joins()
        return True

    def exited(self, worker: int, life: int) -> None:
        self.joins.exited((worker, life))
        self.release_joins()

    def release_joins(self) -> None:
        """Hand over each batch that is complete, lost a member, or is late."""
        now = self.now()
        for joins in self.joins.release(now):
            if self.keeper is not None:
                self.emit(self.keeper.receive_many(now, joins))

    def next_due(self) -> Optional[float]:
        return self.joins.get_timer()
