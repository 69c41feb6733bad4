"""rollcall.app.stats: the one Student-t quantile, one interval method per kind of metric,
and the significance rule.

The quantile is checked against closed forms (1 and 2 degrees of freedom),
printed tables and the normal limit; the intervals against their
definitions by hand and, with hypothesis, against the ranges they must keep:
ratios inside [0, 1], their paired differences inside [-1, 1], counts never
below 0, count differences inside the range the two sides allow; equal
values give no spread and no claim, fewer than three pairs no claim.
"""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollcall.app import analysis, stats
from rollcall.app import comparison as compare
from rollcall.app.stats import (
    MIN_PAIRS, count_difference_range, difference_interval, kind_of, mean_interval,
    significance, t975, t_quantile,
)

# --------------------------------------------------------------------------- the t quantile


def test_t_quantile_matches_its_closed_forms() -> None:
    # df = 1 is Cauchy: tan(pi (p - 1/2)); df = 2: (2p - 1) sqrt(2 / (4 p (1 - p)))
    for p in (0.6, 0.9, 0.975, 0.995):
        assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-12)
        assert t_quantile(p, 2) == pytest.approx((2 * p - 1) * math.sqrt(2 / (4 * p * (1 - p))),
                                                 rel=1e-12)
    assert t_quantile(0.5, 7) == 0.0
    assert t_quantile(0.025, 9) == -t_quantile(0.975, 9)


@pytest.mark.parametrize("df, value", [
    (1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (5, 2.571), (6, 2.447), (7, 2.365),
    (8, 2.306), (9, 2.262), (10, 2.228), (15, 2.131), (20, 2.086), (25, 2.060), (30, 2.042),
    (40, 2.021), (60, 2.000), (120, 1.980), (10 ** 6, 1.960),
])
def test_t975_is_the_printed_table(df: int, value: float) -> None:
    assert t975(df) == value


def test_t_quantile_to_more_digits_and_its_normal_limit() -> None:
    # values of the exact distribution, to 6 decimals (any statistics package)
    assert t_quantile(0.975, 3) == pytest.approx(3.182446, abs=1e-6)
    assert t_quantile(0.975, 10) == pytest.approx(2.228139, abs=1e-6)
    assert t_quantile(0.975, 1000) == pytest.approx(1.962339, abs=1e-6)
    # the series above 2000 degrees of freedom continues the exact sum
    assert t_quantile(0.975, 2001) == pytest.approx(t_quantile(0.975, 2000), abs=1e-6)
    assert t_quantile(0.975, 10 ** 7) == pytest.approx(1.959964, abs=1e-6)
    assert math.isnan(t975(0))


@given(st.integers(min_value=1, max_value=3000))
def test_t975_falls_with_the_degrees_of_freedom(df: int) -> None:
    assert 1.959 < t975(df + 1) <= t975(df) <= 12.706


def test_one_t_quantile_for_the_whole_project() -> None:
    assert compare.t975 is stats.t975 and analysis.t975 is stats.t975
    assert not hasattr(compare, "_T975") and not hasattr(analysis, "_T975")


# --------------------------------------------------------------------------- by hand


def test_t_interval_by_hand() -> None:
    iv = mean_interval([1.0, 2.0, 3.0], "time")
    assert (iv.mean, iv.n, iv.method) == (2.0, 3, "t")
    assert iv.half == pytest.approx(4.303 * 1.0 / math.sqrt(3))
    assert iv.lo == pytest.approx(2.0 - iv.half) and iv.hi == pytest.approx(2.0 + iv.half)
    assert iv.describe() == "t over 3 seeds"
    paired = difference_interval([-8.0, -7.5, -8.5], "time")
    assert paired.method == "paired t" and paired.half == pytest.approx(4.303 * 0.5 / math.sqrt(3))


def test_ratio_interval_by_hand() -> None:
    xs = [0.80, 0.75, 0.70]
    m, se = 0.75, statistics.stdev(xs) / math.sqrt(3)
    centre, half = math.log(m / (1 - m)), 4.303 * se / (m * (1 - m))
    iv = mean_interval(xs, "ratio")
    assert iv.method == "logit t" and iv.mean == pytest.approx(m)
    assert iv.lo == pytest.approx(1 / (1 + math.exp(-(centre - half))))
    assert iv.hi == pytest.approx(1 / (1 + math.exp(-(centre + half))))
    # a paired difference of ratios: the same on (d + 1) / 2
    d = difference_interval([0.12, 0.12, 0.11], "ratio")
    u = (statistics.fmean([0.12, 0.12, 0.11]) + 1) / 2
    se_u = statistics.stdev([0.12, 0.12, 0.11]) / math.sqrt(3) / 2
    half_u = 4.303 * se_u / (u * (1 - u))
    assert d.method == "paired logit t"
    assert d.lo == pytest.approx(2 / (1 + math.exp(-(math.log(u / (1 - u)) - half_u))) - 1)


def test_count_interval_by_hand() -> None:
    # 0, 0, 1: the t interval is [-1.10, 1.77]; on the square-root scale the lower end is 0
    iv = mean_interval([0, 0, 1], "count")
    root, half = math.sqrt(1 / 3), 4.303 * (statistics.stdev([0, 0, 1]) / math.sqrt(3)) / (
        2 * math.sqrt(1 / 3))
    assert iv.method == "root t" and iv.lo == 0.0
    assert iv.hi == pytest.approx((root + half) ** 2)
    # elastic never restarts, checkpoint-restart 0, 0 and 3 times: the paired t interval
    # -1 +- 4.303 is held below 0, the most elastic's own counts allow
    allowed = count_difference_range([0, 0, 0], [0, 0, 3])
    assert allowed is not None and allowed[1] == 0.0
    d = difference_interval([0, 0, -3], "count", allowed)
    assert d.method == "paired t in range" and d.hi == 0.0
    assert d.lo == pytest.approx(-1 - 4.303 * 1.0) and allowed[0] < d.lo
    assert difference_interval([0, 0, -3], "count").hi == pytest.approx(-1 + 4.303)


def test_no_values_one_value_and_a_missing_one() -> None:
    assert math.isnan(mean_interval([], "time").mean)
    one = mean_interval([5.0], "count")
    assert one.mean == 5.0 and math.isnan(one.lo) and one.describe() == "one seed: no interval"
    assert math.isnan(mean_interval([1.0, None, 2.0], "ratio").mean)
    assert math.isnan(mean_interval([1.0, float("nan")], "time").hi)


def test_kind_of_each_metric() -> None:
    assert {m: kind_of(m) for m in ("goodput", "ettr", "completed", "valid")} == dict.fromkeys(
        ("goodput", "ettr", "completed", "valid"), "ratio")
    for m in ("failures", "restarts", "generations", "lost_steps", "samples_duplicated",
              "fallbacks", "steps_lost_to_fallback", "pulled"):
        assert kind_of(m) == "count"
    assert kind_of("elapsed_s") == kind_of("stall_s") == "time"
    assert kind_of("slowdown") == "number"


# --------------------------------------------------------------------------- ranges (hypothesis)

ratio = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
count = st.integers(min_value=0, max_value=10 ** 9)
some = settings(max_examples=300, deadline=None)


@some
@given(st.lists(ratio, min_size=1, max_size=40))
def test_ratio_intervals_stay_inside_0_1(values: list[float]) -> None:
    iv = mean_interval(values, "ratio")
    assert 0.0 <= iv.mean <= 1.0
    if len(values) > 1:
        assert 0.0 <= iv.lo <= iv.mean <= iv.hi <= 1.0, iv


@some
@given(st.lists(st.tuples(ratio, ratio), min_size=2, max_size=40))
def test_paired_ratio_intervals_stay_inside_minus_1_1(pairs: list[tuple[float, float]]) -> None:
    iv = difference_interval([e - c for c, e in pairs], "ratio")
    assert -1.0 <= iv.lo <= iv.mean <= iv.hi <= 1.0, iv


@some
@given(st.lists(count, min_size=2, max_size=40))
def test_count_intervals_never_go_below_0(values: list[int]) -> None:
    iv = mean_interval(values, "count")
    assert 0.0 <= iv.lo <= iv.mean <= iv.hi, iv


@some
@given(st.lists(st.tuples(count, count), min_size=2, max_size=40))
def test_count_differences_stay_inside_what_the_data_allow(pairs: list[tuple[int, int]]) -> None:
    first, second = [a for a, _ in pairs], [b for _, b in pairs]
    allowed = count_difference_range(first, second)
    assert allowed is not None
    iv = difference_interval([a - b for a, b in pairs], "count", allowed)
    low = min(allowed[0], min(a - b for a, b in pairs))
    high = max(allowed[1], max(a - b for a, b in pairs))
    assert low <= iv.lo <= iv.mean <= iv.hi <= high, (iv, allowed)
    # the upper end: no more than elastic's own count interval allows over a zero baseline
    assert allowed[1] == mean_interval(first, "count").hi


@some
@given(st.lists(st.floats(min_value=-1e9, max_value=1e9, allow_nan=False), min_size=2,
                max_size=40))
def test_t_intervals_are_the_definition(values: list[float]) -> None:
    iv = mean_interval(values, "time")
    if iv.no_spread:
        return
    half = t975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    assert iv.half == pytest.approx(half, rel=1e-6, abs=1e-6)
    assert iv.lo <= iv.mean <= iv.hi


# --------------------------------------------------------------------------- significance


@some
@given(st.sampled_from(stats.KINDS), st.floats(min_value=-1.0, max_value=1.0),
       st.integers(min_value=2, max_value=30))
def test_equal_values_have_no_spread_and_make_no_claim(kind: stats.Kind, value: float,
                                                       n: int) -> None:
    if kind in ("ratio", "count"):
        value = abs(value)
    for iv in (mean_interval([value] * n, kind), difference_interval([value] * n, kind)):
        assert iv.no_spread and iv.lo == iv.mean == iv.hi, iv
    claim, why = significance(difference_interval([value] * n, kind))
    assert claim is None and "no spread: every seed gave the same result" in why


@some
@given(st.lists(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), min_size=1,
                max_size=MIN_PAIRS - 1))
def test_fewer_than_three_pairs_make_no_claim(differences: list[float]) -> None:
    claim, why = significance(difference_interval(differences, "time"))
    assert claim is None and "too few seeds" in why


@some
@given(st.lists(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), min_size=MIN_PAIRS,
                max_size=30))
def test_a_claim_is_the_interval_excluding_0(differences: list[float]) -> None:
    iv = difference_interval(differences, "time")
    claim, why = significance(iv)
    if iv.no_spread:
        assert claim is None
    else:
        assert claim == (iv.lo > 0 or iv.hi < 0)
        assert why == f"its 95% interval {'excludes' if claim else 'includes'} 0"
