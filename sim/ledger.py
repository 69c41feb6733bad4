"""What the simulated job trained on: each run's ``commit`` record and its ledger.

The checker (:func:`rollcall.core.check`) reads the same records from both
targets. The per-sample ledger is what the real target writes: one
``contribute`` record per member and step, with the dataset ids of its
shards. At scale the compact form stands in for it: one record per
generation (every member, at its rank, contributed its shards of every step
the generation computed), which the checker expands.
"""

from __future__ import annotations

from typing import Callable, Literal, Optional

from rollcall.core import JOB, IdRuns, commit, members_delta, rank_range, rec, sample_ids
from rollcall.scenario import Workload

from sim.steps import StepRun

LedgerKind = Literal["samples", "compact"]


class Ledger:
    """Writes each closed run of steps to the history (through ``write``)."""

    def __init__(self, write: Callable[[dict], None], seed: int, workload: Workload,
                 kind: LedgerKind, latency_s: float) -> None:
        self.write = write
        self.seed = seed
        self.workload = workload
        self.kind: LedgerKind = kind
        self.latency_s = latency_s
        self._generation: Optional[list] = None  # the compact ledger of the latest generation
        self._workers: Optional[IdRuns] = None  # the last compact record's workers

    def run_closed(self, run: StepRun) -> None:
        """The run's ``commit`` record (the steps that passed, at the last
        passing vote's arrival) and its ledger."""
        if run.passed:
            stop = run.sample + run.passed * run.batch
            self.write(commit(run.vote_at(run.passed, self.latency_s), run.voter, run.gen,
                              run.first, run.first + run.passed - 1, run.sample, stop, run.batch,
                              run.t0 if run.started is None else run.started))
        if run.n:
            if self.kind == "compact":
                self._extend(run)
            else:
                self._contributions(run)

    def _contributions(self, run: StepRun) -> None:
        """One ``contribute`` record per member and step of the run."""
        assert run.n is not None
        w = self.workload
        members, mb = run.members, w.micro_batch
        shards = run.batch // mb
        ranges = [(m, *rank_range(shards, len(members), r)) for r, m in enumerate(members)]
        ranges = [(m, a * mb, b * mb) for m, a, b in ranges if b > a]
        for j in range(run.n):
            lo = run.sample + j * run.batch
            ids = sample_ids(self.seed, w.dataset_samples, lo, lo + run.batch)
            t = run.t0 + (j + 1) * run.step_s
            for m, a, b in ranges:
                self.write(rec(t, "ok", "contribute", m, gen=run.gen, step=run.first + j,
                               samples=ids[a:b]))

    def _extend(self, run: StepRun) -> None:
        """The run joins its generation's compact record (a new generation
        writes the previous one's first)."""
        assert run.n is not None
        led = self._generation
        if led is not None and led[0] == run.gen:
            assert run.first == led[2] + 1 and run.batch == led[4], (led, run)
            led[2] = run.first + run.n - 1
            led[5] = run.t0 + run.n * run.step_s
        else:
            self.flush()
            self._generation = [run.gen, run.first, run.first + run.n - 1, run.sample,
                                run.batch, run.t0 + run.n * run.step_s, run.members]

    def flush(self) -> None:
        """Write the compact record of the generation whose steps it holds."""
        led, self._generation = self._generation, None
        if led is not None:
            g, first, last, sample, batch, t, members = led
            workers = IdRuns.of(members)
            self.write(rec(t, "ok", "contribute", JOB, gen=g, step=first, last=last,
                           sample=sample, batch=batch, shards=batch // self.workload.micro_batch,
                           **members_delta("workers", workers, self._workers)))
            self._workers = workers
