"""ZeRO stage 1 on one worker: parameters replicated, optimizer state sharded.

The SGD momentum (the optimizer state) is cut into ``state.shards`` slices;
the keeper's placement (``Enter.placement``) says which workers hold which
slice, owner first. Per step every holder updates its slices from the
reduced gradient (buddies too, so their copies stay current with no extra
traffic), each *owner* computes the new parameters of its slices, and one
collective gathers them: every worker contributes a buffer of ``-0.0`` with
its owned slices written in, and the sum is the new parameter vector (adding
``-0.0`` is the exact identity in IEEE arithmetic, so nothing is rounded).

A slice this worker does not hold is NaN, so a bug that reads one shows in
the weights. The arithmetic is the replicated update's, element by element
(``real.model.Workload.apply``), so a sharded run in exact mode ends with the
same bits as a replicated one.

Recovery is the keeper's plan (``Enter.recovery``): each ``Copy(shard, src,
dst)`` is carried by one more gather, where one source per shard writes its
replica and every destination reads it; a fallback reloads everything from
the checkpoint. Nothing here decides who holds what.
"""

from __future__ import annotations

from itertools import accumulate
from typing import Optional, Sequence

import torch

from rollcall.core import split_bytes

from real.model import MOMENTUM


def bounds(n: int, n_shards: int) -> list[tuple[int, int]]:
    """Contiguous slices of ``n`` elements, cut as the keeper sizes shards
    (:func:`rollcall.core.sharding.split_bytes`: the first ``n % n_shards`` one longer)."""
    ends = list(accumulate(split_bytes(n, n_shards), initial=0))
    return list(zip(ends, ends[1:]))


def gather_buffer(n: int, device: str | torch.device = "cpu") -> torch.Tensor:
    """``n`` entries of ``-0.0`` on ``device`` (the worker's: a gather runs there)."""
    return torch.full((n,), -0.0, device=device)


class ZeroState:
    """Which momentum slices this worker holds, and the sharded step."""

    def __init__(self, worker: int, wl, n_shards: int) -> None:
        self.worker = worker
        self.wl = wl
        self.bounds = bounds(wl.n, n_shards)
        self.held: set[int] = set(range(n_shards))  # until the first placement
        self.owned: set[int] = set()

    def _sl(self, s: int) -> slice:
        lo, hi = self.bounds[s]
        return slice(lo, hi)

    def momentum_max(self) -> float:
        """Largest momentum magnitude over the slices this worker owns (a
        MAX over all owners gives the whole vector's, as replicated)."""
        from real.reduce import max_abs
        mom = self.wl.momentum
        return max((max_abs(mom[self._sl(s)]) for s in self.owned), default=0.0)

    # --- recovery ----------------------------------------------------------------

    def copy_buffer(self, recovery) -> Optional[torch.Tensor]:
        """This worker's part of the copy gather (None: the plan copies nothing).

        One source per shard writes (the lowest id among its copies' sources):
        replicas are identical, and two writers would add up.
        """
        if recovery is None or not recovery.copies:
            return None
        src: dict[int, int] = {}
        for c in recovery.copies:
            src[c.shard] = min(src.get(c.shard, c.src), c.src)
        sends = [shard for shard, w in src.items() if w == self.worker]
        if not self.held.issuperset(sends):
            raise RuntimeError(f"told to send shards {sorted(set(sends) - self.held)}"
                               " that this worker does not hold")
        return self._momentum_of(sends)

    def adopt(self, placement: Sequence[Sequence[int]], recovery, copied: Optional[torch.Tensor],
              reloaded: bool, replaced: bool) -> None:
        """Take the new placement: copied slices in, slices no longer held out.

        ``reloaded``: the whole state was just loaded (origin or checkpoint),
        so every slice placed here is valid. ``replaced``: only the parameters
        were copied from the source (this worker's state was stale), so none
        of the slices it held before count.
        """
        if replaced and not reloaded:
            self.held = set()
        mine = {s for s, holders in enumerate(placement) if self.worker in holders}
        incoming = set()
        if copied is not None:
            for c in recovery.copies:
                if c.dst == self.worker:
                    sl = self._sl(c.shard)
                    self.wl.momentum[sl] = copied[sl]
                    incoming.add(c.shard)
        if not reloaded:
            missing = mine - self.held - incoming
            if missing:
                raise RuntimeError(f"placed on shards {sorted(missing)} with no copy of them")
        for s in set(range(len(self.bounds))) - mine:
            self.wl.momentum[self._sl(s)] = float("nan")
        self.held = mine
        self.owned = {s for s, holders in enumerate(placement) if holders and holders[0] == self.worker}

    # --- the step ----------------------------------------------------------------------

    def step(self, grad: torch.Tensor, lr_scale: float) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
        """New momentum of the held slices and this worker's part of the parameter gather.

        Nothing is changed in place: a step that does not commit leaves no trace.
        """
        wl = self.wl
        rate = wl.lr * lr_scale
        moms: dict[int, torch.Tensor] = {}
        buf = gather_buffer(wl.n, wl.flat.device)
        for s in sorted(self.held):
            sl = self._sl(s)
            m = wl.momentum[sl].mul(MOMENTUM).add_(grad[sl])
            moms[s] = m
            if s in self.owned:
                buf[sl] = wl.flat[sl].sub(m.mul(rate))
        return moms, buf

    def commit(self, moms: dict[int, torch.Tensor], params: torch.Tensor) -> None:
        with torch.no_grad():
            for s, m in moms.items():
                self.wl.momentum[self._sl(s)] = m
            self.wl.flat.copy_(params)

    def momentum_buffer(self) -> torch.Tensor:
        """This worker's part of a momentum gather (for a checkpoint): its owned slices."""
        return self._momentum_of(self.owned)

    def _momentum_of(self, shards) -> torch.Tensor:
        """A gather buffer holding this worker's momentum of ``shards``, ``-0.0`` elsewhere."""
        buf = gather_buffer(self.wl.n, self.wl.flat.device)
        for s in shards:
            sl = self._sl(s)
            buf[sl] = self.wl.momentum[sl]
        return buf
