"""How sure a number over seeds is: one interval method per kind of metric, and the significance rule.

Why one module: ``compare``'s table and verdict, ``sweep``'s adaptive
replication, the report and the notebooks all say how sure a mean over
seeds is. Each kind of metric gets one method, named wherever an interval
is printed (:attr:`Interval.method`), and there is one Student-t quantile.

Kinds (:func:`kind_of`) and their 95% intervals:

- ``time`` (``*_s``) and ``number`` (a metric this module does not know):
  Student's t interval of the mean, ``m ± t(n-1) s / sqrt(n)``. The paired
  difference ``elastic - checkpoint-restart`` (both strategies of a seed meet
  the same failure trace) gets the paired t interval: the t interval of the
  per-seed differences.
- ``ratio`` (goodput, ETTR and the 0/1 gates completed and valid, all in
  [0, 1]): the t interval of the mean built on the logit scale, ``logit(m)
  ± t se / (m (1 - m))`` (the delta method, as survey software does for
  proportions) and mapped back, so it stays inside [0, 1] and always holds
  the mean. Paired differences lie in [-1, 1] and get the same on that range.
- ``count`` (failures, restarts, generations, lost_steps...; never below 0):
  the t interval on the square-root scale (the variance-stabilising transform
  of counts), its lower end held at 0 there and squared back, so it never
  goes below 0. A paired difference of counts gets the paired t interval
  held inside the range the data allow: from minus the upper end of the
  second side's count interval to the upper end of the first side's (given
  only the differences, the data allow any difference). Holding an interval
  inside the values the mean can take keeps its coverage; a logit on this
  range would not do here, since the range's ends are themselves estimates
  and the logit squeezes the interval against them.

Why a logit transform and not a bootstrap: a percentile bootstrap never
leaves the range of the values it resamples, so with the 2 to 5 seeds a
compare usually has, its interval is about [min, max] of the seeds, which
holds the true mean far less often than 95% of the time (with 2 seeds,
half the time). The transform keeps the t quantile's small-sample width (12.7
standard errors with 2 seeds), is a pure function of the values (no random
stream to seed) and, near a bound, stretches toward it: a few seeds near 1.0
say little about how close to 1.0 the mean is.

No spread: when every value is the same (to 1e-9 of their size) the interval
is that value, ``no_spread`` is set, and :func:`significance` makes no claim.
One value: no interval (NaN ends). A NaN among the values (a missing cell)
makes the whole interval NaN: nothing is filled in.

Significance (:func:`significance`): the paired interval excludes 0, with at
least :data:`MIN_PAIRS` pairs and some spread; otherwise no claim, and why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist
from typing import Iterable, Literal

__all__ = [
    "COUNT_METRICS", "KINDS", "MIN_PAIRS", "RATIO_METRICS", "Interval", "Kind",
    "count_difference_range", "difference_interval", "kind_of", "mean_interval", "significance",
    "t975", "t_quantile",
]

Kind = Literal["time", "number", "ratio", "count"]
KINDS: tuple[Kind, ...] = ("time", "number", "ratio", "count")
#: the fewest pairs on which a difference may be called significant
MIN_PAIRS = 3
#: values within this fraction of their size of one another are "the same"
SAME = 1e-9

RATIO_METRICS = frozenset({"completed", "valid", "ettr", "goodput", "final_weights_agree"})
COUNT_METRICS = frozenset({
    "failures", "generations", "restarts", "lost_steps", "samples_duplicated", "samples_skipped",
    "samples_consumed", "steps_committed", "steps_target", "global_batch_min", "global_batch_max",
    "fallbacks", "steps_lost_to_fallback", "state_bytes_moved", "keeper_failovers", "checkpoints",
    "detections", "evictions", "crashes", "kills", "rack_kills", "pauses", "joins", "repairs",
    "retired", "blames", "pulled", "rounds", "min_members", "events", "keeper_calls",
    "survivor_restarts", "recoveries", "processes",
})

_METHODS = {"time": "t", "number": "t", "ratio": "logit t", "count": "root t"}


def kind_of(metric: str) -> Kind:
    """A summary key's kind: ``ratio``, ``count``, ``time`` (``*_s``), else ``number``."""
    if metric in RATIO_METRICS:
        return "ratio"
    if metric in COUNT_METRICS:
        return "count"
    return "time" if metric.endswith("_s") else "number"


# --------------------------------------------------------------------------- Student's t

def _two_sided(theta: float, df: int) -> float:
    """``P(|T| <= sqrt(df) tan(theta))`` for integer ``df``: Abramowitz & Stegun 26.7.3/4,
    finite sums in ``cos(theta)``, exact up to rounding."""
    c, s = math.cos(theta), math.sin(theta)
    c2 = c * c
    if df == 1:
        return 2.0 * theta / math.pi
    if df % 2 == 0:
        term = total = 1.0
        for k in range(1, df // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        return s * total
    term = total = c
    for k in range(1, (df - 1) // 2):
        term *= c2 * (2 * k) / (2 * k + 1)
        total += term
    return 2.0 / math.pi * (theta + s * total)


#: above this many degrees of freedom the Cornish-Fisher series is used (error < 1e-12)
_SERIES_DF = 2000


@lru_cache(maxsize=1024)
def t_quantile(probability: float, df: int) -> float:
    """The ``probability`` quantile of Student's t with ``df`` (a positive integer) degrees
    of freedom: the exact distribution function inverted by bisection; for very large
    ``df`` the Cornish-Fisher expansion about the normal quantile (A&S 26.7.5)."""
    assert 0.0 < probability < 1.0 and int(df) == df, (probability, df)
    if df < 1:
        return float("nan")
    if probability < 0.5:
        return -t_quantile(1.0 - probability, df)
    if probability == 0.5:
        return 0.0
    if df > _SERIES_DF:
        z = NormalDist().inv_cdf(probability)
        terms = ((z ** 3 + z) / 4, (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96,
                 (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384,
                 (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / 92160)
        return z + sum(g / df ** (k + 1) for k, g in enumerate(terms))
    target = 2.0 * probability - 1.0
    lo, hi = 0.0, math.pi / 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if _two_sided(mid, df) < target else (lo, mid)
    return math.sqrt(df) * math.tan((lo + hi) / 2)


def t975(df: int) -> float:
    """The two-sided 95% quantile ``t_{0.975, df}`` (NaN for ``df < 1``), to the three
    decimals of a printed t table, so every interval can be checked by hand against
    one; the rounding moves an interval's ends by under 0.03% of its width."""
    if df < 1:
        return float("nan")
    return round(t_quantile(0.975, int(df)), 3)


# --------------------------------------------------------------------------- intervals

@dataclass(frozen=True)
class Interval:
    """A mean over ``n`` seeds and its 95% interval ``[lo, hi]`` (NaN ends: none), made
    by ``method``; ``no_spread``: every value was the same."""

    mean: float
    lo: float
    hi: float
    n: int
    method: str
    no_spread: bool = False

    @property
    def half(self) -> float:
        """Half the interval's width (the ``±`` of a t interval; ratio and count
        intervals are not centred on the mean, so read ``lo`` and ``hi`` for them)."""
        return (self.hi - self.lo) / 2

    def describe(self) -> str:
        """``"paired t over 5 seeds"``; ``"one seed: no interval"``."""
        if self.n < 2:
            return "one seed: no interval" if self.n == 1 else "no seeds"
        return f"{self.method} over {self.n} seeds"


def _floats(values: Iterable[float | None]) -> list[float]:
    """The values as floats; a missing one (None) is NaN."""
    return [float("nan") if v is None else float(v) for v in values]


def _same(xs: list[float]) -> bool:
    return max(xs) - min(xs) <= SAME * max(1.0, max(abs(x) for x in xs))


def _start(xs: list[float], method: str) -> Interval | None:
    """The interval when it needs no method (none, NaN, one value, no spread); else None."""
    nan = float("nan")
    if not xs or any(math.isnan(x) for x in xs):
        return Interval(nan, nan, nan, len(xs), method)
    mean = math.fsum(xs) / len(xs)
    if len(xs) == 1:
        return Interval(mean, nan, nan, 1, method)
    if _same(xs):
        return Interval(mean, mean, mean, len(xs), method, no_spread=True)
    return None


def _standard_error(xs: list[float], mean: float) -> float:
    return math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (len(xs) - 1) / len(xs))


def _t(xs: list[float], method: str) -> Interval:
    done = _start(xs, method)
    if done is not None:
        return done
    mean = math.fsum(xs) / len(xs)
    half = t975(len(xs) - 1) * _standard_error(xs, mean)
    return Interval(mean, mean - half, mean + half, len(xs), method)


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def _logit_t(xs: list[float], low: float, high: float, method: str) -> Interval:
    """The t interval on the logit scale of ``(m - low) / (high - low)``, mapped back."""
    done = _start(xs, method)
    if done is not None:
        return done
    low, high = min(low, min(xs)), max(high, max(xs))  # a value off its range widens it
    mean = min(max(math.fsum(xs) / len(xs), low), high)
    width = high - low
    # with spread the mean is off both bounds; held off them where rounding puts it on one
    u = min(max((mean - low) / width, 1e-15), 1.0 - 1e-15)
    half = t975(len(xs) - 1) * _standard_error(xs, mean) / width / (u * (1.0 - u))
    centre = math.log(u) - math.log1p(-u)
    lo = min(max(low + width * _sigmoid(centre - half), low), mean)
    hi = max(min(low + width * _sigmoid(centre + half), high), mean)
    return Interval(mean, lo, hi, len(xs), method)


def _root_t(xs: list[float], method: str) -> Interval:
    """The t interval on the square-root scale, its lower end held at 0 there, squared back."""
    done = _start(xs, method)
    if done is not None:
        return done
    low = min(0.0, min(xs))
    mean = max(math.fsum(xs) / len(xs), low)
    root = math.sqrt(mean - low)
    half = t975(len(xs) - 1) * _standard_error(xs, mean) / (2.0 * root)
    lo = min(low + max(0.0, root - half) ** 2, mean)
    hi = max(low + (root + half) ** 2, mean)
    return Interval(mean, lo, hi, len(xs), method)


def mean_interval(values: Iterable[float | None], kind: Kind = "number") -> Interval:
    """The 95% interval of a metric's mean over seeds, by its kind's method (module docstring)."""
    xs = _floats(values)
    if kind == "ratio":
        return _logit_t(xs, 0.0, 1.0, _METHODS[kind])
    if kind == "count":
        return _root_t(xs, _METHODS[kind])
    assert kind in KINDS, kind
    return _t(xs, _METHODS[kind])


def count_difference_range(first: Iterable[float | None],
                           second: Iterable[float | None]) -> tuple[float, float] | None:
    """The range the data allow a mean difference ``first - second`` of counts: from minus
    the upper end of ``second``'s count interval to the upper end of ``first``'s (None
    when either has no interval)."""
    a, b = mean_interval(first, "count"), mean_interval(second, "count")
    if not (math.isfinite(a.hi) and math.isfinite(b.hi)):
        return None
    return -b.hi, a.hi


def difference_interval(differences: Iterable[float | None], kind: Kind = "number",
                        allowed: tuple[float, float] | None = None) -> Interval:
    """The 95% interval of a mean paired difference: paired t for times and numbers;
    the logit interval on [-1, 1] for ratios; for counts the paired t held inside
    ``allowed`` (:func:`count_difference_range`), or the plain paired t without it."""
    xs = _floats(differences)
    if kind == "ratio":
        return _logit_t(xs, -1.0, 1.0, "paired logit t")
    assert kind in KINDS, kind
    if kind != "count" or allowed is None:
        return _t(xs, "paired t")
    interval = _t(xs, "paired t in range")
    if interval.no_spread or not math.isfinite(interval.half):
        return interval
    low, high = min(allowed[0], min(xs)), max(allowed[1], max(xs))  # the data widen it
    return Interval(interval.mean, max(interval.lo, low), min(interval.hi, high), interval.n,
                    interval.method)


def significance(difference: Interval) -> tuple[bool | None, str]:
    """Whether a paired difference is significant, and why: ``(True, "its 95% interval
    excludes 0")``, ``(False, "... includes 0")``, or ``(None, reason)`` when no claim can
    be made (no spread, fewer than :data:`MIN_PAIRS` pairs, no interval)."""
    reasons = []
    if difference.no_spread:
        reasons.append("no spread: every seed gave the same result")
    if difference.n < MIN_PAIRS:
        reasons.append(f"too few seeds: {difference.n} "
                       f"{'pair' if difference.n == 1 else 'pairs'}, a significance claim "
                       f"needs at least {MIN_PAIRS}")
    if not reasons and not (math.isfinite(difference.lo) and math.isfinite(difference.hi)):
        reasons.append("no interval")
    if reasons:
        return None, ", and ".join(reasons)
    excludes = difference.lo > 0 or difference.hi < 0
    return excludes, f"its 95% interval {'excludes' if excludes else 'includes'} 0"
