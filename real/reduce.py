"""Gradient reduction of the real target: ``fast`` or ``exact``.

``fast`` sums float32 gradients as DDP does: each worker adds up its own
micro-batches, then the collective adds the workers' sums. The result depends
on who held which micro-batch and on the collective's order of additions, so
an elastic run that shrank and grew ends a few ulps away from a fixed-size run.

``exact`` makes the global gradient a function of the step's data alone:

1. every virtual shard's gradient is computed on its own (never accumulated
   in float with another shard), so it does not depend on which worker
   computed it (one thread, same kernels, data keyed by sample index);
2. a scalar MAX collective gives every worker the largest magnitude ``m`` of
   any shard's gradient this step (max is exact and order-free);
3. each shard's gradient is converted to fixed point, ``round(g * 2**e)``,
   with one exponent ``e`` derived from ``m`` and the number of shards so
   that every partial sum of the step's shards stays below ``2**53``;
4. those integers are summed locally and by a float64 allreduce. Integers
   below ``2**53`` are exact in float64 and so is every sum of them, so the
   addition is associative: any grouping, order and number of contributors
   gives the same bits. The sum is converted back once.

(Integers held in float64 rather than int64: the same 8 bytes on the wire,
but no integer conversion passes, which cost more than the collective on a
CPU.) Cost: one extra scalar collective per step (latency), a payload twice
the bytes of float32, a separate gradient per micro-batch and a few passes
over it. Precision: the sum keeps ``52 - ceil(log2 n_shards)`` bits below
the step's largest component, far finer than float32's 24; components more
than ~2**28 times smaller than the largest entry lose relative precision.

The step's loss travels in the same vector (last element), so the loss curve
comes for free; in exact mode with its own exponent, from the same MAX
collective. A non-finite gradient or loss (a diverged run) has no fixed-point
form: :func:`scale_exp` raises ``FloatingPointError``.
"""

from __future__ import annotations

import math

import torch


def scale_exp(max_abs: float, n_shards: int) -> int:
    """Exponent ``e`` such that ``n_shards`` values of magnitude <= ``max_abs``,
    each rounded to ``round(x * 2**e)``, sum to at most ``2**52`` (exact in float64)."""
    if not math.isfinite(max_abs):
        raise FloatingPointError(f"non-finite gradient (max |g| = {max_abs})")
    if max_abs <= 0.0:
        return 0
    _, top = math.frexp(max_abs)  # max_abs < 2**top
    return 52 - top - max(0, math.ceil(math.log2(n_shards)))


def encode(values: torch.Tensor, exp: int) -> torch.Tensor:
    """Fixed point: ``round(values * 2**exp)``, integers in the dtype of ``values``.

    Scaling by a power of two only moves the exponent, so it is exact in
    float32 too while the result stays below float32's maximum (it does:
    below ``2**53``), and rounding a float32 to an integer is exact. The
    integers then widen to float64 without loss where they are summed.
    """
    if not -120 <= exp <= 120:  # 2**exp itself is not a float32: scale in float64
        values = values.to(torch.float64)
    return torch.mul(values, math.ldexp(1.0, exp)).round_()


def decode(total: torch.Tensor, exp: int, divisor: int) -> torch.Tensor:
    """The float32 mean of a fixed-point sum over ``divisor`` shards."""
    return total.mul_(math.ldexp(1.0, -exp)).div_(divisor).float()


def local_max(grads: list[torch.Tensor], losses: list[float]) -> torch.Tensor:
    """This worker's ``[max |gradient entry|, max |loss|]``, for the MAX collective."""
    def top(values: list[float]) -> float:
        # NaN compares false both ways, so max() could skip it: make it inf,
        # which the MAX collective spreads to every worker.
        return math.inf if not all(map(math.isfinite, values)) else max(values, default=0.0)

    g = top([float(x.abs().max()) for x in grads])
    return torch.tensor([g, top([abs(x) for x in losses])], dtype=torch.float64)


def exact_payload(grads: list[torch.Tensor], losses: list[float], exps: tuple[int, int],
                  n: int) -> torch.Tensor:
    """This worker's contribution: its shards' fixed-point gradients plus losses."""
    out = torch.zeros(n + 1, dtype=torch.float64)
    body = out[:n]
    for g in grads:  # widen first: a same-dtype add is several times faster than a mixed one
        body.add_(encode(g, exps[0]).to(torch.float64))
    out[n] = float(sum(round(math.ldexp(loss, exps[1])) for loss in losses))
    return out


def exact_result(total: torch.Tensor, exps: tuple[int, int],
                 n_shards: int) -> tuple[torch.Tensor, float]:
    """Mean gradient (float32) and mean loss from the reduced payload."""
    n = total.numel() - 1
    grad = decode(total[:n], exps[0], n_shards)
    loss = math.ldexp(float(total[n]), -exps[1]) / n_shards
    return grad, loss


def fast_payload(grad: torch.Tensor, losses: list[float]) -> torch.Tensor:
    """This worker's float32 contribution: its accumulated gradient plus its loss sum
    (a fresh tensor: an abandoned collective may still write into an old one)."""
    out = torch.empty(grad.numel() + 1, dtype=grad.dtype)
    out[:-1].copy_(grad)
    out[-1] = sum(losses)
    return out


def fast_result(total: torch.Tensor, n_shards: int) -> tuple[torch.Tensor, float]:
    n = total.numel() - 1
    return total[:n] / n_shards, float(total[n]) / n_shards
