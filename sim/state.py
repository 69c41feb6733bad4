"""The simulator's own state, in three parts small enough to read.

* :class:`Nodes`: per-node facts as flat numpy arrays (the physical world:
  hardware, processes, which life each runs), so that 10^5 nodes cost mask
  operations, not Python loops;
* :class:`Tally`: where every simulated second went, and the counters of
  the summary;
* :class:`Recorder`: the history, written in batches to ``history.jsonl``
  and kept in memory for the checkers.

None of them decides anything: decisions are the core's (:mod:`sim.driver`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from rollcall.core import IdRuns, Lives
from rollcall.results import HistoryWriter


@dataclass
class Nodes:
    """Per-node state over node ids ``0..n-1``."""

    exists: np.ndarray       # the machine has arrived
    hw: np.ndarray           # hardware up
    proc: np.ndarray         # a worker process (current incarnation) runs
    paused: np.ndarray       # stopped (silent) process
    inc: np.ndarray          # life of the current / last process started alone (or looked up)
    started_at: np.ndarray   # when the current process's agent started (its beat phase)
    life: np.ndarray         # hardware life counter (cancels stale failure events)
    pause_epoch: np.ndarray  # bumped per pause and teardown (cancels stale resumes)
    # the current generation's member list, and which of its members still
    # have a process in it (a restart's teardown clears these, not the list)
    member_flags: np.ndarray
    is_member: np.ndarray
    # the relaunch that started each node's current / last process (an index
    # into ``relaunches``, the keeper's lives of each), -1: started alone (``inc``)
    relaunch: np.ndarray
    # a relaunched process still starting (``restart_s``): the number of the
    # relaunch that ordered it, -1: none (a teardown or the node's loss voids it)
    starting: np.ndarray
    # the life of each node's process whose exit its host saw (a kill, a
    # blame), -1: none; a crash or a restart's teardown is no exit
    exit_seen: np.ndarray
    # lost and not given back to the job since (the keeper was told
    # ``node_down``, or a new keeper is at takeover, and no ``node_up``
    # since): a repaired node the repair shop holds idle stays so
    held_down: np.ndarray
    relaunches: list[Lives] = field(default_factory=list)
    ordered: dict[int, Lives] = field(default_factory=dict)  # relaunch number -> its lives
    orders: int = 0  # relaunches ordered so far

    @classmethod
    def zeros(cls, n: int) -> "Nodes":
        flags = [np.zeros(n, bool) for _ in range(4)]
        return cls(*flags, np.zeros(n, np.int64), np.zeros(n), np.zeros(n, np.int64),
                   np.zeros(n, np.int64), np.zeros(n, bool), np.zeros(n, bool),
                   np.full(n, -1, np.int64), np.full(n, -1, np.int64),
                   np.full(n, -1, np.int64), np.zeros(n, bool))

    def beating(self) -> np.ndarray:
        """Nodes whose process runs and beats."""
        return self.proc & ~self.paused

    # The keeper alone counts lives: a process runs the life it was started
    # as, named by the keeper (a Relaunch's lives, or node_up's answer).

    def life_of(self, w: int) -> int:
        """The life of node ``w``'s current (or last) process (a relaunched
        one's is looked up once, then kept in ``inc``: the voter asks per vote)."""
        k = self.relaunch.item(w)
        if k < 0:
            return self.inc.item(w)
        life = self.relaunches[k].of(w)
        assert life is not None, (w, k)
        self.inc[w] = life
        self.relaunch[w] = -1
        return life

    def started(self, w: int, life: int) -> None:
        """A process started alone on node ``w`` as ``life``."""
        assert life >= self.life_of(w), (w, life, self.life_of(w))
        self.inc[w] = life
        self.relaunch[w] = -1

    def relaunched(self, up: np.ndarray, lives: Lives) -> None:
        """A process started on every node of the mask ``up`` as ``lives`` names."""
        self.relaunch[up] = len(self.relaunches)
        self.relaunches.append(lives)

    def relaunch_ordered(self, up: np.ndarray, lives: Lives) -> int:
        """A relaunch's processes begin to start on the nodes of the mask
        ``up``, as ``lives`` names; returns the relaunch's number."""
        self.orders += 1
        self.starting[up] = self.orders
        self.ordered[self.orders] = lives
        return self.orders

    def relaunch_started(self, number: int) -> np.ndarray:
        """The processes relaunch ``number`` began are up, those not voided
        meanwhile (a teardown, the node's loss): the mask of their nodes."""
        lives = self.ordered.pop(number)
        up = self.starting == number
        if up.any():
            self.starting[up] = -1
            self.relaunched(up, lives)
        return up

    def lives_starting(self) -> dict[int, int]:
        """Node -> the life of its relaunched process still starting."""
        return {w: life for w in map(int, np.flatnonzero(self.starting >= 0))
                if (life := self.ordered[int(self.starting[w])].of(w)) is not None}

    def lives_exited(self) -> dict[int, int]:
        """Node -> the life of its latest process, where its host saw that
        process exit (nothing runs or starts on the node since)."""
        ids = np.flatnonzero((self.exit_seen >= 0) & ~self.proc & (self.starting < 0))
        return {w: life for w in map(int, ids)
                if (life := int(self.exit_seen[w])) == self.life_of(w)}

    def lives_started(self) -> dict[int, int]:
        """Node -> the life of its current or last process, for every node
        that ever ran one past its first life."""
        ids = np.flatnonzero(self.inc | (self.relaunch >= 0))
        return {w: life for w in map(int, ids) if (life := self.life_of(w))}


@dataclass
class Tally:
    """The run's counters, its smallest membership and when it ended (the
    time metrics are the core's, from the history:
    :func:`rollcall.core.time_account`)."""

    workers: int
    counts: dict[str, int] = field(default_factory=lambda: dict(
        crashes=0, kills=0, pauses=0, joins=0, repairs=0, detections=0,
        evictions=0, checkpoints=0, restarts=0, rounds=0, keeper_calls=0, rack_kills=0,
        retired=0, pulled=0, blames=0))
    end_s: float = 0.0
    min_members: int = 0

    def __post_init__(self) -> None:
        self.min_members = self.min_members or self.workers


class Recorder:
    """The history: in memory (``records``) and, with a run directory, on disk
    in batches of ``flush_every`` records (a crash keeps what was flushed)."""

    def __init__(self, out_dir: Optional[Path], flush_every: int = 4096) -> None:
        self.writer = HistoryWriter(out_dir) if out_dir is not None else None
        self.records: list[dict] = []
        self.flush_every = flush_every
        self._buf: list[dict] = []

    def write(self, record: dict) -> None:
        self._buf.append(record)
        if len(self._buf) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        if self._buf:
            if self.writer is not None:
                self.writer.write_many(self._buf)
            self.records.extend(self._buf)
            self._buf = []

    def close(self) -> None:
        self.flush()
        if self.writer is not None:
            self.writer.close()


def ids_of_flags(flags: np.ndarray) -> IdRuns:
    """The ids whose flag is set, as the core's id set (its bitmask, packed by numpy)."""
    return IdRuns.from_mask(int.from_bytes(np.packbits(flags, bitorder="little").tobytes(),
                                           "little"))


def flags_of_ids(ids: IdRuns, n: int) -> np.ndarray:
    """The inverse of :func:`ids_of_flags` over ``n`` node ids."""
    m = ids.mask
    raw = np.frombuffer(m.to_bytes((n + 7) // 8, "little"), np.uint8)
    return np.unpackbits(raw, count=n, bitorder="little").view(np.bool_)
