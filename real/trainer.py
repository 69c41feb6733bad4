"""The training thread of a worker process (:mod:`real.worker`).

It trains a real torch model: per generation it builds a fresh group
(:class:`real.groups.Groups`), takes the state as the keeper decided (the
agent's ``Enter``: who is stale, who is the source), and runs steps whose
micro-batches come from the core planner. It reports to the agent only
what happened (a step committed, the state is ready); what the worker
claims at a roll call is the agent's. A step counts only when the keeper
accepts its commit (:meth:`TrainerHost.request_commit`). It reaches the
worker's control side only through :class:`TrainerHost`.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

from rollcall.config import job_policy
from rollcall.core import Agent, Cursor, Enter, lr_scale, plan_step, rec, sample_ids, stripes
from rollcall.scenario import Scenario

from real import reduce
from real.device import Communicators, pick_device
from real.groups import Aborted, Groups

__all__ = ["Trainer", "TrainerHost", "Update"]


class TrainerHost(Protocol):
    """What the training thread needs of the worker's control side (:class:`real.worker.Worker`)."""

    @property
    def scenario(self) -> Scenario: ...

    @property
    def worker(self) -> int: ...

    @property
    def incarnation(self) -> int: ...

    @property
    def run_dir(self) -> Path: ...

    @property
    def keeper_host(self) -> str:
        """The keeper service's address, and torch's store's."""

    @property
    def addr(self) -> str:
        """This host's own address: the gloo groups run over it."""

    @property
    def comms(self) -> Optional[Communicators]:
        """NCCL's communicators (None on gloo)."""

    @property
    def lock(self) -> Any:
        """Held for every call to the agent."""

    @property
    def cond(self) -> threading.Condition:
        """Notified when the target generation, the stop or torch's store changes."""

    @property
    def wake(self) -> threading.Event:
        """Set by whatever may end a generation here."""

    @property
    def agent(self) -> Agent: ...

    @property
    def stopped(self) -> bool: ...

    @property
    def target(self) -> Optional[Enter]:
        """The generation the agent entered last."""

    @property
    def store_port(self) -> Optional[int]:
        """torch's store's port, once the launcher said it."""

    @property
    def slow_factor(self) -> float:
        """A ``slow`` fault's: each step's compute takes this many times as long ..."""

    @property
    def slow_from(self) -> int:
        """... from this step on."""

    def now(self) -> float: ...

    def ended(self, gen: int) -> bool:
        """Whether generation ``gen`` is over for this worker."""

    def record(self, r: dict) -> None: ...

    def apply(self, actions: list) -> None:
        """Carry out the agent's actions (the caller holds ``lock``)."""

    def trainer_ready(self) -> None:
        """torch is imported and the model built."""

    def request_commit(self, gen: int, step: int, nxt: Cursor, record: dict,
                       compute: tuple[float, int]) -> Optional[bool]:
        """Whether the step commits (None: the generation ended before it was asked)."""

    def report_final(self, gen: int, cursor: list, weights_sha256: str) -> None: ...

    def report_fatal(self, reason: str) -> None: ...


class Trainer:
    """The training thread of one worker process."""

    def __init__(self, host: TrainerHost) -> None:
        self._host = host
        self.compute: tuple[float, int] = (0.0, 0)  # the last step's compute_s, micro-batches
        self.stretched = -1  # the last step whose compute was stretched
        self.cursor = Cursor()  # position of the state held
        self.holds_state = False

    def run(self) -> None:
        """Import torch, build the model, then train in each generation the
        agent enters until the worker stops."""
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        torch.set_num_threads(1)
        from real.model import Workload

        host = self._host
        sc = host.scenario
        cl = sc.cluster
        count = torch.cuda.device_count() if cl.device == "cuda" else 0
        where = torch.device(pick_device(host.worker, cl.device, cl.backend, count,
                                         cl.gpus_per_worker))
        if where.type == "cuda":
            torch.cuda.set_device(where)  # this process's GPU: NCCL's, the allocator's
        self.wl = Workload(sc.seed, sc.workload.model_params, sc.workload.lr, where)
        self.groups = Groups(dist, torch, where, self.check, host.wake, host.comms)
        self.scratch = None  # exact mode's encoding buffers, kept from step to step
        self.zero = None
        if sc.state.sharding == "sharded":
            from real.zero import ZeroState
            self.zero = ZeroState(host.worker, self.wl, sc.state_shards)
        host.trainer_ready()
        done = 0
        while True:
            with host.cond:
                while not host.stopped and (
                        host.target is None or host.target.generation <= done
                        or host.store_port is None):
                    host.cond.wait(0.5)
                if host.stopped:
                    return
                enter = host.target
            done = enter.generation
            self.groups.retire()
            try:
                self.run_generation(enter)
            except Aborted:
                continue
            except Exception as exc:  # a failed collective: report and wait
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                print(f"[worker {host.worker}.{host.incarnation} gen {enter.generation}] "
                      f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
                with host.lock:
                    if host.agent.generation == enter.generation:
                        host.apply(host.agent.step_failed(host.now(), self.cursor.step))

    def check(self, gen: int) -> None:
        """Raise :class:`Aborted` once generation ``gen`` is over for this worker."""
        if self._host.ended(gen):
            raise Aborted()

    def run_generation(self, enter: Enter) -> None:
        """Train in ``enter``'s generation, step after step, until it ends for
        this worker (:class:`Aborted`) or the job is complete."""
        gen = enter.generation
        pg = self.groups.build(enter, self._host.keeper_host, self._host.store_port,
                               self._host.addr)
        self.sync_state(pg, enter)
        policy = job_policy(self._host.scenario)
        while True:
            self.check(gen)
            cursor = self.cursor
            if policy.complete(cursor.step):
                self._host.report_final(gen, self.cursor.to_json(), self.wl.weights_sha256())
                raise Aborted()
            plan = self.plan(cursor, enter.members)
            t0 = self._host.now()
            update = self.compute_step(pg, plan, cursor, gen)
            self.late_stretch(gen, cursor.step)
            nxt = plan.next_cursor()
            if not self.request_commit(gen, cursor, nxt, plan, t0, update.loss):
                raise Aborted()
            self.apply_update(update)
            with self._host.lock:
                self.cursor = nxt
            self.checkpoint_if_due(pg, enter, policy, nxt)

    def plan(self, cursor: Cursor, members: tuple[int, ...]):
        """The core planner's step at ``cursor`` for ``members``."""
        sc = self._host.scenario
        wl = sc.workload
        return plan_step(cursor, members, global_batch=wl.global_batch,
                         micro_batch=wl.micro_batch, policy=sc.strategy.batch,
                         full_workers=sc.cluster.workers)

    def shard_ids(self, plan, j: int) -> list[int]:
        offs = plan.shard_offsets(j)
        sc = self._host.scenario
        return sample_ids(sc.seed, sc.workload.dataset_samples, offs.start, offs.stop)

    # --- the generation's state --------------------------------------------------------

    def hold(self, enter: Enter, load) -> None:
        """Adopt the state at ``enter.cursor`` if the generation is still ours."""
        with self._host.lock:
            self.check(enter.generation)
            load()
            self.cursor = enter.cursor
            self.holds_state = True
            self._host.apply(self._host.agent.state_ready(self._host.now(), enter.cursor))

    def local_state(self, cursor: Cursor):
        """The state at ``cursor`` from the origin or a checkpoint, as a tensor."""
        if cursor == Cursor():
            return self.wl.initial_state()
        from real.model import load_checkpoint
        ck = load_checkpoint(self._host.run_dir, cursor.step, map_location=self.wl.device)
        if ck is None or ck["sample"] != cursor.sample:
            raise RuntimeError(f"no checkpoint at {cursor}")
        return ck["state"]

    def settle(self, pg, enter: Enter, load, reloaded: bool = False,
               replaced: bool = False) -> None:
        """Adopt the generation's state: ``load`` it, and under ZeRO-1 carry out
        the keeper's shard copies (one gather every member joins) first."""
        z = self.zero
        if z is None or enter.placement is None:
            self.hold(enter, load)
            return
        buf = z.copy_buffer(enter.recovery)
        if buf is not None:
            self.groups.allreduce(pg, buf, enter.generation)

        def adopt() -> None:
            load()
            z.adopt(enter.placement, enter.recovery, buf, reloaded, replaced)

        self.hold(enter, adopt)

    def holds(self, cursor: Cursor) -> bool:
        """Whether the trainer holds the state at ``cursor``."""
        return self.holds_state and self.cursor == cursor

    def sync_state(self, pg, enter: Enter) -> None:
        """Take the generation's state as the keeper decided (``Enter``): load
        it when there is no source; otherwise stale members copy it from the
        source, in one broadcast every member joins when ``enter.broadcast``."""
        if enter.source is None:
            state = self.local_state(enter.cursor)
            self.settle(pg, enter, lambda: self.wl.load_state(state), reloaded=True)
            return
        assert enter.broadcast or not enter.sync, "a stale member always has a copy to take"
        reloaded = False
        if not enter.sync and not self.holds(enter.cursor):
            # The keeper counts this member as holding the state (its agent
            # claimed it); the one claim a trainer may not have backed yet is
            # the origin's (see Enter), and the origin is built, not copied.
            assert enter.cursor == Cursor(), (enter.cursor, self.cursor, self.holds_state)
            self.wl.load_state(self.local_state(enter.cursor))
            self.cursor, self.holds_state = enter.cursor, True
            reloaded = True
        if enter.broadcast:
            self.copy_from_source(pg, enter, reloaded)
        else:
            self.settle(pg, enter, lambda: None, reloaded=reloaded)

    def copy_from_source(self, pg, enter: Enter, reloaded: bool) -> None:
        """The replicated state (under ZeRO-1 the parameters only: shards
        move by the recovery's copies) reaches the stale members: on gloo in
        stripes, each from another holder at once (``stripes``: a copy
        spread over the holders' links, as the sim prices it); on NCCL by
        the source's broadcast, which every member joins and only the stale
        ones keep."""
        torch = self.torch
        sharded = self.zero is not None
        me = self._host.worker
        holder = me not in enter.stale if enter.stale else enter.source == me
        if holder:
            buf = self.wl.flat.clone() if sharded else self.wl.state()
        else:
            buf = torch.empty(self.wl.n if sharded else 2 * self.wl.n, device=self.wl.device)
        if pg is not None and enter.stale and self._host.comms is None:  # gloo
            self.copy_stripes(pg, enter, buf, holder)
        elif pg is not None:
            self.groups.wait_work(pg.broadcast(buf, enter.members.index(enter.source)),
                                  enter.generation)
        if not enter.sync:
            self.settle(pg, enter, lambda: None, reloaded=reloaded)
            return
        load = (lambda: self.wl.flat.copy_(buf)) if sharded else (lambda: self.wl.load_state(buf))
        self.settle(pg, enter, load, reloaded=reloaded, replaced=True)

    def copy_stripes(self, pg, enter: Enter, buf, holder: bool) -> None:
        """Point to point over gloo: a holder sends its stripe of ``buf`` to
        every stale member, a stale member takes each stripe from its holder
        into ``buf``, all at once (one tag per stripe). The ``copy`` record
        says what moved and how long it took, for the calibration."""
        members, gen = list(enter.members), enter.generation
        plan = stripes(members, enter.stale, buf.numel())
        rank = {w: r for r, w in enumerate(members)}
        t0 = self._host.now()
        if holder:
            works = [pg.send([buf[lo:hi]], rank[w], j) for j, (h, lo, hi) in enumerate(plan)
                     if h == self._host.worker for w in members if w in enter.stale]
        else:
            works = [pg.recv([buf[lo:hi]], rank[h], j) for j, (h, lo, hi) in enumerate(plan)]
        # gloo's send and receive works never report completion (no future,
        # is_completed stays false): only wait() returns, so a thread waits
        self.groups.watched(gen, f"copy-{gen}", lambda: [work.wait() for work in works])
        if not holder:
            now = self._host.now()
            self._host.record(rec(now, "ok", "copy", self._host.worker, gen=gen,
                                  stripes=len(plan), bytes=buf.numel() * buf.element_size(),
                                  seconds=round(now - t0, 6)))

    # --- a step ------------------------------------------------------------------------

    def compute_step(self, pg, plan, cursor: Cursor, gen: int) -> "Update":
        """This worker's gradients, exchanged, and the update they make; nothing is applied."""
        part, losses, mine = self.compute_gradients(pg, plan, cursor, gen)
        self.check(gen)
        grad, loss = self.exchange(pg, plan, part, losses, mine, cursor, gen)
        sc = self._host.scenario
        scale = lr_scale(sc.strategy.batch, sc.strategy.lr_scaling,
                         plan.global_batch, sc.workload.global_batch)
        if self.zero is None:
            return Update(grad, loss, scale)
        # ZeRO-1: update the held slices, gather the parameters
        moms, params = self.zero.step(grad, scale)
        self.groups.allreduce(pg, params, gen)
        return Update(grad, loss, scale, moms, params)

    def compute_gradients(self, pg, plan, cursor: Cursor, gen: int):
        """The gradients of this worker's shards of the step: accumulated in
        fast mode (``part`` None, one loss per shard), or each kept on its own
        in exact mode's ``part``. The per-sample ledger record leaves here,
        before the exchange, so a kill cannot lose it, with how long the
        compute took (``compute_s``, see :meth:`compute_clock`)."""
        clock = self.compute_clock()
        began = clock()
        self.wl.zero_grad()
        ids_all: list[int] = []
        losses: list[float] = []
        part = None
        if self._host.scenario.strategy.reduction == "exact":  # the guess: the shared momentum's
            if self.zero is None:
                hint = reduce.hint_top(self.wl.momentum)
            else:  # sliced: the owners' maxima, MAX-reduced
                hint = reduce.hint_from_max(self.groups.max_over(pg, self.zero.momentum_max(), gen))
            part = reduce.ExactPart(self.wl.n, plan.n_shards, hint, self.scratch, self.wl.device)
        mine = plan.shards_of(self._host.worker)
        for j in mine:
            self.check(gen)
            ids = self.shard_ids(plan, j)
            ids_all.extend(ids)
            if part is None:
                losses.append(self.wl.accumulate(ids))
            else:  # each shard's gradient on its own, never float-added to another
                grads, loss = self.wl.shard_gradient(ids)
                part.add(j, grads, loss)
        compute_s = clock() - began
        if self._host.slow_factor > 1 and cursor.step >= self._host.slow_from:
            self.stretch(gen, (self._host.slow_factor - 1) * compute_s)
            compute_s *= self._host.slow_factor
            self.stretched = cursor.step
        compute_s = round(compute_s, 6)
        # the keeper's straggler policy hears it with the commit request
        self.compute = (compute_s, len(mine))
        if ids_all:
            # compute_s: this step's gradients took this long here (a straggler's is long)
            self._host.record(rec(self._host.now(), "ok", "contribute", self._host.worker, gen=gen,
                            step=cursor.step, samples=ids_all, compute_s=compute_s))
        return part, losses, mine

    def compute_clock(self) -> Callable[[], float]:
        """What a step's compute is timed with. On the CPU: this thread's CPU
        time (torch computes on it, ``set_num_threads(1)``). The straggler
        policy compares members' compute, and on a machine the workers share
        with other load, wall time counts the moments a member waited for a
        core: a few milliseconds now and then, against steps of about one,
        which made a member lag or not by chance (``real-straggler`` evicted
        two steps late beside a CPU hog). A ``slow`` fault's stretch, the
        throttling it models, is added to it. On a GPU: wall time (the
        compute runs on the device, not on this thread)."""
        return time.thread_time if self.wl.device.type == "cpu" else time.monotonic

    def late_stretch(self, gen: int, step: int) -> None:
        """A slow order meant for this step (``slow_from``) that came once its
        compute was done: the stretch it missed, before the commit request,
        where the others wait for this worker's next exchange as they would
        have for this one. The reported compute includes it (the keeper's
        straggler policy hears the step as slow on both targets: the sim's
        first slow step is the order's)."""
        if self._host.slow_factor > 1 and step >= self._host.slow_from and self.stretched != step:
            compute_s, load = self.compute
            self.stretch(gen, (self._host.slow_factor - 1) * compute_s)
            self.compute = (round(compute_s * self._host.slow_factor, 6), load)
            self.stretched = step

    def stretch(self, gen: int, wait_s: float) -> None:
        """A ``slow`` fault: the compute just done takes ``slow_factor`` times as
        long, as on a throttled machine, before the exchange; a wait, not a
        spin (a spin would slow the workers sharing this machine's cores
        too), that an abort still cuts short."""
        until = time.monotonic() + wait_s
        while (left := until - time.monotonic()) > 0:
            self.check(gen)
            self._host.wake.wait(min(left, 0.05))
            self._host.wake.clear()
        self.check(gen)

    def exchange(self, pg, plan, part, losses: list[float], mine, cursor: Cursor, gen: int):
        """The step's mean gradient and loss over the generation."""
        if part is None:
            total = reduce.fast_payload(self.wl.grad_buf, losses)
            self.groups.allreduce(pg, total, gen)
            return reduce.fast_result(total, plan.n_shards)

        def recompute(kept) -> list:
            """The shards not kept, computed again (same data, same bits)."""
            out = []
            for j in mine:
                if j not in kept:
                    self.check(gen)
                    out.append((j, *self.wl.shard_gradient(self.shard_ids(plan, j))))
            return out

        try:
            grad, loss = self.groups.exact_reduce(pg, part, recompute, gen)
        except FloatingPointError as exc:
            self._host.report_fatal(f"step {cursor.step}: {exc}")
            raise Aborted() from exc
        self.scratch = part.scratch  # allocated once, by the first encode
        return grad, loss

    def request_commit(self, gen: int, cursor: Cursor, nxt: Cursor, plan, t0: float,
                       loss: float) -> bool:
        """Ask the keeper service whether the step at ``cursor`` commits
        (:meth:`TrainerHost.request_commit`), with this step's compute."""
        commit = rec(0.0, "ok", "commit", self._host.worker, gen=gen, step=cursor.step,
                     last=cursor.step, sample=cursor.sample, stop=nxt.sample,
                     batch=plan.global_batch, t0=round(t0, 9), loss=loss)
        ok = self._host.request_commit(gen, cursor.step, nxt, commit, self.compute)
        if ok is None:
            raise Aborted()
        return ok

    def apply_update(self, update: "Update") -> None:
        """Apply a committed step's update to the state held."""
        if self.zero is not None:
            self.zero.commit(update.moms, update.params)
        else:
            self.wl.apply(update.grad, update.scale)

    def checkpoint_if_due(self, pg, enter: Enter, policy, nxt: Cursor) -> None:
        """The core's checkpoint policy, the sim's too: every strategy
        checkpoints (the keeper resumes from it when no member holds usable
        state). Every member knows when, so ZeRO's gather of the momentum
        slices is a collective all of them join; rank 0 writes."""
        gen = enter.generation
        due = policy.checkpoint_due(nxt.step)
        t0 = self._host.now()
        state = None
        if due and self.zero is not None:
            momentum = self.zero.momentum_buffer()
            self.groups.allreduce(pg, momentum, gen)
            state = self.torch.cat([self.wl.flat, momentum])
        if due and enter.rank == 0:
            from real.model import save_checkpoint
            save_checkpoint(self._host.run_dir, nxt.step, nxt.sample,
                            self.wl.state() if state is None else state)
            with self._host.lock:
                if self._host.agent.generation == gen:
                    self._host.record(rec(self._host.now(), "ok", "checkpoint", self._host.worker,
                                    gen=gen, cursor=nxt.to_json(), t0=round(t0, 9)))
                    self._host.apply(self._host.agent.checkpointed(self._host.now(), nxt))


@dataclass
class Update:
    """A computed step's update, applied only once the step commits."""

    grad: Any
    loss: float
    scale: float
    moms: Optional[dict] = None  # ZeRO-1: the held slices' new momentum
    params: Any = None  # ZeRO-1: the gathered parameters
