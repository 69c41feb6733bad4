"""The exact reduction's arithmetic (real/reduce.py), without processes.

What exact mode rests on: whichever way the step's shard gradients are split
among workers and in whatever order the pieces are added, the fixed-point sum
is the same integer vector, so the decoded mean is the same float32 bits; the
shared exponent never lets a sum overflow; and a guess that a shard breaks is
caught by every worker alike and redone under the true bound.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, strategies as st

torch = pytest.importorskip("torch")

from real import reduce  # noqa: E402

finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@st.composite
def step_grads(draw):
    """A step: K shard gradients of n floats, and a partition of shards among workers."""
    k = draw(st.integers(1, 12))
    n = draw(st.integers(1, 8))
    grads = [torch.tensor(draw(st.lists(finite32, min_size=n, max_size=n)), dtype=torch.float32)
             for _ in range(k)]
    losses = draw(st.lists(st.floats(0.0, 10.0), min_size=k, max_size=k))
    workers = draw(st.integers(1, k))
    owner = [draw(st.integers(0, workers - 1)) for _ in range(k)]
    order = draw(st.permutations(range(workers)))
    return grads, losses, owner, list(order)


def _reduce(grads, losses, owner, order, top):
    """Every worker builds its part under ``top``; the collective adds the
    payloads in ``order``; a broken guess is redone as the worker does."""
    k, n = len(grads), grads[0].numel()
    parts = {}
    for w in order:
        part = reduce.ExactPart(n, k, top)
        for j in range(k):
            if owner[j] == w:
                part.add(j, grads[j].clone(), losses[j])
        parts[w] = part
    total = sum((parts[w].wire() for w in order), torch.zeros_like(parts[order[0]].payload))
    out = parts[order[0]].result(total)
    if out is None:  # no guess, or a shard broke it: MAX, then again
        true_top = reduce.top_of(max(p.max_abs for p in parts.values()))
        again = {w: parts[w].again(true_top, [(j, grads[j], losses[j]) for j in range(k)
                                             if owner[j] == w and j not in parts[w].kept])
                 for w in order}
        total = sum((again[w].wire() for w in order), torch.zeros_like(total))
        out = again[order[0]].result(total)
    return out


@given(step_grads(), st.sampled_from([None, -5, 0, 3, 40]))
def test_exact_sum_ignores_who_computed_what_and_the_order(case, guess) -> None:
    grads, losses, owner, order = case
    alone_grad, alone_loss = _reduce(grads, losses, [0] * len(grads), [0], guess)
    grad, loss = _reduce(grads, losses, owner, order, guess)
    assert torch.equal(alone_grad.view(torch.int32), grad.view(torch.int32))
    assert loss == alone_loss == math.fsum(losses) / len(losses)


@given(step_grads())
def test_a_wrong_guess_gives_the_same_bits_as_no_guess(case) -> None:
    """Too low a guess is redone under the true bound: the same result as
    having had no guess; a guess above the bound keeps the step's own result."""
    grads, losses, owner, order = case
    none, _ = _reduce(grads, losses, owner, order, None)
    low, _ = _reduce(grads, losses, owner, order, -200)
    assert torch.equal(none.view(torch.int32), low.view(torch.int32))


@given(step_grads())
def test_exact_mean_is_close_to_the_float64_mean(case) -> None:
    grads, losses, _, _ = case
    got = _reduce(grads, losses, [0] * len(grads), [0], None)[0].double()
    want = torch.stack([g.double() for g in grads]).mean(0)
    top = reduce.top_of(max(float(g.abs().max()) for g in grads))
    quantum = 2.0 ** -reduce.scale_exp(top, len(grads)) if top > -1000 else 0.0
    # float32 rounding of the result (relative, or the subnormal quantum
    # near zero) plus the fixed-point quantum.
    tol = want.abs() * 2.0 ** -22 + 2.0 ** -149 + quantum
    assert bool(((got - want).abs() <= tol).all()), (got, want)


@pytest.mark.parametrize("k", [1, 2, 3, 8, 1000])
@pytest.mark.parametrize("top_value", [1e-30, 1.0, 3.4e38])
def test_scale_never_overflows(k: int, top_value: float) -> None:
    top = reduce.top_of(top_value)
    exp = reduce.scale_exp(top, k)
    below = math.nextafter(math.ldexp(1.0, top), 0.0)  # the largest value under the bound
    one = reduce.encode(torch.tensor([below, -below], dtype=torch.float64), exp)
    assert abs(int(one[0])) * k <= 2 ** reduce.SUM_BITS  # every partial sum fits int32


def test_the_guess_comes_from_the_momentum() -> None:
    assert reduce.hint_top(torch.zeros(4)) is None  # the first step: no guess
    assert reduce.hint_top(torch.tensor([0.0, math.nan])) is None
    top = reduce.hint_top(torch.tensor([0.3, -1.5]))
    assert top == math.frexp(1.5)[1] + reduce.HINT_HEADROOM_BITS and 1.5 * 4 < 2.0 ** top


def test_zero_and_non_finite_gradients() -> None:
    assert reduce.scale_exp(reduce.top_of(0.0), 4) == 0
    with pytest.raises(FloatingPointError):
        reduce.top_of(math.inf)


def test_fast_sum_does_depend_on_grouping() -> None:
    """The reason exact mode exists: float addition is not associative."""
    a, b, c = (torch.tensor([x], dtype=torch.float32) for x in (1e8, -1e8, 1.0))
    assert not torch.equal((a + b) + c, a + (b + c))


def test_a_nan_anywhere_makes_the_step_fail_on_every_worker() -> None:
    grads = [torch.tensor([1.0]), torch.tensor([math.nan])]
    with pytest.raises(FloatingPointError):  # caught as over the guess, then by the MAX bound
        _reduce(grads, [0.1, 0.2], [0, 1], [1, 0], 3)
    with pytest.raises(FloatingPointError):  # a finite gradient with a NaN loss
        _reduce([torch.tensor([2.0])], [math.nan], [0], [0], 3)


@given(step_grads(), st.integers(0, 8))
def test_a_gradient_in_pieces_encodes_as_the_flat_one(case, cut) -> None:
    """Exact mode hands each parameter's gradient as backward left it: the
    pieces must give the payload of the flat vector they make up."""
    grads, losses, _, _ = case
    n, k = grads[0].numel(), len(grads)
    cut = min(cut, n)
    flat, pieces = reduce.ExactPart(n, k, 3), reduce.ExactPart(n, k, 3)
    for j, g in enumerate(grads):
        flat.add(j, g, losses[j])
        pieces.add(j, [g[:cut], g[cut:]], losses[j])
    assert torch.equal(flat.wire(), pieces.wire())
