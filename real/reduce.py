"""Gradient reduction of the real target: ``fast`` or ``exact``.

``fast`` sums float32 gradients as DDP does: each worker adds up its own
micro-batches, then the collective adds the workers' sums. The result depends
on who held which micro-batch and on the collective's order of additions, so
an elastic run that shrank and grew ends a few ulps away from a fixed-size run.

``exact`` makes the global gradient a function of the step's data alone:

1. every virtual shard's gradient is computed on its own (never accumulated
   in float with another shard), so it does not depend on which worker
   computed it (one thread, same kernels, data keyed by sample index);
2. each shard's gradient is converted to fixed point, ``round(g * 2**e)``,
   int32, with one exponent ``e`` shared by the whole step and chosen so that
   the sum of every shard stays below ``2**30``;
3. those integers are summed locally and by an int32 allreduce. Integer
   addition is associative, so any grouping, order and number of
   contributors gives the same integers; they are converted back once.

The exponent needs a bound on the step's largest gradient entry that every
worker agrees on before any of them has seen the others' gradients. It comes
from the state they share: the SGD momentum, a decaying sum of the recent
gradients, bounds where this step's gradient will most likely be (``top``:
four times its largest entry). Each shard checks the guess; the payload
counts the shards that broke it, and if any did (a gradient spike, the first
step, whose momentum is zero) every worker learns so from the same sum and
the step is reduced again with an exponent from a scalar MAX collective of
the true largest entries (:class:`ExactPart`, ``top=None``). Every choice
depends only on the shared state and on sums, never on who computed what, so
the result is the same bits whatever the membership. (With ZeRO-1 the
momentum is sliced among workers: a scalar MAX of the owners' slice maxima
gives the same guess, so a sharded run keeps the replicated run's bits.)

Cost against ``fast``: the same bytes on the wire (int32 for float32); per
micro-batch one pass to find its largest entry and three to encode and add
it; one pass to decode; a second exchange only when the guess fails.
Precision: ``30 - ceil(log2 n_shards)`` bits below the bound, so about 24
bits below the step's largest entry (float32 has 24 in each entry); entries
far smaller than the largest are quantised. Exactness costs accuracy only
there, and the loss curve tracks ``fast`` (tests/test_exact.py).

The step's loss travels in the same payload, each shard's float64 loss in two
int32 slots of its own (one writer per slot, so the sum is that value), and
is averaged in shard order. A non-finite gradient or loss (a diverged run)
has no fixed-point form: :meth:`ExactPart.result` and :func:`top_of` raise
``FloatingPointError``.
"""

from __future__ import annotations

import math
import struct
from typing import Optional, Sequence

import torch

SUM_BITS = 30          # every partial sum of the step stays below 2**30 < 2**31
HINT_HEADROOM_BITS = 2  # the momentum's largest entry, times 4, bounds the guess


def top_of(max_abs: float) -> int:
    """``t`` with ``max_abs < 2**t``: the bound behind the exponent."""
    if not math.isfinite(max_abs):
        raise FloatingPointError(f"non-finite gradient (max |g| = {max_abs})")
    if max_abs <= 0.0:
        return -1000  # all zero: any exponent encodes it exactly
    return math.frexp(max_abs)[1]


def scale_exp(top: int, n_shards: int) -> int:
    """Exponent ``e``: ``n_shards`` values below ``2**top``, each rounded to
    ``round(x * 2**e)``, sum to at most ``2**SUM_BITS``."""
    if top <= -1000:
        return 0
    return SUM_BITS - top - max(0, math.ceil(math.log2(n_shards)))


def max_abs(t: torch.Tensor) -> float:
    """Largest magnitude of ``t`` (one pass); inf when any entry is not finite."""
    if not t.numel():
        return 0.0
    lo, hi = torch.aminmax(t)
    m = max(-float(lo), float(hi))
    return m if math.isfinite(m) else math.inf  # NaN as inf: the MAX collective spreads it


def hint_top(momentum: torch.Tensor) -> Optional[int]:
    """The guessed bound from the shared momentum; None when it says nothing
    (zero: the first step, or not finite)."""
    return hint_from_max(max_abs(momentum))


def hint_from_max(m: float) -> Optional[int]:
    """:func:`hint_top` from the momentum's largest magnitude (ZeRO-1: the
    MAX over the slices' owners)."""
    if m == 0.0 or not math.isfinite(m):
        return None
    return math.frexp(m)[1] + HINT_HEADROOM_BITS


def encode(values: torch.Tensor, exp: int) -> torch.Tensor:
    """Fixed point: ``round(values * 2**exp)`` as int32 (scaling by a power of
    two and rounding to an integer are both exact while below ``2**31``)."""
    if not -120 <= exp <= 120:  # 2**exp is not a float32 scalar: scale in float64
        values = values.double()
    return torch.mul(values, math.ldexp(1.0, exp)).round_().to(torch.int32)


def _loss_words(loss: float) -> tuple[int, int]:
    return struct.unpack("<ii", struct.pack("<d", loss))


def _loss_of(words: list[int]) -> float:
    return struct.unpack("<d", struct.pack("<ii", *words))[0]


class ExactPart:
    """One worker's contribution to an exact step, built shard by shard.

    ``top``: the agreed bound (``2**top`` above every entry), or None when
    there is none yet; then the shards' gradients are kept for a second pass
    once the MAX collective has given it (:meth:`again`).

    Payload (int32, as :meth:`wire` hands it over): ``[fixed-point gradient sum (n) | shards over the bound
    (1) | each shard's loss as two words (2 * n_shards)]``. Fresh per step: an
    abandoned collective may still write into an old one.
    """

    def __init__(self, n: int, n_shards: int, top: Optional[int],
                 scratch: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
                 device: str | torch.device = "cpu") -> None:
        """``scratch``: a float32 and an int32 buffer of ``n`` entries to encode
        in, kept by the caller from step to step (never sent on the wire);
        fresh 4 MB tensors per micro-batch cost more than the arithmetic.
        ``device``: where the gradients are and the payload goes (the
        worker's GPU under ``cluster.device: cuda``; the integers, and so the
        bits, are the same on any device)."""
        self.n, self.n_shards, self.top = n, n_shards, top
        self.device = torch.device(device)
        self.exp = None if top is None else scale_exp(top, n_shards)
        self.payload = torch.empty(n + 1 + 2 * n_shards, dtype=torch.int32, device=self.device)
        self.payload[n:].zero_()
        self.blank = True  # the gradient sum holds nothing yet (not even zeros)
        self.kept: dict[int, tuple[torch.Tensor, float]] = {}
        self.losses: dict[int, float] = {}  # written into the payload by wire()
        self.max_abs = 0.0  # largest entry of this worker's shards
        self.scratch = scratch

    def add(self, shard: int, grad: "torch.Tensor | Sequence[torch.Tensor]", loss: float) -> None:
        """Shard ``shard`` (its index in the step) gave ``grad`` and ``loss``.
        ``grad``: the flat gradient, or its consecutive pieces (one tensor per
        parameter, as backward leaves them); read now, free to reuse after."""
        n = self.n
        pieces = [grad.reshape(-1)] if isinstance(grad, torch.Tensor) else [p.reshape(-1) for p in grad]
        if sum(p.numel() for p in pieces) != n:
            raise ValueError(f"gradient of {sum(p.numel() for p in pieces)} entries, expected {n}")
        m = max(map(max_abs, pieces), default=0.0)
        self.max_abs = max(self.max_abs, m)
        self.losses[shard] = loss
        if self.exp is None:
            self.kept[shard] = (torch.cat(pieces), loss)
        elif not math.isfinite(m) or top_of(m) > self.top:  # type: ignore[operator]
            self.payload[n] += 1  # over the bound: this step is redone
        else:
            body = self.payload[:n]
            if not -120 <= self.exp <= 120:  # rare: encode() scales in float64
                self._put(body, encode(torch.cat(pieces), self.exp))
                return
            if self.scratch is None:
                self.scratch = (torch.empty(n, device=self.device),
                                torch.empty(n, dtype=torch.int32, device=self.device))
            f32, i32 = self.scratch
            # encode() into reused buffers: each piece scaled straight into its
            # place in the flat buffer (no concatenation pass), the rest flat
            scale, off = math.ldexp(1.0, self.exp), 0
            for p in pieces:
                torch.mul(p, scale, out=f32[off:off + p.numel()])
                off += p.numel()
            rounded = f32.round_()
            self._put(body, rounded if self.blank else i32.copy_(rounded))

    def _put(self, body: torch.Tensor, fixed: torch.Tensor) -> None:
        """Add ``fixed`` (integer values) into the sum; the first shard is
        converted straight into it (no zero fill, no add pass)."""
        if self.blank:
            body.copy_(fixed)
            self.blank = False
        else:
            body.add_(fixed)

    def wire(self) -> torch.Tensor:
        """The payload to reduce, with this worker's shard losses written in."""
        n, words = self.n, self.payload
        if self.blank:  # no shard encoded here (none held, or all over the bound)
            words[:n].zero_()
            self.blank = False
        if self.losses:
            idx = sorted(self.losses)
            slots = torch.tensor([n + 1 + 2 * j + k for j in idx for k in (0, 1)],
                                 device=words.device)
            vals = torch.tensor([w for j in idx for w in _loss_words(self.losses[j])],
                                dtype=torch.int32, device=words.device)
            words.index_copy_(0, slots, vals)
        return words

    def result(self, total: torch.Tensor) -> Optional[tuple[torch.Tensor, float]]:
        """Mean gradient (float32) and mean loss from the reduced payload;
        None when some shard broke the bound (then: MAX, :meth:`again`)."""
        n, k = self.n, self.n_shards
        if self.exp is None or int(total[n]) > 0:
            return None
        words = total[n + 1:].tolist()
        losses = [_loss_of(words[2 * j: 2 * j + 2]) for j in range(k)]
        loss = math.fsum(losses) / k
        if not math.isfinite(loss):
            raise FloatingPointError(f"non-finite loss ({loss})")
        body = total[:n]
        # one pass: int32 times a float scalar is computed and stored in
        # float32 (the sum, then the product, rounded once each: the same
        # bits on every worker); far from 1 the scaling is done in float64
        if -90 <= self.exp <= 90:
            grad = torch.mul(body, math.ldexp(1.0, -self.exp) / k)
        else:
            grad = body.double().div_(k).mul_(math.ldexp(1.0, -self.exp)).float()
        return grad, loss

    def again(self, top: int, shards: "list[tuple[int, torch.Tensor, float]]") -> "ExactPart":
        """The same shards encoded under the agreed ``top`` (from the MAX
        collective). ``shards``: ``(index, grad, loss)`` recomputed by the
        caller for those not kept."""
        part = ExactPart(self.n, self.n_shards, top, self.scratch, self.device)
        for j, (g, loss) in sorted(self.kept.items()):
            part.add(j, g, loss)
        for j, g, loss in shards:
            part.add(j, g, loss)
        return part


def fast_payload(grad: torch.Tensor, losses: list[float]) -> torch.Tensor:
    """This worker's float32 contribution: its accumulated gradient plus its loss sum
    (a fresh tensor: an abandoned collective may still write into an old one)."""
    out = torch.empty(grad.numel() + 1, dtype=grad.dtype, device=grad.device)
    out[:-1].copy_(grad)
    out[-1] = sum(losses)
    return out


def fast_result(total: torch.Tensor, n_shards: int) -> tuple[torch.Tensor, float]:
    n = total.numel() - 1
    return total[:n] / n_shards, float(total[n]) / n_shards
