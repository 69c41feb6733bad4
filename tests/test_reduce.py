"""The exact reduction's arithmetic (real/reduce.py), without processes.

What exact mode rests on: whichever way the step's shard gradients are split
among workers and in whatever order the pieces are added, the fixed-point sum
is the same integer vector, so the decoded mean is the same float32 bits; and
the shared exponent never lets a sum overflow.
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
    workers = draw(st.integers(1, k))
    owner = [draw(st.integers(0, workers - 1)) for _ in range(k)]
    order = draw(st.permutations(range(workers)))
    return grads, owner, list(order)


def _exact_sum(grads, owner, order) -> torch.Tensor:
    k = len(grads)
    top = max(float(g.abs().max()) for g in grads)
    exps = (reduce.scale_exp(top, k), reduce.scale_exp(1.0, k))
    total = torch.zeros(grads[0].numel() + 1, dtype=torch.float64)
    for w in order:  # the collective's order of addition, any grouping
        mine = [g for g, o in zip(grads, owner) if o == w]
        total += reduce.exact_payload(mine, [1.0] * len(mine), exps, grads[0].numel())
    grad, loss = reduce.exact_result(total, exps, k)
    assert loss == 1.0
    return grad


@given(step_grads())
def test_exact_sum_ignores_who_computed_what_and_the_order(case) -> None:
    grads, owner, order = case
    alone = _exact_sum(grads, [0] * len(grads), [0])
    split = _exact_sum(grads, owner, order)
    assert torch.equal(alone.view(torch.int32), split.view(torch.int32))


@given(step_grads())
def test_exact_mean_is_close_to_the_float64_mean(case) -> None:
    grads, _, _ = case
    got = _exact_sum(grads, [0] * len(grads), [0]).double()
    want = torch.stack([g.double() for g in grads]).mean(0)
    top = max(float(g.abs().max()) for g in grads)
    # Within float32 rounding of the result (relative, or the subnormal
    # quantum near zero) plus the fixed-point quantum.
    tol = want.abs() * 2.0 ** -23 + 2.0 ** -149 + top * 2.0 ** -36
    assert bool(((got - want).abs() <= tol).all()), (got, want)


@pytest.mark.parametrize("k", [1, 2, 3, 8, 1000])
@pytest.mark.parametrize("top", [1e-30, 1.0, 3.4e38])
def test_scale_never_overflows(k: int, top: float) -> None:
    exp = reduce.scale_exp(top, k)
    one = reduce.encode(torch.tensor([top, -top], dtype=torch.float64), exp)
    assert abs(int(one[0])) * k <= 2 ** 52  # every partial sum exact in float64


def test_zero_and_non_finite_gradients() -> None:
    assert reduce.scale_exp(0.0, 4) == 0
    with pytest.raises(FloatingPointError):
        reduce.scale_exp(math.inf, 4)


def test_fast_sum_does_depend_on_grouping() -> None:
    """The reason exact mode exists: float addition is not associative."""
    a, b, c = (torch.tensor([x], dtype=torch.float32) for x in (1e8, -1e8, 1.0))
    assert not torch.equal((a + b) + c, a + (b + c))


def test_a_nan_anywhere_makes_the_step_fail_on_every_worker() -> None:
    grads = [torch.tensor([1.0]), torch.tensor([math.nan])]
    top = reduce.local_max(grads, [0.1, 0.2])
    assert top[0] == math.inf
    with pytest.raises(FloatingPointError):
        reduce.scale_exp(float(top[0]), 2)
    assert reduce.local_max([torch.tensor([2.0])], [math.nan])[1] == math.inf
