"""A worker's process group for each generation, and the collectives on it.

Every generation gets a fresh group (gloo, or NCCL on GPUs:
``cluster.backend``) over a fresh store connection and key prefix. Every
wait on it is cut short by the generation's end (``check(gen)`` raises
:class:`Aborted`): a collective is asynchronous and polled together with
the abort flag, and a call that blocks and cannot be told to stop (a
group's set-up, gloo's point-to-point waits) runs on a thread of its own
that is watched. A retired gloo group is torn down by the
:class:`Reaper`'s thread, an NCCL one aborted and kept
(:class:`real.device.Communicators`).
"""

from __future__ import annotations

import gc
import queue
import sys
import threading
from datetime import timedelta
from typing import Any, Callable, Optional

from rollcall.core import Enter

from real import reduce
from real.device import Communicators, nccl_backend

__all__ = ["Aborted", "GROUP_TIMEOUT_S", "Groups", "Reaper"]

#: A group's collective timeout (gloo and NCCL) and NCCL's non-blocking init
#: and abort limit: a backstop only; the keeper ends a generation long before.
GROUP_TIMEOUT_S = 60.0


class Aborted(Exception):
    """The generation being trained in is over for this worker."""


class Groups:
    """One worker's groups: built per generation, retired when it moves on.

    ``check(gen)`` raises :class:`Aborted` once generation ``gen`` is over
    here; ``wake`` is set by whatever may end it (and by a collective's
    completion); ``comms``: NCCL's communicators (None on gloo)."""

    def __init__(self, dist: Any, torch: Any, device: Any, check: Callable[[int], None],
                 wake: threading.Event, comms: Optional[Communicators]) -> None:
        self._dist = dist
        self._torch = torch
        self._device = device
        self._check = check
        self._wake = wake
        self._comms = comms
        self._group: Optional[dict] = None  # the current generation's group and store
        self._reaper = Reaper()

    def build(self, enter: Enter, keeper_host: str, store_port: int, addr: str) -> Any:
        """The group of ``enter``'s generation (None for a generation of one),
        over torch's store at ``keeper_host:store_port``; gloo runs over
        this host's ``addr``."""
        if len(enter.members) == 1:
            return None
        dist = self._dist
        out: dict = {}

        def build() -> None:
            store = dist.TCPStore(keeper_host, store_port, is_master=False,
                                  timeout=timedelta(seconds=60))
            prefixed = dist.PrefixStore(f"rollcall/gen{enter.generation}/", store)
            out["gen"] = enter.generation
            if self._comms is not None:
                out["pg"] = self._nccl_group(prefixed, enter)
                out["store"] = store
                return
            # gloo, on CPU or CUDA tensors
            opts = dist.ProcessGroupGloo._Options()
            opts._timeout = timedelta(seconds=GROUP_TIMEOUT_S)
            opts._devices = [dist.ProcessGroupGloo.create_device(hostname=addr)]
            out["pg"] = dist.ProcessGroupGloo(prefixed, enter.rank, len(enter.members), opts)
            out["store"] = store

        self.watched(enter.generation, f"group-{enter.generation}", build)
        assert self._group is None, "the previous generation's group was not retired"
        self._group = out
        return out["pg"]

    def _nccl_group(self, prefixed: Any, enter: Enter) -> Any:
        """This generation's NCCL backend, registered for abort before it
        connects (a peer may die while it does)."""
        comms = self._comms
        assert comms is not None
        return nccl_backend(self._dist, prefixed, enter.rank, len(enter.members), self._device,
                            GROUP_TIMEOUT_S, lambda b: comms.add(enter.generation, b))

    def retire(self) -> None:
        """Hand the last generation's group to the reaper. Called when the
        trainer takes a later generation, not when it leaves one: the keeper
        has formed the new one, so each member of the old one has either
        answered its roll call (its agent left the old generation) or was
        left out and is fenced when it next speaks; a collective that fails
        there once this side closes cannot fail a live generation."""
        group, self._group = self._group, None
        if group is None:
            return
        if self._comms is not None:  # NCCL: aborted (if the control thread has not yet) and kept
            self._comms.abort_through(group["gen"])
            return
        if sys.getrefcount(group["pg"]) > 2:
            gc.collect()  # a frame of the last generation kept in a reference cycle
        # Only the dict holds the group now (getrefcount's own argument is
        # the other ref): no frame of the trainer can drop the last reference
        # later and block in the destructor.
        assert sys.getrefcount(group["pg"]) == 2, sys.getrefcount(group["pg"])
        self._reaper.retire(group)

    # --- waits ------------------------------------------------------------------------

    def wait_work(self, work: Any, gen: int) -> None:
        """Wait for an async collective *or* the abort flag, whichever comes first.

        The collective's completion callback and every agent action that can
        end the generation set ``wake``; a short timeout bounds any missed wake.
        """
        wake = self._wake
        try:
            work.get_future().add_done_callback(lambda _f: wake.set())
        except Exception:  # noqa: BLE001 - no future: plain polling below
            pass
        while not work.is_completed():
            self._check(gen)
            wake.wait(0.005)
            wake.clear()
        if self._comms is not None:  # an NCCL work fails when we abort it: that ends the generation
            self._check(gen)
        work.wait()  # completed: raises if the collective failed

    def watched(self, gen: int, name: str, fn: Callable[[], None]) -> None:
        """Run ``fn`` (a call that blocks and cannot be told to stop) in a
        thread of its own, named ``name``, while this one watches the abort
        flag; re-raise what ``fn`` raised. An aborted generation leaves the
        thread to its own timeout, like an abandoned collective."""
        err: list[Exception] = []

        def run() -> None:
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - raised here, below
                err.append(exc)

        th = threading.Thread(target=run, daemon=True, name=name)
        th.start()
        while th.is_alive():
            self._check(gen)
            th.join(0.001)
        self._check(gen)
        if err:
            raise err[0]

    # --- collectives ------------------------------------------------------------------

    def allreduce(self, pg: Any, tensor: Any, gen: int) -> None:
        if pg is None:
            return
        self.wait_work(pg.allreduce([tensor]), gen)

    def exact_reduce(self, pg: Any, part: Any, recompute: Callable[[Any], list], gen: int) -> Any:
        """Order-free reduction (see :mod:`real.reduce`): a SUM of fixed-point
        integers under the guessed bound; when there is no guess or a shard
        broke it, a scalar MAX for the true bound and the SUM again."""
        if part.exp is not None:
            total = part.wire()
            self.allreduce(pg, total, gen)
            out = part.result(total)
            if out is not None:
                return out
        top = self.max_over(pg, part.max_abs, gen)
        again = part.again(reduce.top_of(top), recompute(part.kept))
        total = again.wire()
        self.allreduce(pg, total, gen)
        return again.result(total)

    def max_over(self, pg: Any, value: float, gen: int) -> float:
        """``value``'s maximum over the generation (a scalar MAX collective)."""
        t = self._torch.tensor([value], dtype=self._torch.float64, device=self._device)
        if pg is not None:
            opts = self._dist.AllreduceOptions()
            opts.reduceOp = self._dist.ReduceOp.MAX
            self.wait_work(pg.allreduce([t], opts), gen)
        return float(t[0])


class Reaper:
    """Tears retired process groups down on a thread of its own.

    A gloo group's destructor waits for the collectives still queued or
    running on it: one waiting on a paused (SIGSTOPped) peer blocks until that
    peer wakes and leaves the generation too (it retires its side, or the
    collective completes), or at worst until the group's collective timeout
    (:data:`GROUP_TIMEOUT_S`). ``ProcessGroupGloo.abort()`` does not cancel
    such a collective (measured, torch 2.13), so that wait cannot be avoided,
    only moved: it must never be the trainer's, which is training in the next
    generation meanwhile. The destructor releases the GIL while it waits
    (measured), so the control thread keeps beating. One thread, daemon: the
    process ends with ``os._exit`` whatever it is waiting on; groups queue
    here in retirement order and each wait is bounded by that timeout.
    """

    def __init__(self) -> None:
        self.retired: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self.loop, daemon=True, name="reaper")
        self.thread.start()

    def retire(self, group: dict) -> None:
        self.retired.put(group)

    def loop(self) -> None:
        while True:
            group = self.retired.get()
            group.clear()  # the last references: the group's destructor runs here
            del group
