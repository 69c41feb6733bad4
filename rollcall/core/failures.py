"""Random failures as pure functions of (seed, name, k): the same on every target.

A node's k-th hardware life lasts :meth:`FailureModel.lifetime` ``(node, k)``
seconds: SHA-256 of ``"<seed>/node/<node>/<k>"`` turned into 53 uniform bits,
then into a time by the inverse CDF. No generator carries state between
draws, so the failure trace depends only on the seed (never on the strategy,
on the order in which a driver asks, or on the target), and a 10^5-node job
pays one hash per life instead of seeding a generator per repaired node.

Random slowdowns (:class:`SlowdownModel`) are drawn the same way from
``slow/<node>``: a gray failure, so a separate stream, and the lifetimes
do not move when slowdowns are added.

A ``random`` target of a scripted fault is the k-th draw of the run's
``schedule`` name (:func:`pick`), made over the candidates sorted by id.
:class:`Draws` counts both k's for a driver, so the sim and the real target
number a node's lives and the run's picks the same way.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Optional, Sequence

__all__ = ["Draws", "FailureModel", "SlowdownModel", "nth_uniform", "pick", "weibull_scale"]

DISTRIBUTIONS = ("exponential", "weibull", "lognormal")


def nth_uniform(seed: int, name: str, k: int) -> float:
    """The k-th draw of the stream ``name``, uniform on (0, 1]."""
    digest = hashlib.sha256(f"{seed}/{name}/{k}".encode()).digest()
    return ((int.from_bytes(digest[:8], "big") >> 11) + 1) * 2.0 ** -53


def weibull_scale(mean_s: float, shape: float) -> float:
    """The Weibull scale that gives ``mean_s`` at ``shape``."""
    return mean_s / math.gamma(1.0 + 1.0 / shape)


# Acklam's rational approximation of the standard normal quantile (relative
# error below 1.2e-9), refined by one Halley step on math.erfc: the core may
# not import statistics (it loads random, a global generator).
_A = (-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
      1.383577518672690e+02, -3.066479806614716e+01, 2.506628277459239e+00)
_B = (-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
      6.680131188771972e+01, -1.328068155288572e+01)
_C = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
      -2.549732539343734e+00, 4.374664141464968e+00, 2.938163982698783e+00)
_D = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
      3.754408661907416e+00)


def normal_quantile(u: float) -> float:
    """The standard normal's inverse CDF at ``u`` in (0, 1)."""
    assert 0.0 < u < 1.0, u
    if u < 0.02425 or u > 1 - 0.02425:
        q = math.sqrt(-2 * math.log(min(u, 1 - u)))
        x = (((((_C[0] * q + _C[1]) * q + _C[2]) * q + _C[3]) * q + _C[4]) * q + _C[5]) / \
            ((((_D[0] * q + _D[1]) * q + _D[2]) * q + _D[3]) * q + 1)
        x = x if u < 0.5 else -x
    else:
        q = u - 0.5
        r = q * q
        x = (((((_A[0] * r + _A[1]) * r + _A[2]) * r + _A[3]) * r + _A[4]) * r + _A[5]) * q / \
            (((((_B[0] * r + _B[1]) * r + _B[2]) * r + _B[3]) * r + _B[4]) * r + 1)
    e = 0.5 * math.erfc(-x / math.sqrt(2)) - u  # Halley's step
    d = e * math.sqrt(2 * math.pi) * math.exp(x * x / 2)
    return x - d / (1 + x * d / 2)


@dataclass(frozen=True)
class FailureModel:
    """Independent node lifetimes of one distribution and mean.

    ``mean_s`` is a good node's mean lifetime. A fraction ``bad_fraction``
    of the nodes are bad ("lemons": a marginal part, a flaky NIC), chosen by
    node id from the stream ``bad``: their lifetimes are ``bad_multiplier``
    times shorter, draw for draw. ``lognormal`` lifetimes have the log's
    standard deviation ``lognormal_sigma`` and the mean ``mean_s``.
    """

    seed: int
    distribution: str
    mean_s: float
    weibull_shape: float = 0.7
    lognormal_sigma: float = 1.0
    bad_fraction: float = 0.0
    bad_multiplier: float = 1.0

    def __post_init__(self) -> None:
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"unknown failure distribution {self.distribution!r}")
        if not self.mean_s > 0:
            raise ValueError(f"mean_s must be > 0, got {self.mean_s}")
        if not (0.0 <= self.bad_fraction <= 1.0 and self.bad_multiplier >= 1.0
                and self.lognormal_sigma > 0 and self.weibull_shape > 0):
            raise ValueError(f"bad failure model {self}")

    def is_bad(self, node: int) -> bool:
        """Whether node ``node`` is a lemon (fixed for the run, by its id)."""
        return self.bad_fraction > 0 and nth_uniform(self.seed, "bad", node) <= self.bad_fraction

    def node_mean_s(self, node: int, cured: bool = False) -> float:
        """Node ``node``'s mean lifetime (``cured``: a repair removed a bad
        node's fault, and it lives as a good one)."""
        bad = self.is_bad(node) and not cured
        return self.mean_s / self.bad_multiplier if bad else self.mean_s

    def lifetime(self, node: int, k: int, cured: bool = False) -> float:
        """Seconds from the start of node ``node``'s k-th hardware life (k = 0
        when it first arrives, k + 1 after each repair) to its failure."""
        assert node >= 0 and k >= 0, (node, k)
        u = nth_uniform(self.seed, f"node/{node}", k)
        mean = self.node_mean_s(node, cured)
        if self.distribution == "lognormal":
            sigma = self.lognormal_sigma
            z = normal_quantile(min(u, 1.0 - 2.0 ** -53))
            return math.exp(math.log(mean) - sigma * sigma / 2.0 + sigma * z)
        e = -math.log(u)  # a unit exponential
        if self.distribution == "exponential":
            return mean * e
        shape = self.weibull_shape
        return weibull_scale(mean, shape) * e ** (1.0 / shape)


@dataclass(frozen=True)
class SlowdownModel:
    """Random slowdowns (gray failures, not deaths): each node is slowed now
    and then, for ``for_s`` seconds, ``factor`` times.

    A node's k-th slowdown starts an exponential gap of mean ``mtbf_s``
    after its hardware life began (k = 0) or after its previous slowdown
    ended: draw ``2k`` of the stream ``slow/<node>``. Its factor is
    ``factor`` when ``spread`` is 0, else ``1 + (factor - 1) * exp(spread *
    z)`` with ``z`` standard logistic (``ln(u / (1 - u))``, draw ``2k + 1``):
    the slowness beyond 1 is log-logistic with median ``factor - 1`` (so a
    factor is always above 1), capped at :data:`MAX_FACTOR`.
    """

    seed: int
    mtbf_s: float
    factor: float
    for_s: float
    spread: float = 0.0

    def __post_init__(self) -> None:
        if not (self.mtbf_s > 0 and 1 < self.factor <= MAX_FACTOR and self.for_s > 0
                and self.spread >= 0):
            raise ValueError(f"bad slowdown model {self}")

    def slowdown(self, node: int, k: int) -> tuple[float, float]:
        """(gap before it, its factor) of node ``node``'s k-th slowdown."""
        assert node >= 0 and k >= 0, (node, k)
        gap = -self.mtbf_s * math.log(nth_uniform(self.seed, f"slow/{node}", 2 * k))
        if not self.spread:
            return gap, self.factor
        u = nth_uniform(self.seed, f"slow/{node}", 2 * k + 1) * (1 - 2.0 ** -53)  # (0, 1)
        z = math.log(u / (1.0 - u))  # standard logistic
        return gap, min(MAX_FACTOR, 1.0 + (self.factor - 1.0) * math.exp(min(self.spread * z, 700.0)))


MAX_FACTOR = 1000.0  # the most a worker is slowed (the schema's bound too)


def pick(seed: int, k: int, candidates: Sequence[int]) -> Optional[int]:
    """The run's k-th random choice among ``candidates`` (None when empty)."""
    if not candidates:
        return None
    pool = sorted(candidates)
    return pool[min(len(pool) - 1, int(nth_uniform(seed, "schedule", k) * len(pool)))]


class Draws:
    """One run's random draws, in the order a driver asks for them.

    ``next_lifetime(node)`` is the length of the node's next hardware life
    (its k-th: k counts the lives asked for that node); ``pick(candidates)``
    is the run's next random choice (k counts the picks made; an empty pool
    draws nothing). None: no random failures, or nothing to pick from.
    """

    def __init__(self, seed: int, model: Optional[FailureModel],
                 slow: Optional[SlowdownModel] = None) -> None:
        self.seed = seed
        self.model = model
        self.slow = slow
        self._lives: dict[int, int] = {}  # node -> hardware lives drawn so far
        self._slowdowns: dict[int, int] = {}  # node -> slowdowns drawn so far
        self._picks = 0
        self._keepers = 0  # keeper lives drawn so far
        self.cured: set[int] = set()  # bad nodes a repair fixed (rollcall.core.repairs)

    def cure(self, node: int) -> None:
        """A repair removed node ``node``'s fault: its next lives are a good node's."""
        self.cured.add(node)

    def next_slowdown(self, node: int) -> Optional[tuple[float, float]]:
        """(gap, factor) of the node's next random slowdown (None: no model)."""
        if self.slow is None:
            return None
        k = self._slowdowns.get(node, 0)
        self._slowdowns[node] = k + 1
        return self.slow.slowdown(node, k)

    def next_lifetime(self, node: int) -> Optional[float]:
        if self.model is None:
            return None
        k = self._lives.get(node, 0)
        self._lives[node] = k + 1
        return self.model.lifetime(node, k, node in self.cured)

    def next_keeper_life(self, mtbf_s: Optional[float]) -> Optional[float]:
        """How long the next active record-keeper lives (exponential, mean
        ``mtbf_s``; the k-th keeper's from draw k of the stream ``keeper``,
        apart from the nodes' so that modelling keeper failures changes no
        node's trace). None: keepers do not fail at random."""
        if mtbf_s is None:
            return None
        assert mtbf_s > 0, mtbf_s
        k = self._keepers
        self._keepers = k + 1
        return -mtbf_s * math.log(nth_uniform(self.seed, "keeper", k))

    def pick(self, candidates: Sequence[int]) -> Optional[int]:
        if not candidates:
            return None
        self._picks += 1
        return pick(self.seed, self._picks - 1, candidates)
