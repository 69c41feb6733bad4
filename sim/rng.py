"""Named, seeded random streams.

Every random draw of a simulation comes from a stream named after what it is
for (``failures``, ``schedule``, ``network``, ``node/<i>``), seeded from
SHA-256 of ``"<seed>/<name>"``: the same seed gives the same draws in every
process and every Python run, and two streams never share state, so adding
draws to one (e.g. a strategy that makes more scheduling choices) never
shifts another (the failure trace).
"""

from __future__ import annotations

import hashlib
import math

import numpy as np


def stream(seed: int, name: str) -> np.random.Generator:
    digest = hashlib.sha256(f"{seed}/{name}".encode()).digest()
    return np.random.Generator(np.random.PCG64(int.from_bytes(digest[:16], "big")))


def lifetimes(rng: np.random.Generator, distribution: str, mean_s: float, shape: float,
              size: int) -> np.ndarray:
    """Times to failure with the given mean: exponential, or Weibull of ``shape``."""
    if distribution == "exponential":
        return rng.exponential(mean_s, size)
    if distribution == "weibull":
        scale = mean_s / math.gamma(1.0 + 1.0 / shape)
        return scale * rng.weibull(shape, size)
    raise ValueError(f"unknown failure distribution {distribution!r}")
