"""Random failures as pure functions of (seed, name, k): the same on every target.

A node's k-th hardware life lasts :meth:`FailureModel.lifetime` ``(node, k)``
seconds: SHA-256 of ``"<seed>/node/<node>/<k>"`` turned into 53 uniform bits,
then into a time by the inverse CDF. No generator carries state between
draws, so the failure trace depends only on the seed (never on the strategy,
on the order in which a driver asks, or on the target), and a 10^5-node job
pays one hash per life instead of seeding a generator per repaired node.

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

__all__ = ["Draws", "FailureModel", "nth_uniform", "pick", "weibull_scale"]

DISTRIBUTIONS = ("exponential", "weibull")


def nth_uniform(seed: int, name: str, k: int) -> float:
    """The k-th draw of the stream ``name``, uniform on (0, 1]."""
    digest = hashlib.sha256(f"{seed}/{name}/{k}".encode()).digest()
    return ((int.from_bytes(digest[:8], "big") >> 11) + 1) * 2.0 ** -53


def weibull_scale(mean_s: float, shape: float) -> float:
    """The Weibull scale that gives ``mean_s`` at ``shape``."""
    return mean_s / math.gamma(1.0 + 1.0 / shape)


@dataclass(frozen=True)
class FailureModel:
    """Independent node lifetimes of one distribution and mean."""

    seed: int
    distribution: str
    mean_s: float
    weibull_shape: float = 0.7

    def __post_init__(self) -> None:
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"unknown failure distribution {self.distribution!r}")
        if not self.mean_s > 0:
            raise ValueError(f"mean_s must be > 0, got {self.mean_s}")

    def lifetime(self, node: int, k: int) -> float:
        """Seconds from the start of node ``node``'s k-th hardware life (k = 0
        when it first arrives, k + 1 after each repair) to its failure."""
        assert node >= 0 and k >= 0, (node, k)
        e = -math.log(nth_uniform(self.seed, f"node/{node}", k))  # a unit exponential
        if self.distribution == "exponential":
            return self.mean_s * e
        shape = self.weibull_shape
        return weibull_scale(self.mean_s, shape) * e ** (1.0 / shape)


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

    def __init__(self, seed: int, model: Optional[FailureModel]) -> None:
        self.seed = seed
        self.model = model
        self._lives: dict[int, int] = {}  # node -> hardware lives drawn so far
        self._picks = 0

    def next_lifetime(self, node: int) -> Optional[float]:
        if self.model is None:
            return None
        k = self._lives.get(node, 0)
        self._lives[node] = k + 1
        return self.model.lifetime(node, k)

    def pick(self, candidates: Sequence[int]) -> Optional[int]:
        if not candidates:
            return None
        self._picks += 1
        return pick(self.seed, self._picks - 1, candidates)
