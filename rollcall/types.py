"""Small value types shared by every part of the core.

Workers are named by integers: the initial workers are ``0 .. workers-1`` and
every newcomer (spare or join) takes the next unused id. A repaired machine
comes back under its old id with a higher incarnation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

WorkerId = int


@dataclass(frozen=True, order=True)
class Cursor:
    """The training position: one point in the data stream.

    ``step`` counts committed optimizer steps, ``sample`` counts samples
    consumed from the endless stream of per-epoch permutations (stream offset
    ``q`` is sample ``perm[q // dataset_samples][q % dataset_samples]``).
    Under ``batch: constant`` ``sample == step * global_batch``; under
    ``shrink`` the two drift apart, so both are kept.
    """

    step: int = 0
    sample: int = 0

    def to_json(self) -> list[int]:
        return [self.step, self.sample]

    @classmethod
    def from_json(cls, value: Iterable[int]) -> "Cursor":
        step, sample = value
        return cls(int(step), int(sample))


def to_ranges(ids: Iterable[int]) -> list[list[int]]:
    """Encode integer ids as sorted inclusive ``[lo, hi]`` runs.

    Member lists of thousands of workers with a few holes stay a few runs
    long, which keeps a weeks-long history small.
    """
    runs: list[list[int]] = []
    for i in sorted(set(ids)):
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return runs


def from_ranges(runs: Iterable[Iterable[int]]) -> tuple[int, ...]:
    """Decode the output of :func:`to_ranges` back to a sorted tuple."""
    out: list[int] = []
    for lo, hi in runs:
        out.extend(range(int(lo), int(hi) + 1))
    return tuple(out)
