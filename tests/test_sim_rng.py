"""Named streams: the counter-based node lifetimes have the distribution asked for.

A node's lifetimes after a repair are hashes of (seed, node, k) turned into
times by the inverse CDF. These tests hold them (and the bulk numpy draws of
the first lifetimes) to the exact CDF with a Kolmogorov-Smirnov bound and to
the mean, so a wrong transform or a biased uniform fails.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from sim.rng import lifetimes, nth_lifetime, nth_uniform, stream

N = 40_000
KS_1PCT = 1.63  # sqrt(n) * D above this: rejected at the 1% level


def _cdf(distribution: str, mean_s: float, shape: float):
    if distribution == "exponential":
        return lambda x: 1.0 - np.exp(-x / mean_s)
    scale = mean_s / math.gamma(1.0 + 1.0 / shape)
    return lambda x: 1.0 - np.exp(-((x / scale) ** shape))


def _ks(draws: np.ndarray, cdf) -> float:
    x = np.sort(draws)
    f = cdf(x)
    i = np.arange(1, len(x) + 1)
    return float(np.sqrt(len(x)) * max(np.max(i / len(x) - f), np.max(f - (i - 1) / len(x))))


def test_nth_uniform_is_deterministic_in_range_and_per_name() -> None:
    us = [nth_uniform(7, "node/3", k) for k in range(1000)]
    assert us == [nth_uniform(7, "node/3", k) for k in range(1000)]
    assert all(0.0 < u <= 1.0 for u in us)
    assert len(set(us)) == 1000
    assert us[:50] != [nth_uniform(7, "node/4", k) for k in range(50)]
    assert us[:50] != [nth_uniform(8, "node/3", k) for k in range(50)]


@pytest.mark.parametrize("distribution, shape", [("exponential", 1.0), ("weibull", 0.7),
                                                 ("weibull", 2.0)])
def test_node_lifetimes_follow_the_distribution(distribution: str, shape: float) -> None:
    mean_s = 1000.0
    cdf = _cdf(distribution, mean_s, shape)
    # a draw per node (the common case: one repair each) and many draws of one node
    across = np.array([nth_lifetime(1, f"node/{w}", 0, distribution, mean_s, shape)
                       for w in range(N)])
    along = np.array([nth_lifetime(1, "node/5", k, distribution, mean_s, shape)
                      for k in range(N)])
    bulk = lifetimes(stream(1, "failures"), distribution, mean_s, shape, N)
    for draws in (across, along, bulk):
        assert _ks(draws, cdf) < KS_1PCT
        assert abs(draws.mean() / mean_s - 1.0) < 0.04


def test_unknown_distribution_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown failure distribution"):
        nth_lifetime(0, "node/0", 0, "lognormal", 1.0, 1.0)
