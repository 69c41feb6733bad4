"""The core's failure draws: counter-based node lifetimes have the distribution asked for.

A node's k-th lifetime is a hash of (seed, node, k) turned into a time by the
inverse CDF, on both targets. These tests hold them to the exact CDF with a
Kolmogorov-Smirnov bound and to the mean, so a wrong transform or a biased
uniform fails; and the random picks to uniformity over the candidates.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from rollcall.core.failures import Draws, FailureModel, nth_uniform, pick

N = 40_000
KS_1PCT = 1.63  # sqrt(n) * D above this: rejected at the 1% level


def _cdf(distribution: str, mean_s: float, shape: float):
    if distribution == "exponential":
        return lambda x: 1.0 - np.exp(-x / mean_s)
    if distribution == "lognormal":  # shape: the log's standard deviation
        mu = math.log(mean_s) - shape * shape / 2
        erf = np.vectorize(math.erf)
        return lambda x: 0.5 * (1.0 + erf((np.log(x) - mu) / (shape * math.sqrt(2.0))))
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
                                                 ("weibull", 2.0), ("lognormal", 0.5),
                                                 ("lognormal", 1.0)])
def test_node_lifetimes_follow_the_distribution(distribution: str, shape: float) -> None:
    mean_s = 1000.0
    cdf = _cdf(distribution, mean_s, shape)
    model = FailureModel(1, distribution, mean_s, weibull_shape=shape, lognormal_sigma=shape)
    # the first life of every node (as a job starts) and many lives of one node
    across = np.array([model.lifetime(w, 0) for w in range(N)])
    along = np.array([model.lifetime(5, k) for k in range(N)])
    for draws in (across, along):
        assert _ks(draws, cdf) < KS_1PCT
        assert abs(draws.mean() / mean_s - 1.0) < 0.04


def test_unknown_distribution_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown failure distribution"):
        FailureModel(0, "gamma", 1.0, 1.0)


def test_lifetimes_depend_only_on_seed_node_and_k() -> None:
    a, b = FailureModel(3, "weibull", 50.0, 0.7), FailureModel(3, "weibull", 50.0, 0.7)
    asked = [(w, k) for w in range(20) for k in range(3)]
    assert [a.lifetime(w, k) for w, k in asked] == \
        [b.lifetime(w, k) for w, k in reversed(asked)][::-1]
    assert a.lifetime(0, 0) != FailureModel(4, "weibull", 50.0, 0.7).lifetime(0, 0)


def test_pick_is_uniform_over_the_candidates_and_ignores_their_order() -> None:
    pool = [9, 3, 5, 7]
    counts = {w: 0 for w in pool}
    for k in range(4000):
        w = pick(11, k, pool)
        assert w == pick(11, k, sorted(pool))
        counts[w] += 1
    assert all(abs(c / 4000 - 0.25) < 0.03 for c in counts.values()), counts
    assert pick(11, 0, []) is None


def test_draws_count_lives_per_node_and_picks_per_run() -> None:
    model = FailureModel(5, "exponential", 10.0)
    d = Draws(5, model)
    assert [d.next_lifetime(1), d.next_lifetime(2), d.next_lifetime(1)] == \
        [model.lifetime(1, 0), model.lifetime(2, 0), model.lifetime(1, 1)]
    assert d.pick([]) is None  # an empty pool draws nothing...
    assert [d.pick([4, 2]), d.pick([7, 8, 9])] == [pick(5, 0, [2, 4]), pick(5, 1, [7, 8, 9])]
    assert Draws(5, None).next_lifetime(1) is None


def test_bad_nodes_are_a_fixed_fraction_that_fails_that_many_times_as_often() -> None:
    """AIReSim's lemons: ``bad_fraction`` of the node ids, each failing
    ``bad_multiplier`` times as often; good nodes draw what they drew before."""
    good = FailureModel(3, "exponential", 1000.0)
    model = FailureModel(3, "exponential", 1000.0, bad_fraction=0.15, bad_multiplier=5.0)
    bad = [w for w in range(N) if model.is_bad(w)]
    assert abs(len(bad) / N - 0.15) < 3 * math.sqrt(0.15 * 0.85 / N)
    assert bad == [w for w in range(N) if model.is_bad(w)]  # by id, fixed
    lives = np.array([model.lifetime(w, 0) for w in bad])
    assert _ks(lives, _cdf("exponential", 200.0, 1.0)) < KS_1PCT
    assert all(model.lifetime(w, 1) == good.lifetime(w, 1) for w in range(200)
               if not model.is_bad(w))
    assert all(model.lifetime(w, 1) == pytest.approx(good.lifetime(w, 1) / 5.0) for w in bad[:50])
    with pytest.raises(ValueError, match="bad failure model"):
        FailureModel(3, "exponential", 1000.0, bad_fraction=1.5)


def test_the_normal_quantile_is_the_stdlib_one() -> None:
    from statistics import NormalDist

    from rollcall.core.failures import normal_quantile

    us = [1e-300, 1e-12, 1e-6, 0.01, 0.02425, 0.3, 0.5, 0.7, 0.97575, 1 - 1e-9, 1 - 2.0 ** -53]
    us += [nth_uniform(0, "q", k) * (1 - 2.0 ** -53) for k in range(2000)]
    assert all(normal_quantile(u) == pytest.approx(NormalDist().inv_cdf(u), rel=1e-9, abs=1e-12)
               for u in us)
