"""Named, seeded random streams.

Every random draw of a simulation comes from a stream named after what it is
for (``failures``, ``schedule``, ``network``, ``node/<i>``), seeded from
SHA-256 of ``"<seed>/<name>"``: the same seed gives the same draws in every
process and every Python run, and two streams never share state, so adding
draws to one (e.g. a strategy that makes more scheduling choices) never
shifts another (the failure trace).

A node's lifetimes after a repair are counter-based (:func:`nth_lifetime`):
the k-th draw of ``node/<i>`` is a hash of the seed, the name and k. A
10^5-node job repairs thousands of nodes, each of which would otherwise
need its own generator (tens of microseconds to seed) for one or two draws.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np


def stream(seed: int, name: str) -> np.random.Generator:
    digest = hashlib.sha256(f"{seed}/{name}".encode()).digest()
    return np.random.Generator(np.random.PCG64(int.from_bytes(digest[:16], "big")))


def weibull_scale(mean_s: float, shape: float) -> float:
    """The Weibull scale that gives ``mean_s`` at ``shape``."""
    return mean_s / math.gamma(1.0 + 1.0 / shape)


def nth_uniform(seed: int, name: str, k: int) -> float:
    """The k-th draw of stream ``name``, uniform on (0, 1]: 53 bits of
    SHA-256 of ``"<seed>/<name>/<k>"``."""
    digest = hashlib.sha256(f"{seed}/{name}/{k}".encode()).digest()
    return ((int.from_bytes(digest[:8], "big") >> 11) + 1) * 2.0 ** -53


def nth_lifetime(seed: int, name: str, k: int, distribution: str, mean_s: float,
                 shape: float) -> float:
    """The k-th time to failure of stream ``name`` (inverse CDF of one
    :func:`nth_uniform`): exponential, or Weibull of ``shape``, with the given mean."""
    e = -math.log(nth_uniform(seed, name, k))  # a unit exponential
    if distribution == "exponential":
        return mean_s * e
    if distribution == "weibull":
        return weibull_scale(mean_s, shape) * e ** (1.0 / shape)
    raise ValueError(f"unknown failure distribution {distribution!r}")


def lifetimes(rng: np.random.Generator, distribution: str, mean_s: float, shape: float,
              size: int) -> np.ndarray:
    """Times to failure with the given mean: exponential, or Weibull of ``shape``."""
    if distribution == "exponential":
        return rng.exponential(mean_s, size)
    if distribution == "weibull":
        return weibull_scale(mean_s, shape) * rng.weibull(shape, size)
    raise ValueError(f"unknown failure distribution {distribution!r}")
